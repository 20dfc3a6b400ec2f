"""Damaged and odd input, read by every importer: losses stay local and are noted, and nothing ends in a traceback.

A fixed-seed subset of benchmarks/fuzz.py (which runs 10,000 cases per importer), plus the cases it taught us, each as
a specification: the salvage of a Kineto trace with one changed byte, the same tables from the C scanner and the
Python path on damaged traces, byte order marks, values of the wrong type in nsys exports, Flight Recorder dumps and
TORCH_TRACE logs (structured by hypothesis), and the environment an nsys export recorded never echoed.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import re
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from conftest import FIXTURES
from traceql.ingest import IngestError, kineto, nsys, read_source
from traceql.model import Source

_spec = importlib.util.spec_from_file_location("fuzz", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

TRACE = FIXTURES / "h200-ddp-eager" / "rank0.pt.trace.json.gz"  # 3,923 events in Kineto's own layout
NSYS = FIXTURES / "h200-sync-memcpy-nsys" / "rank0.nsys.sqlite"


def _events(path: Path, use_kscan: bool, monkeypatch) -> tuple[Source, dict]:
    monkeypatch.setattr(kineto, "_USE_KSCAN", use_kscan)
    src = Source(path, "kineto")
    return src, kineto.read(path, src)


@pytest.fixture(scope="module")
def plain_trace() -> bytes:
    return gzip.decompress(TRACE.read_bytes())


# ---- Kineto: one damaged event costs that event -------------------------------------------------------------------


@pytest.mark.parametrize("use_kscan", [True, False], ids=["C scanner", "msgspec"])
def test_one_changed_byte_inside_trace_events_keeps_the_other_events(plain_trace, tmp_path, monkeypatch, use_kscan):
    lo = plain_trace.index(b"[", plain_trace.index(b'"traceEvents"'))
    hi = plain_trace.rindex(b"]")
    rng = random.Random(16)
    p = tmp_path / "rank0.pt.trace.json"
    dropped = 0
    for _ in range(16):
        pos = rng.randrange(lo, hi + 1)
        data = bytearray(plain_trace)
        data[pos] = (data[pos] + rng.randrange(1, 256)) % 256
        p.write_bytes(data)
        src, _ = _events(p, use_kscan, monkeypatch)
        assert src.meta["events"] >= 0.99 * 3923, (pos, src.detail)
        if src.status == "partial":
            dropped += 1
            m = re.search(r"dropped (\d+) events? that do(?:es)? not parse, in \d+ damaged regions? at byte "
                                        r"(\d+)-(\d+)", src.detail)
            assert m, src.detail
            assert int(m.group(2)) <= pos < int(m.group(3))  # the region named holds the changed byte
            assert src.meta["events"] + int(m.group(1)) >= 3923
    assert dropped >= 4  # most changes inside an event's text break it


def test_damaged_traces_read_the_same_with_and_without_the_scanner(plain_trace, tmp_path, monkeypatch):
    lo = plain_trace.index(b"[", plain_trace.index(b'"traceEvents"'))
    rng = random.Random(5)
    p = tmp_path / "rank0.pt.trace.json"
    for _ in range(6):
        data = bytearray(plain_trace)
        for _ in range(3):
            data[rng.randrange(lo, len(data) - 50)] = rng.randrange(256)
        p.write_bytes(data)
        (sa, ta), (sb, tb) = _events(p, True, monkeypatch), _events(p, False, monkeypatch)
        assert (sa.status, sa.detail, sa.meta | {"parser": 0}) == (sb.status, sb.detail, sb.meta | {"parser": 0})
        assert sorted(ta) == sorted(tb)
        for name in ta:
            key = [c for c in ("id", "step", "kind", "flow_id", "src_ts", "dst_ts") if c in ta[name].columns]
            assert_frame_equal(ta[name].sort(key, nulls_last=True), tb[name].sort(key, nulls_last=True))


def test_every_event_damaged_is_one_clear_error(tmp_path):
    p = tmp_path / "rank0.pt.trace.json"
    p.write_bytes(b'{"traceEvents": [\n  {\n    "ph": "X", "name": "a", "ts": 1 "dur": 2\n  },\n'
                  b'  {\n    "ph": "X", "name": "b" "ts": 1, "dur": 2\n  }\n  ]\n}')
    with pytest.raises(IngestError) as e:
        kineto.read(p, Source(p, "kineto"))
    msg = str(e.value)
    assert "no trace event parses" in msg and "byte" in msg and "\n" not in msg and "truncated" not in msg


def test_a_byte_order_mark_is_skipped(plain_trace, tmp_path, monkeypatch):
    p = tmp_path / "rank0.pt.trace.json"
    p.write_bytes(b"\xef\xbb\xbf" + plain_trace)
    for use in (True, False):
        src, t = _events(p, use, monkeypatch)
        assert src.status == "ok" and src.meta["events"] == 3923
        assert src.rank == 0  # the header (distributedInfo) was read too


def test_a_utf16_trace_is_recognised_and_read(plain_trace, tmp_path):
    p = tmp_path / "rank0.pt.trace.json"
    p.write_bytes(b"\xff\xfe" + plain_trace.decode().encode("utf-16-le"))
    assert kineto.sniff(p, p.read_bytes()[:4096])
    src = Source(p, "kineto")
    kineto.read(p, src)
    assert src.meta["events"] == 3923 and src.meta["encoding"] == "utf-16"


def test_odd_values_where_scalars_belong_become_nulls(tmp_path, monkeypatch):
    evs = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": 1, "args": a}
           for n, ts, a in [("ok", 10, {}), ([["deep"] * 3], 11, "a string"), ({"x": 1}, 2**70, ["a", "list"]),
                            (5, 13.5, None), ("deep", [[[[[[1]]]]]], {"External id": {"a": 1}})]]
    p = tmp_path / "rank0.pt.trace.json"
    p.write_text('{"traceEvents": [\n  ' + ",\n  ".join(json.dumps(e) for e in evs) + "\n  ]\n}")
    got = [_events(p, use, monkeypatch) for use in (True, False)]
    for src, t in got:
        assert src.status == "ok" and src.meta["events"] == 5
        h = t["host_ops"].sort("id")
        assert h["name"].to_list() == ["ok", None, None, "5", "deep"]
        assert h["ts"].null_count() == 2 and h["external_id"].null_count() == 5
    assert_frame_equal(got[0][1]["host_ops"].sort("id"), got[1][1]["host_ops"].sort("id"))


# ---- nsys: odd column types, missing tables, and the recorded environment ----------------------------------------


def _export(tmp_path: Path, *sql: str, env: str = "API_TOKEN=hunter2-secret-value") -> Path:
    p = tmp_path / "rank0.nsys.sqlite"
    shutil.copyfile(NSYS, p)
    con = sqlite3.connect(p)
    con.execute("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)", (env,))
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return p


@pytest.mark.parametrize("sql", [
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'hunter2-secret-value' WHERE rowid % 5 = 0",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = x'00ff' WHERE rowid = 3",
    "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 1.5",
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 9223372036854775807",
    "UPDATE StringIds SET value = 17 WHERE id % 3 = 0",
    "UPDATE NVTX_EVENTS SET start = 'x' WHERE rowid % 2 = 0",
    "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME",
    "ALTER TABLE META_DATA_EXPORT DROP COLUMN value",
    "ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind",
])
def test_nsys_odd_values_read_as_nulls_and_no_recorded_value_is_echoed(tmp_path, sql):
    p = _export(tmp_path, sql)
    src = Source(p, "nsys", rank=0, rank_origin="file name")
    tables = read_source(src)  # every one of these reads (a refusal would now fail here, not pass quietly)
    text = f"{src.detail} {json.dumps(src.meta, default=str)}"
    assert tables["kernels"].height > 0
    assert "hunter2" not in text


def test_nsys_internal_errors_do_not_quote_the_export(tmp_path, monkeypatch):
    p = _export(tmp_path)

    def boom(*a, **k):
        raise ValueError("could not append value: \"hunter2-secret-value\" of type: str; API_TOKEN=hunter2-secret-value")

    monkeypatch.setattr(nsys, "_steps", boom)
    with pytest.raises(RuntimeError) as e:
        nsys.read(p, Source(p, "nsys"))
    assert "hunter2" not in str(e.value) and "ValueError" in str(e.value)


def test_a_damaged_sqlite_page_is_one_clear_error(tmp_path):
    p = tmp_path / "rank0.nsys.sqlite"
    data = bytearray(NSYS.read_bytes())
    for i in range(4096, len(data), 997):
        data[i] = 0xD4
    p.write_bytes(data)
    with pytest.raises(IngestError) as e:
        read_source(Source(p, "nsys"))
    assert "\n" not in str(e.value) and p.name in str(e.value)


# ---- Flight Recorder and TORCH_TRACE: structured odd values (hypothesis) ------------------------------------------

_odd = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_entry = st.fixed_dictionaries({}, optional={
    "record_id": _odd, "pg_id": _odd, "collective_seq_id": _odd, "p2p_seq_id": _odd, "profiling_name": st.one_of(
        st.sampled_from(["nccl:all_reduce", "nccl:send", "gloo:broadcast", ""]), _odd),
    "process_group": st.one_of(st.tuples(_odd, _odd), _odd), "time_created_ns": _odd, "input_sizes": st.one_of(
        st.lists(st.lists(st.one_of(st.integers(-3, 2**40), _odd), max_size=3), max_size=2), _odd),
    "output_sizes": _odd, "input_dtypes": st.one_of(st.lists(st.sampled_from(["Float", "BFloat16", "x"])), _odd),
    "state": _odd, "timeout_ms": _odd, "is_p2p": _odd, "time_discovered_completed_ns": _odd,
})
_dump = st.fixed_dictionaries({"entries": st.lists(st.one_of(_entry, _entry, _odd), max_size=6)}, optional={
    "version": _odd, "pg_config": st.one_of(st.dictionaries(st.text(max_size=2), st.one_of(
        st.fixed_dictionaries({"name": _odd, "desc": _odd, "ranks": _odd}), _odd), max_size=2), _odd),
    "pg_status": st.one_of(st.dictionaries(st.text(max_size=2), st.one_of(st.dictionaries(
        st.sampled_from(["last_enqueued_collective", "last_completed_collective"]), _odd), _odd), max_size=2), _odd),
    "nccl_version": _odd, "rank": _odd,
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dump=_dump, as_json=st.booleans())
def test_flight_recorder_dumps_with_odd_values_never_raise_a_traceback(tmp_path, dump, as_json):
    import pickle

    p = tmp_path / ("nccl_trace_rank_3.json" if as_json else "nccl_trace_rank_3")
    if as_json:
        p.write_bytes(orjson.dumps(dump, option=orjson.OPT_NON_STR_KEYS, default=str)
                      if not _big(dump) else json.dumps(dump, default=str).encode())
    else:
        p.write_bytes(pickle.dumps(dump))
    try:
        read_source(Source(p, "flight_recorder", rank=3, rank_origin="file name"))
    except IngestError as e:
        assert "\n" not in str(e)


def _big(x) -> bool:
    if isinstance(x, int):
        return not -(1 << 63) <= x < (1 << 64)
    if isinstance(x, dict):
        return any(_big(k) or _big(v) for k, v in x.items())
    if isinstance(x, list | tuple):
        return any(_big(v) for v in x)
    return False


_record = st.fixed_dictionaries({}, optional={
    "frame_id": _odd, "frame_compile_id": _odd, "attempt": _odd, "rank": _odd, "has_payload": _odd,
    "dynamo_start": st.one_of(st.fixed_dictionaries({"stack": _odd}), _odd),
    "artifact": st.one_of(st.fixed_dictionaries({"name": st.one_of(st.sampled_from(
        ["dynamo_graph_break_reason", "recompile_reasons", "fx_graph_cache_miss"]), _odd), "encoding": _odd}), _odd),
    "compilation_metrics": st.one_of(st.dictionaries(st.sampled_from(
        ["compile_id", "frame_key", "co_name", "graph_op_count", "entire_frame_compile_time_s", "fail_reason"]), _odd,
        max_size=4), _odd),
    "guard_added": _odd, "chromium_event": _odd, "str": _odd,
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_record, min_size=1, max_size=6))
def test_torch_trace_records_with_odd_values_never_raise_a_traceback(tmp_path, records):
    p = tmp_path / "dedicated_log_torch_trace_rank_0_x.log"
    lines = [f"V1201 10:00:0{i % 10}.000000 100 torch/_dynamo/x.py:1] " + json.dumps(r, default=str)
             for i, r in enumerate(records)]
    p.write_text("\n".join(lines) + "\n")
    try:
        read_source(Source(p, "torch_trace", rank=0, rank_origin="file name"))
    except IngestError as e:
        assert "\n" not in str(e)


# ---- the fuzz harness itself, a fixed-seed subset -----------------------------------------------------------------


@pytest.mark.parametrize("target,cases", [("kineto-c", 30), ("kineto-py", 30), ("nsys", 20), ("torch_trace", 40),
                                          ("nccl_log", 40), ("fr_pickle", 40), ("fr_json", 40), ("rules", 40)])
def test_fuzz_subset_has_no_tracebacks_hangs_crashes_or_leaks(target, cases):
    results: list = []
    fuzz.run_target(target, cases, seed=11, cap=60, jobs=1, batch=cases, results=results)
    s = fuzz.summarise(target, results)
    assert s["cases"] == cases
    assert (s["traceback"], s["hang"], s["crash"], s["leak"]) == (0, 0, 0, 0), s["classes"]
    assert s["ok"] + s["partial"] > 0  # the mutations leave something readable: the harness reads, not just refuses


def test_fuzz_cases_are_reproducible_from_their_number(tmp_path):
    seeds = fuzz.seeds("torch_trace", tmp_path)
    a = fuzz.make_case("torch_trace", 17, 3, seeds, tmp_path)
    b = fuzz.make_case("torch_trace", 17, 3, seeds, tmp_path)
    assert a == b and a != fuzz.make_case("torch_trace", 18, 3, seeds, tmp_path)


def test_a_crashing_case_is_counted_and_the_batch_goes_on(monkeypatch, tmp_path):
    """A segfault in a worker is one crash, pinned to its case; the cases after it still run."""
    real = fuzz._spawn

    def spawn(target, start, count, seed, cap, err):
        if start <= 2 < start + count:  # the batch holding case 2: a worker that dies on it
            import subprocess
            import sys
            code = ("import os, sys\nfor i in range(%d, %d):\n    print(f'S {i}', flush=True)\n"
                    "    if i == 2: os.abort()\n    print('R {\"outcome\": \"ok\", \"case\": %%d}' %% i, flush=True)"
                    % (start, start + count))
            return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err)
        return real(target, start, count, seed, cap, err)

    monkeypatch.setattr(fuzz, "_spawn", spawn)
    results: list = []
    fuzz.run_target("rules", 5, seed=0, cap=30, jobs=1, batch=5, results=results)
    s = fuzz.summarise("rules", results)
    assert s["crash"] == 1 and s["cases"] == 5 and [r["case"] for r in results if r["outcome"] == "crash"] == [2]
