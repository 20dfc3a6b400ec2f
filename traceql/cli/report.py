"""Report commands: `traceql annotate`, `traceql diff`, `traceql query`. Argument handling only; the work is in
traceql.report.annotate, .diff and .query."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceql.cli._common import _check_out, _fail, _say


def _progress(quiet: bool, machine_output: bool) -> bool:
    """Bars go to stderr, and only for people: not with --quiet, not when machine output is piped."""
    return not quiet and not (machine_output and not sys.stdout.isatty())


def _check(run_dir: Path, no_cache: bool, progress: bool, config_path: Path | None = None, trust: bool = False):
    """pipeline.check with the configuration `check` would read: --config, else the checkout's, never one inside the
    run dir unless --trust-run-config (it can change the verdict, and uploads are untrusted)."""
    from traceql import pipeline
    from traceql.cli.check import _config_path
    from traceql.rules.config import ConfigError, load_config
    from traceql.rules.loader import RuleError

    try:
        config = load_config(_config_path(run_dir, config_path, trust))
        return pipeline.check(run_dir, use_cache=not no_cache, config=config, progress=progress)
    except (ConfigError, RuleError, pipeline.NothingToAnalyse) as e:
        _fail(str(e))


_TRUST_HELP = "Also read traceql.toml / pyproject.toml from inside the run dir(s) (only for runs you trust)."


def _analysed_or_fail(result, run_dir: Path) -> None:
    if not any(s.status in ("ok", "partial") for s in result.run.sources):
        _fail(f"nothing could be analysed in {run_dir}: no readable input (`traceql check {run_dir} -v` lists the sources)")


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Trace file to write (.json, or .json.gz).")
@click.option("--no-host", is_flag=True, help="GPU streams and findings only: leave host ops and runtime calls out (smaller file).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--trust-run-config", is_flag=True, help=_TRUST_HELP)
@click.option("--no-cache", is_flag=True)
@click.option("--quiet", "-q", is_flag=True)
def annotate(run_dir, out, no_host, config_path, trust_run_config, no_cache, quiet):
    """Merge RUN_DIR's per-rank traces into one Chrome/Perfetto trace with the findings on it.

    One clock for every source (an nsys export and a Kineto trace of one rank are put on one clock, or the one that
    cannot be is left out with a note), one process per rank, one thread per GPU stream and host thread, each finding
    a slice on the rank's "traceql findings" track at its evidence (and an instant on the evidence's thread), arrows
    from the last rank to reach a collective to the ranks that waited for it (NCCL and gloo). Open it in
    https://ui.perfetto.dev or chrome://tracing.
    """
    from traceql.report.annotate import write

    _check_out(out)
    result = _check(run_dir, no_cache, _progress(quiet, False), config_path, trust_run_config)
    _analysed_or_fail(result, run_dir)
    if result.run.table("kernels").height == 0 and result.run.table("host_ops").height == 0:
        _fail(f"{run_dir}: no trace events (kernels or host ops) to merge; annotate needs Kineto or nsys traces")
    try:
        meta = write(result, out, host=not no_host)
    except OSError as e:
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
        return
    for w in meta["warnings"]:
        _say(w)
    click.echo(
        f"wrote {out}: {len(meta['ranks'])} rank(s), {meta['findings']} finding marker(s), {meta['flows']} wait arrow(s); "
        + ("aligned clocks" if meta["aligned"] else "unaligned clocks"),
        err=True,
    )


@click.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--trust-run-config", is_flag=True, help=_TRUST_HELP)
@click.option("--no-cache", is_flag=True)
@click.option("--quiet", "-q", is_flag=True)
def diff(run_a, run_b, fmt, config_path, trust_run_config, no_cache, quiet):
    """Compare two runs (eager vs compiled, before vs after): per-rank deltas and findings new and resolved."""
    import orjson

    from traceql.report import diff as d

    progress = _progress(quiet, fmt == "json")
    a = _check(run_a, no_cache, progress, config_path, trust_run_config)
    _analysed_or_fail(a, run_a)
    b = _check(run_b, no_cache, progress, config_path, trust_run_config)
    _analysed_or_fail(b, run_b)
    data = d.diff(a, b)
    if fmt == "json":
        click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    else:
        click.echo(d.render_text(data), nl=False)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--no-cache", is_flag=True)
@click.option("--quiet", "-q", is_flag=True)
def query(run_dir, sql, fmt, no_cache, quiet):
    """Run polars SQL over RUN_DIR's tables, e.g. "SELECT rank, count(*) AS n FROM kernels GROUP BY rank".

    Canonical tables (kernels, host_ops, runtime, syncs, collectives, steps, flows, compile_events, nccl_comms,
    nccl_events) are always there; derived tables (step_breakdown, collective_instances, ...) are built when named.
    """
    from traceql import pipeline
    from traceql.report import query as q

    try:
        run = pipeline.load_run(run_dir, use_cache=not no_cache, progress=_progress(quiet, fmt != "table"))
    except pipeline.NothingToAnalyse as e:
        _fail(str(e))
        return
    try:
        df = q.query(run, sql)
    except q.QueryError as e:
        _fail(str(e))
        return
    click.echo(q.render(df, fmt), nl=False)

