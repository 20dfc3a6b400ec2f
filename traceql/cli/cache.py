"""`traceql cache info|clear`."""

from __future__ import annotations


import click

from traceql.cli import main

@main.group("cache")
def cache_group():
    """Where the Parquet cache of parsed traces is, how big it is, and emptying it."""


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@cache_group.command("info")
def cache_info():
    """Folder, entries, total size and cap of the cache (TRACEQL_CACHE_MAX_MB, 0 = no limit)."""
    from traceql import cache

    cap, problem = cache.cap_setting()
    if problem:
        click.echo(f"traceql: {problem}", err=True)
    u = cache.usage()
    click.echo(f"path     {cache.cache_dir()}")
    click.echo(f"entries  {u['sources']} parsed sources, {u['runs']} runs' derived tables"
               + (f", {u['leftovers']} unfinished (removed by the next prune)" if u["leftovers"] else ""))
    click.echo(f"size     {_size(u['bytes'])}")
    click.echo(f"cap      {'no limit' if cap is None else f'{cap / (1 << 20):g} MB'} (TRACEQL_CACHE_MAX_MB; least recently used entries go beyond it)")


@cache_group.command("clear")
def cache_clear():
    """Delete every cache entry; files traceql did not write stay."""
    from traceql import cache

    removed, freed = cache.clear()
    click.echo(f"freed {_size(freed)}: {removed} entries deleted from {cache.cache_dir()}")
