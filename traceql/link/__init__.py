"""Cross-source linking: steps for every row, clock alignment, collective matching, the graph, derived tables.

Each module of this package may expose `DERIVED: dict[str, Callable[[Run], pl.DataFrame]]`: derived tables, built
on demand (the first time a rule or report asks for one) and stored in run.tables. Every derived table is declared
in traceql/model/derived.py (schema, docs, scope, the tables it reads); tests/test_derived.py keeps the two equal.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import polars as pl

from traceql.model import Run

# The engine the lazy queries of rules and derived tables run on. polars' default ("auto") picks the streaming
# engine, which costs 2-3x more CPU than the in-memory one on tables of this size (a rule's SQL over one rank, a
# level of parent lookups); eager DataFrame calls run in memory already.
POLARS_ENGINE = "in-memory"

_REGISTRY: dict[str, Callable[[Run], pl.DataFrame]] | None = None


def derived_tables() -> dict[str, Callable[[Run], pl.DataFrame]]:
    global _REGISTRY
    if _REGISTRY is None:
        reg: dict[str, Callable[[Run], pl.DataFrame]] = {}
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            reg.update(getattr(mod, "DERIVED", {}))
        _REGISTRY = reg
    return _REGISTRY


# tables of the sources' statuses, not of their rows: the cache key (the read sources' content) does not cover them
UNCACHED = frozenset({"source_errors", "source_partials", "source_problems"})


def ensure(run: Run, name: str) -> pl.DataFrame:
    """The table `name`, building it (and what it depends on) if it is derived and not built yet."""
    if name in run.tables:
        return run.tables[name]
    builder = derived_tables().get(name)
    if builder is None:
        return run.table(name)
    if run.scope == "rank":
        from traceql.model.derived import DERIVED

        if name in DERIVED and DERIVED[name].scope == "run":
            raise RuntimeError(f"{name} compares ranks and cannot be built in a rank task (traceql.executor.plan sent "
                               "a rule that reads it there); please report it")
    if _empty_inputs(run, name):
        # nothing to build from: every table it reads is empty, so is it (checked for every derived table on every
        # fixture, with no note added either), and its plans need not run; rules over it see an empty table as before
        from traceql.model.derived import empty

        df = run.tables[name] = empty(name)
        return df
    folder = None if name in UNCACHED else run.derived_cache
    if folder is not None:
        from traceql import cache

        hit = cache.load_derived(folder, name)
        if hit is not None:
            df, notes = hit
            run.notes.extend(n for n in notes if n not in run.notes)
            run.tables[name] = df
            return df
    before = len(run.notes)
    df = builder(run)
    run.tables[name] = df
    if folder is not None:
        cache.store_derived(folder, name, df, run.notes[before:])
    return df


def _empty_inputs(run: Run, name: str, heights: dict[str, int] | None = None) -> bool:
    """Whether every table the derived table `name` reads (model/derived.py) is empty here and on the rank tasks'
    workers (Run.held): canonical tables by their height, derived ones built already by theirs, the others by their
    own inputs in turn, building nothing. (Heights are taken once from run.tables' items: what this looks at is the
    registry's business, not a read of the builder that asked for `name`.)"""
    from traceql.model.derived import DERIVED

    decl = DERIVED.get(name)
    if decl is None or not decl.reads:  # built from the sources' statuses or the run itself, not from tables
        return False
    if heights is None:
        heights = run.heights()  # a table the cache has not read yet stays unread
    for t in decl.reads:
        if run.held.get(t, 0) > 0:
            return False
        if t in heights:
            if heights[t]:
                return False
        elif t not in DERIVED or not _empty_inputs(run, t, heights):
            return False
    return True


def link_run(run: Run) -> Run:
    """The eager part of linking: which rank each source holds (link.ranks: assumed ranks, collisions kept apart),
    then every row gets its step. Cross-rank tables are derived on demand."""
    from traceql.link.ranks import resolve_ranks
    from traceql.link.steps import assign_steps

    resolve_ranks(run)
    if not _cached_steps(run):
        assign_steps(run)
        _store_steps(run)
    return run


# The tables assign_steps gives a step column. On a cached check their rows come back from the cache in the same
# order (source order, each source's rows as stored), so the step columns of the last check are those assign_steps
# would compute again: kept in the run's derived-table cache, whose key covers the sources, the ranks that
# resolve_ranks gave them and the linking code (8 ranks x 216k events: ~0.15 CPU s of every warm re-check).
STEPPED = ("host_ops", "runtime", "collectives", "kernels", "syncs")


def _cached_steps(run: Run) -> bool:
    if run.derived_cache is None:
        return False
    from traceql import cache

    cols = {}
    for name in STEPPED:
        rows = run.rows(name)  # a table the cache has not read yet stays unread (model.run.Pending)
        if not rows:
            continue
        hit = cache.load_derived(run.derived_cache, f"step-of-{name}")
        if hit is None or hit[0].height != rows or hit[0].columns != ["step"]:
            return False  # a miss or a damaged entry: assign every step afresh
        cols[name] = hit[0].to_series()
    for name, step in cols.items():
        run.amend(name, lambda t, step=step: t.with_columns(step))
    return True


def _store_steps(run: Run) -> None:
    if run.derived_cache is None:
        return
    from traceql import cache

    for name in STEPPED:
        df = run.table(name)
        if df.height:
            cache.store_derived(run.derived_cache, f"step-of-{name}", df.select("step"), [])
