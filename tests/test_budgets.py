"""Every source is read under a time and a memory budget; one past its budget becomes an error source with a one-line
reason naming the file, the budget and the variable that raises it, and every other source keeps its tables."""

from __future__ import annotations

import copy
import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from traceql import pipeline
from traceql.discover import discover
from traceql.ingest import budget
from traceql.ingest.loader import ingest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"
FR_OK = REPO / "fixtures" / "nccl-fr-ok"
GB, MB = 1 << 30, 1 << 20


@pytest.fixture
def mixed(tmp_path) -> Path:
    """A Kineto trace (1.2 MB of JSON) beside three small Flight Recorder dumps."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(DEMO / "rank0.pt.trace.json.gz", d)
    for p in FR_OK.glob("nccl_trace_rank_*"):
        shutil.copy(p, d)
    return d


def _by_name(sources):
    return {s.path.name: s for s in sources}


def _one_line_naming(reason: str, path: Path, var: str) -> None:
    assert "\n" not in reason and str(path) in reason and var in reason, reason


# ---------------------------------------------------------------- the defaults


def test_default_budgets_scale_with_the_file_and_the_machine(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEQL_SOURCE_TIMEOUT_S", raising=False)
    monkeypatch.delenv("TRACEQL_SOURCE_MAX_MB", raising=False)
    small = tmp_path / "small.json"
    small.write_text('{"traceEvents": []}')
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # 13 GB, sparse: only its size matters here
        f.truncate(13 * GB)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(b" " * (1 << 20)))
    from traceql.model import Source

    b_small, b_big, b_gz = (budget.budget_for(Source(p, "kineto")) for p in (small, big, gz))
    assert b_small.timeout_s == pytest.approx(60, abs=0.01) and b_small.max_bytes == pytest.approx(GB, rel=0.01)
    assert b_big.timeout_s == pytest.approx(60 + 20 * 13)
    ram = budget._ram_bytes()
    assert b_big.max_bytes == min(GB + 3 * 13 * GB, int(ram * 0.8))  # a 13 GB trace gets most of a big box
    assert budget.estimated_bytes(gz) == 8 * gz.stat().st_size


def test_variables_replace_the_defaults(tmp_path, monkeypatch):
    from traceql.model import Source

    p = tmp_path / "t.json"
    p.write_text("{}")
    monkeypatch.setenv("TRACEQL_SOURCE_TIMEOUT_S", "7.5")
    monkeypatch.setenv("TRACEQL_SOURCE_MAX_MB", "300")
    b = budget.budget_for(Source(p, "kineto"))
    assert (b.timeout_s, b.max_bytes) == (7.5, 300 * MB)
    monkeypatch.setenv("TRACEQL_SOURCE_TIMEOUT_S", "0")
    monkeypatch.setenv("TRACEQL_SOURCE_MAX_MB", "0")
    b = budget.budget_for(Source(p, "kineto"))
    assert (b.timeout_s, b.max_bytes) == (None, None)


def test_a_nonsense_variable_is_a_one_line_error_on_every_source(monkeypatch):
    monkeypatch.setenv("TRACEQL_SOURCE_TIMEOUT_S", "soon")
    run = ingest(DEMO, discover(DEMO), use_cache=False)
    errors = [s for s in run.sources if s.status == "error"]
    assert len(errors) == 2  # the two traces; the logs and the manifest are not read
    assert all(s.detail == "TRACEQL_SOURCE_TIMEOUT_S='soon' is not a number >= 0; set e.g. "
               "TRACEQL_SOURCE_TIMEOUT_S=600, or 0 for no limit" for s in errors)


# ---------------------------------------------------------------- workers: the hard limits


def test_time_budget_kills_the_reader_and_the_others_go_on(mixed):
    sources = discover(mixed)
    trace = next(s for s in sources if s.kind == "kineto")
    tasks = [(s, False, budget.Budget(0.001 if s is trace else 120.0, None)) for s in sources]
    pool = budget.pool()
    t0 = time.monotonic()
    done = _by_name(s for s, _ in pool.run(tasks, 2))
    assert time.monotonic() - t0 < 60
    _one_line_naming(done[trace.path.name].detail, trace.path, "TRACEQL_SOURCE_TIMEOUT_S")
    assert "time budget of 0.001 s" in done[trace.path.name].detail
    assert all(done[f"nccl_trace_rank_{r}"].status == "ok" for r in range(3))
    # the killed worker was replaced: the same trace reads in full under an ordinary budget
    trace.status, trace.detail = "ok", ""
    again = list(pool.run([(trace, False, budget.Budget(120.0, None))], 1))
    assert again[0][0].status == "ok" and again[0][1]["kernels"].height > 0


@pytest.mark.parametrize("mb", [2, 8])
def test_memory_budget_stops_the_reader_and_the_others_go_on(mixed, mb, capfd):
    sources = discover(mixed)
    trace = next(s for s in sources if s.kind == "kineto")
    # the backstop: no slack for reserved address space, so RLIMIT_AS refuses the read's allocations
    # the dumps beside it get an ordinary budget: they are what must survive, not what is tested
    tasks = [(s, False, budget.Budget(120.0, mb * MB, slack=0) if s is trace else budget.Budget(120.0, 512 * MB))
             for s in sources]
    # a fresh worker: one that read this trace before holds freed memory it can reuse without growing
    pool = budget.Pool()
    try:
        done = {s.path.name: (s, t) for s, t in pool.run(tasks, 1)}
    finally:
        pool.close()
    # Rust's "memory allocation failed", its backtrace, jemalloc's complaints: all stay in the worker
    assert capfd.readouterr() == ("", "")
    src, tables = done[trace.path.name]
    assert src.status == "error" and tables == {}
    _one_line_naming(src.detail, trace.path, "TRACEQL_SOURCE_MAX_MB")
    assert f"memory budget of {mb} MB" in src.detail
    for r in range(3):
        s, t = done[f"nccl_trace_rank_{r}"]
        assert s.status == "ok" and t["collectives"].height > 0


def _widened(path: Path, times: int) -> None:
    """The demo trace with its events repeated: a read that lasts long enough for the 50 ms memory watch to see it
    on a loaded machine (the demo's own 1.2 MB read can finish between two looks)."""
    import orjson

    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * times
    path.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))


def test_resident_memory_watch_stops_the_reader_and_the_others_go_on(mixed, monkeypatch):
    """TRACEQL_SOURCE_MAX_MB=8: the parent sees the trace's reader grow past 8 MB of resident memory and kills it;
    the Flight Recorder dumps need less and are read."""
    _widened(mixed / "rank0.pt.trace.json.gz", 20)
    monkeypatch.setenv("TRACEQL_SOURCE_MAX_MB", "8")
    # a fresh pool: a warm worker that read this trace before holds freed memory that it reuses without growing
    monkeypatch.setattr(budget, "_POOL", budget.Pool())
    run = ingest(mixed, discover(mixed), use_cache=False)
    src = _by_name(run.sources)
    trace = src["rank0.pt.trace.json.gz"]
    assert trace.status == "error" and "memory budget of 8 MB" in trace.detail
    _one_line_naming(trace.detail, trace.path, "TRACEQL_SOURCE_MAX_MB")
    assert all(src[f"nccl_trace_rank_{r}"].status == "ok" for r in range(3))
    assert run.table("collectives").height > 0 and run.table("kernels").height == 0
    monkeypatch.setenv("TRACEQL_SOURCE_MAX_MB", "2000")
    try:
        again = ingest(mixed, discover(mixed), use_cache=False)
    finally:
        budget._POOL.close()
    assert _by_name(again.sources)["rank0.pt.trace.json.gz"].status == "ok"


def test_worker_reads_equal_in_process_reads(monkeypatch):
    """The budgeted path changes nothing about what is read: same sources, same tables."""
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "0")
    plain = ingest(DEMO, discover(DEMO), use_cache=False)
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "always")
    isolated = ingest(DEMO, discover(DEMO), use_cache=False)
    assert [(s.path, s.status, s.rank) for s in plain.sources] == [(s.path, s.status, s.rank) for s in isolated.sources]
    for name, df in plain.tables.items():
        # sorted: the Kineto importer's flows come out in a different row order from one read to the next
        keys = [c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct, pl.Array))]
        assert isolated.tables[name].sort(keys, nulls_last=True).equals(df.sort(keys, nulls_last=True)), name


def test_large_tables_come_back_as_mapped_files(tmp_path, monkeypatch):
    """Past INLINE_MAX_BYTES the worker writes Arrow IPC files that the parent maps (no pickled copy of gigabytes);
    the tables are the same and the files are gone afterwards."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # the worker reads TMPDIR as it starts; this process too
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "0")
    plain = ingest(DEMO, discover(DEMO), use_cache=False)
    srcs = [s for s in discover(DEMO) if s.kind == "kineto"]
    kinds = []
    unpack = budget._unpack
    monkeypatch.setattr(budget, "_unpack", lambda packed: (kinds.append(packed[0]), unpack(packed))[1])
    pool = budget.Pool()
    try:
        done = list(pool.run([(s, False, budget.Budget(120.0, None)) for s in srcs], 1, inline_max=0))
    finally:
        pool.close()
        tempfile.tempdir = None
    assert [s.status for s, _ in done] == ["ok", "ok"] and kinds == ["files", "files"]
    kernels = pl.concat([t["kernels"] for s, t in sorted(done, key=lambda d: d[0].id)])
    assert kernels.equals(plain.tables["kernels"].select(kernels.columns))
    assert not list(tmp_path.glob("traceql-ingest-*"))


def test_check_cli_reports_the_budget_error_and_the_other_findings(mixed, monkeypatch):
    from click.testing import CliRunner

    from traceql.cli import main

    monkeypatch.setenv("TRACEQL_SOURCE_TIMEOUT_S", "0.001")
    r = CliRunner().invoke(main, ["check", str(mixed), "-v", "--no-cache", "-q"])
    assert "reading stopped after its time budget of 0.001 s" in r.output
    assert "raise it with TRACEQL_SOURCE_TIMEOUT_S" in r.output


# ---------------------------------------------------------------- in-process: the watchdog for small runs


def test_small_runs_are_read_in_process_under_the_watchdog(monkeypatch, tmp_path):
    """Below IN_PROCESS_MAX_BYTES no worker starts; the SIGALRM timer still stops a read that runs past its budget."""
    from traceql.ingest.loader import _ingest_one

    log = tmp_path / "rank0.stderr.log"
    line = "node1:1234:1240 [0] NCCL INFO Channel 00/02 :    0   1\n"
    log.write_text(line * 200_000)  # ~11 MB of NCCL INFO lines, parsed in Python
    src = next(s for s in discover(tmp_path) if s.kind == "nccl_log")
    out, tables = budget.run_here(_ingest_one, src, False, budget.Budget(0.01, None))
    assert out.status == "error" and tables == {}
    _one_line_naming(out.detail, log, "TRACEQL_SOURCE_TIMEOUT_S")


def test_the_demo_is_read_in_process(monkeypatch):
    monkeypatch.delenv("TRACEQL_SOURCE_ISOLATION", raising=False)
    monkeypatch.delenv("TRACEQL_SOURCE_MAX_MB", raising=False)
    started = budget.pool().spawned
    run = ingest(DEMO, discover(DEMO), use_cache=False)
    assert budget.pool().spawned == started  # no worker started for 200 KB of input
    assert sum(s.status == "ok" for s in run.sources) == 2


# ---------------------------------------------------------------- a 5 GB sparse file


def test_sparse_trace_fails_fast_and_the_others_go_on(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    head = gzip.decompress((REPO / "fixtures" / "h200-ddp-eager" / "rank0.pt.trace.json.gz").read_bytes())[:20000]
    big = d / "rank0.pt.trace.json"
    big.write_bytes(head)
    with open(big, "r+b") as f:
        f.truncate(5 * GB)
    with open(big, "rb") as f:
        if os.lseek(f.fileno(), 0, os.SEEK_HOLE) >= 5 * GB:
            pytest.skip("this file system does not report holes (SEEK_HOLE)")
    shutil.copy(REPO / "fixtures" / "h200-ddp-eager" / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz")
    t0 = time.monotonic()
    run = pipeline.load_run(d, use_cache=True)
    took = time.monotonic() - t0
    src = _by_name(run.sources)
    assert src["rank0.pt.trace.json"].status == "error"
    assert "sparse hole" in src["rank0.pt.trace.json"].detail and str(big) in src["rank0.pt.trace.json"].detail
    assert src["rank1.pt.trace.json.gz"].status == "ok"
    # within its budget (60 s + 20 s/GB): a full read of 5 GB took ~16 s and 5 GB of memory; here it is not read
    assert took < 12  # well under the ~16 s a read of it takes: the hole is refused before any reading


def test_tables_come_back_over_the_socket_when_no_temporary_file_can_be_written(tmp_path, monkeypatch):
    """Past INLINE_MAX_BYTES tables travel as files; a temporary folder that cannot be made, or fills up, sends them
    over the socket instead of losing the source."""
    import tempfile

    tables = {"kernels": pl.DataFrame({"a": list(range(10_000))}), "steps": pl.DataFrame({"step": [1, 2]})}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    packed = budget._pack(tables, 0)
    assert packed[0] == "files" and budget._unpack(packed)["kernels"].equals(tables["kernels"])

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_ipc", full)
    packed = budget._pack(tables, 0)
    assert packed[0] == "inline" and packed[1] is tables and not list(tmp_path.iterdir())

    def no_dir(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", no_dir)
    assert budget._pack(tables, 0)[0] == "inline"


def test_a_worker_whose_parent_is_killed_exits_even_while_its_socket_stays_open(tmp_path):
    # A service job killed with SIGKILL cannot stop its workers (they run in their own sessions), and a worker in the
    # middle of a read never sees the socket close. Here the test holds the socket's other end open, as a busy read
    # would keep the worker from noticing; the worker must still go once its parent is gone.
    import socket
    import subprocess

    mine, theirs = socket.socketpair()
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "fd = int(sys.argv[1])\n"
         "w = subprocess.Popen([sys.executable, '-m', 'traceql.ingest.budget', str(fd)], pass_fds=(fd,),"
         " start_new_session=True)\n"
         "print(w.pid, flush=True)\n"
         "time.sleep(600)\n", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE, text=True)
    theirs.close()
    worker = -1
    try:
        worker = int(parent.stdout.readline())
        time.sleep(1.5)  # the worker is up and waiting on the socket, which this test keeps open
        assert _alive(worker)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the orphaned worker is still running"
    finally:
        mine.close()
        if worker > 0 and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_workers_are_forked_by_one_zygote_and_read_as_started_workers_do(mixed):
    """Every worker of a pool costs a fork of the one zygote, not a fresh interpreter's imports; what they read is what
    a started worker reads, and the pool's close leaves no process behind."""
    if not budget._can_fork():
        pytest.skip("no pidfds here: workers are started as fresh interpreters")
    sources = discover(mixed)
    tasks = [(s, False, budget.Budget(120.0, None)) for s in sources]
    pool = budget.Pool()
    try:
        forked = {s.path.name: t for s, t in pool.run(tasks, 3)}
        assert pool.zygotes == 1 and pool.spawned == 3
        zygote = pool.zygote.proc.pid
        workers = [w.proc.pid for w in pool.idle]
        assert all(isinstance(w.proc, budget._Forked) for w in pool.idle) and len(workers) == 3
    finally:
        pool.close()
    assert not any(_alive(p) for p in [zygote, *workers])
    started = budget.Pool()
    started.zygotes = 2  # no zygote: fresh interpreters, as where pidfds are missing
    try:
        plain = {s.path.name: t for s, t in started.run([(copy.deepcopy(s), False, b) for s, _, b in tasks], 3)}
    finally:
        started.close()
    assert forked.keys() == plain.keys()
    for name, tables in plain.items():
        for t, df in tables.items():
            keys = [c for c, d in df.schema.items() if not isinstance(d, (pl.List, pl.Struct, pl.Array))]
            assert forked[name][t].sort(keys, nulls_last=True).equals(df.sort(keys, nulls_last=True)), (name, t)


def _polars_threads(pid: int) -> int:
    """The threads of polars' pool in a process, once their count holds for half a second (a pool thread names
    itself just after it starts)."""
    def count() -> int:
        names = [(t / "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()]
        return sum(n.startswith("polars-") and n[7:].isdigit() for n in names)

    seen, deadline = count(), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = count()
        if now == seen and now:
            break
        seen = now
    return seen


def test_forked_workers_have_the_polars_thread_pool_a_started_worker_of_their_size_has():
    # polars sizes its pool from POLARS_MAX_THREADS as it is imported: a zygote imported without it would fork
    # one-thread workers with a pool of every core (16 workers x 16 threads on a 16-core machine)
    if not budget._can_fork():
        pytest.skip("no pidfds here: workers are started as fresh interpreters")
    pool = budget.Pool()
    pool.max_spawn = 9
    fresh = budget._Worker("1")
    try:
        forked = pool._take(2, "1")
        assert all(isinstance(w.proc, budget._Forked) for w in forked)
        wide = pool._take(1, None)[0]  # another size: started afresh, not forked at the zygote's size
        assert isinstance(wide.proc, subprocess.Popen) and pool.zygote.threads == "1"
        deadline = time.monotonic() + 60
        for w in [*forked, fresh]:
            while not w.conn.poll(0.1):  # "ready": its thread pool has started
                assert time.monotonic() < deadline, "a worker did not start"
            assert w.conn.recv() == "ready"
        assert [_polars_threads(w.proc.pid) for w in forked] == [_polars_threads(fresh.proc.pid)] * 2 == [1, 1]
        wide.kill()
    finally:
        fresh.kill()
        pool.close()


def test_a_zygote_that_dies_leaves_workers_started_as_fresh_interpreters(mixed, monkeypatch):
    if not budget._can_fork():
        pytest.skip("no pidfds here: workers are started as fresh interpreters")
    started = []
    interpreter = budget._interpreter
    monkeypatch.setattr(budget, "_interpreter", lambda args, *a: (started.append(args), interpreter(args, *a))[1])
    sources = discover(mixed)
    pool = budget.Pool()
    try:
        first = list(pool.run([(s, False, budget.Budget(120.0, None)) for s in sources[:2]], 2))
        assert [s.status for s, _ in first] == ["ok", "ok"] and pool.zygotes == 1
        for w in pool.idle:
            w.kill()
        pool.zygote.proc.kill()
        pool.zygote.proc.wait(10)
        # the first fork asked of the dead zygote fails: that worker starts afresh; the next zygote serves the rest
        done = list(pool.run([(s, False, budget.Budget(120.0, None)) for s in sources], 2))
        assert sorted(s.path.name for s, _ in done) == sorted(s.path.name for s in sources)
        assert all(s.status == "ok" for s, _ in done)
        assert started == [["--zygote"], [], ["--zygote"]] and pool.zygotes == 2
    finally:
        pool.close()


def test_the_zygote_and_its_workers_exit_once_the_checking_process_is_killed(tmp_path):
    # the chain a service's killed job leaves: its zygote sees its parent gone, kills its workers and goes
    import subprocess

    if not budget._can_fork():
        pytest.skip("no pidfds here: workers are started as fresh interpreters")
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from traceql.ingest import budget\n"
         "pool = budget.Pool(); pool.max_spawn = 5\n"
         "ws = pool._take(2, '1')\n"
         "print(pool.zygote.proc.pid, *(w.proc.pid for w in ws), flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    pids: list[int] = []
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "the zygote or a worker is still running"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except (FileNotFoundError, ProcessLookupError):
        return False


# ---------------------------------------------------------------- one large plain trace: in-process, under the watch


@pytest.fixture
def plain_run(tmp_path, monkeypatch) -> Path:
    """The demo's rank 0 trace as a plain file (1.2 MB of JSON), made 'large' by a 64 KB inflate cap."""
    d = tmp_path / "plain"
    d.mkdir()
    (d / "rank0.pt.trace.json").write_bytes(gzip.decompress((DEMO / "rank0.pt.trace.json.gz").read_bytes()))
    monkeypatch.setattr(budget, "INFLATE_CAP", 64 << 10)
    for k in ("TRACEQL_SOURCE_ISOLATION", "TRACEQL_SOURCE_MAX_MB", "TRACEQL_SOURCE_TIMEOUT_S", "TRACEQL_KSCAN"):
        monkeypatch.delenv(k, raising=False)
    return d


@pytest.fixture
def handed(monkeypatch) -> list:
    """The tasks handed to budget workers."""
    tasks_seen: list = []
    run = budget.Pool.run

    def spy(self, tasks, *a, **k):
        tasks_seen.extend(tasks)
        return run(self, tasks, *a, **k)

    monkeypatch.setattr(budget.Pool, "run", spy)
    return tasks_seen


def _same_tables(a, b) -> None:
    assert a.tables.keys() == b.tables.keys()
    for name, df in a.tables.items():
        keys = [c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct, pl.Array))]
        assert b.tables[name].sort(keys, nulls_last=True).equals(df.sort(keys, nulls_last=True)), name


def _worker_read(run_dir, monkeypatch):
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "always")
    try:
        return ingest(run_dir, discover(run_dir), use_cache=False)
    finally:
        monkeypatch.delenv("TRACEQL_SOURCE_ISOLATION")


def test_a_large_plain_trace_is_read_here_with_the_tables_a_worker_reads(plain_run, handed, monkeypatch):
    """Beyond the inflate cap, a run's one plain Kineto file is read in this process (no worker starts) under the
    memory watch, and its tables are those a budget worker reads."""
    src = next(s for s in discover(plain_run) if s.kind == "kineto")
    assert budget.large_here(src, budget.budget_for(src))
    here = ingest(plain_run, discover(plain_run), use_cache=False)
    assert not handed
    assert [s.status for s in here.sources if s.kind == "kineto"] == ["ok"]
    _same_tables(here, _worker_read(plain_run, monkeypatch))


def test_a_large_read_that_grows_past_its_watch_goes_to_a_worker(plain_run, handed, monkeypatch):
    """Past its share of the memory budget the in-process read stops; a worker reads the source afresh, with the time
    already spent charged to its time budget, and the tables are the same."""
    monkeypatch.setattr(budget, "LARGE_HERE_SHARE", -1.0)  # any growth, or none, is past it: the first look stops it
    got = ingest(plain_run, discover(plain_run), use_cache=False)
    assert [t[0].path.name for t in handed] == ["rank0.pt.trace.json"] and handed[0][2].spent_s > 0
    assert handed[0][0].status == "ok" and not handed[0][0].meta.get("parser")  # the source as before the read here
    monkeypatch.undo()
    _same_tables(got, _worker_read(plain_run, monkeypatch))


def test_a_large_file_the_scanner_declines_whole_is_not_parsed_whole_here(plain_run, handed, monkeypatch):
    """B/E events send the file to the whole-document parser (some ten times its size in objects): here it refuses a
    file beyond _gz.WHOLE_MAX, and a worker reads it."""
    import json

    from traceql.ingest import _gz

    f = plain_run / "rank0.pt.trace.json"
    doc = json.loads(f.read_bytes())
    doc["traceEvents"] += [{"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 1.0},
                           {"ph": "E", "name": "b", "pid": 1, "tid": 1, "ts": 2.0}]
    f.write_text(json.dumps(doc, indent=1))
    monkeypatch.setattr(_gz, "WHOLE_MAX", 64 << 10)
    got = ingest(plain_run, discover(plain_run), use_cache=False)
    assert [t[0].path.name for t in handed] == ["rank0.pt.trace.json"]
    assert _by_name(got.sources)["rank0.pt.trace.json"].meta["parser"] == "whole"


def test_a_large_read_here_stops_at_its_time_budget(plain_run, handed, monkeypatch):
    monkeypatch.setenv("TRACEQL_SOURCE_TIMEOUT_S", "0.001")
    got = ingest(plain_run, discover(plain_run), use_cache=False)
    src = _by_name(got.sources)["rank0.pt.trace.json"]
    assert not handed and src.status == "error"
    _one_line_naming(src.detail, src.path, "TRACEQL_SOURCE_TIMEOUT_S")
