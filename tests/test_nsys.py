"""Nsight Systems SQLite exports: the importer against real exports (the reference corpus), plain SQL as the oracle.

Expected numbers are computed here with SQLite queries over the same file, never taken from the importer's output.
Broken and edited exports are made in tmp_path from corpus files (copies, never committed).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import CORPUS, FIXTURES, corpus_path
from traceql.ingest import IngestError, nsys
from traceql.model import Source

NSYS = corpus_path("nsys")
MFU = NSYS / "mfu_2gpu_before.sqlite"
H100 = NSYS / "h100_2gpu_1s.sqlite"
MOCK = NSYS / "mock.sqlite"
needs_corpus = pytest.mark.skipif(not NSYS.is_dir(), reason=f"reference corpus not present at {CORPUS}")


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


def _gpu_processes(path: Path) -> list[int]:
    """pids with kernels/memcpy/memset, in the order the importer documents: first device used, then pid."""
    q = """SELECT (globalPid >> 24) & 0xFFFFFF AS pid, min(deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1
           ORDER BY 2, 1"""
    return [r[0] for r in _sql(path, q)]


# ---------------------------------------------------------------------------------------------------------------
# Real exports


@needs_corpus
@pytest.mark.parametrize("path", [MFU, H100, MOCK], ids=lambda p: p.name)
def test_kernel_counts_per_rank_match_sql(path):
    src, t = _cached(path)
    pids = _gpu_processes(path)
    assert src.ranks == list(range(len(pids)))
    k = t["kernels"]
    for rank, pid in enumerate(pids):
        for table, kinds in (("KERNEL", ("compute", "comm")), ("MEMCPY", ("memcpy",)), ("MEMSET", ("memset",))):
            if not _sql(path, "SELECT 1 FROM sqlite_master WHERE name = ?", (f"CUPTI_ACTIVITY_KIND_{table}",)):
                continue
            want, busy = _sql(path, f"""SELECT count(*), coalesce(sum("end" - start), 0) FROM CUPTI_ACTIVITY_KIND_{table}
                                        WHERE (globalPid >> 24) & 0xFFFFFF = ?""", (pid,))[0]
            got = k.filter((pl.col("rank") == rank) & pl.col("kind").is_in(kinds))
            assert got.height == want, (table, rank)
            assert got["dur"].sum() == busy


@needs_corpus
def test_two_rank_training_has_nccl_kernels_as_comm_with_collective():
    src, t = _cached(MFU)
    assert src.ranks == [0, 1] and src.rank is None and src.rank_origin == "process order"
    want = dict(_sql(MFU, """SELECT (k.globalPid >> 24) & 0xFFFFFF, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                             JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%' GROUP BY 1"""))
    comm = t["kernels"].filter(pl.col("kind") == "comm")
    for rank, pid in enumerate(_gpu_processes(MFU)):
        assert comm.filter(pl.col("rank") == rank).height == want[pid]
    assert set(comm["collective"]) == {"send_recv"}  # ncclDevKernel_SendRecv
    assert t["kernels"].filter(pl.col("kind") == "compute")["collective"].null_count() == \
        t["kernels"].filter(pl.col("kind") == "compute").height


@needs_corpus
def test_kernels_join_their_launch_on_correlation_and_process():
    _, t = _cached(MFU)
    k, r = t["kernels"], t["runtime"]
    joined = k.join(r.select("rank", "pid", "correlation", pl.col("name").alias("api"), pl.col("ts").alias("api_ts")),
                    on=["rank", "pid", "correlation"], how="inner")
    # The same join in plain SQL over the export, on correlation AND process.
    want = _sql(MFU, """SELECT count(*) FROM (
                          SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
                          SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
                          SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) g
                        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId
                         AND (r.globalTid >> 24) = (g.globalPid >> 24)""")[0][0]
    assert joined.height == want > 0
    assert (joined["api_ts"] <= joined["ts"]).all()  # a launch happens before its kernel runs


@needs_corpus
def test_runtime_names_lose_version_suffix_and_get_kinds():
    _, t = _cached(MFU)
    r = t["runtime"]
    assert not r["name"].str.contains(r"_v\d{4,}$").any()  # cudaLaunchKernel_v7000; not ..._v2
    kinds = dict(r.group_by("name").agg(pl.col("kind").first()).iter_rows())
    assert kinds["cudaLaunchKernel"] == "launch" and kinds["cuLaunchKernelEx"] == "launch"
    assert kinds["cudaStreamSynchronize"] == "sync"
    assert kinds["cudaMemcpyAsync"] == "memcpy" and kinds["cudaMemsetAsync"] == "memset"
    assert kinds["cudaEventRecord"] == "event_record" and kinds["cudaStreamWaitEvent"] == "event_wait"
    assert kinds["cudaStreamGetCaptureInfo_v2"] == "other"  # only the final _vNNNN is a version suffix
    pids = _gpu_processes(MFU)
    for rank, pid in enumerate(pids):
        want = _sql(MFU, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE (globalTid >> 24) & 0xFFFFFF = ?",
                    (pid,))[0][0]
        sub = r.filter(pl.col("rank") == rank)
        assert sub.height == want and set(sub["pid"]) == {pid}


@needs_corpus
def test_sync_kinds_follow_the_sync_type_enum():
    _, t = _cached(MFU)
    want = dict(_sql(MFU, """SELECT e.name, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s
                             JOIN ENUM_CUPTI_SYNC_TYPE e ON e.id = s.syncType GROUP BY 1"""))
    got = dict(t["syncs"].group_by("kind").len().iter_rows())
    assert got == {"event_sync": want["CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE"],
                   "stream_wait_event": want["CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT"],
                   "stream_sync": want["CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE"]}


@needs_corpus
def test_memcpy_copy_and_memory_kinds_from_enums():
    _, t = _cached(MFU)
    want = {(c, s, d): n for c, s, d, n in _sql(MFU, """
        SELECT ck.name, sk.name, dk.name, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
        JOIN ENUM_CUDA_MEMCPY_OPER ck ON ck.id = m.copyKind JOIN ENUM_CUDA_MEM_KIND sk ON sk.id = m.srcKind
        JOIN ENUM_CUDA_MEM_KIND dk ON dk.id = m.dstKind GROUP BY 1, 2, 3""")}
    got = {tuple(k): n for *k, n in t["kernels"].filter(pl.col("kind") == "memcpy")
           .group_by("copy_kind", "src_memory", "dst_memory").len().iter_rows()}
    assert sum(got.values()) == sum(want.values())
    for (c, s, d), n in want.items():
        key = (c.rsplit("_", 1)[1][0] + "to" + c.rsplit("_", 1)[1][3], s.rsplit("_", 1)[1].lower(),
               d.rsplit("_", 1)[1].lower())
        assert got[key] == n


@needs_corpus
def test_nvtx_ranges_become_nested_host_ops():
    _, t = _cached(MFU)
    h = t["host_ops"]
    pids = _gpu_processes(MFU)
    want = _sql(MFU, f"""SELECT count(*) FROM NVTX_EVENTS WHERE "end" IS NOT NULL AND eventType IN (59, 60)
                         AND (globalTid >> 24) & 0xFFFFFF IN ({",".join(map(str, pids))})""")[0][0]
    assert h.height == want and set(h["cat"]) == {"nvtx"}
    assert not h["name"].str.contains(", op_id = ").any()  # emit_nvtx decorations dropped: names match Kineto's
    # Depth and parent against a stack walk over each thread.
    by_id = {}
    for _, g in h.group_by(["pid", "tid"]):
        stack: list[tuple[int, int]] = []
        for r in g.sort(["ts", "end"], descending=[False, True]).iter_rows(named=True):
            while stack and stack[-1][1] <= r["ts"]:
                stack.pop()
            by_id[r["id"]] = (len(stack), stack[-1][0] if stack else None)
            stack.append((r["id"], r["end"]))
    assert all(by_id[i] == (d, p) for i, d, p in h.select("id", "depth", "parent").iter_rows())
    assert h["depth"].max() >= 2


@needs_corpus
def test_collectives_from_pytorch_nccl_ranges_linked_to_their_kernel():
    _, t = _cached(MFU)
    c = t["collectives"]
    want = _sql(MFU, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'nccl:all_to_all%'")[0][0]
    assert c.height == want and set(c["op"]) == {"all_to_all"} and set(c["backend"]) == {"nccl"}
    # Oracle: ranges that contain, on their thread, the launch of an NCCL kernel of their process (the export is
    # time-sliced, so a range at the window's edge can have lost its kernel).
    linked = _sql(MFU, """SELECT count(*) FROM NVTX_EVENTS n WHERE n.text LIKE 'nccl:all_to_all%' AND EXISTS (
                            SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k
                              ON k.correlationId = r.correlationId AND (k.globalPid >> 24) = (r.globalTid >> 24)
                            JOIN StringIds s ON s.id = k.shortName
                            WHERE r.globalTid = n.globalTid AND r.start BETWEEN n.start AND n."end"
                              AND s.value LIKE 'nccl%')""")[0][0]
    assert c["kernel_ts"].is_not_null().sum() == linked > 0
    comm = t["kernels"].filter(pl.col("kind") == "comm")
    # Every linked kernel start is a real NCCL kernel start of the same rank, after the host call began.
    starts = set(zip(comm["rank"], comm["ts"]))
    hit = c.filter(pl.col("kernel_ts").is_not_null())
    assert all((r, k) in starts for r, k in zip(hit["rank"], hit["kernel_ts"]))
    assert (hit["kernel_ts"] >= hit["ts"]).all() and (hit["kernel_end"] > hit["kernel_ts"]).all()
    host = t["host_ops"].select(pl.col("id").alias("host_op_id"), pl.col("name").alias("host_name"), "rank")
    assert set(c.join(host, on=["rank", "host_op_id"])["host_name"]) == {"nccl:all_to_all"}


@needs_corpus
def test_session_relative_time_base_is_shifted_to_the_target_clock():
    src, t = _cached(MOCK)
    start = _sql(MOCK, "SELECT startTime FROM ANALYSIS_DETAILS")[0][0]
    first = _sql(MOCK, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert "session-relative" in src.meta["time_base"]
    assert t["kernels"].filter(pl.col("kind") == "compute")["ts"].min() == first + start
    assert src.meta["nsys_version"].startswith("2026.1")
    assert src.meta["gpus"] == ["NVIDIA GeForce RTX 3080"]


@needs_corpus
def test_missing_target_info_gpu_and_nvtx_tables_are_fine():
    src, t = _cached(H100)
    assert "gpus" not in src.meta  # time-sliced export without TARGET_INFO_GPU
    assert t["collectives"].height == 0 and t["steps"].height == 0
    assert t["host_ops"].height > 0


@needs_corpus
@pytest.mark.parametrize("path", [MFU, H100, MOCK], ids=lambda p: p.name)
def test_no_sensitive_value_in_meta_or_detail(path, monkeypatch):
    monkeypatch.delenv(nsys.SENSITIVE_ENV, raising=False)
    src, tables = _read(path)
    secrets = {v for (v,) in _sql(path, """SELECT value FROM META_DATA_EXPORT WHERE name IN
                                             ('EXPORT_HOST', 'EXPORT_USER', 'EXPORT_PARAM_INPUT_PATH_ABS')""") if v}
    secrets |= {v for (v,) in _sql(path, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'") if v}
    for (v,) in _sql(path, "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"):
        val = v.split("=", 1)[-1].strip('"')
        if len(val) >= 6:
            secrets.add(val)
    text = repr(src.meta) + src.detail + repr(src.host)
    strings = " ".join(" ".join(df[c].drop_nulls().unique().to_list()) for df in tables.values()
                       for c in df.columns if df[c].dtype == pl.Utf8 and c != "name")
    leaked = [s for s in secrets if s in text or s in strings]
    assert secrets and not leaked
    monkeypatch.setenv(nsys.SENSITIVE_ENV, "1")
    src2, _ = _read(path)
    assert src2.host is not None


# ---------------------------------------------------------------------------------------------------------------
# Edited copies of real exports (tmp_path only)


def _copy(src: Path, tmp_path: Path, name="edited.sqlite") -> Path:
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


@needs_corpus
def test_rank_from_recorded_environment_never_echoes_env(tmp_path):
    p = _copy(MOCK, tmp_path)
    con = sqlite3.connect(p)
    con.execute("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'RANK=3')")
    con.commit()
    con.close()
    src, t = _read(p)
    assert src.rank == 3 and src.ranks == [3] and src.rank_origin == "env RANK"
    assert set(t["kernels"]["rank"]) == {3}
    assert "RANK=" not in src.detail and "3" not in src.detail


@needs_corpus
def test_file_name_rank_beats_process_order_for_a_single_process(tmp_path):
    p = _copy(MOCK, tmp_path, "trace_rank5.sqlite")
    src, t = _read(p, rank=5, rank_origin="file name")
    assert src.rank == 5 and src.rank_origin == "file name" and set(t["runtime"]["rank"]) == {5}


@needs_corpus
def test_steps_from_nvtx_ranges_and_pattern_override(tmp_path, monkeypatch):
    p = _copy(MFU, tmp_path)
    pid0 = _gpu_processes(MFU)[0]
    (gtid, lo, hi) = _sql(MFU, """SELECT globalTid, min(start), max("end") FROM NVTX_EVENTS
                                  WHERE (globalTid >> 24) & 0xFFFFFF = ? GROUP BY globalTid
                                  ORDER BY count(*) DESC LIMIT 1""", (pid0,))[0]
    mid = (lo + hi) // 2
    con = sqlite3.connect(p)
    for text, a, b in (("ProfilerStep#7", lo - 10, mid), ("ProfilerStep#8", mid, hi + 10), ("iter-9", lo, hi)):
        con.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                    (a, b, text, gtid))
    con.commit()
    con.close()
    src, t = _read(p)
    steps = t["steps"]
    assert steps.select("rank", "step").rows() == [(0, 7), (0, 8)]
    assert steps["dur"].to_list() == [mid - lo + 10, hi + 10 - mid] and set(steps["origin"]) == {"nvtx"}
    monkeypatch.setenv(nsys.STEP_PATTERN_ENV, r"^iter-(\d+)$")
    _, t2 = _read(p)
    assert t2["steps"]["step"].to_list() == [9]


def test_step_pattern_default():
    rx = re.compile(nsys.STEP_PATTERN)
    assert [bool(rx.match(s)) for s in ("ProfilerStep#12", "step 3", "Step_4", "STEP#5", "step7", "stepper 1",
                                        "ProfilerStep#", "train_step 2")] == [True] * 5 + [False] * 3


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line, what is wrong and what to do


def test_not_sqlite(tmp_path):
    p = tmp_path / "x.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)
    with pytest.raises(IngestError) as e:
        _read(p)
    assert "\n" not in str(e.value) and "x.sqlite" in str(e.value)


def test_sqlite_from_another_program(tmp_path):
    p = tmp_path / "app.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(IngestError, match="SQLite database but not an Nsight Systems export .*nsys export --type sqlite"):
        _read(p)


@needs_corpus
def test_truncated_export(tmp_path):
    p = tmp_path / "cut.sqlite"
    p.write_bytes(MFU.read_bytes()[: MFU.stat().st_size // 3])
    with pytest.raises(IngestError) as e:
        _read(p)
    msg = str(e.value)
    assert "\n" not in msg and "cut.sqlite" in msg and ("truncated or corrupt" in msg or "not an Nsight" in msg)


@needs_corpus
def test_locked_export(tmp_path):
    p = _copy(MOCK, tmp_path)
    writer = sqlite3.connect(p, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(IngestError, match="locked"):
            _read(p)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


@needs_corpus
def test_a_bad_export_does_not_stop_the_others(tmp_path):
    from traceql.ingest.loader import ingest

    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(MOCK.read_bytes()[:5000])
    good = _copy(MOCK, tmp_path, "good.sqlite")
    sources = [Source(bad, "nsys", id=0), Source(good, "nsys", id=1)]
    run = ingest(tmp_path, sources, use_cache=False)
    assert [s.status for s in run.sources] == ["error", "ok"]
    want = _sql(MOCK, """SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL)
                              + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY)""")[0][0]
    assert run.tables["kernels"].height == want
    assert set(run.tables["kernels"]["source"]) == {1}


# ---------------------------------------------------------------------------------------------------------------
# Old schema (nsys 2022.1): EXPORT_META_DATA, no ENUM_* tables, NVTX textId


@needs_corpus
def test_nsys_2022_schema(tmp_path):
    """Hand-made from the corpus's nsys 2022.1 DDL: no 2022.1 data file may be copied, so rows are typed in here."""
    ddl = (NSYS / "schema_2.9.1_nsys2022.1_dlprof.sql").read_text()
    p = tmp_path / "old.sqlite"
    con = sqlite3.connect(p)
    con.executescript(ddl)
    g = (1234 << 24) | 1234  # pid 1234, tid 1234
    gp = 1234 << 24
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel_v7000"), (2, "my_kernel"),
                                                            (3, "cudaMemcpy_v3020"), (4, "forward")])
    con.execute("INSERT INTO EXPORT_META_DATA VALUES ('EXPORT_PRODUCT_VERSION', '2022.1.3.3')")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (100, 110, 1, ?, 7, 1, 0, NULL)", (g,))
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (200, 300, 1, ?, 8, 3, 0, NULL)", (g,))
    con.execute("""INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, contextId, streamId, correlationId,
                   globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ,
                   staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId)
                   VALUES (120, 150, 0, 1, 7, 7, ?, 2, 2, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1)""", (gp,))
    con.execute("""INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, "end", deviceId, contextId, streamId, correlationId,
                   globalPid, bytes, copyKind, srcKind, dstKind) VALUES (210, 290, 0, 1, 7, 8, ?, 64, 2, 2, 0)""", (gp,))
    con.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, textId, globalTid) VALUES (90, 400, 59, 4, ?)", (g,))
    con.commit()
    con.close()
    src, t = _read(p)
    assert src.meta["nsys_version"] == "2022.1.3.3" and src.ranks == [0]
    k = t["kernels"].sort("ts")
    assert k["name"].to_list() == ["my_kernel", "Memcpy DtoH (Device -> Pageable)"]
    assert k.row(1, named=True)["copy_kind"] == "DtoH" and k.row(1, named=True)["dst_memory"] == "pageable"
    assert t["runtime"]["name"].to_list() == ["cudaLaunchKernel", "cudaMemcpy"]
    assert t["host_ops"]["name"].to_list() == ["forward"]
    assert src.meta["time_base"].startswith("as exported")  # ANALYSIS_DETAILS is empty


# ---------------------------------------------------------------------------------------------------------------
# Nesting on random well-nested ranges


@st.composite
def _nested(draw):
    """Well-nested ranges on a few threads, as (tid, ts, end)."""
    out = []
    for tid in range(draw(st.integers(1, 3))):
        def grow(lo, hi, depth):
            t = lo
            while t < hi - 2 and draw(st.booleans()):
                a = draw(st.integers(t, hi - 2))
                b = draw(st.integers(a + 1, hi))
                out.append((tid, a, b))
                if depth < 4:
                    grow(a, b, depth + 1)
                t = b
        grow(0, 1000, 0)
    return out


@settings(max_examples=60, deadline=None)
@given(_nested())
def test_nesting_matches_a_stack_walk(ranges):
    df = pl.DataFrame(ranges, schema={"tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64}, orient="row")
    df = df.with_columns(pl.lit(1).cast(pl.Int64).alias("pid"), pl.lit("r").alias("name"))
    out = nsys._nest(df)
    want = {}
    for _, g in out.group_by("tid"):
        stack: list[tuple[int, int]] = []
        for r in g.sort("id").iter_rows(named=True):
            while stack and stack[-1][1] <= r["ts"]:
                stack.pop()
            want[r["id"]] = (len(stack), stack[-1][0] if stack else None)
            stack.append((r["id"], r["end"]))
    assert {i: (d, p) for i, d, p in out.select("id", "depth", "parent").iter_rows()} == want


# ---------------------------------------------------------------------------------------------------------------
# Cross-check against NVIDIA's own summary (captured on the H200 by the capture module)


def _kern_sum_fixtures() -> list[tuple[Path, Path]]:
    """(export, nsys stats CSV) pairs under fixtures/h200-*: the export the CSV's "Processing [...]" line names."""
    out = []
    for d in sorted(FIXTURES.glob("h200-*")):
        stats = d / "nsys_stats_cuda_gpu_kern_sum.csv"
        dbs = sorted(d.rglob("*.sqlite"))
        if not (stats.is_file() and dbs):
            continue
        m = re.search(r"Processing \[([^\]]+)\]", stats.read_text())
        named = [db for db in dbs if m and Path(m.group(1)).name == db.name]
        out.append((named[0] if named else dbs[0], stats))
    return out


def _read_kern_sum(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (instances, total ns) from nsys stats' cuda_gpu_kern_sum CSV, whatever text precedes the header."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Instances" in line and "Total Time" in line)
    out: dict[str, tuple[int, int]] = {}
    for r in csv.DictReader(lines[start:]):
        total = int(float(r[next(k for k in r if k.startswith("Total Time"))]))
        n, t = out.get(r["Name"], (0, 0))
        out[r["Name"]] = (n + int(float(r["Instances"])), t + total)
    return out


def test_matches_nsys_stats():
    pairs = _kern_sum_fixtures()
    if not pairs:
        pytest.skip("no fixtures/h200-*/ with both an nsys export and nsys_stats_cuda_gpu_kern_sum.csv committed yet")
    for db, stats in pairs:
        want = _read_kern_sum(stats)
        want_n, want_ns = sum(n for n, _ in want.values()), sum(t for _, t in want.values())
        _, t = _read(db)
        k = t["kernels"].filter(pl.col("kind").is_in(["compute", "comm"]))
        assert k.height == want_n, db
        assert abs(k["dur"].sum() - want_ns) <= 0.001 * want_ns, db
        got = {name: (n, ns) for name, n, ns in k.group_by("name").agg(pl.len(), pl.col("dur").sum()).iter_rows()}
        assert {name: n for name, (n, _) in got.items()} == {name: n for name, (n, _) in want.items()}, db


# ---------------------------------------------------------------------------------------------------------------
# Rules TQL204-TQL208 on nsys input (expected counts from SQL over the export)

REPO = Path(__file__).resolve().parents[1]


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


def _api_copies(path: Path, api_like: str, table: str, extra: str = "") -> dict[int, int]:
    """Per GPU process (in rank order): copies/sets whose runtime call matches api_like, joined on correlation+pid."""
    rows = dict(_sql(path, f"""SELECT (g.globalPid >> 24) & 0xFFFFFF, count(*) FROM CUPTI_ACTIVITY_KIND_{table} g
                               JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId
                                AND (r.globalTid >> 24) = (g.globalPid >> 24)
                               JOIN StringIds s ON s.id = r.nameId
                               WHERE s.value LIKE '{api_like}' {extra} GROUP BY 1"""))
    return {rank: rows[pid] for rank, pid in enumerate(_gpu_processes(path)) if pid in rows}


@needs_corpus
def test_tql205_pageable_async_memcpy_fires_on_real_export():
    run = _run_of(MFU)
    want = _api_copies(MFU, "cudaMemcpy%Async%", "MEMCPY", "AND (g.srcKind = 0 OR g.dstKind = 0)")
    got = {}
    for f in _findings(run, "TQL205"):
        got[f.ranks[0]] = got.get(f.ranks[0], 0) + f.evidence["n"]
    assert got == want and want
    assert _findings(run, "TQL204") == []  # every copy in this export is cudaMemcpyAsync


@needs_corpus
def test_tql207_counts_stream_synchronize_per_rank():
    run = _run_of(MFU)
    want = {}
    for rank, pid in enumerate(_gpu_processes(MFU)):
        want[rank] = _sql(MFU, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                                  WHERE s.value LIKE 'cudaStreamSynchronize%' AND (r.globalTid >> 24) & 0xFFFFFF = ?""",
                       (pid,))[0][0]
    got = {f.ranks[0]: f.evidence["n"] for f in _findings(run, "TQL207")}
    assert got == want
    assert _findings(run, "TQL207", min_blocked_ms=1e9) == []


@needs_corpus
def test_tql204_fires_when_the_copy_is_synchronous(tmp_path):
    p = _copy(MOCK, tmp_path)
    con = sqlite3.connect(p)
    con.execute("UPDATE StringIds SET value = 'cudaMemcpy_v3020' WHERE value LIKE 'cudaMemcpyAsync%'")
    con.commit()
    con.close()
    fs = _findings(_run_of(p), "TQL204")
    want = _api_copies(p, "cudaMemcpy%", "MEMCPY", "AND g.copyKind <> 8")
    assert [(f.ranks, f.evidence["n"], f.evidence["copy_kind"]) for f in fs] == [([0], want[0], "DtoH")]


@needs_corpus
def test_tql206_fires_on_synchronous_memset_of_pinned_memory_only(tmp_path):
    p = _copy(MFU, tmp_path)
    con = sqlite3.connect(p)
    con.execute("UPDATE StringIds SET value = 'cudaMemset_v3020' WHERE value LIKE 'cudaMemsetAsync%'")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET memKind = 1 WHERE rowid % 3 = 0")
    con.commit()
    con.close()
    want = _api_copies(p, "cudaMemset%", "MEMSET", "AND g.memKind IN (1, 4)")
    got = {f.ranks[0]: f.evidence["n"] for f in _findings(_run_of(p), "TQL206")}
    assert got == want and want
    assert _findings(_run_of(MFU), "TQL206") == []  # the original: async memsets of device memory


@needs_corpus
def test_gpu_time_util_matches_a_brute_force_chunking():
    from traceql.link.gpu_util import CHUNKS, gpu_time_util

    run = _run_of(MFU)
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
        assert abs(mine["busy_ms"].sum() * 1e6 - ops["dur"].sum()) < 1  # every op's time lands in some chunk


@needs_corpus
def test_tql208_threshold_is_a_parameter():
    run = _run_of(MFU)
    low = _findings(run, "TQL208")
    assert {tuple(f.ranks) for f in low} <= {(0,), (1,)}
    assert all(f.evidence["util_pct"] < 50 for f in low)
    every = _findings(run, "TQL208", max_util_pct=1000.0)
    assert sorted(f.ranks[0] for f in every) == [0, 1]


@needs_corpus
def test_gpu_time_util_uses_one_source_per_rank():
    """One rank seen by two sources on different clocks (as a Kineto trace and an nsys export of one process are):
    the chunks follow the source with the most GPU time, never a span across both clocks."""
    from traceql.link.gpu_util import gpu_time_util
    from traceql.model import Run, concat

    run = _run_of(MFU)
    k0 = run.tables["kernels"].filter(pl.col("rank") == 0)
    other = k0.head(k0.height // 3).with_columns(pl.lit(7, dtype=pl.Int32).alias("source"),
                                                 pl.col("ts") + 10**12, pl.col("end") + 10**12)
    two = Run(path=MFU, tables={"kernels": concat("kernels", [k0, other])})
    util = gpu_time_util(two)
    assert util["ts"].min() == k0["ts"].min() and util["end"].max() == k0["end"].max()
    assert abs(util["busy_ms"].sum() * 1e6 - k0["dur"].sum()) < 1


@needs_corpus
@pytest.mark.parametrize("path", [MFU, MOCK], ids=lambda p: p.name)
def test_fast_and_standard_readers_agree(path, monkeypatch):
    """The optional ADBC reader (adbc-driver-sqlite) and the sqlite3 one give identical tables."""
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
