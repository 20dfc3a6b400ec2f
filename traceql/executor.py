"""Where a check's work runs: every rank's part where the rank was read, only small tables back to the driver.

The default path (traceql.pipeline.check without a scheduler) reads every source in the local worker pool and hands
all tables to this process. With a Dask scheduler the work is split the way the rules' declarations allow:

1. a read task per source (largest first) ingests it where a Dask worker runs and keeps its tables there; the
   driver gathers only the source's metadata (status, ranks, detail);
2. the driver decides the ranks from every source's metadata (link.ranks: assumed ranks, collisions), exactly as the
   local path does, and groups the sources by the ranks they hold;
3. a rank task per group takes its sources' tables (worker to worker, never through the driver), applies the rank
   decision, links the rows to their steps, runs every per-rank rule, and returns its rule results and the tables the
   cross-rank stage reads, and nothing else;
4. the driver builds one run from those tables and runs the cross-rank rules (matching, clock alignment, straggler,
   desync, divergence) on them. Two kinds of work read per-rank rows and a cross-rank fact together, and run on the
   workers, not the driver: the critical path (ON_WORKER: each rank group's part of the walk runs where its
   path_kernels and host_cover were kept, on its ranks' rows of the driver's clock offsets and matched collectives;
   the driver stitches the parts' segments from per-step and per-collective rows: link.critical_path) and
   the late rules (TQL105: a second task per rank group runs them on the group's kept tables and its ranks' rows of
   collective_instances). Rules' `needs` of a table that stayed on the workers are answered from row counts
   (Run.held).

The ship set (what reaches the driver) is source statuses, rule results without their Rule objects, findings,
collectives, steps and step times, compile and NCCL events, and per-rank summaries (step_breakdown, comm_coverage,
warmup_steps ...): rows per step, per collective or per event, never per kernel, host op or runtime call
(tests/test_executor.py checks it).

Which rule is per-rank is decided from declarations, never guessed: a rule runs in the rank task when it does not
compare ranks (cross_rank, spread, distinct) and every table it reads, followed through the derived tables' `reads`
(model/derived.py) and the views' reads, is canonical or declared scope "rank". Everything else is cross-rank, and the
cross-rank stage gets the canonical and rank-scoped tables its rules reach through run-scoped tables.

Budgets on Dask: in a Dask worker process a source is read inside that process (TRACEQL_SOURCE_ISOLATION=0 there,
since Dask's daemonic worker processes cannot start ingest workers of their own; threads of a process that can keep
the local budgets); the worker's memory_limit (its nanny restarts a worker
past it) and the task's failure stand in for the per-source budgets, and a rank whose task fails becomes error sources
with the reason, never sinking the other ranks.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceql import link
from traceql.link.ranks import apply_resolution, resolve_ranks
from traceql.link.steps import assign_steps
from traceql.model import SCHEMAS, Run, Source, concat
from traceql.model.derived import DERIVED, canonical_reads, empty
from traceql.model.result import RuleResult
from traceql.rules import sql_guard
from traceql.rules.engine import run_rules
from traceql.ingest.loader import _size
from traceql.rules.loader import Rule

_COMPARING_MEASURES = ("spread", "distinct")


class SchedulerError(ValueError):
    """--scheduler names nothing Dask can connect to, or Dask is not installed."""


# ---------------------------------------------------------------- the plan: which rule runs where


def _walk(v, found: set[str], flags: set[str]) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "table" and isinstance(x, str):
                found.add(x)
            elif k == "skip_warmup" and x:
                flags.add("skip_warmup")
            else:
                _walk(x, found, flags)
    elif isinstance(v, list):
        for x in v:
            _walk(x, found, flags)


def _named_tables(rule: Rule, needs: bool = True) -> set[str]:
    """The tables and views a rule names, and those the engine reads on its behalf (rules/engine.py: step_times for
    the step_ms of every measured output, warmup_steps for a window that skips the warm-up). needs=False: only those
    it reads rows of (a table named in `needs` alone is only asked whether it has rows: Run.held answers that)."""
    names: set[str] = set()
    flags: set[str] = set()
    _walk(rule.select or {}, names, flags)
    if rule.select and rule.select.get("measure") != "rows":
        names.add("step_times")
    if "skip_warmup" in flags:
        names.add("warmup_steps")
    if rule.sql:
        names |= sql_guard.read_tables(rule.sql)
    if needs:
        for need in rule.need_sets():
            names.update(need)
    names.update(getattr(rule, "uses_views", []) or [])
    return names


def _closure(names, reads) -> set[str]:
    """Every table reached from names, going on through reads(t): the names t is built from (empty: stop at t)."""
    todo, seen = list(names), set()
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(reads(t))
    return seen


def _reads_of(views: dict):
    """reads(t) of derived tables and views: what each is built from."""
    return lambda t: DERIVED[t].reads if t in DERIVED else views[t].reads if t in views else ()


def reach(rule: Rule) -> set[str]:
    """Every table and view the rule reads, directly or through derived tables' and views' reads."""
    return _closure(_named_tables(rule), _reads_of(getattr(rule, "views", {}) or {}))


def _rank_scoped(table: str, views: dict) -> bool:
    if table in SCHEMAS or table in views:
        return True  # canonical tables hold each rank's own rows; a view keeps rank in its keys (rules/views.py)
    d = DERIVED.get(table)
    return d is not None and d.scope == "rank"


def is_per_rank(rule: Rule) -> bool:
    if rule.cross_rank or (rule.select or {}).get("measure") in _COMPARING_MEASURES:
        return False
    views = getattr(rule, "views", {}) or {}
    return all(_rank_scoped(t, views) for t in reach(rule))


# Run-scoped tables that read rank-scoped tables of per-kernel or per-host-segment rows, too big for the driver: those
# tables stay on the workers where the rank tasks built them (plan.stay), tasks there work on each rank group's own
# rows and its share of the driver's small tables, and only small rows come back (_BUILD_ON_WORKERS: the critical
# path's parts and segments, per step and per collective). {table: the rank-scoped reads that stay}
ON_WORKER = {"critical_path": ("path_kernels", "host_cover")}
# the per-rank tables of a run: what a rank task never returns to the driver (tests/test_executor.py)
BIG = ("kernels", "host_ops", "runtime", "syncs", "flows")


def given_tables(rule: Rule) -> set[str] | None:
    """The run-scoped tables a rule reads that stop it from running in a rank task, where it could run there once
    the driver has built them (None where it cannot: it compares ranks, or a run-scoped table it reads has no rank
    column to hand each rank its own rows). Such a rule runs in a second task per rank group, on the tables that
    stayed on the workers and the group's rows of these tables (TQL105: its ranks' waits in collective_instances)."""
    if rule.cross_rank or (rule.select or {}).get("measure") in _COMPARING_MEASURES:
        return None
    views = getattr(rule, "views", {}) or {}
    # through views only: a rank-scoped table is the rank task's own, a run-scoped one is what the driver hands over
    seen = _closure(_named_tables(rule), lambda t: views[t].reads if t in views else ())
    given = {t for t in seen if t not in views and t in DERIVED and DERIVED[t].scope == "run"}
    if any("rank" not in DERIVED[t].columns or t in ON_WORKER for t in given):
        return None
    return given


def _frontier(names, views: dict, cut_run: bool) -> tuple[set[str], set[str]]:
    """(canonical and rank-scoped tables, run-scoped tables) reached from names, stopping at both kinds."""
    def near(t: str) -> bool:
        return t in SCHEMAS or (t in DERIVED and DERIVED[t].scope == "rank")

    through = _reads_of(views)
    seen = _closure(names, lambda t: () if near(t) or (cut_run and t in DERIVED) else through(t))
    return {t for t in seen if near(t)}, {t for t in seen if cut_run and t in DERIVED and not near(t)}


def _reads_big(rule: Rule) -> bool:
    near, _ = _frontier(_named_tables(rule, needs=False), getattr(rule, "views", {}) or {}, cut_run=True)
    return any(t in BIG or canonical_reads(t) & set(BIG) for t in near)


@dataclass
class Plan:
    per_rank: list[Rule]
    cross: list[Rule]
    ship: set[str]  # the tables a rank task returns: what the cross-rank stage reads, canonical or rank-scoped
    stay: set[str] = field(default_factory=set)  # rank-scoped tables kept on the workers for the ON_WORKER tables
    remote: set[str] = field(default_factory=set)  # the ON_WORKER tables the cross-rank stage reads
    counted: set[str] = field(default_factory=set)  # canonical tables the cross-rank rules' needs ask about
    late: list[Rule] = field(default_factory=list)  # run in a second task per rank group (given_tables)
    given: set[str] = field(default_factory=set)  # the run-scoped tables the driver hands the late rules


def plan(rules: list[Rule]) -> Plan:
    per = [r for r in rules if is_per_rank(r)]
    # late only where running on the driver would ship big per-rank rows (TQL105's activity intervals): a rule over
    # small tables runs on the driver, where it sees every rank's rows as the local path does
    late = [r for r in rules if r not in per and given_tables(r) is not None and _reads_big(r)]
    cross = [r for r in rules if r not in per and r not in late]
    given = {t for r in late for t in given_tables(r)}
    # The cross-rank stage rebuilds run-scoped tables and views from these; nothing else leaves a rank task. Only the
    # frontier goes: a rank-scoped table is shipped built (step_times, not the kernels it was built from).
    ship: set[str] = set()
    stay: set[str] = set()
    remote: set[str] = set()
    # what the what-if replay reads on the driver to cost every finding (traceql.rules.causes, link.whatif)
    replay = {"step_metrics", "collective_instances", "critical_path", "collectives"} if any(r.cost for r in rules) else set()
    replay |= given  # the driver builds the late rules' run-scoped tables from what the rank tasks ship
    for r in [*cross, None] if replay else cross:
        views = getattr(r, "views", {}) or {}
        todo, seen = list(_named_tables(r, needs=False) if r is not None else replay), set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in ON_WORKER:
                remote.add(t)
                stay.update(ON_WORKER[t])
                todo.extend(x for x in DERIVED[t].reads if x not in ON_WORKER[t])
            elif t in SCHEMAS or (t in DERIVED and DERIVED[t].scope == "rank"):
                ship.add(t)
            elif t in DERIVED:
                todo.extend(DERIVED[t].reads)
            elif t in views:
                todo.extend(views[t].reads)
    counted = {t for r in cross for need in r.need_sets() for t in need if t in SCHEMAS}
    for r in late:  # what the late rules read stays where the rank task built it
        stay |= _frontier(_named_tables(r), getattr(r, "views", {}) or {}, cut_run=True)[0]
    return Plan(per, cross, ship, stay, remote, counted, late, given)


# ---------------------------------------------------------------- the tasks (run on Dask workers)


_READ_LOCK = threading.Lock()


def read_task(run_path: str, source: Source, use_cache: bool, began: float | None = None
              ) -> tuple[Source, dict[str, pl.DataFrame]]:
    """Phase 1: one source read where the worker runs; its tables stay there. `began`: when the check began, so
    that a worker reading several sources of it never evicts the earlier ones from the cache (cache.begin_run)."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        # a Dask worker process is daemonic and cannot start ingest workers: read here (its nanny's memory_limit
        # and the task's failure stand in for the per-source budgets); only that process's environment changes
        os.environ["TRACEQL_SOURCE_ISOLATION"] = "0"
    from traceql.ingest.loader import ingest

    with _READ_LOCK:  # the ingest worker pool of this process is one pipe per worker: one thread at a time uses it
        run = ingest(Path(run_path), [source], use_cache=use_cache, jobs=1, began=began)
    src = run.sources[0]
    return src, {k: v for k, v in run.tables.items() if v.height}


def meta_of(read: tuple[Source, dict]) -> Source:
    return read[0]


@dataclass
class RankOutput:
    results: list  # RuleResult in the task; (rule id, status, reason, findings) once for_driver took it
    tables: dict[str, pl.DataFrame]  # plan.ship: what the driver gets
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # rows of plan.counted's tables here (Run.held)
    kept: dict[str, pl.DataFrame] | None = None  # plan.stay: read by later tasks on the workers, never by the driver
    ranks: list[int] = field(default_factory=list)  # the ranks this task held, as decided


def _bare(results: list[RuleResult]) -> list[tuple]:
    """Rule results without their Rule objects (the driver has its own): a thousand ranks' copies of the parsed rules
    were most of the driver's memory."""
    return [(r.rule.id, r.status, r.reason, r.findings) for r in results]


def _dressed(bare: list[tuple], rules: dict[str, Rule]) -> list[RuleResult]:
    return [RuleResult(rules[rid], status, reason, findings) for rid, status, reason, findings in bare]


def for_driver(out: RankOutput) -> RankOutput:
    """What of a rank task's output the driver fetches: all but the tables that stay on the workers, and the rule
    results as (rule id, status, reason, findings)."""
    return RankOutput(_bare(out.results), out.tables, out.notes, out.counts, None, out.ranks)


def kept_of(out: RankOutput, names: list[str]) -> dict[str, pl.DataFrame]:
    """The kept tables an ON_WORKER table reads, out of a rank task's output."""
    return {n: df for n, df in (out.kept or {}).items() if n in names}


def late_task(run_path: str, sources: list[Source], out: RankOutput, given: dict[str, pl.DataFrame], rules: list[Rule],
              overrides: dict) -> list[RuleResult]:
    """Phase 3: the late rules on one rank group, from its kept tables and its ranks' rows of the given tables."""
    run = Run(path=Path(run_path), sources=sources, tables={**(out.kept or {}), **given})
    run.scope = "rank"
    return _bare(run_rules(run, rules, overrides))


def rank_task(run_path: str, sources: list[Source], assumed: list[int], lost: list[int], reads: list[tuple],
              rules: list[Rule], overrides: dict, ship: list[str], stay: list[str] = (),
              counted: list[str] = ()) -> RankOutput:
    """Phase 2: one group of ranks linked, its per-rank rules run, the cross-rank stage's tables returned."""
    frames: dict[str, list[pl.DataFrame]] = {}
    for _, tables in reads:
        for name, df in tables.items():
            frames.setdefault(name, []).append(df)
    run = Run(path=Path(run_path), sources=sources, tables={n: concat(n, frames.get(n, [])) for n in SCHEMAS})
    apply_resolution(run, [i for i in assumed if any(s.id == i for s in sources)],
                      [i for i in lost if any(s.id == i for s in sources)])
    assign_steps(run)
    run.scope = "rank"  # link.ensure refuses a run-scoped table here: the plan never sends a rule that reads one
    results = run_rules(run, rules, overrides)
    tables = {}
    for name in ship:
        df = link.ensure(run, name)
        if df.height:
            tables[name] = df
    kept = {name: link.ensure(run, name) for name in stay}
    counts = {name: run.table(name).height for name in counted}
    return RankOutput(results, tables, list(run.notes), counts, kept, run.ranks)


def cp_part_task(kept: dict[str, pl.DataFrame], small: dict[str, pl.DataFrame | None], coll: bool):
    """The critical path's part of one rank group (link.critical_path._Part), built from its kept path_kernels and
    host_cover and its ranks' rows of the driver's small tables; it stays on the worker for the segment tasks."""
    from traceql.link.critical_path import _Part

    return _Part(kept.get("path_kernels", empty("path_kernels")), kept.get("host_cover", empty("host_cover")),
                 small["steps"], small.get("offsets"), small.get("matches"), small.get("ci"), coll)


def cp_meta(part) -> tuple[tuple, int]:
    """What the driver reads of a part: per step its last kernel, per collective its kernel row; its kernel count."""
    return part.meta(), part.n_kernels


def cp_with_jumps(part, jumps: pl.DataFrame):
    return part.with_jumps(jumps)


def cp_segments(part, entries: list[tuple]) -> dict[tuple, tuple]:
    return part.segments(entries)


# ---------------------------------------------------------------- the driver


def client_for(address: str):
    """A distributed.Client for `local` (a LocalCluster of processes), a scheduler file (.json) or an address."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SchedulerError("--scheduler needs Dask: pip install 'traceql[dask]'") from None
    if address == "local":
        # one polars thread per single-threaded worker: polars' own pool per worker oversubscribed the cores (on 16
        # cores, 16 workers burned 113 CPU s for 65 with one thread each, and the wall grew)
        cluster = LocalCluster(processes=True, n_workers=max(1, min(os.cpu_count() or 1, 8)), threads_per_worker=1,
                               dashboard_address=":0",
                               env={"POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS", "1")})
        return Client(cluster)
    if address.endswith(".json"):
        p = Path(address)
        if not p.is_file():
            raise SchedulerError(f"--scheduler {address}: no such scheduler file")
        try:
            json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise SchedulerError(f"--scheduler {address}: not a Dask scheduler file ({e})") from None
        try:
            return Client(scheduler_file=str(p), timeout="30s")
        except OSError as e:  # a scheduler file left behind by a scheduler that is gone (TimeoutError included)
            raise SchedulerError(f"--scheduler {address}: cannot reach the scheduler it names ({e})") from None
    try:
        return Client(address, timeout="30s")
    except OSError as e:
        raise SchedulerError(f"--scheduler {address}: cannot reach a Dask scheduler there ({e})") from None


def _groups(sources: list[Source]) -> list[list[Source]]:
    """Sources grouped so that every rank's sources share one group (a file holding several ranks joins them); the
    sources attributed to no rank form their own group."""
    read = [s for s in sources if s.status in ("ok", "partial")]
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s in read:
        held = sorted(s.ranks) if s.ranks else ([s.rank] if s.rank is not None else [None])
        for r in held[1:]:
            parent[find(("r", held[0]))] = find(("r", r))
        find(("r", held[0]))
    out: dict = {}
    for s in read:
        held = sorted(s.ranks) if s.ranks else ([s.rank] if s.rank is not None else [None])
        out.setdefault(find(("r", held[0])), []).append(s)
    return sorted(out.values(), key=lambda g: -sum(_size(s) for s in g))


def _merge(rule: Rule, parts: list[RuleResult]) -> RuleResult:
    """One rule's outcome over every rank task: an error anywhere is the rule's error; it ran where any rank ran it."""
    errors = [p for p in parts if p.status == "error"]
    if errors:
        return RuleResult(rule, "error", errors[0].reason, [f for p in parts for f in p.findings])
    ran = [p for p in parts if p.status == "ran"]
    if ran:
        return RuleResult(rule, "ran", findings=[f for p in ran for f in p.findings])
    return parts[0] if parts else RuleResult(rule, "skipped", "no rank was read")


def check_distributed(client, run_path: Path, sources: list[Source], rules: list[Rule], overrides: dict,
                      use_cache: bool = True) -> tuple[Run, list[RuleResult]]:
    """Discovered sources through Dask to (the cross-rank stage's run, every rule's result in rule order). A run at
    an fsspec URL keeps its URLPath; each read task copies its source from the URL on its worker (traceql.remote)."""
    run_path = Path(run_path) if isinstance(run_path, str) else run_path
    todo = [s for s in sources if s.status in ("ok", "partial")]
    import time

    order = sorted(todo, key=_size, reverse=True)  # largest first: the longest tasks start first
    began = time.time() - 2
    reads = {s.id: client.submit(read_task, str(run_path), s, use_cache, began, key=f"read-{s.id}-{id(s)}",
                                 priority=len(order) - i, pure=False)
             for i, s in enumerate(order)}
    from distributed import wait

    meta_futs = {s.id: client.submit(meta_of, reads[s.id], pure=False) for s in order}
    wait(list(meta_futs.values()))
    metas = {}
    for s in order:
        f = meta_futs[s.id]
        if f.status == "finished":
            metas[s.id] = f.result()
        else:  # the worker died or the reader broke: this source is an error, the others go on
            e = f.exception()
            s.status, s.detail = "error", f"its read task failed on the Dask cluster ({type(e).__name__}: {e})"
            metas[s.id] = s
    resolved = [metas.get(s.id, s) for s in sources]
    meta_run = Run(path=run_path, sources=resolved, tables={n: concat(n, []) for n in SCHEMAS})
    assumed, lost = resolve_ranks(meta_run)
    p = plan(rules)
    groups = _groups(meta_run.sources)
    # what every task takes, sent to the cluster once rather than pickled into each of a thousand tasks
    per_rank, late_rules, over = (client.scatter([x], hash=False)[0] for x in (p.per_rank, p.late, overrides))
    tasks = []
    for i, g in enumerate(groups):
        ids = {s.id for s in g}
        full = client.submit(rank_task, str(run_path), g, [x for x in assumed if x in ids], [x for x in lost if x in ids],
                             [reads[s.id] for s in g if s.id in reads], per_rank, over, sorted(p.ship),
                             sorted(p.stay), sorted(p.counted), priority=len(groups) - i, pure=False)
        tasks.append((g, full, client.submit(for_driver, full, pure=False)))
    outputs: list[RankOutput] = []
    kept = []  # the rank tasks' futures, whose kept tables a cluster task reads (ON_WORKER)
    position = {s.id: i for i, s in enumerate(meta_run.sources)}
    # the driver's tables in source order, as the local path has them (ties between equal ranks break the same way)
    wait([f for _, _, f in tasks])
    reads.clear()  # the sources' tables: released on the workers once every rank task that read them is done
    meta_futs.clear()
    tasks.sort(key=lambda t: min(position[s.id] for s in t[0]))
    done = [(g, full, fut) for g, full, fut in tasks if fut.status == "finished"]
    for g, _, fut in tasks:
        if fut.status != "finished":
            e = fut.exception()
            reason = f"its rank task failed on the Dask cluster ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
            for s in g:
                s.status, s.detail = "error", reason
    # one gather for every rank (a round trip per rank was most of the driver's wait at 1,024 ranks); each rank's
    # for_driver future is released once fetched, and its rank task's only where a later task reads what it kept
    outputs: list[RankOutput] = client.gather([fut for _, _, fut in done])
    needs_kept = bool(p.remote or p.late)
    kept = [(g, full if needs_kept else None) for g, full, _ in done]
    del tasks, done
    # every rank's frames concatenated once and rechunked, so that the per-rank chunks are freed with the outputs
    # (a plain concat keeps a thousand small chunks per column alive, and every cross-rank query walks them)
    frames: dict[str, list[pl.DataFrame]] = {}
    for o in outputs:
        for name, df in o.tables.items():
            frames.setdefault(name, []).append(df)
        o.tables = {}
    tables = {n: concat(n, frames.pop(n, [])).rechunk() for n in SCHEMAS}
    for name in list(frames):
        tables[name] = pl.concat(frames.pop(name), how="diagonal_relaxed", rechunk=True)
    run = Run(path=run_path, sources=meta_run.sources, tables={**tables, "source_problems": meta_run.tables["source_problems"]})
    run.notes = list(meta_run.notes)
    for o in outputs:
        run.notes.extend(n for n in o.notes if n not in run.notes)
        for name, n in o.counts.items():
            run.held[name] = run.held.get(name, 0) + n
    for name in sorted(p.remote):
        _BUILD_ON_WORKERS[name](client, run, [client.submit(kept_of, f, list(ON_WORKER[name]), pure=False)
                                              for _, f in kept], [o.ranks for o in outputs])
    late = []
    if p.late:
        given = {t: link.ensure(run, t) for t in sorted(p.given)}
        by_rank = {t: df.partition_by("rank", as_dict=True) for t, df in given.items()}  # one pass, not one per group
        for (g, full), o in zip(kept, outputs):
            mine = {t: pl.concat([parts[(r,)] for r in o.ranks if (r,) in parts] or [given[t].clear()])
                    for t, parts in by_rank.items()}
            late.append((g, client.submit(late_task, str(run_path), g, full, mine, late_rules, over, pure=False)))
    cross = {r.id: res for r, res in zip(p.cross, run_rules(run, p.cross, overrides))}
    per: dict[str, list[RuleResult]] = {}
    by_id = {r.id: r for r in rules}
    for o in outputs:
        for res in _dressed(o.results, by_id):
            per.setdefault(res.rule.id, []).append(res)
    for g, fut in late:
        try:
            parts = _dressed(fut.result(), by_id)
        except Exception as e:  # noqa: BLE001 - a worker lost or a rule broken there: those rules' error
            reason = f"its rank task failed on the Dask cluster ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"
            parts = [RuleResult(r, "error", reason) for r in p.late]
        for res in parts:
            per.setdefault(res.rule.id, []).append(res)
    results = [cross[r.id] if r.id in cross else _merge(r, per.get(r.id, [])) for r in rules]
    return run, results


def _critical_path_on_workers(client, run: Run, kept: list, ranks: list[list[int]]) -> None:
    """run.tables["critical_path"], walked where the ranks were read (link.critical_path: segments and stitch): a task
    per rank group builds its part from its kept tables and its ranks' rows of the driver's small tables, and hands
    back per-step and per-collective rows; the driver decides the jumps between ranks (jumps_frame), asks each part
    for the segments the walks enter it at, and stitches them; any other segment a walk needs is asked for in a
    further round. No kernel or host row leaves a worker."""
    from traceql.link import critical_path as cp

    coll = run.has("collectives")
    ci = link.ensure(run, "collective_instances") if coll else None
    small = {"steps": run.table("steps").filter(pl.col("rank").is_not_null())}
    if coll:
        small.update(offsets=link.ensure(run, "clock_offsets"), ci=cp.host_waits(ci),
                     matches=link.ensure(run, "collective_matches").select("rank", "source", "match_id", "kernel_ts"))
    split = {n: df.partition_by("rank", as_dict=True) for n, df in small.items()}

    def mine(n: str, held: list[int]) -> pl.DataFrame:
        return pl.concat([split[n][(r,)] for r in held if (r,) in split[n]] or [small[n].clear()])

    parts = [client.submit(cp_part_task, k, {n: mine(n, held) for n in small}, coll, pure=False)
             for k, held in zip(kept, ranks)]
    got = client.gather([client.submit(cp_meta, f, pure=False) for f in parts])
    metas = [m for m, _ in got]
    if not any(n for _, n in got):
        if run.has("steps") and cp.NO_GPU_NOTE not in run.notes:
            run.notes.append(cp.NO_GPU_NOTE)
        run.tables["critical_path"] = pl.DataFrame(schema=cp.CP_SCHEMA)
        return
    jf = cp.jumps_frame(metas, ci)
    by_part = jf.partition_by("_part", as_dict=True)
    parts = [client.submit(cp_with_jumps, f, by_part.get((i,), jf.clear()), pure=False) for i, f in enumerate(parts)]

    def fetch(need: dict[int, list]) -> dict[int, dict]:
        futs = {i: client.submit(cp_segments, parts[i], es, pure=False) for i, es in need.items()}
        return dict(zip(futs, client.gather(list(futs.values()))))

    # the first round: where the walks begin (each step's last kernel) and where they jump to (the last arrivers'
    # collective kernels, for the step of the kernel that waited; the late ranks of host-side collectives at the end
    # of the waits for them, for the step of the wait)
    first: dict[int, list] = {}
    for s, (i, row, *_) in cp.last_kernels(metas).items():
        first.setdefault(i, []).append(("last", row, s))
    for lp, lr, s in jf.filter(pl.col("step").is_not_null()).select("_lpart", "_lrow", "step").unique().iter_rows():
        first.setdefault(lp, []).append(("after", lr, s))
    part_of = {r: i for i, (_, _, held) in enumerate(metas) for r in held}
    if coll:
        for x, w_end, s in small["ci"].filter(pl.col("step").is_not_null()).select(
                "last_arriver", "wait_end", "step").unique().iter_rows():
            if x in part_of:
                first.setdefault(part_of[x], []).append(("host", (int(x), w_end), s))
    cache = {(i, e): v for i, segs in fetch(first).items() for e, v in segs.items()}
    run.tables["critical_path"] = cp.stitch(metas, fetch, cache)


# how each ON_WORKER table is built where its rank-scoped reads stayed
_BUILD_ON_WORKERS = {"critical_path": _critical_path_on_workers}
