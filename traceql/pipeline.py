"""The flow in one place: discover -> ingest -> link -> rules. The CLI and tests call these."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from traceql import polars_env

polars_env.load()  # before anything imports polars: its allocator keeps freed pages (traceql.polars_env)

from traceql import link, remote
from traceql.discover import discover
from traceql.ingest.loader import ingest
from traceql.model import Run
from traceql.model.finding import Finding
from traceql.model.result import CheckResult, RuleResult
from traceql.rules import config as cfgmod
from traceql.rules.causes import attribute
from traceql.rules.engine import run_rules
from traceql.rules.loader import load_rules, with_input_rules


class NothingToAnalyse(Exception):
    pass


def load_run(path: Path, use_cache: bool = True, jobs: int | None = None, progress: bool = False) -> Run:
    polars_env.load()  # polars imported already: only its version checked, here as at import (a notebook's polars)
    if remote.is_url(path):  # a run at an fsspec URL (traceql.remote)
        path = _located(path)
        return _load(path, discover(path), use_cache, jobs, progress)
    path = Path(path)
    if not path.exists():
        raise NothingToAnalyse(f"{path}: no such file or directory")
    if path.is_file():  # a folder is never an archive: traceql.archive loads only for a file
        from traceql import archive

        try:
            if archive.is_archive(path):  # read inside a private temporary folder, shown as ARCHIVE!/PATH
                with archive.expanded(path) as x:
                    run = _load(x.run_dir, discover(x.run_dir, extra=x.refused), use_cache, jobs, progress)
                    archive.relocate(run, x)
                    return run
        except archive.ArchiveError as e:
            raise NothingToAnalyse(str(e)) from None
    return _load(path, discover(path), use_cache, jobs, progress)


def _located(url):
    try:
        return remote.locate(url)
    except remote.RemoteError as e:
        raise NothingToAnalyse(str(e)) from None


def _load(path: Path, sources, use_cache: bool, jobs: int | None, progress: bool) -> Run:
    bar = _progress(sources) if progress else None
    try:
        run = ingest(path, sources, use_cache=use_cache, jobs=jobs, progress=bar.advance if bar else None,
                     read_progress=bar.reading if bar else None)
    finally:
        if bar:
            bar.close()
    return link.link_run(run)


def check(
    path: Path,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    sets: list[str] | None = None,
    rules_dirs: list[Path] | None = None,
    use_cache: bool = True,
    config: cfgmod.Config | None = None,
    jobs: int | None = None,
    progress: bool = False,
    suppress: set[str] | None = None,
    scheduler: str | None = None,
) -> CheckResult:
    """Run the chosen rules over the run at `path`. With `scheduler` (a Dask scheduler address, a scheduler file, or
    "local"), each rank's part runs on the Dask cluster and only small tables come back (traceql.executor)."""
    config = config or cfgmod.Config()
    rules = load_rules(rules_dirs)
    if not rules:
        raise cfgmod.ConfigError(f"no rule files (TQL*.yaml) in {', '.join(map(str, rules_dirs or []))}; point --rules at a rule pack")
    if rules_dirs:  # a user's pack still says whether the run was read at all (TQL001-TQL004), unless it defines them
        rules = with_input_rules(rules)
    cfgmod.check_params(config, rules)
    cfgmod.check_selectors(select or [], rules, "--select")
    cfgmod.check_selectors(ignore or [], rules, "--ignore")
    cfgmod.check_selectors(config.select, rules, f"{config.path}: select")
    cfgmod.check_selectors(config.ignore, rules, f"{config.path}: ignore")
    picks = (select or []) or config.select
    chosen = cfgmod.choose(rules, picks, (ignore or []) + config.ignore)
    if not cfgmod.asked_for(chosen, picks):
        raise cfgmod.ConfigError("--select/--ignore leave no rule to run; see `traceql rules list`")
    overrides = {k: dict(v) for k, v in config.params.items()}
    for rid, params in cfgmod.parse_set(sets or [], rules).items():
        overrides.setdefault(rid, {}).update(params)
    if scheduler:
        run, results = _check_on_dask(path if remote.is_url(path) else Path(path), scheduler, chosen, overrides,
                                      use_cache)
        result = _concluded(run, chosen, lambda: results, use_cache)
    else:
        run = load_run(path, use_cache=use_cache, jobs=jobs, progress=progress)
        result = _evaluated(run, chosen, overrides, use_cache)
    drop = set(config.suppress) | (suppress or set())
    if drop:
        before = len(result.findings)
        result.findings = [f for f in result.findings if f.fingerprint not in drop]
        result.suppressed = before - len(result.findings)
    return result


def _concluded(run: Run, chosen, results, use_cache: bool) -> CheckResult:
    """The rules' results (results(): the rules run now), then what each finding costs per step and which cause
    explains which."""
    results = results()
    note = remote.uncached_note(run.sources) if use_cache else None
    if note:
        run.notes.append(note)
    result = CheckResult(run, results)
    attribute(run, result.findings, chosen)
    return result


def _evaluated(run: Run, chosen, overrides: dict, use_cache: bool) -> CheckResult:
    """The rules run and their findings costed, or what they concluded the last time on exactly this input (the run's
    derived-table cache folder) with these rules, parameters and code: a warm re-check of 8 ranks x 216k events spent
    0.3-0.45 CPU s evaluating the pack again, and 0.03-0.07 costing it, over tables that came from the cache. Kept only
    where no rule failed (a failure may not recur)."""
    from traceql import cache

    def fresh() -> CheckResult:
        return _concluded(run, chosen, lambda: run_rules(run, chosen, overrides), use_cache)

    folder = run.derived_cache
    if folder is None:
        return fresh()
    key = cache.rules_digest(chosen, overrides, run.sources)
    hit = cache.load_results(folder, key)
    by_id = {r.id: r for r in chosen}
    if hit is not None and [r["rule"] for r in hit["results"]] == [r.id for r in chosen]:
        run.notes.extend(n for n in hit["notes"] if n not in run.notes)
        return CheckResult(run, [RuleResult(by_id[r["rule"]], r["status"], r["reason"],
                                            [Finding(**f) for f in r["findings"]]) for r in hit["results"]])
    before = list(run.notes)
    result = fresh()
    if all(r.status != "error" for r in result.results):
        cache.store_results(folder, key, {
            "results": [{"rule": r.rule.id, "status": r.status, "reason": r.reason,
                         "findings": [dataclasses.asdict(f) for f in r.findings]} for r in result.results],
            "notes": [n for n in run.notes if n not in before],  # what the rules' derived tables and costing noted
        })
    return result


def _check_on_dask(path: Path, scheduler, chosen, overrides, use_cache: bool):
    from traceql import executor

    if remote.is_url(path):
        if isinstance(scheduler, str) and str(path).startswith("memory://"):
            raise NothingToAnalyse(f"{path}: memory:// is this process's own memory, which Dask's worker processes "
                                   "cannot see; check it without --scheduler")
        path = _located(path)
    elif not path.exists():
        raise NothingToAnalyse(f"{path}: no such file or directory")
    from traceql import archive

    if not remote.is_url(path) and archive.is_archive(path):
        raise NothingToAnalyse(f"{path}: --scheduler reads a run directory the Dask workers can see; unpack the "
                               "archive there first, or check it without --scheduler")
    sources = discover(path)
    client = executor.client_for(scheduler) if isinstance(scheduler, str) else scheduler  # or a Client already made
    try:
        return executor.check_distributed(client, path, sources, chosen, overrides, use_cache=use_cache)
    finally:
        if isinstance(scheduler, str):
            cluster = getattr(client, "cluster", None)
            client.close()
            if scheduler == "local" and cluster is not None:
                cluster.close()


class _Bar:
    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        # the console is fixed at construction (Progress.console has no setter): stderr, never stdout
        self.p = Progress(TextColumn("ingest"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.description}"),
                          transient=True, console=Console(file=sys.stderr))
        self.task = self.p.add_task("", total=total)
        self.p.start()

    def advance(self, source):
        self.p.update(self.task, advance=1, description=source.path.name)

    def reading(self, source, done: int, total: int):
        """Bytes read of one large file (from the ingest worker), as the description: '1.2 of 3.4 GB'."""
        unit, div = ("GB", 1 << 30) if total >= 1 << 30 else ("MB", 1 << 20)
        self.p.update(self.task, description=f"{source.path.name}: {done / div:.1f} of {total / div:.1f} {unit} read")

    def close(self):
        self.p.stop()


READ_PROGRESS_MIN_BYTES = 64 << 20  # one source this large takes seconds: show its bytes read


def _progress(sources):
    todo = [s for s in sources if s.status in ("ok", "partial")]
    if not sys.stderr.isatty() or not todo:
        return None
    if len(todo) < 2 and not any(s.path.is_file() and s.path.stat().st_size >= READ_PROGRESS_MIN_BYTES for s in todo):
        return None
    return _Bar(len(todo))
