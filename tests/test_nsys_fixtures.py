"""Nsight Systems importer on the project's own H200 captures (fixtures/h200-*-nsys): the twins of test_nsys.py's
corpus tests, so that CI (where ../shared/corpus is absent) still reads real exports.

The oracle is plain SQL over the same export, never the importer's output. Edited or damaged exports are copies made
in tmp_path from the fixtures (never committed). The capture's exports hold one process each, on nsys 2025.3.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from conftest import FIXTURES
from traceql.ingest import IngestError, nsys
from traceql.model import Source

REPO = Path(__file__).resolve().parents[1]
EXPOSED = FIXTURES / "h200-exposed-allreduce-nsys"
HOST_SYNC = FIXTURES / "h200-host-sync-per-step-nsys"
EXPORTS = [EXPOSED / "rank0.nsys.sqlite", EXPOSED / "rank1.nsys.sqlite", HOST_SYNC / "rank0.nsys.sqlite"]
IDS = ["exposed-rank0", "exposed-rank1", "host-sync-rank0"]


def _sql(path: Path, q: str, args=()):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(q, args).fetchall()
    finally:
        con.close()


def _read(path: Path, **kw) -> tuple[Source, dict[str, pl.DataFrame]]:
    src = Source(Path(path), "nsys", **kw)
    return src, nsys.read(Path(path), src)


_CACHE: dict[Path, tuple[Source, dict]] = {}


def _cached(path: Path):
    if path not in _CACHE:
        _CACHE[path] = _read(path)
    return _CACHE[path]


def _pid(path: Path) -> int:
    (pid,) = [r[0] for r in _sql(path, "SELECT DISTINCT (globalPid >> 24) & 0xFFFFFF FROM CUPTI_ACTIVITY_KIND_KERNEL")]
    return pid


def _env_rank(path: Path) -> int:
    """RANK as the capture's environment recorded it (META_DATA_CAPTURE), read here with SQL."""
    (v,) = [v for (v,) in _sql(path, "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'")
            if v.startswith("RANK=")]
    return int(v.split("=", 1)[1].strip('"'))


def _copy(src: Path, tmp_path: Path, name="edited.sqlite") -> Path:
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


@pytest.fixture(params=EXPORTS, ids=IDS)
def export(request) -> Path:
    return request.param


# ---------------------------------------------------------------------------------------------------------------
# Tables against SQL


def test_kernel_counts_match_sql(export):
    src, t = _cached(export)
    rank = _env_rank(export)
    assert src.ranks == [rank] and src.rank_origin == "env RANK"
    k = t["kernels"]
    assert set(k["rank"]) == {rank}
    for table, kinds in (("KERNEL", ("compute", "comm")), ("MEMCPY", ("memcpy",)), ("MEMSET", ("memset",))):
        want, busy = _sql(export, f'SELECT count(*), coalesce(sum("end" - start), 0) FROM CUPTI_ACTIVITY_KIND_{table}')[0]
        got = k.filter(pl.col("kind").is_in(kinds))
        assert got.height == want > 0, table
        assert got["dur"].sum() == busy
    # no NCCL kernel in these captures (gloo, or NCCL with one rank): nothing may be classed as communication
    nccl = _sql(export, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                           WHERE s.value LIKE 'nccl%'""")[0][0]
    assert k.filter(pl.col("kind") == "comm").height == nccl


def test_kernels_join_their_launch_on_correlation_and_process(export):
    _, t = _cached(export)
    k, r = t["kernels"], t["runtime"]
    joined = k.join(r.select("rank", "pid", "correlation", pl.col("ts").alias("api_ts")),
                    on=["rank", "pid", "correlation"], how="inner")
    want = _sql(export, """SELECT count(*) FROM (
                             SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
                             SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
                             SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) g
                           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId
                            AND (r.globalTid >> 24) = (g.globalPid >> 24)""")[0][0]
    assert joined.height == want > 0
    assert (joined["api_ts"] <= joined["ts"]).all()


def test_runtime_names_lose_version_suffix_and_get_kinds(export):
    _, t = _cached(export)
    r = t["runtime"]
    assert not r["name"].str.contains(r"_v\d{4,}$").any()  # cudaLaunchKernel_v7000 -> cudaLaunchKernel
    raw = {v for (v,) in _sql(export, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId")}
    assert "cudaLaunchKernel_v7000" in raw and "cuGetProcAddress_v2" in raw
    kinds = dict(r.group_by("name").agg(pl.col("kind").first()).iter_rows())
    assert kinds["cudaLaunchKernel"] == "launch" and kinds["cuLaunchKernel"] == "launch"
    assert kinds["cudaStreamSynchronize"] == "sync" and kinds["cudaDeviceSynchronize"] == "sync"
    assert kinds["cudaMemcpyAsync"] == "memcpy" and kinds["cudaMemsetAsync"] == "memset"
    assert kinds["cudaEventRecord"] == "event_record" and kinds["cudaStreamWaitEvent"] == "event_wait"
    assert kinds["cuGetProcAddress_v2"] == "other"  # only a final _vNNNN is a version suffix
    want = _sql(export, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE (globalTid >> 24) & 0xFFFFFF = ?",
                (_pid(export),))[0][0]
    assert r.height == want and set(r["pid"]) == {_pid(export)}


def test_sync_kinds_follow_the_sync_type_enum(export):
    _, t = _cached(export)
    names = {"CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE": "event_sync",
             "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT": "stream_wait_event",
             "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE": "stream_sync",
             "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE": "context_sync"}
    want = {names[e]: n for e, n in _sql(export, """SELECT e.name, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s
                                                    JOIN ENUM_CUPTI_SYNC_TYPE e ON e.id = s.syncType GROUP BY 1""")}
    assert dict(t["syncs"].group_by("kind").len().iter_rows()) == want and want


def test_memcpy_copy_and_memory_kinds_from_enums(export):
    _, t = _cached(export)
    want = {}
    for c, s, d, n in _sql(export, """SELECT ck.name, sk.name, dk.name, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                                      JOIN ENUM_CUDA_MEMCPY_OPER ck ON ck.id = m.copyKind
                                      JOIN ENUM_CUDA_MEM_KIND sk ON sk.id = m.srcKind
                                      JOIN ENUM_CUDA_MEM_KIND dk ON dk.id = m.dstKind GROUP BY 1, 2, 3"""):
        op = c.rsplit("_", 1)[1]  # DTOH
        want[(op[0] + "to" + op[3], s.rsplit("_", 1)[1].lower(), d.rsplit("_", 1)[1].lower())] = n
    got = {tuple(k): n for *k, n in t["kernels"].filter(pl.col("kind") == "memcpy")
           .group_by("copy_kind", "src_memory", "dst_memory").len().iter_rows()}
    assert got == want and ("HtoD", "pageable", "device") in got  # the captures copy from pageable memory


def test_nvtx_ranges_become_nested_host_ops(export):
    _, t = _cached(export)
    h = t["host_ops"]
    want = _sql(export, """SELECT count(*) FROM NVTX_EVENTS WHERE "end" IS NOT NULL AND eventType IN (59, 60)
                           AND (globalTid >> 24) & 0xFFFFFF = ?""", (_pid(export),))[0][0]
    assert h.height == want > 0 and set(h["cat"]) == {"nvtx"}
    by_id = {}
    for _, g in h.group_by(["pid", "tid"]):
        stack: list[tuple[int, int]] = []
        for r in g.sort(["ts", "end"], descending=[False, True]).iter_rows(named=True):
            while stack and stack[-1][1] <= r["ts"]:
                stack.pop()
            by_id[r["id"]] = (len(stack), stack[-1][0] if stack else None)
            stack.append((r["id"], r["end"]))
    assert all(by_id[i] == (d, p) for i, d, p in h.select("id", "depth", "parent").iter_rows())


def test_nccl_ranges_nest_inside_the_nvtx_steps():
    # NCCL's own NVTX ranges (ncclBroadcast, ...) run inside the capture's "step N" ranges in this export
    _, t = _cached(HOST_SYNC / "rank0.nsys.sqlite")
    h = t["host_ops"]
    inner = h.filter(pl.col("depth") >= 1)
    assert inner.height > 0 and inner["name"].str.starts_with("nccl").all()
    parents = h.join(inner.select(pl.col("parent").alias("id")), on="id", how="semi")
    assert parents["name"].str.starts_with("step ").all()


def test_steps_from_the_captures_nvtx_ranges(export, tmp_path, monkeypatch):
    _, t = _cached(export)
    want = sorted((int(text.split()[1]), e - s) for text, s, e in _sql(
        export, """SELECT text, start, "end" FROM NVTX_EVENTS WHERE text LIKE 'step %' AND (globalTid >> 24) & 0xFFFFFF = ?""",
        (_pid(export),)))
    steps = t["steps"].sort("step")
    assert list(zip(steps["step"], steps["dur"])) == want and len(want) >= 2
    assert set(steps["origin"]) == {"nvtx"} and set(steps["rank"]) == {_env_rank(export)}
    # a pattern of one's own replaces the default: add an "iter-9" range in a copy and ask for it alone
    p = _copy(export, tmp_path)
    lo, hi = want and _sql(export, 'SELECT min(start), max("end") FROM NVTX_EVENTS')[0]
    gtid = _sql(export, "SELECT globalTid FROM NVTX_EVENTS WHERE text LIKE 'step %' LIMIT 1")[0][0]
    con = sqlite3.connect(p)
    con.execute('INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)',
                (lo, hi, "iter-9", gtid))
    con.commit()
    con.close()
    monkeypatch.setenv(nsys.STEP_PATTERN_ENV, r"^iter-(\d+)$")
    _, t2 = _read(p)
    assert t2["steps"]["step"].to_list() == [9]


def test_target_clock_exports_are_not_shifted(export):
    src, t = _cached(export)
    assert src.meta["nsys_version"] == _sql(export, "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'")[0][0]
    assert src.meta["time_base"] == "target clock"
    first = _sql(export, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert t["kernels"].filter(pl.col("kind") == "compute")["ts"].min() == first
    assert src.meta["gpus"] == [g for (g,) in _sql(export, "SELECT name FROM TARGET_INFO_GPU")]


def test_session_relative_copy_is_shifted_back_to_the_target_clock(tmp_path):
    """A copy rewritten the way nsys 2026.1 writes exports: times relative to ANALYSIS_DETAILS.startTime."""
    orig = EXPORTS[0]
    p = _copy(orig, tmp_path)
    (start,) = _sql(orig, "SELECT startTime FROM ANALYSIS_DETAILS")[0]
    con = sqlite3.connect(p)
    con.execute("UPDATE META_DATA_EXPORT SET value = '2026.1.1.0' WHERE name = 'EXPORT_PRODUCT_VERSION'")
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS"):
        con.execute(f'UPDATE {table} SET start = start - ?, "end" = "end" - ?', (start, start))
    con.commit()
    con.close()
    src, t = _read(p)
    assert "session-relative" in src.meta["time_base"]
    _, base = _cached(orig)
    assert t["kernels"]["ts"].sort().to_list() == base["kernels"]["ts"].sort().to_list()
    assert t["steps"]["ts"].to_list() == base["steps"]["ts"].to_list()


def test_missing_target_info_gpu_and_nvtx_tables_are_fine(tmp_path):
    # nsys writes a table only when it has rows: drop the two a time-sliced export may lack
    p = _copy(EXPORTS[0], tmp_path)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE TARGET_INFO_GPU")
    con.execute("DROP TABLE NVTX_EVENTS")
    con.commit()
    con.close()
    src, t = _read(p)
    assert src.status == "ok" and "gpus" not in src.meta
    assert t["steps"].height == 0 and t["host_ops"].height == 0
    assert t["kernels"].height == _cached(EXPORTS[0])[1]["kernels"].height


def test_no_sensitive_value_in_meta_or_detail(export, monkeypatch):
    monkeypatch.delenv(nsys.SENSITIVE_ENV, raising=False)
    src, tables = _read(export)
    secrets = {v for (v,) in _sql(export, """SELECT value FROM META_DATA_EXPORT WHERE name IN
                                               ('EXPORT_HOST', 'EXPORT_USER', 'EXPORT_PARAM_INPUT_PATH_ABS')""") if v}
    secrets |= {v for (v,) in _sql(export, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'") if v}
    for (v,) in _sql(export, "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"):
        val = v.split("=", 1)[-1].strip('"')
        if len(val) >= 6:
            secrets.add(val)
    text = repr(src.meta) + src.detail + repr(src.host)
    strings = " ".join(" ".join(df[c].drop_nulls().unique().to_list()) for df in tables.values()
                       for c in df.columns if df[c].dtype == pl.Utf8 and c != "name")
    leaked = [s for s in secrets if s in text or s in strings]
    assert len(secrets) > 5 and not leaked  # the capture's path, MASTER_PORT, PATH, ...
    monkeypatch.setenv(nsys.SENSITIVE_ENV, "1")
    src2, _ = _read(export)
    assert src2.host is not None


# ---------------------------------------------------------------------------------------------------------------
# Edited and damaged copies (tmp_path only)


def test_rank_from_recorded_environment_never_echoes_env(tmp_path):
    p = _copy(EXPORTS[0], tmp_path)
    con = sqlite3.connect(p)
    con.execute("""UPDATE META_DATA_CAPTURE SET value = 'RANK="3"'
                   WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE' AND value LIKE 'RANK=%'""")
    assert con.total_changes == 1
    con.commit()
    con.close()
    src, t = _read(p)
    assert src.rank == 3 and src.ranks == [3] and src.rank_origin == "env RANK"
    assert set(t["kernels"]["rank"]) == {3}
    assert "RANK=" not in src.detail and "3" not in src.detail


def test_file_name_rank_beats_process_order_for_a_single_process(tmp_path):
    p = _copy(EXPORTS[0], tmp_path, "trace_rank5.sqlite")
    con = sqlite3.connect(p)  # no RANK in the environment: the file name is the best evidence left
    con.execute("DELETE FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE' AND value LIKE 'RANK=%'")
    con.commit()
    con.close()
    src, t = _read(p, rank=5, rank_origin="file name")
    assert src.rank == 5 and src.rank_origin == "file name" and set(t["runtime"]["rank"]) == {5}


def test_truncated_export(tmp_path):
    orig = EXPORTS[2]
    p = tmp_path / "cut.sqlite"
    p.write_bytes(orig.read_bytes()[: orig.stat().st_size // 3])
    with pytest.raises(IngestError) as e:
        _read(p)
    msg = str(e.value)
    assert "\n" not in msg and "cut.sqlite" in msg and ("truncated or corrupt" in msg or "not an Nsight" in msg)


def test_locked_export(tmp_path):
    p = _copy(EXPORTS[0], tmp_path)
    writer = sqlite3.connect(p, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(IngestError, match="locked"):
            _read(p)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_bad_export_does_not_stop_the_others(tmp_path):
    from traceql.ingest.loader import ingest

    orig = EXPORTS[1]
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(orig.read_bytes()[:5000])
    good = _copy(orig, tmp_path, "good.sqlite")
    run = ingest(tmp_path, [Source(bad, "nsys", id=0), Source(good, "nsys", id=1)], use_cache=False)
    assert [s.status for s in run.sources] == ["error", "ok"]
    want = _sql(orig, """SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL) + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY)
                              + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET)""")[0][0]
    assert run.tables["kernels"].height == want
    assert set(run.tables["kernels"]["source"]) == {1}


# ---------------------------------------------------------------------------------------------------------------
# Rules TQL204-TQL208 on the exports (expected counts from SQL)


def _run_of(path: Path):
    from traceql.ingest.loader import ingest

    return ingest(path.parent, [Source(path, "nsys", id=0)], use_cache=False)


def _findings(run, rule_id: str, **params):
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    rule = next(r for r in load_rules([REPO / "rules"]) if r.id == rule_id)
    res = evaluate(run, rule, params or None)
    assert res.status == "ran", res.reason
    return res.findings


def _api_copies(path: Path, api_like: str, table: str, extra: str = "") -> int:
    return _sql(path, f"""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{table} g
                          JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId
                           AND (r.globalTid >> 24) = (g.globalPid >> 24)
                          JOIN StringIds s ON s.id = r.nameId
                          WHERE s.value LIKE '{api_like}' {extra}""")[0][0]


def test_tql205_pageable_async_memcpy(export):
    run = _run_of(export)
    want = _api_copies(export, "cudaMemcpy%Async%", "MEMCPY", "AND (g.srcKind = 0 OR g.dstKind = 0)")
    # count_outside_steps=1: every copy of the run, as nsys's own rule counts them (start-up copies too)
    fs = _findings(run, "TQL205", count_outside_steps=1)
    assert sum(f.evidence["n_all"] for f in fs) == want > 0
    assert {r for f in fs for r in f.ranks} == {_env_rank(export)}
    sync = _api_copies(export, "cudaMemcpy\\_v%", "MEMCPY", "ESCAPE '\\' AND g.copyKind <> 8")
    assert sync == 0 and _findings(run, "TQL204") == []  # every copy here is cudaMemcpyAsync


def test_tql207_counts_stream_synchronize(export):
    run = _run_of(export)
    want = _sql(export, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                           WHERE s.value LIKE 'cudaStreamSynchronize%'""")[0][0]
    got = {f.evidence["call"]: f.evidence["n"] for f in _findings(run, "TQL207")}
    assert got.get("cudaStreamSynchronize", 0) == want
    assert _findings(run, "TQL207", min_blocked_ms=1e9) == []


def test_tql204_fires_when_the_copy_is_synchronous(tmp_path):
    p = _copy(HOST_SYNC / "rank0.nsys.sqlite", tmp_path)
    con = sqlite3.connect(p)
    con.execute("UPDATE StringIds SET value = 'cudaMemcpy_v3020' WHERE value LIKE 'cudaMemcpyAsync%'")
    con.commit()
    con.close()
    want = {}
    for op, n in _sql(p, """SELECT ck.name, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY g
                            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId
                             AND (r.globalTid >> 24) = (g.globalPid >> 24)
                            JOIN StringIds s ON s.id = r.nameId JOIN ENUM_CUDA_MEMCPY_OPER ck ON ck.id = g.copyKind
                            WHERE s.value = 'cudaMemcpy_v3020' AND ck.name <> 'CUDA_MEMCPY_KIND_DTOD' GROUP BY 1"""):
        o = op.rsplit("_", 1)[1]
        want[o[0] + "to" + o[3]] = n
    got = {f.evidence["copy_kind"]: f.evidence["n"] for f in _findings(_run_of(p), "TQL204")}
    assert got == want and set(want) >= {"HtoD", "DtoH"}


def test_tql206_fires_on_synchronous_memset_of_pinned_memory_only(tmp_path):
    orig = HOST_SYNC / "rank0.nsys.sqlite"
    p = _copy(orig, tmp_path)
    con = sqlite3.connect(p)
    con.execute("UPDATE StringIds SET value = 'cudaMemset_v3020' WHERE value LIKE 'cudaMemsetAsync%'")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET memKind = 1 WHERE rowid % 3 = 0")
    con.commit()
    con.close()
    want = _api_copies(p, "cudaMemset%", "MEMSET", "AND g.memKind IN (1, 4)")
    got = sum(f.evidence["n"] for f in _findings(_run_of(p), "TQL206"))
    assert got == want > 0
    assert _findings(_run_of(orig), "TQL206") == []  # the original: async memsets of device memory


def test_gpu_time_util_matches_a_brute_force_chunking(export):
    from traceql.link.gpu_util import CHUNKS, gpu_time_util

    run = _run_of(export)
    util = gpu_time_util(run)
    k = run.tables["kernels"]
    for (rank, device), ops in k.group_by(["rank", "device"]):
        spans = list(zip(ops["ts"].to_list(), ops["end"].to_list()))
        t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
        size = -(-(t1 - t0) // CHUNKS)
        mine = util.filter((pl.col("rank") == rank) & (pl.col("device") == device)).sort("chunk")
        assert mine.height == CHUNKS
        for c, busy_ms in zip(mine["chunk"].to_list(), mine["busy_ms"].to_list()):
            cs, ce = t0 + c * size, min(t0 + (c + 1) * size, t1)
            busy = sum(max(0, min(b, ce) - max(a, cs)) for a, b in spans)
            assert abs(busy / 1e6 - busy_ms) < 1e-9
        assert abs(mine["busy_ms"].sum() * 1e6 - ops["dur"].sum()) < 1


def test_tql208_threshold_is_a_parameter(export):
    run = _run_of(export)
    assert all(f.evidence["util_pct"] < 50 for f in _findings(run, "TQL208"))
    every = _findings(run, "TQL208", max_util_pct=1000.0)
    assert [f.ranks for f in every] == [[_env_rank(export)]]


def test_gpu_time_util_uses_one_source_per_rank():
    """One rank seen by two sources on different clocks (as a Kineto trace and an nsys export of one process are):
    the chunks follow the source with the most GPU time, never a span across both clocks."""
    from traceql.link.gpu_util import gpu_time_util
    from traceql.model import Run, concat

    run = _run_of(EXPORTS[0])
    k0 = run.tables["kernels"]
    other = k0.head(k0.height // 3).with_columns(pl.lit(7, dtype=pl.Int32).alias("source"),
                                                 pl.col("ts") + 10**12, pl.col("end") + 10**12)
    two = Run(path=EXPORTS[0], tables={"kernels": concat("kernels", [k0, other])})
    util = gpu_time_util(two)
    assert util["ts"].min() == k0["ts"].min() and util["end"].max() == k0["end"].max()
    assert abs(util["busy_ms"].sum() * 1e6 - k0["dur"].sum()) < 1


@pytest.mark.parametrize("path", [EXPORTS[0], EXPORTS[2]], ids=[IDS[0], IDS[2]])
def test_fast_and_standard_readers_agree(path, monkeypatch):
    if nsys._adbc() is None:
        pytest.skip("adbc-driver-sqlite not installed (optional fast reader)")
    monkeypatch.delenv(nsys.READER_ENV, raising=False)
    fast_src, fast = _read(path)
    monkeypatch.setenv(nsys.READER_ENV, "sqlite3")
    std_src, std = _read(path)
    assert (fast_src.meta["reader"], std_src.meta["reader"]) == ("adbc", "sqlite3")
    assert fast.keys() == std.keys()
    for name in fast:
        assert fast[name].equals(std[name]), name
