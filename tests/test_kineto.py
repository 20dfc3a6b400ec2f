"""Kineto/Chrome trace importer: the reference corpus (real HTA traces) and damaged copies of it made in tmp.

Expected counts come from the corpus's MANIFEST.tsv / INVENTORY.json, which whoever assembled the corpus computed
independently of traceql.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from conftest import CORPUS, corpus_path
from traceql.discover import discover
from traceql.ingest import IngestError, kineto
from traceql.ingest.collective_names import canonical_collective
from traceql.ingest.loader import ingest
from traceql.model import SCHEMAS, Source, conform

HTA = CORPUS / "hta"


def _manifest() -> dict[str, dict]:
    path = HTA / "MANIFEST.tsv"
    if not path.exists():
        return {}
    return {r["path"]: r for r in csv.DictReader(open(path), delimiter="\t")}


def _inventory() -> dict[str, dict]:
    path = HTA / "INVENTORY.json"
    if not path.exists():
        return {}
    return {e["file"]: e for e in json.loads(path.read_text())}


MANIFEST = _manifest()
INVENTORY = _inventory()
TRACES = sorted(p for p in MANIFEST if INVENTORY.get(p, {}).get("n_events", 0) > 0)


def _read(path: Path, rank_from_name: int | None = None) -> tuple[Source, dict[str, pl.DataFrame]]:
    src = Source(Path(path), "kineto", rank=rank_from_name, rank_origin="file name" if rank_from_name is not None else "")
    tables = kineto.read(Path(path), src)
    return src, {name: conform(name, df) for name, df in tables.items()}


@functools.lru_cache(maxsize=None)
def _read_corpus(rel: str) -> tuple[Source, dict[str, pl.DataFrame]]:
    """Each corpus trace is read once per test session (the largest take seconds); tests only look."""
    return _read(HTA / rel)


def _table(tables, name):
    return tables.get(name, pl.DataFrame(schema=SCHEMAS[name]))


def _hta(*parts):
    p = corpus_path("hta", *parts)
    if not p.exists():
        pytest.skip(f"corpus file absent: {p}")
    return p


# ---------------------------------------------------------------------------------------------------------------
# The whole corpus


@pytest.mark.parametrize("rel", TRACES or ["<corpus absent>"])
def test_corpus_trace_kernel_counts_match_manifest(rel, corpus):
    if rel not in MANIFEST:
        pytest.skip("corpus manifest absent")
    row, inv = MANIFEST[rel], INVENTORY[rel]
    src, tables = _read_corpus(rel)
    assert src.status == "ok", src.detail
    k = _table(tables, "kernels")
    # MANIFEST counts ph X events of cat "kernel"; one old trace spells it "Kernel" (counted in INVENTORY's cats).
    expected = int(row["n_kernel_X"]) + inv["cats"].get("Kernel", 0)
    assert k.filter(pl.col("kind").is_in(["compute", "comm"])).height == expected
    assert k.filter(pl.col("kind") == "comm").height == int(row["n_nccl_kernel"])
    names = {n for n in row["nccl_kernel_names"].split(";") if n}
    got = {n.split("(")[0] for n in k.filter(pl.col("kind") == "comm")["name"].to_list()}
    assert got == names
    assert k.filter(pl.col("kind") == "memcpy").height == inv["cats"].get("gpu_memcpy", 0)
    assert k.filter(pl.col("kind") == "memset").height == inv["cats"].get("gpu_memset", 0)
    # Every ProfilerStep#N the inventory lists is a step.
    want_steps = {int(s.split("#")[1]) for s in inv.get("profiler_steps", [])}
    assert set(_table(tables, "steps")["step"].to_list()) == want_steps
    # Rank: distributedInfo when it has one.
    di = inv.get("distributedInfo") or {}
    if isinstance(di.get("rank"), int):
        assert src.rank == di["rank"] and src.rank_origin == "distributedInfo"
    # ids unique within the source, across tables.
    ids = pl.concat([_table(tables, t)["id"] for t in ("kernels", "host_ops", "runtime", "syncs")])
    assert ids.n_unique() == ids.len()


def test_whole_corpus_folder_ingests_or_says_why(corpus):
    """Every file under hta/ ends ok, or skipped/error with a reason; none fails with an internal error."""
    sources = discover(corpus / "hta")
    done = []
    for s in sources:
        rel = str(s.path.relative_to(HTA))
        if s.kind == "kineto" and rel in TRACES:
            s.status, s.detail = _read_corpus(rel)[0].status, _read_corpus(rel)[0].detail
            done.append(s)
        else:  # everything else goes through the loader, as `traceql check` would take it
            done.extend(ingest(corpus / "hta", [s], use_cache=False, jobs=1).sources)
    by_name = {s.path.name: s for s in done}
    for s in done:
        assert "internal error" not in s.detail, (s.path, s.detail)
        if s.status != "ok":
            assert s.detail, s.path
    et = by_name["benchmark_simple_add_et.json.gz"]  # an execution trace, not a Kineto trace
    assert et.status in ("skipped", "error") and et.detail
    assert by_name["mtia_rank_0.json.gz"].status == "ok" and "MTIA" in by_name["mtia_rank_0.json.gz"].detail
    kineto_ok = [s for s in done if s.kind == "kineto" and s.status == "ok"]
    assert len(kineto_ok) == len(TRACES)


def test_execution_trace_is_refused_with_reason(corpus):
    with pytest.raises(IngestError, match="execution trace"):
        _read_corpus("tests/data/execution_trace/benchmark_simple_add_et.json.gz")


# ---------------------------------------------------------------------------------------------------------------
# Facts of single traces


def test_rank_from_distributed_info_wins_over_file_name(corpus):
    p = _hta("tests", "data", "cpu_only", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    src, _ = _read(p, rank_from_name=7)  # pretend the name said 7
    assert src.rank == 34 and src.rank_origin == "distributedInfo"
    assert src.meta["world_size"] == 300 and src.meta["backend"] == "gloo"
    assert isinstance(src.meta["pg_config"], list) and len(src.meta["pg_config"]) == 11


def test_rank_from_file_name_and_unknown(corpus):
    p = _hta("tests", "data", "mtia_inference_trace", "mtia_inference_rank_0.json.gz")  # no distributedInfo
    src = [s for s in discover(p)][0]
    run = ingest(p, [src], use_cache=False)
    s = run.sources[0]
    assert s.rank == 0 and s.rank_origin == "file name"
    src, tables = _read_corpus("tests/data/rank_unavailable/rank_not_found.json.gz")
    assert src.rank is None
    assert "rank unknown: no distributedInfo and no rank in the file name" in src.detail
    assert _table(tables, "host_ops").height == 2467


def test_nccl_collectives_link_to_their_kernels(corpus):
    src, t = _read_corpus("tests/data/nccl_parser_config/nccl_data.json.gz")
    c, k = t["collectives"], t["kernels"]
    inv = INVENTORY["tests/data/nccl_parser_config/nccl_data.json.gz"]["collective_names"]
    # record_param_comms: allreduce 30, broadcast 12, wait 6 in the inventory; "wait" is not a collective call,
    # and each call is recorded twice (record_param_comms nests in record_param_comms).
    assert c.filter(pl.col("op") == "all_reduce").height * 2 == inv["allreduce"]
    assert c.filter(pl.col("op") == "broadcast").height * 2 == inv["broadcast"]
    assert c["kernel_ts"].null_count() == 0
    assert set(c["backend"].unique()) == {"nccl"}
    assert set(c["pg_name"].unique()) == {"0"} and set(c["pg_ranks"].unique()) == {"[0, 1]"}
    assert (c["bytes"] == c["in_nelems"] * 4).filter(c["dtype"] == "Float").all()
    # Each collective's kernel is a comm kernel of the same op, starting after the host call began.
    comm = k.filter(pl.col("kind") == "comm")
    j = c.join(comm.select("ts", "collective"), left_on="kernel_ts", right_on="ts")
    assert j.height == c.height
    assert (j["op"] == j["collective"]).all()
    assert (c["kernel_ts"] > c["ts"]).all()
    assert src.meta["nccl_version"] == "2.17.1" and src.meta["baseTimeNanoseconds"] > 0


def test_old_collectives_take_op_from_nccl_annotation(corpus):
    # record_param_comms without args: the op comes from the nccl:all_reduce annotation inside it.
    _, t = _read_corpus("tests/data/df_index_resolver/df_index_resolver.json.gz")
    c = t["collectives"]
    assert c.height == int(MANIFEST["tests/data/df_index_resolver/df_index_resolver.json.gz"]["n_nccl_kernel"])
    assert set(c["op"].unique()) == {"all_reduce"}
    assert c["kernel_ts"].null_count() == 0
    assert c["kernel_ts"].n_unique() == c.height  # one kernel per call, no kernel claimed twice


def test_gloo_collectives_have_no_kernel(corpus):
    _, t = _read_corpus("tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    c = t["collectives"]
    assert c.height > 0 and set(c["backend"].unique()) == {"gloo"}
    assert c["kernel_ts"].null_count() == c.height


def test_memcpy_sync_and_runtime_kinds(corpus):
    _, t = _read_corpus("tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz")
    m = t["kernels"].filter(pl.col("kind") == "memcpy").row(0, named=True)
    assert m["name"] == "Memcpy DtoH (Device -> Pageable)"
    assert (m["copy_kind"], m["src_memory"], m["dst_memory"], m["bytes"]) == ("DtoH", "device", "pageable", 1)
    rt = t["runtime"]
    kinds = dict(zip(rt["name"].to_list(), rt["kind"].to_list()))
    assert kinds["cudaLaunchKernel"] == "launch"
    assert all(kinds[n] == "sync" for n in kinds if n.endswith("Synchronize"))
    assert t["syncs"].height == 4
    _, t2 = _read_corpus("tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz")
    assert set(t2["syncs"]["kind"].unique()) >= {"event_sync", "stream_wait_event", "context_sync"}
    # Kernels join their launches on correlation.
    k = t["kernels"].filter(pl.col("kind") == "compute")
    assert k.join(rt.filter(pl.col("kind") == "launch"), on="correlation").height == k.height


def test_amd_and_triton_runtime_names(corpus):
    _, t = _read_corpus("tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    rt = t["runtime"]
    assert rt.filter(pl.col("name").str.starts_with("hipLaunchKernel"))["kind"].unique().to_list() == ["launch"]
    assert rt.filter(pl.col("name") == "hipMemcpyWithStream")["kind"].unique().to_list() == ["memcpy"]
    _, t = _read_corpus("tests/data/triton_example/triton_example.json.gz")
    rt = t["runtime"]
    assert dict(zip(rt["name"], rt["kind"])) == {"cuLaunchKernel": "launch", "cudaDeviceSynchronize": "sync"}


def test_host_op_nesting_and_flows(corpus):
    _, t = _read_corpus("tests/data/nccl_parser_config/nccl_data.json.gz")
    h = t["host_ops"]
    steps = h.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert steps["depth"].to_list() == [0] * steps.height and steps["parent"].null_count() == steps.height
    # Every child lies inside its parent on the same thread.
    j = h.join(h.select("id", pts="ts", pend="end", ptid="tid"), left_on="parent", right_on="id")
    assert j.height == h["parent"].is_not_null().sum()
    assert (j["tid"] == j["ptid"]).all() and (j["ts"] >= j["pts"]).all()
    assert (j["depth"] >= 1).all()
    f = t["flows"]
    ac2g = f.filter(pl.col("kind") == "ac2g")
    ph = INVENTORY["tests/data/nccl_parser_config/nccl_data.json.gz"]["ph"]
    # One row per flow id: its start (ph s) and its end (ph f); Kineto writes ends without starts for launches
    # whose start it dropped, so the ends outnumber the starts here.
    assert f["src_ts"].is_not_null().sum() == ph["s"] and f["dst_ts"].is_not_null().sum() == ph["f"]
    both = ac2g.drop_nulls(["src_ts", "dst_ts"])
    assert both.height > 0 and (both["src_ts"] <= both["dst_ts"]).all()
    assert set(f["kind"].unique()) == {"ac2g", "fwdbwd"}


def test_string_pids_do_not_break_int_columns(corpus):
    src, t = _read_corpus("tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    h = t["host_ops"]
    trace_row = h.filter(pl.col("cat") == "Trace").row(0, named=True)
    assert trace_row["pid"] == src.meta["string_ids"]["Spans"] < 0
    assert h["pid"].dtype == pl.Int64


# ---------------------------------------------------------------------------------------------------------------
# Damaged and foreign input (hand-made in tmp from real traces)


def _plain(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


SMALL = ("tests", "data", "critical_path", "alexnet", "benchmark_result_2869224_1695835535_trace.json.gz")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fracs=st.lists(st.floats(min_value=0.05, max_value=0.98), min_size=2, max_size=2, unique=True))
def test_truncated_file_salvages_complete_events(fracs, tmp_path, corpus):
    data = _plain(_hta(*SMALL))
    full = len(json.loads(data)["traceEvents"])
    got = []
    for frac in sorted(fracs):
        cut = int(len(data) * frac)
        p = tmp_path / f"cut_{cut}.json"
        p.write_bytes(data[:cut])
        src, t = _read(p)
        assert src.status == "partial"
        assert "byte" in src.detail and "truncated" in src.detail
        n = src.meta["events"]
        assert 0 <= n < full
        got.append(n)
    assert got[0] <= got[1]


def test_truncated_near_end_keeps_almost_everything(tmp_path, corpus):
    data = _plain(_hta(*SMALL))
    events = json.loads(data)["traceEvents"]
    p = tmp_path / "cut.json"
    p.write_bytes(data[: data.rfind(b'"traceName"') - 40])
    src, t = _read(p)
    assert src.status == "partial"
    assert len(events) - 2 <= src.meta["events"] < len(events) + 1
    assert t["kernels"].filter(pl.col("kind") == "compute").height == 79


def test_truncated_gzip_salvages_what_decompressed(tmp_path, corpus):
    raw = _hta(*SMALL).read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    src, t = _read(p)
    assert src.status == "partial"
    assert "gzip stream ends early" in src.detail
    assert 0 < src.meta["events"] < 1408
    assert t["host_ops"].height > 0


def test_raw_control_characters_in_names(tmp_path, corpus):
    data = _plain(_hta("tests", "data", "call_stack", "backward_thread.json"))
    bad = data.replace(b'"name": "ProfilerStep#552"', b'"name": "Profiler\x01Step#552"', 1)
    assert bad != data
    p = tmp_path / "ctrl.json"
    p.write_bytes(bad)
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)  # strict parsers refuse it
    src, t = _read(p)
    assert src.status == "ok" and src.meta["control_chars_escaped"] == 1
    assert "Profiler\x01Step#552" in t["host_ops"]["name"].to_list()
    assert t["kernels"].height == 1


def test_args_keys_that_appear_late_are_kept(tmp_path, corpus):
    doc = json.loads(_plain(_hta("tests", "data", "call_stack", "backward_thread.json")))
    base = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    filler = []
    for i in range(2000):
        e = dict(base, ts=base["ts"] + 1000 + i * 10, dur=5, args={})
        filler.append(e)
    late = dict(base, ts=base["ts"] + 50_000, dur=5, args={"External id": 424242})
    doc["traceEvents"] = doc["traceEvents"] + filler + [late]
    p = tmp_path / "late.json"
    p.write_text(json.dumps(doc))
    _, t = _read(p)
    assert 424242 in t["host_ops"]["external_id"].to_list()


def test_begin_end_pairs_and_instants(tmp_path):
    # hand-made: a minimal Chrome trace with B/E pairs, nested, on one thread; plus an instant event.
    ev = [
        {"ph": "B", "name": "outer", "cat": "user_annotation", "pid": 1, "tid": 2, "ts": 10.0},
        {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 12.5},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 14.0},
        {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 15.0, "s": "t"},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 20.0},
    ]
    p = tmp_path / "be.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    src, t = _read(p)
    h = t["host_ops"].sort("ts")
    assert h["name"].to_list() == ["outer", "inner"]
    assert h["dur"].to_list() == [10_000, 1_500]
    assert h["parent"].to_list() == [None, h["id"][0]] and h["depth"].to_list() == [0, 1]
    assert src.meta["instant_events_ignored"] == 1


def test_huge_numbers_do_not_overflow(tmp_path):
    # hand-made: a ts beyond int64 nanoseconds and a 2**70 correlation.
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1e30, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": {"External id": 2**70}},
    ]
    p = tmp_path / "huge.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    _, t = _read(p)
    h = t["host_ops"].sort("name")
    assert h["ts"].to_list() == [None, 5000]
    assert h["external_id"].to_list() == [None, None]


def test_foreign_json_and_empty_file(tmp_path):
    p = tmp_path / "foreign.json"
    p.write_text(json.dumps({"model": "resnet", "epochs": 3}))
    with pytest.raises(IngestError, match="not a Chrome/Kineto trace"):
        _read(p)
    e = tmp_path / "empty.json"
    e.write_bytes(b"")
    with pytest.raises(IngestError, match="empty"):
        _read(e)
    g = tmp_path / "junk.json.gz"
    g.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 20)
    with pytest.raises(IngestError):
        _read(g)


def test_loader_reports_bad_file_and_keeps_others(tmp_path, corpus):
    good = tmp_path / "rank-1.trace.json"
    good.write_bytes(_plain(_hta("tests", "data", "call_stack", "backward_thread.json")))
    bad = tmp_path / "rank-2.trace.json"
    bad.write_text('{"traceEvents": "nope", "schemaVersion": 1}')
    run = ingest(tmp_path, discover(tmp_path), use_cache=False)
    st_ = {s.path.name: s for s in run.sources}
    assert st_["rank-2.trace.json"].status == "error"
    assert "not a Chrome/Kineto trace" in st_["rank-2.trace.json"].detail
    assert "\n" not in st_["rank-2.trace.json"].detail
    assert st_["rank-1.trace.json"].status == "ok"
    assert set(run.tables["host_ops"]["rank"].unique()) == {0}  # distributedInfo says 0; the name said 1


def test_canonical_collective_names():
    c = canonical_collective
    assert c("allreduce") == "all_reduce"
    assert c("_allgather_base") == "all_gather"
    assert c("reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert c("all_gather_into_tensor") == "all_gather"
    assert c("alltoall_base") == "all_to_all"
    assert c("nccl:all_reduce") == "all_reduce"
    assert c("gloo:broadcast") == "broadcast"
    assert c("allreduce_coalesced") == "all_reduce"
    assert c("barrier") == "barrier"
    assert c("_broadcast_oop") == "broadcast" and c("nccl:_reduce_oop") == "reduce"


# ---------------------------------------------------------------------------------------------------------------
# The two parsers: chunked msgspec over Kineto's layout, and the whole-document orjson fallback


def _kineto_layout(data: bytes) -> bool:
    """Whether the text is laid out the way torch.profiler writes it (what the chunked parser cuts at); decided from
    the text itself, not by asking the importer."""
    return b'"traceEvents": [\n  {\n' in data


def _read_whole(path: Path, monkeypatch) -> tuple[Source, dict[str, pl.DataFrame]]:
    """Read with the fast path switched off, so every event goes through orjson and the dict column builder."""
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
        x = a[name].sort(key, nulls_last=True)
        y = b[name].sort(key, nulls_last=True)
        assert_frame_equal(x, y, check_exact=True), name


def _meta(src: Source) -> dict:
    return {k: v for k, v in src.meta.items() if k != "parser"}


@pytest.mark.parametrize("rel", TRACES or ["<corpus absent>"])
def test_fast_and_fallback_parsers_give_identical_tables(rel, corpus, monkeypatch):
    if rel not in MANIFEST:
        pytest.skip("corpus manifest absent")
    src, fast = _read_corpus(rel)
    if _kineto_layout(_plain(HTA / rel)[:1 << 16]):
        assert src.meta["parser"] == "chunks"
    slow_src, slow = _read_whole(HTA / rel, monkeypatch)
    assert slow_src.meta["parser"] == "whole"
    _same_tables(fast, slow)
    assert (src.status, src.detail, src.rank, _meta(src)) == (slow_src.status, slow_src.detail, slow_src.rank, _meta(slow_src))


@pytest.mark.parametrize("rel, block", [
    ("tests/data/nccl_parser_config/nccl_data.json.gz", 256 << 10),  # Kineto's layout, ~40 chunks
    ("tests/data/timeline_analysis/sampled_rank-0.json.gz", 16 << 10),  # one line ("}, {"), ~100 chunks
    ("tests/data/call_stack/backward_thread.json", 512),  # json.dump(indent=4), a few events per chunk
])
def test_tiny_chunks_give_the_same_tables(rel, block, tmp_path, corpus, monkeypatch):
    """Every chunk boundary, string-id and collective-args hand-over is crossed, in each layout."""
    data = _plain(_hta(*rel.split("/")))
    _, whole = _read_corpus(rel)
    monkeypatch.setattr(kineto, "_BLOCK", block)
    src, tiny = _read(_hta(*rel.split("/")))
    assert src.meta["parser"] == "chunks"
    assert len(data) / block > 3  # really several chunks
    _same_tables(whole, tiny)


def _as_kineto_layout(doc: dict) -> bytes:
    """Write a trace the way Kineto does: header keys, then one event per group of lines at two spaces."""
    events = doc["traceEvents"]
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    body = ",\n".join("  {\n    " + json.dumps(e)[1:-1] + "\n  }" for e in events)
    return (json.dumps(head)[:-1] + ',\n  "traceEvents": [\n' + body + "\n  ]\n}\n").encode()


def test_late_args_keys_kept_across_chunks(tmp_path, corpus, monkeypatch):
    doc = json.loads(_plain(_hta(*SMALL)))
    base = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    filler = [dict(base, ts=base["ts"] + 1000 + i * 10, dur=5, args={}) for i in range(3000)]
    late = dict(base, ts=base["ts"] + 90_000, dur=5, args={"External id": 424242, "Collective name": "x"})
    doc["traceEvents"] = doc["traceEvents"] + filler + [late]
    p = tmp_path / "late.json"
    p.write_bytes(_as_kineto_layout(doc))
    monkeypatch.setattr(kineto, "_BLOCK", 32 << 10)
    src, t = _read(p)
    assert src.meta["parser"] == "chunks" and src.status == "ok"
    assert 424242 in t["host_ops"]["external_id"].to_list()
    assert src.meta["events"] == len(doc["traceEvents"])


def test_raw_control_characters_in_kineto_layout(tmp_path, corpus):
    data = _plain(_hta(*SMALL))
    assert _kineto_layout(data)
    bad = data.replace(b'"name": "aten::', b'"name": "aten\x01::', 1)
    assert bad != data
    p = tmp_path / "ctrl.json"
    p.write_bytes(bad)
    src, t = _read(p)
    assert src.meta["parser"] == "chunks" and src.status == "ok"
    assert src.meta["control_chars_escaped"] == 1
    assert sum(n.startswith("aten\x01::") for n in t["host_ops"]["name"].to_list()) == 1
    _, good = _read(_hta(*SMALL))
    assert t["kernels"].height == good["kernels"].height


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(min_value=0.02, max_value=0.999))
def test_truncated_file_fast_path_keeps_what_the_fallback_keeps(frac, tmp_path, corpus, monkeypatch):
    data = _plain(_hta(*SMALL))
    p = tmp_path / "cut.json"
    p.write_bytes(data[: int(len(data) * frac)])
    src, fast = _read(p)
    slow_src, slow = _read_whole(p, monkeypatch)
    assert src.status == slow_src.status == "partial"
    assert "truncated" in src.detail and "byte" in src.detail
    assert src.meta["events"] == slow_src.meta["events"]
    _same_tables(fast, slow)


def test_truncated_after_the_event_array_keeps_header_keys_before_the_break(tmp_path, corpus):
    data = _plain(_hta("tests", "data", "trace_file_list", "inference_rank_1.json.gz"))
    assert data.rstrip().endswith(b"}") and b'"distributedInfo"' in data[data.rfind(b"]"):]
    p = tmp_path / "rank-5.cut.json"
    p.write_bytes(data.rstrip()[:-1].rstrip())  # lose only the closing brace
    src, t = _read(p, rank_from_name=5)
    assert src.status == "partial" and "truncated" in src.detail
    assert src.rank == 1 and src.rank_origin == "distributedInfo"  # distributedInfo sits after the array here
    assert src.meta["events"] == INVENTORY["tests/data/trace_file_list/inference_rank_1.json.gz"]["n_events"]


def test_warm_ingest_from_cache_matches_cold_in_source_order(tmp_path, corpus):
    """Cache hits load in the calling process; a miss among them still goes through the importer; the run's
    tables and sources come out in discovery order either way."""
    for name, rel in (("rank-0.trace.json.gz", SMALL), ("rank-1.trace.json.gz", ("tests", "data", "critical_path",
                                                                                     "simple_add", "benchmark_result_493459_1694039959_trace.json.gz"))):
        (tmp_path / name).write_bytes(_hta(*rel).read_bytes())
    cold = ingest(tmp_path, discover(tmp_path), use_cache=True, jobs=1)
    (tmp_path / "rank-2.trace.json").write_bytes(_plain(_hta(*SMALL)))  # new content: a miss among hits
    warm = ingest(tmp_path, discover(tmp_path), use_cache=True, jobs=1)
    assert [s.path.name for s in warm.sources] == sorted(s.path.name for s in warm.sources)
    assert [s.status for s in warm.sources] == ["ok"] * 3
    for name in ("kernels", "host_ops", "runtime"):
        two = warm.tables[name].filter(pl.col("source").is_in([s.id for s in warm.sources[:2]]))
        assert_frame_equal(two.drop("source"), cold.tables[name].drop("source"))
    assert warm.tables["kernels"].filter(pl.col("source") == warm.sources[2].id).height == \
        cold.tables["kernels"].filter(pl.col("source") == cold.sources[0].id).height


def test_odd_values_in_kineto_layout_go_through_either_parser(tmp_path, corpus, monkeypatch):
    # hand-made from a real trace: a list where a timestamp belongs, a string pid, an object as a name, args that are
    # not an object (msgspec refuses that one: the whole document goes to the fallback, which must cope too).
    doc = json.loads(_plain(_hta(*SMALL)))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[0]["ts"] = [1, 2]
    ops[1]["pid"] = "stream 7"
    ops[2]["name"] = {"not": "a name"}
    p = tmp_path / "odd.json"
    p.write_bytes(_as_kineto_layout(doc))
    src, fast = _read(p)
    assert src.meta["parser"] == "chunks"
    h = fast["host_ops"]
    assert h.filter(pl.col("id").is_null()).height == 0
    assert h["ts"].null_count() == 1
    assert src.meta["string_ids"]["stream 7"] in h["pid"].to_list()
    _, slow = _read_whole(p, monkeypatch)
    _same_tables(fast, slow)
    ops[3]["args"] = ["not", "an", "object"]
    p.write_bytes(_as_kineto_layout(doc))
    src, t = _read(p)
    # msgspec's structs refuse args that are a list: that chunk is read as dicts, the rest stays on the fast path
    assert src.meta["parser"] == "chunks" and src.status == "ok"
    assert t["host_ops"].height == h.height
    _, slow = _read_whole(p, monkeypatch)
    _same_tables(t, slow)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([None, "ac2g", "fwdbwd"]), st.one_of(st.none(), st.integers(0, 4)),
                          st.integers(0, 3)), max_size=40))
def test_flows_pair_the_first_start_and_end_of_each_kind_and_id(rows):
    # starts and ends repeat (a trace written twice, a reused id) and ids may be missing: each (kind, id) keeps its
    # first start and its first end in file order, as unique(keep="first", maintain_order=True) would
    df = pl.DataFrame([{"start": s, "kind": k, "flow_id": i, "pid": p, "tid": p + 10, "ts": n}
                       for n, (s, k, i, p) in enumerate(rows)],
                      schema={"start": pl.Boolean, "kind": pl.Categorical, "flow_id": pl.Int64, "pid": pl.Int64,
                              "tid": pl.Int64, "ts": pl.Int64})
    got = kineto._flows(df)
    first = {}
    for n, (s, k, i, p) in enumerate(rows):
        first.setdefault((s, k, i), (p, p + 10, n))
    want = set()
    for k, i in {(k, i) for s, k, i, _ in rows}:
        a, b = first.get((True, k, i)), first.get((False, k, i))
        if i is None or k is None:  # a null key never pairs: each side on its own row
            want |= {(k, i, *a, None, None, None)} if a else set()
            want |= {(k, i, None, None, None, *b)} if b else set()
        elif a or b:
            want.add((k, i, *(a or (None,) * 3), *(b or (None,) * 3)))
    assert set(got.iter_rows()) == want
    assert got.height == len(want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["ac2g", "fwdbwd", ""]), st.integers(0, 4), st.integers(0, 3)),
                max_size=40), st.sampled_from([0, -7, 1 << 41]))
def test_flows_packed_key_pairs_as_the_two_column_key(rows, shift):
    # no nulls and ids in 0..2^40: (kind, id) is joined as one packed int64; shifted below 0 or past 40 bits the
    # two columns are the key. Both give the same rows, ids shifted back
    df = pl.DataFrame([{"start": s, "kind": k, "flow_id": i, "pid": p, "tid": p + 10, "ts": n}
                       for n, (s, k, i, p) in enumerate(rows)],
                      schema={"start": pl.Boolean, "kind": pl.Categorical, "flow_id": pl.Int64, "pid": pl.Int64,
                              "tid": pl.Int64, "ts": pl.Int64})
    packed = kineto._flows(df)
    other = kineto._flows(df.with_columns(pl.col("flow_id") + shift)).with_columns(pl.col("flow_id") - shift)
    assert packed.schema == other.schema
    assert sorted(packed.iter_rows(), key=repr) == sorted(other.iter_rows(), key=repr)
    pairs = {(k, i) for _, k, i, _ in rows}
    assert packed.height == len(pairs)


def test_collective_args_parse_together_and_one_by_one_where_one_fails():
    # a chunk's collective args are parsed as one JSON list; bytes that are no UTF-8 (orjson refuses them) send them
    # one by one, that one through the stdlib with the bytes replaced; only the collective keys with values are
    # kept, {} for no args
    raws = [b'{"Collective name": "allreduce", "Seq": 3, "dtype": null, "Ev Idx": 1}', None,
            b'{"Process Group Name": "0", "In msg nelems": 4}']
    want = [{"Collective name": "allreduce", "Seq": 3}, {}, {"Process Group Name": "0", "In msg nelems": 4}]
    assert kineto._coll_args(raws) == want
    bad = b'{"Process Group Name": "\xff", "Seq": 5}'
    assert kineto._coll_args([*raws, bad]) == [*want, {"Process Group Name": "\ufffd", "Seq": 5}]
    assert kineto._coll_args([]) == []
