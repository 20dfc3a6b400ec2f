"""`traceql check` and `traceql summary`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceql.cli import main
from traceql.cli._common import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    _check_out,
    _color,
    _fail,
    done,
    _say,
    _width,
    _write_out,
    text_options,
)


class _RunArg(click.Path):
    """A run dir, a file, or an fsspec URL (s3://bucket/run7/, kept as the string: traceql.remote reads it)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and "://" in value:
            from traceql.remote import is_url

            if is_url(value):
                return value
        return super().convert(value, param, ctx)


RUN_ARG = _RunArg(path_type=Path)


# How many threads polars runs on in this process. Below ONE_THREAD_MAX_BYTES of input, one: on a small run's tables its
# operations take tens of microseconds, and waking and parking a pool's threads for each costs more CPU than it saves
# in wall time (samples/demo, 2 MB: 0.88 against 1.00 CPU s, min of 8 interleaved; a 54 MB trace 1.24 against 1.38,
# and no slower on the wall clock). Above it, at most MAX_THREADS: the parent's queries over many ranks' tables gain
# little wall time past that and pay for it in CPU (128 ranks x 36 MB on 16 cores: 67-69 CPU s / 13.8 s wall on 16
# threads, 55-61 / 14.2-15.8 on 4). polars sizes its pool as it is imported: decided before that (traceql.polars_env),
# which also keeps a one-thread check on the CPU it starts on (its workers get every CPU back).
ONE_THREAD_MAX_BYTES = 128 << 20
MAX_THREADS = 4


def _polars_threads(run_dir, cores: int | None) -> int | None:
    """The thread count for this check's polars pool, or None for polars' default."""
    if not isinstance(run_dir, Path):
        return None  # a URL: its size is the listing's business
    if _bytes_within(run_dir, ONE_THREAD_MAX_BYTES):
        return 1
    return MAX_THREADS if (cores or 1) > MAX_THREADS else None


def _size_polars_pool(run_dir) -> None:
    import os

    from traceql import polars_env

    if "polars" in sys.modules:  # loaded already (a test, an API caller): its pool is sized
        polars_env.load(threads=_polars_threads(run_dir, os.cpu_count()))
        return
    import gc

    # The imports make objects that live as long as the process (modules, classes, functions): the collector would
    # walk them again at each collection of the generation they reach. So none runs while polars and the check's
    # modules load, and what they made is set aside (gc.freeze) before the work: 0.025 G of the demo's 1.74 G
    # instructions (callgrind), garbage of the check itself still collected as usual.
    gc.disable()
    try:
        polars_env.load(threads=_polars_threads(run_dir, os.cpu_count()))
        from traceql import pipeline  # noqa: F401  (the check's modules, imported under the same pause)
    finally:
        gc.freeze()
        gc.enable()


def _bytes_within(path: Path, cap: int, max_entries: int = 20_000) -> bool:
    """Whether the regular files under `path` (symlinks not followed) add up to at most `cap` bytes; False as soon as
    they pass it, where there are more than `max_entries` entries to look at, or where a folder cannot be listed."""
    import os

    total, seen, todo = 0, 0, [path]
    try:
        while todo:
            p = todo.pop()
            if not p.is_dir():
                total += p.stat().st_size if p.is_file() else 0
                continue
            with os.scandir(p) as it:
                for e in it:
                    seen += 1
                    if e.is_dir(follow_symlinks=False):
                        todo.append(Path(e.path))
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                    if seen > max_entries or total > cap:
                        return False
    except OSError:
        return False  # discovery says what it cannot read
    return total <= cap


def _csv(values: tuple[str, ...]) -> list[str]:
    return [p for v in values for p in v.split(",") if p.strip()]


@main.command()
@click.argument("run_dir", type=RUN_ARG)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sarif", "html"]), default="text", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="Write the report to this file instead of stdout.")
@click.option("--select", multiple=True, help="Rule ids or prefixes to run (TQL1, TQL101); comma-separated or repeated.")
@click.option("--ignore", multiple=True, help="Rule ids or prefixes to skip.")
@click.option("--set", "sets", multiple=True, help="Override a threshold: RULE.param=value (e.g. TQL101.min_exposed_ms=5).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info", "never"]), default=None, help="Exit 1 when a finding is at or above this severity [default: warning].")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False), help="Rule folder(s) to use instead of the bundled pack (its input rules TQL001-TQL004 still run unless the folder defines them; leave them with --ignore).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, exists=True, dir_okay=False), help="traceql.toml (default: found from the current folder upwards, never inside RUN_DIR).")
@click.option("--trust-run-config", is_flag=True, help="Also read traceql.toml / pyproject.toml from inside RUN_DIR (it can change the verdict: only for runs you trust).")
@click.option("--baseline", type=click.Path(path_type=Path, exists=True, dir_okay=False), help="A previous --format json report: report only findings not in it.")
@click.option("--no-cache", is_flag=True, help="Parse every input again instead of using the Parquet cache.")
@click.option("--jobs", "-j", type=int, default=None, help="Parallel ingest processes [default: cores].")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE.json|local",
              help="Run each rank's part on a Dask cluster (tcp://host:8786, a scheduler file, or `local` for a local "
                   "cluster of processes); needs the [dask] extra. Only small tables come back to this process.")
@click.option("--verbose", "-v", is_flag=True, help="List every source and every rule that did not run.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@text_options
def check(run_dir, fmt, out, select, ignore, sets, fail_on, rules_dirs, config_path, trust_run_config, baseline, no_cache, jobs, scheduler, verbose, quiet, width, color):
    """Analyse RUN_DIR (a run directory or a single file) and report findings.

    Exit status: 0 no finding at or above --fail-on, 1 at least one, 2 bad usage or configuration, or nothing could
    be analysed, 3 a rule or internal error (the report is incomplete).
    """
    if not scheduler:
        _size_polars_pool(run_dir)
    from traceql import pipeline
    from traceql.rules.config import ConfigError, load_config
    from traceql.rules.loader import RuleError

    usage_errors: tuple[type[Exception], ...] = (ConfigError, pipeline.NothingToAnalyse)
    if scheduler:
        from traceql.executor import SchedulerError  # Dask and the executor load only when asked for

        usage_errors = (*usage_errors, SchedulerError)
    if scheduler and fmt == "html":
        _fail("--format html draws every rank's kernels, which stay on the Dask workers with --scheduler; "
              "render the HTML report without --scheduler")
    _check_out(out)
    try:
        config = load_config(_config_path(run_dir, config_path, trust_run_config))
        suppress = _baseline(baseline) if baseline else None
        result = pipeline.check(
            run_dir, select=_csv(select), ignore=_csv(ignore), sets=list(sets), rules_dirs=list(rules_dirs) or None,
            use_cache=not no_cache, config=config, jobs=jobs, suppress=suppress, scheduler=scheduler,
            progress=not quiet and (fmt == "text" or out is not None or sys.stdout.isatty()),  # no bar over piped machine output
        )
    except usage_errors as e:
        _fail(str(e))
        return
    except RuleError as e:  # a broken rule file is configuration: nothing ran
        _fail(str(e), EXIT_USAGE)
        return
    except Exception as e:  # an internal error must not pass as a clean (or a usage) exit
        _internal(e)
        return
    if verbose:
        for note in result.run.notes:
            if isinstance(note, str) and note.startswith("not cached: "):
                _say(note)  # a run at a URL whose listing names no version: said once, with -v
    colored = _color(color, to_file=out is not None)
    from traceql.report import render

    text = render(result, fmt, color=colored, verbose=verbose, width=_width(width, to_file=out is not None))
    if out:
        _write_out(out, text)
    else:  # click strips colour codes off a terminal unless told: --color always means always
        click.echo(text, nl=not text.endswith("\n"), color=colored)
    done(_verdict(result, run_dir, fail_on or config.fail_on))


def _config_path(run_dir: Path, given: Path | None, trust: bool) -> Path | None:
    """--config, else the checkout's (current folder upwards, never inside the run dir unless trusted); a config file
    inside the run dir that is passed over is named in one line."""
    from traceql.rules.config import find_config, run_config

    if isinstance(run_dir, str):  # a run at a URL: nothing inside it configures the check
        return given or find_config(Path.cwd())
    inside = run_config(run_dir)
    if given is not None:
        return given
    if trust and inside is not None:
        return inside
    found = find_config(Path.cwd(), untrusted=None if trust or not run_dir.is_dir() else run_dir)
    if inside is not None and found != inside:
        _say(f"ignoring {inside}: configuration inside the analysed run is not trusted (pass --trust-run-config to use it)")
    return found


def _internal(e: Exception) -> None:
    """Exit 3 with one line; TRACEQL_DEBUG=1 shows the traceback instead. A polars too old for traceql is the
    environment's, not an internal error: it goes on to the group's invoke (traceql.cli), which says it."""
    import os

    from traceql.polars_env import PolarsTooOld

    if isinstance(e, PolarsTooOld):
        raise e
    if os.environ.get("TRACEQL_DEBUG"):
        raise e
    _fail(f"internal error: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}; please report it with the run "
          "(TRACEQL_DEBUG=1 shows where)", EXIT_INTERNAL)


def _verdict(result, run_dir: Path, level: str) -> int:
    """The exit status of a rendered check, with its one-line reason on stderr for 2 and 3."""
    code, reason = result.verdict(run_dir, level)
    if reason:
        _say(reason)
    return code


def _baseline(path: Path) -> set[str]:
    import orjson

    try:
        data = orjson.loads(path.read_bytes())
        return {f["fingerprint"] for f in data.get("findings", []) if "fingerprint" in f}
    except (OSError, orjson.JSONDecodeError, AttributeError, TypeError) as e:
        _fail(f"{path}: not a traceql --format json report ({e}); write one with `traceql check RUN --format json --out FILE`")
        return set()


@main.command()
@click.argument("run_dir", type=RUN_ARG)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--no-cache", is_flag=True)
@click.option("--quiet", "-q", is_flag=True)
@text_options
def summary(run_dir, fmt, no_cache, quiet, width, color):
    """Per-rank step time, compute, communication, overlap and idle time."""
    import orjson

    from traceql import pipeline
    from traceql.report.summary import summarize

    try:
        run = pipeline.load_run(run_dir, use_cache=not no_cache, progress=not quiet)
        data = summarize(run)
    except pipeline.NothingToAnalyse as e:
        _fail(str(e))
        return
    except Exception as e:  # an internal error must not pass as a clean (or a usage) exit
        _internal(e)
        return
    if not data["ranks"]:
        _say(f"no rank could be analysed in {run_dir}: no source holds a rank's steps or kernels; see `traceql check {run_dir}`")
        if fmt == "json":
            click.echo(orjson.dumps(data).decode())
        sys.exit(EXIT_USAGE)
    if fmt == "json":
        click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    from rich.console import Console
    from rich.table import Table

    # the JSON's columns (data["columns"] defines each): per-step medians, then totals
    cols = ["steps", "step_time_ms_median", "compute_ms_median", "comm_ms_median", "exposed_comm_ms_median", "wait_ms_median",
            "idle_ms_median", "comm_comp_overlap_pct_steps", "kernels_in_steps", "kernels_total"]
    heads = ["steps", "step ms\nmedian", "compute ms\nmedian", "comm ms\nmedian", "exposed comm\nms median", "wait ms\nmedian",
             "GPU idle ms\nmedian", "overlap %\nin steps", "kernels\nin steps", "kernels\ntotal"]
    t = Table("rank", *heads)
    for rank, row in data["ranks"].items():
        t.add_row(rank, *["-" if row[c] is None else str(row[c]) for c in cols])
    # the table wraps its headers and cells to the width; colour as for check
    Console(width=_width(width) or 160, force_terminal=_color(color), no_color=not _color(color), highlight=False).print(t)
