"""A warm check reads a cached source's table only when something reads the table (model.run.Pending in a Tables):
row counts come from what the cache recorded, every way of reading a value gives a DataFrame, and a table file found
damaged only at that late read is read from the source again, never an error. conftest gives every test its own cache
folder."""

from __future__ import annotations

import pickle
from pathlib import Path

import polars as pl

from traceql import pipeline
from traceql.link import STEPPED
from traceql.model.run import Pending, Run, Tables

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "fixtures" / "h200x2-straggler"  # kernels, host ops, runtime, collectives, steps, flows


def _findings(res) -> list:
    return sorted((f.rule, tuple(f.ranks), f.step, f.message, f.fingerprint) for f in res.findings)


def _reads(log: list, df: pl.DataFrame) -> Pending:
    def read():
        log.append(1)
        return df

    return Pending(df.height, read)


def test_tables_read_a_pending_entry_once_whichever_way_it_is_read():
    df = pl.DataFrame({"ts": [1, 2, 3]})
    for read in (lambda t: t["k"], lambda t: t.get("k"), lambda t: dict(t)["k"], lambda t: {**t}["k"],
                 lambda t: dict(t.items())["k"], lambda t: t.values()[0], lambda t: t.pop("k"),
                 lambda t: t.setdefault("k", None), lambda t: pickle.loads(pickle.dumps(t))["k"],
                 lambda t: t.copy()["k"]):
        log: list = []
        t = Tables({"k": _reads(log, df)})
        assert t.rows("k") == 3 and log == []  # the row count reads nothing
        got = read(t)
        assert isinstance(got, pl.DataFrame) and got.equals(df)
        assert log == [1]
        if "k" in t:
            t["k"]
            assert log == [1]  # once


def test_amend_applies_to_a_pending_table_when_it_is_read():
    log: list = []
    run = Run(path=Path("."), tables=Tables({"kernels": _reads(log, pl.DataFrame({"ts": [1, 2]}))}))
    run.amend("kernels", lambda t: t.with_columns(step=pl.lit(4)))
    assert log == [] and run.rows("kernels") == 2 and run.has("kernels")
    assert run.table("kernels")["step"].to_list() == [4, 4] and log == [1]
    plain = Run(path=Path("."), tables={"kernels": pl.DataFrame({"ts": [1]})})  # a plain dict: at once
    plain.amend("kernels", lambda t: t.with_columns(step=pl.lit(1)))
    assert plain.table("kernels").columns == ["ts", "step"] and plain.rows("kernels") == 1


def test_a_warm_check_leaves_tables_no_rule_reads_unread_and_finds_the_same():
    cold = pipeline.check(GPU, use_cache=False)
    pipeline.check(GPU)  # fills the cache
    warm = pipeline.check(GPU)
    assert _findings(warm) == _findings(cold)
    pending = [n for n in dict.keys(warm.run.tables) if isinstance(dict.__getitem__(warm.run.tables, n), Pending)]
    assert "flows" in pending  # no rule of the pack reads flows on this run
    for name in ("host_ops", "kernels", "runtime", "collectives", "steps", "flows"):
        assert warm.run.rows(name) == cold.run.table(name).height, name
        w, c = warm.run.table(name), cold.run.table(name)  # read now: the same rows and columns as the cold path
        # (flows come back from the cache in another row order than a cold read gives them, as before this change)
        assert w.schema == c.schema and w.sort(w.columns).equals(c.sort(c.columns)), name
    assert all(warm.run.table(n)["step"].equals(cold.run.table(n)["step"]) for n in STEPPED if cold.run.table(n).height)


def test_a_table_file_damaged_after_the_load_is_read_from_the_source(monkeypatch):
    cold = pipeline.load_run(GPU, use_cache=False)
    pipeline.load_run(GPU)  # fills the cache
    warm = pipeline.load_run(GPU)
    keys = {s.cache_key for s in warm.sources if s.cache_key}
    assert keys
    from traceql import cache

    for k in keys:  # same size, garbage content: load() saw a whole entry, the late read finds it damaged
        p = cache.cache_dir() / k / "host_ops.parquet"
        if p.exists():
            p.write_bytes(b"\0" * p.stat().st_size)
    got = warm.table("host_ops")
    assert got.equals(cold.table("host_ops")) and got.schema == cold.table("host_ops").schema
