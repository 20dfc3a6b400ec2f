"""model/derived.py declares every table link/ derives: the declarations must be the frames the builders return.

Every derived table is built on a set of fixtures that between them give each table rows; its schema must equal
the declaration's (column names and dtypes), whether or not it has rows. A builder may read only the tables its
declaration names, and a table declared scope "rank" must give a rank the same rows when built from that rank's
tables alone.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import polars as pl
import pytest

from traceql import link
from traceql.model import Run
from traceql.model.derived import DERIVED, SCHEMAS, canonical_reads, empty, schema
from traceql.pipeline import load_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# between them every declared table gets rows (asserted below, so that the dtype check is never vacuous)
RUNS = [
    "cpu-ddp-eager", "cpu-desync", "cpu-loader-bound", "cpu-grad-accum-without-no_sync", "h200x2-exposed-allreduce-nsys",
    "h200x2-desync", "h200-duplicate-gpu", "compile-5rank-graph-divergence", "compile-ddp-divergent",
    "compile-torch213-probe", "compile-3rank-cache-pattern", "nccl-fr-dead-rank", "nccl-log-misconfigured",
    "nccl-log-timeout-desync", "nccl-log-copied", "h200-cold-start", "compile-graph-break", "nccl-log-desync-report",
    "corrupt-rank-cpu-ddp-eager", "lost-rank-cpu-ddp-eager", "cut-rank-cpu-ddp-eager",
]


class _Reads(dict):
    """run.tables that records which tables each builder (the innermost on `stack`) looks up."""

    def __init__(self, tables, seen, stack):
        super().__init__(tables)
        self.seen, self.stack = seen, stack

    def _note(self, k):
        if self.stack:
            self.seen.setdefault(self.stack[-1], set()).add(k)

    def __contains__(self, k):
        self._note(k)
        return dict.__contains__(self, k)

    def __getitem__(self, k):
        self._note(k)
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        self._note(k)
        return dict.get(self, k, default)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{fixture: (canonical tables, run with every derived table built, reads seen per builder)}"""
    import os

    os.environ["TRACEQL_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    reg = link.derived_tables()
    out = {}
    for name in RUNS:
        base = load_run(FIXTURES / name)
        seen: dict[str, set[str]] = {}
        stack: list[str] = []
        run = Run(base.path, base.sources, _Reads(base.tables, seen, stack), None, list(base.notes), None)
        saved = dict(reg)
        try:
            for t, fn in saved.items():
                reg[t] = _traced(t, fn, stack)
            for t in saved:
                link.ensure(run, t)
        finally:
            reg.update(saved)
        out[name] = (dict(base.tables), run, seen)
    return out


def _traced(name, fn, stack):
    def build(run):
        stack.append(name)
        try:
            return fn(run)
        finally:
            stack.pop()
    return build


def test_registry_and_declarations_name_the_same_tables():
    reg = link.derived_tables()
    assert sorted(reg) == sorted(DERIVED)
    for name, d in DERIVED.items():
        mod, fn = d.builder.split(":")
        assert getattr(importlib.import_module(mod), fn) is reg[name], f"{name}: builder {d.builder} is not link's"
        for r in d.reads:
            assert r in DERIVED or r in SCHEMAS, f"{name} reads {r}, which is no table"
        assert d.doc and all(doc for _, doc in d.columns.values()), f"{name}: a doc is empty"


def test_every_table_has_its_declared_schema(built):
    with_rows = set()
    for fx, (_, run, _) in built.items():
        for name, d in DERIVED.items():
            df = run.tables[name]
            got = {c: str(t) for c, t in df.schema.items()}
            want = {c: str(t) for c, t in d.schema.items()}
            assert got == want, f"{fx}: {name}: built {got}, declared {want}"
            if df.height:
                with_rows.add(name)
    assert set(DERIVED) - with_rows == set(), "these tables have rows on no fixture of RUNS: add one"


def test_builders_read_only_what_they_declare(built):
    for fx, (_, _, seen) in built.items():
        for name, tables in seen.items():
            extra = tables - {name} - set(DERIVED[name].reads)
            assert not extra, f"{fx}: {name} read {sorted(extra)}, not in its declared reads {DERIVED[name].reads}"


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True) if df.height else df


def test_rank_scope_tables_need_no_other_rank(built):
    checked = 0
    for fx, (tables, run, _) in built.items():
        ranks = run.ranks
        if len(ranks) < 2:
            continue
        r0 = ranks[-1]
        solo = Run(run.path, run.sources, {k: v.filter(pl.col("rank") == r0) if "rank" in v.columns else v
                                            for k, v in tables.items()}, None, [], None)
        for name, d in DERIVED.items():
            if d.scope != "rank":
                continue
            full = run.tables[name].filter(pl.col("rank") == r0)
            alone = link.ensure(solo, name).select(full.columns)
            assert _rows(alone).equals(_rows(full)), f"{fx}: {name} is declared scope rank but rank {r0} alone differs"
            checked += full.height
    assert checked > 0


def test_schema_helpers():
    assert schema("kernels") == SCHEMAS["kernels"]
    assert empty("collective_instances").columns == list(DERIVED["collective_instances"].columns)
    assert canonical_reads("step_metrics") >= {"kernels", "collectives", "steps"}
    with pytest.raises(KeyError):
        schema("no_such_table")


@pytest.mark.parametrize("name", ["cpu-straggler", "h200x2-straggler", "h200x2-exposed-allreduce-nsys"])
def test_rank_scope_holds_when_ranks_differ(name):
    """A rank cut off early (its first steps' rows gone) holds fewer keys than the others: a table built from keys
    numbered over the whole run (a dense rank of match keys) would give it other rows alone than beside the others.
    The symmetric fixtures above cannot show that; this run is asymmetric on purpose."""
    base = load_run(FIXTURES / name)
    ranks = base.ranks
    assert len(ranks) >= 2
    cut = ranks[-1]
    st = base.tables["steps"].filter(pl.col("rank") == cut)
    assert st.height >= 2, "the fixture needs steps to cut"
    t_cut = st.sort("ts")["ts"][1]  # everything of the rank before its second step is gone

    def trimmed(df: pl.DataFrame) -> pl.DataFrame:
        if "rank" not in df.columns or "ts" not in df.columns:
            return df
        return df.filter((pl.col("rank") != cut) | pl.col("ts").is_null() | (pl.col("ts") >= t_cut))

    tables = {k: trimmed(v) for k, v in base.tables.items()}
    whole = Run(base.path, base.sources, dict(tables), None, [], None)
    solo = Run(base.path, base.sources, {k: v.filter(pl.col("rank") == cut) if "rank" in v.columns else v
                                         for k, v in tables.items()}, None, [], None)
    for t, d in DERIVED.items():
        if d.scope != "rank":
            continue
        full = link.ensure(whole, t).filter(pl.col("rank") == cut)
        alone = link.ensure(solo, t).select(full.columns)
        assert _rows(alone).equals(_rows(full)), f"{name}: {t} is declared scope rank but rank {cut} alone differs"
