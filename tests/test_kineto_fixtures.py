"""Kineto importer on the project's own captures (samples/demo, fixtures/h200-*, fixtures/cpu-*): the twins of
test_kineto.py's corpus tests, so CI reads real torch.profiler traces too. (test_kineto.py is being edited by its
owner; these live here to stay out of its way.)

The oracle is the trace itself, read here with the json module (event categories, ph, args, distributedInfo), never
the importer's output. Damaged copies are made in tmp_path.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from conftest import DAMAGED, FIXTURES, SAMPLES
from traceql.discover import discover
from traceql.ingest import kineto
from traceql.ingest.loader import ingest
from traceql.model import SCHEMAS, Source, conform

# every recorded trace except those damaged on purpose
TRACES = sorted(p for p in [*SAMPLES.glob("*/rank*.pt.trace.json.gz"), *FIXTURES.glob("*/rank*.pt.trace.json.gz"),
                            *FIXTURES.glob("*/kineto_trace.json.gz")] if p not in DAMAGED)
IDS = [f"{p.parent.name}/{p.name.split('.')[0]}" for p in TRACES]
DEMO0 = SAMPLES / "demo" / "rank0.pt.trace.json.gz"
DEMO1 = SAMPLES / "demo" / "rank1.pt.trace.json.gz"
SMALL = FIXTURES / "h200-pageable-copy" / "rank0.pt.trace.json.gz"  # one rank, memcpy from pageable memory


def _plain(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


@functools.lru_cache(maxsize=None)
def _doc(path: Path) -> dict:
    return json.loads(_plain(path))


def _read(path: Path, rank_from_name: int | None = None) -> tuple[Source, dict[str, pl.DataFrame]]:
    src = Source(Path(path), "kineto", rank=rank_from_name, rank_origin="file name" if rank_from_name is not None else "")
    tables = kineto.read(Path(path), src)
    return src, {name: conform(name, df) for name, df in tables.items()}


@functools.lru_cache(maxsize=None)
def _cached(path: Path):
    return _read(path)


def _table(tables, name):
    return tables.get(name, pl.DataFrame(schema=SCHEMAS[name]))


def _read_whole(path: Path, monkeypatch):
    """Read with the chunked fast path switched off: every event through orjson and the dict column builder."""
    def refuse(*_a, **_k):
        raise kineto._Fallback("switched off by the test")

    with monkeypatch.context() as m:
        m.setattr(kineto, "_parse_chunked", refuse)
        m.setattr(kineto, "_parse_mapped", refuse)
        return _read(path)


def _same_tables(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        key = [c for c in ("id", "step", "kind", "flow_id") if c in a[name].columns]
        assert_frame_equal(a[name].sort(key, nulls_last=True), b[name].sort(key, nulls_last=True), check_exact=True)


# ---------------------------------------------------------------------------------------------------------------
# Every committed trace against its own JSON


def test_there_are_committed_traces():
    assert len(TRACES) >= 20


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_trace_counts_match_its_json(path):
    doc = _doc(path)
    src, t = _cached(path)
    assert src.status == "ok", src.detail
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    n = lambda cat: sum(1 for e in ev if e.get("cat") == cat)  # noqa: E731
    k = _table(t, "kernels")
    assert k.filter(pl.col("kind").is_in(["compute", "comm"])).height == n("kernel")
    assert k.filter(pl.col("kind") == "memcpy").height == n("gpu_memcpy")
    assert k.filter(pl.col("kind") == "memset").height == n("gpu_memset")
    nccl = sum(1 for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl"))
    assert k.filter(pl.col("kind") == "comm").height == nccl
    steps = {int(e["name"].split("#")[1]) for e in ev if e.get("name", "").startswith("ProfilerStep#")}
    assert set(_table(t, "steps")["step"].to_list()) == steps
    di = doc.get("distributedInfo") or {}
    if isinstance(di.get("rank"), int):
        assert src.rank == di["rank"] and src.rank_origin == "distributedInfo"
    ids = pl.concat([_table(t, x)["id"] for x in ("kernels", "host_ops", "runtime", "syncs")])
    assert ids.n_unique() == ids.len()


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_fast_and_fallback_parsers_give_identical_tables(path, monkeypatch):
    src, fast = _cached(path)
    if b'"traceEvents": [\n  {\n' in _plain(path)[:1 << 20]:  # Kineto's own layout: the chunked path must take it
        assert src.meta["parser"] == "chunks"
    slow_src, slow = _read_whole(path, monkeypatch)
    assert slow_src.meta["parser"] == "whole"
    _same_tables(fast, slow)
    strip = lambda s: {k: v for k, v in s.meta.items() if k != "parser"}  # noqa: E731
    assert (src.status, src.detail, src.rank, strip(src)) == (slow_src.status, slow_src.detail, slow_src.rank, strip(slow_src))


def test_committed_run_dirs_ingest_or_say_why():
    """Every other file of every committed run dir (the Kineto traces are read above) ends ok, or skipped/error with
    a reason; none with an internal error."""
    seen = 0
    for d in sorted([*FIXTURES.iterdir(), *SAMPLES.iterdir()]):
        run = ingest(d, [s for s in discover(d) if s.kind != "kineto"], use_cache=False, jobs=1)
        for s in run.sources:
            seen += 1
            assert "internal error" not in s.detail, (s.path, s.detail)
            assert s.status == "ok" or s.detail, s.path
    assert seen > 80


# ---------------------------------------------------------------------------------------------------------------
# Facts of single traces


def test_rank_from_distributed_info_wins_over_file_name():
    di = _doc(DEMO1)["distributedInfo"]
    src, _ = _read(DEMO1, rank_from_name=7)  # pretend the name said 7
    assert src.rank == di["rank"] == 1 and src.rank_origin == "distributedInfo"
    assert src.meta["world_size"] == di["world_size"] and src.meta["backend"] == di["backend"]
    assert src.meta["pg_config"] == di["pg_config"]


def test_rank_from_file_name_and_unknown(tmp_path):
    doc = dict(_doc(DEMO1))
    doc.pop("distributedInfo")
    named = tmp_path / "named"
    named.mkdir()
    (named / "rank-3.trace.json").write_text(json.dumps(doc))
    run = ingest(named, discover(named), use_cache=False)
    s = run.sources[0]
    assert s.rank == 3 and s.rank_origin == "file name"
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(doc))
    src, t = _read(p)
    assert src.rank is None
    assert "rank unknown: no distributedInfo and no rank in the file name" in src.detail
    assert t["host_ops"].height == sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in
                                       ("cpu_op", "user_annotation", "python_function", "Trace"))


def test_gloo_collectives_have_no_kernel():
    doc = _doc(DEMO0)
    _, t = _cached(DEMO0)
    c = t["collectives"]
    assert c.height > 0 and set(c["backend"].unique()) == {"gloo"}
    assert c["kernel_ts"].null_count() == c.height
    assert doc["distributedInfo"]["backend"] == "gloo"


def test_memcpy_sync_and_runtime_kinds():
    doc = _doc(SMALL)
    _, t = _cached(SMALL)
    names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy"}
    assert "Memcpy HtoD (Pageable -> Device)" in names
    m = t["kernels"].filter(pl.col("name") == "Memcpy HtoD (Pageable -> Device)")
    assert m.height > 0 and set(zip(m["copy_kind"], m["src_memory"], m["dst_memory"])) == {("HtoD", "pageable", "device")}
    want_bytes = sum(e["args"]["bytes"] for e in doc["traceEvents"] if e.get("name") == "Memcpy HtoD (Pageable -> Device)")
    assert m["bytes"].sum() == want_bytes
    rt = t["runtime"]
    kinds = dict(zip(rt["name"].to_list(), rt["kind"].to_list()))
    assert kinds["cudaLaunchKernel"] == "launch"
    assert all(kinds[n] == "sync" for n in kinds if n.endswith("Synchronize"))
    assert any(n.endswith("Synchronize") for n in kinds)
    # every kernel whose launch the trace recorded joins it on correlation, once
    launched = {e["args"]["correlation"] for e in doc["traceEvents"]
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in e.get("name", "")}
    k = t["kernels"].filter((pl.col("kind") == "compute") & pl.col("correlation").is_in(list(launched)))
    launches = rt.filter(pl.col("kind") == "launch")
    assert k.height > 0 and k.join(launches, on="correlation").height == k.height


def test_host_op_nesting_and_flows():
    doc = _doc(DEMO0)
    _, t = _cached(DEMO0)
    h = t["host_ops"]
    steps = h.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert steps.height > 0 and steps["depth"].to_list() == [0] * steps.height
    j = h.join(h.select("id", pts="ts", pend="end", ptid="tid"), left_on="parent", right_on="id")
    assert j.height == h["parent"].is_not_null().sum() > 0
    assert (j["tid"] == j["ptid"]).all() and (j["ts"] >= j["pts"]).all() and (j["depth"] >= 1).all()
    f = t["flows"]
    ph = {x: sum(1 for e in doc["traceEvents"] if e.get("ph") == x) for x in ("s", "f")}
    assert f["src_ts"].is_not_null().sum() == ph["s"] and f["dst_ts"].is_not_null().sum() == ph["f"]
    both = f.filter(pl.col("kind") == "ac2g").drop_nulls(["src_ts", "dst_ts"])
    assert both.height > 0 and (both["src_ts"] <= both["dst_ts"]).all()
    assert set(f["kind"].unique()) == {e["cat"] for e in doc["traceEvents"] if e.get("ph") in ("s", "f")}


def test_string_pids_do_not_break_int_columns():
    # torch.profiler writes its "Trace" span with pid "Spans": a string where every other pid is a number
    doc = _doc(DEMO0)
    (span,) = [e for e in doc["traceEvents"] if e.get("cat") == "Trace" and e.get("ph") == "X"]
    assert isinstance(span["pid"], str)
    src, t = _cached(DEMO0)
    h = t["host_ops"]
    row = h.filter(pl.col("cat") == "Trace").row(0, named=True)
    assert row["pid"] == src.meta["string_ids"][span["pid"]] < 0
    assert h["pid"].dtype == pl.Int64


# ---------------------------------------------------------------------------------------------------------------
# Damaged and foreign input, made in tmp from a committed trace


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fracs=st.lists(st.floats(min_value=0.05, max_value=0.98), min_size=2, max_size=2, unique=True))
def test_truncated_file_salvages_complete_events(fracs, tmp_path):
    data = _plain(SMALL)
    full = len(json.loads(data)["traceEvents"])
    got = []
    for frac in sorted(fracs):
        cut = int(len(data) * frac)
        p = tmp_path / f"cut_{cut}.json"
        p.write_bytes(data[:cut])
        src, _ = _read(p)
        assert src.status == "partial" and "byte" in src.detail and "truncated" in src.detail
        assert 0 <= src.meta["events"] < full
        got.append(src.meta["events"])
    assert got[0] <= got[1]


def test_truncated_near_end_keeps_almost_everything(tmp_path):
    data = _plain(SMALL)
    events = json.loads(data)["traceEvents"]
    p = tmp_path / "cut.json"
    p.write_bytes(data[: data.rfind(b'"traceName"') - 40])
    src, t = _read(p)
    assert src.status == "partial"
    assert len(events) - 2 <= src.meta["events"] < len(events) + 1
    assert t["kernels"].filter(pl.col("kind") == "compute").height == sum(
        1 for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def test_truncated_gzip_salvages_what_decompressed(tmp_path):
    raw = SMALL.read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    src, t = _read(p)
    assert src.status == "partial" and "gzip stream ends early" in src.detail
    assert 0 < src.meta["events"] < len(_doc(SMALL)["traceEvents"])
    assert t["host_ops"].height > 0


def test_raw_control_characters_in_names(tmp_path):
    data = _plain(SMALL)
    bad = data.replace(b'"name": "ProfilerStep#', b'"name": "Profiler\x01Step#', 1)
    assert bad != data
    p = tmp_path / "ctrl.json"
    p.write_bytes(bad)
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)  # strict parsers refuse it
    src, t = _read(p)
    assert src.status == "ok" and src.meta["control_chars_escaped"] == 1
    assert sum(n.startswith("Profiler\x01Step#") for n in t["host_ops"]["name"].to_list()) == 1
    assert t["kernels"].height == _cached(SMALL)[1]["kernels"].height


def test_tiny_chunks_give_the_same_tables(monkeypatch):
    """~40 chunks of 16 KiB: every chunk boundary, string-id and collective-args hand-over is crossed."""
    _, whole = _cached(DEMO0)
    monkeypatch.setattr(kineto, "_BLOCK", 16 << 10)
    src, tiny = _read(DEMO0)
    assert src.meta["parser"] == "chunks"
    _same_tables(whole, tiny)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(min_value=0.02, max_value=0.999))
def test_truncated_file_fast_path_keeps_what_the_fallback_keeps(frac, tmp_path, monkeypatch):
    data = _plain(SMALL)
    p = tmp_path / "cut.json"
    p.write_bytes(data[: int(len(data) * frac)])
    src, fast = _read(p)
    slow_src, slow = _read_whole(p, monkeypatch)
    assert src.status == slow_src.status == "partial"
    assert src.meta["events"] == slow_src.meta["events"]
    _same_tables(fast, slow)


def test_loader_reports_bad_file_and_keeps_others(tmp_path):
    (tmp_path / "rank-1.trace.json").write_bytes(_plain(DEMO0))
    (tmp_path / "rank-2.trace.json").write_text('{"traceEvents": "nope", "schemaVersion": 1}')
    run = ingest(tmp_path, discover(tmp_path), use_cache=False)
    st_ = {s.path.name: s for s in run.sources}
    assert st_["rank-2.trace.json"].status == "error"
    assert "not a Chrome/Kineto trace" in st_["rank-2.trace.json"].detail and "\n" not in st_["rank-2.trace.json"].detail
    assert st_["rank-1.trace.json"].status == "ok"
    assert set(run.tables["host_ops"]["rank"].unique()) == {0}  # distributedInfo says 0; the name said 1
