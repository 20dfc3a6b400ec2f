"""Per-source time and memory budgets: every untrusted source is read in a worker process that can be stopped.

A source is read in a worker of a persistent pool (`python -m traceql.ingest.budget`, started by the first read that
needs one and reused by every later ingest of the process; the workers are forked by a zygote that imported what a
worker imports once, see "the zygote" below, or with TRACEQL_FORK_WORKERS=0 started afresh), under

- a time budget: wall-clock seconds from handing the source to the worker until its tables are back (less any time
  this process spent reading it first, see "one large plain trace" below). Past it the worker is killed (SIGKILL: a loop inside polars or a C scanner cannot be interrupted any other way) and replaced;
- a memory budget: how much the worker's resident anonymous memory (RssAnon: heap and anonymous mappings, not the
  pages of the input file it maps) may grow over its value when the read starts. The parent reads it every 50 ms
  and kills the worker past the budget; RLIMIT_AS (the budget + the file's size + AS_SLACK of reserved address
  space) is the backstop that refuses a single absurd allocation at once. Memory a worker freed after an earlier
  read and still holds is reused without counting, so the budget bounds new growth, not the read's total.

Either way the source becomes an error source with a one-line reason naming the file, the budget and how to raise it;
the other sources are read as usual. Defaults scale with the input and the machine, where `est` is the file's size
(8 x for gzip, which traces compress about that much; a folder: its files' sizes added up):

    time   = 60 s + 20 s per GB of est            (a 1 GB trace reads in ~3 s on one core)
    memory = min(1 GB + 3 x est, 80% of RAM)      (~200 bytes per event, ~1 x the JSON)

TRACEQL_SOURCE_TIMEOUT_S and TRACEQL_SOURCE_MAX_MB replace them for every source (0 = no limit); with
TRACEQL_SOURCE_MAX_MB set, every source goes to a worker, so that a tight limit stops that source only.

Small runs stay cheap: where starting a worker (~0.4 CPU s, importing polars, and the tables' hand-back) would cost
more than the reading, the sources are read in-process under a SIGALRM timer (from the main thread only; other threads
use workers) and without a memory limit (a refused allocation inside Rust code aborts the process), so what is read
here is bounded instead: at most INFLATE_CAP (64 MB) of content in all for the formats that stream it (Kineto,
TORCH_TRACE, NCCL logs, TORCH_LOGS: a slice at a time into columns; the Kineto reader peaks at ~1.6 x its content,
85 MB over the interpreter for the 54 MB df_index_resolver, tables included, which the parent holds either way), of
which at most IN_PROCESS_MAX_BYTES of files for the others, and a whole-document parse (~10 x its size in objects)
only up to _gz.WHOLE_MAX (16 MB). A gzip source counts by its trailer (ISIZE) as a hint and is charged as it
inflates (ingest/_gz.py): past the cap it stops and goes to a worker, so a forged trailer or a bomb costs this
process at most the cap. That watchdog stops Python code but not a loop inside C code; the formats' own bounds (the Flight Recorder pre-scan, the sparse-file check) cover the
small hostile files known. TRACEQL_SOURCE_ISOLATION=always sends every source to a worker (for a service reading
uploads); =0 reads everything in-process without budgets (for debugging an importer).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from traceql import polars_env
from traceql.model import Source

try:
    import resource
except ImportError:  # not POSIX: no RLIMIT_AS; the time budget still holds
    resource = None

GB = 1 << 30
MB = 1 << 20
# Address space reserved but not used, which RLIMIT_AS counts as well: a glibc malloc arena per thread reserves 64 MB,
# jemalloc and Arrow reserve ahead (reading a 0.5 MB nsys export through ADBC grows the address space by 1.3 GB and
# the resident memory by 60 MB). RLIMIT_AS is therefore only the backstop against one absurd allocation; the budget
# itself is watched on resident anonymous memory (RssAnon) by the parent.
AS_SLACK = 2 * GB + 64 * MB * (os.cpu_count() or 1)
RECYCLE_BYTES = 256 * MB  # a worker holding more than this over its start is replaced after its read
_POLL_S = 0.05  # how often the parent reads its busy workers' RssAnon
_READY_TIMEOUT_S = 300.0  # a worker's start (importing polars) on a loaded machine; not charged to any source


@dataclass
class Budget:
    timeout_s: float | None  # None: no limit
    max_bytes: int | None
    slack: int = AS_SLACK
    est: int = 0  # estimated_bytes of the source, which the budget was scaled by (the pool reads largest first)
    spent_s: float = 0.0  # of timeout_s, already spent reading the source in this process (watched, see LargeHere)

    def time_reason(self, path: Path) -> str:
        return (f"{path}: reading stopped after its time budget of {self.timeout_s:g} s; raise it with "
                "TRACEQL_SOURCE_TIMEOUT_S=SECONDS (0 = no limit)")

    def memory_reason(self, path: Path) -> str:
        if self.max_bytes is None:
            return f"{path}: ran out of memory reading it; split the trace or read it on a machine with more memory"
        return (f"{path}: reading stopped at its memory budget of {self.max_bytes // MB} MB; raise it with "
                "TRACEQL_SOURCE_MAX_MB=MB (0 = no limit) or read it on a machine with more memory")


def _env_number(name: str) -> float | None:
    """The variable's value (None when unset); a value that is not a number >= 0 raises ValueError, one line."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"{name}={raw!r} is not a number >= 0; set e.g. {name}=600, or 0 for no limit")
    return v


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def estimated_bytes(path: Path) -> int:
    """What the reader will hold in memory, roughly: the decompressed input size."""
    try:
        if path.is_dir():
            total = 0
            for i, p in enumerate(path.rglob("*")):
                if i > 100_000:
                    break
                if p.is_file() and not p.is_symlink():
                    total += p.stat().st_size
            return total
        size = path.stat().st_size
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return size * 8 if gz else size
    except OSError:
        return 0


def budget_for(source: Source) -> Budget:
    est = estimated_bytes(source.path)
    t = _env_number("TRACEQL_SOURCE_TIMEOUT_S")
    m = _env_number("TRACEQL_SOURCE_MAX_MB")
    timeout = (t or None) if t is not None else 60.0 + 20.0 * est / GB
    if m is not None:
        mem = int(m * MB) or None
    else:
        mem = GB + 3 * est
        ram = _ram_bytes()
        if ram:
            mem = min(mem, int(ram * 0.8))
    return Budget(timeout, mem, AS_SLACK, est)


IN_PROCESS_MAX_BYTES = 2 << 20
# Formats whose readers stream their content (a slice at a time, into columns) and gunzip through ingest/_gz.py, with
# the weight a byte of their content counts by against INFLATE_CAP: in this process they may read that much in all,
# plain files by their size and gzip as it inflates. The line readers run at 20-60 MB/s against the Kineto scanner's
# 250-300, so their bytes count 4 x: what is read here, serially, stays a fraction of a second where workers would
# read several logs side by side.
STREAMED = {"kineto": 1, "torch_trace": 4, "nccl_log": 4, "torch_logs": 4}
INFLATE_CAP = 64 * MB


def in_process_allowance(sources: list[Source]) -> int | None:
    """Weighted gzip bytes (STREAMED) that may be inflated in this process reading these sources here, or None where
    budget workers read them: their weighted content (a gzip's by _gz.size_hint) must come to at most INFLATE_CAP, of
    which the formats that do not stream (a SQLite export, a pickle, a folder) at most IN_PROCESS_MAX_BYTES of files.
    The allowance is charged as gzip inflates; a source that inflates past it goes to a worker (loader._read_here)."""
    from traceql.ingest import _gz

    plain = hinted = other = 0
    for s in sources:
        if s.kind in STREAMED and s.path.is_file():
            w = STREAMED[s.kind]
            if _gz.gzipped(s.path):
                hinted += w * _gz.size_hint(s.path)  # a large one says so: to a worker without inflating it here first
            else:
                plain += w * _file_size(s.path)
        else:
            other += estimated_bytes(s.path) if s.path.is_dir() else _file_size(s.path)
    if other >= IN_PROCESS_MAX_BYTES or plain + hinted + other > INFLATE_CAP:
        return None
    return INFLATE_CAP - plain - other


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def isolation_mode() -> str:
    """off (in-process, no budgets), auto (small runs in-process with a watchdog, others in workers), always.
    A budget set by hand is honoured exactly, so it sends every source to a worker: in-process, a read that hits a
    tight memory limit inside Rust code would abort the whole command."""
    v = os.environ.get("TRACEQL_SOURCE_ISOLATION", "auto").strip().lower()
    if v in ("0", "no", "false", "off"):
        return "off"
    if v in ("always", "all", "workers") or os.environ.get("TRACEQL_SOURCE_MAX_MB", "").strip():
        return "always"
    return "auto"


class _Timeout(BaseException):
    """Raised by the in-process watchdog's timer; a BaseException so that importers' `except Exception` let it by."""


def run_here(fn, source: Source, use_cache: bool, limits: Budget):
    """fn(source, use_cache, limits) in this process, under the memory limit and (in the main thread) the timer."""
    timer = limits.timeout_s is not None and threading.current_thread() is threading.main_thread()
    old = None
    if timer:
        def _alarm(signum, frame):
            raise _Timeout()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limits.timeout_s)
    try:
        return fn(source, use_cache, limits)
    except _Timeout:
        source.status, source.detail = "error", limits.time_reason(source.path)
        return source, {}
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- one large plain trace, read here under a watch
#
# A worker's start and its tables' hand-back cost a 1 GB plain Kineto trace 1.5-4 CPU s (measured interleaved on the
# 2-vCPU box: 8.8-11.6 CPU s in a worker, 7.2-7.5 in-process), most of it system time: the worker's pages, freed as it
# ends, are fresh pages again for the parent, and 370 MB of tables are written to temporary files and mapped back.
# Read here, the pages the read freed serve the rules that follow. So a run whose one large source is a plain Kineto
# file for the compiled scanner (its memory grows with the events it scans, a slice at a time; nothing of it parses
# the document whole) is read in this process, under
# - the watchdog's timer (run_here), the source's own time budget;
# - a watch on this process's resident anonymous memory, read as the reader reports its position (every slice of
#   512 KB, and between its table-building steps): past half the source's memory budget the read stops (LargeHere)
#   and a worker reads the source afresh under its whole budget and the time left of it, as it would have before.
#   A hostile file that makes many rows of few bytes therefore costs this process at most half its budget (plus what
#   one step of building a table part makes: a part holds at most a million rows), and ends as before: the worker's
#   one-line error. A file the scanner declines whole goes to the whole-document parser, which refuses a file that
#   large here (_gz.read_all: OverCap), so it too goes to a worker.


class LargeHere(BaseException):
    """An in-process read of a large file grew past its watch's share of the memory budget: a worker reads it."""


class _Watch:
    def __init__(self, cap: int, on_progress=None):
        self.cap = cap
        self.base = _rss_anon(os.getpid())
        self.thread = threading.get_ident()
        self.next_s = 0.0
        self.on_progress = on_progress  # (done, total): what a worker would send as its progress

    def look(self, done: int, total: int) -> None:
        if threading.get_ident() != self.thread:
            return
        now = time.monotonic()
        if now < self.next_s:
            return
        self.next_s = now + _POLL_S
        if _rss_anon(os.getpid()) - self.base > self.cap:
            raise LargeHere()
        if self.on_progress is not None and total:
            self.on_progress(done, total)


_WATCH: _Watch | None = None


def watch_point() -> None:
    """Where a reader between two steps of building its tables lets the memory watch look (a no-op without one)."""
    if _WATCH is not None:
        _WATCH.look(0, 0)
LARGE_HERE_SHARE = 0.5  # of the source's memory budget, that its in-process read may grow this process by


@contextmanager
def watched(limits: Budget, on_progress=None):
    """A read in this process (main thread) under the memory watch; LargeHere past its share of limits.max_bytes."""
    global _WATCH
    was = _WATCH
    _WATCH = _Watch(int(limits.max_bytes * LARGE_HERE_SHARE), on_progress)
    try:
        yield
    finally:
        _WATCH = was


def large_here(source: Source, limits: Budget | None) -> bool:
    """Whether this source may be read in this process under the watch: a plain Kineto file beyond INFLATE_CAP that
    the compiled scanner reads, with a time and a memory budget (auto isolation; the caller checks the thread)."""
    if source.kind != "kineto" or limits is None or limits.max_bytes is None or limits.timeout_s is None:
        return False
    if os.environ.get("TRACEQL_KSCAN", "1") == "0" or isolation_mode() != "auto":
        return False
    try:
        if not source.path.is_file() or source.path.stat().st_size <= INFLATE_CAP:
            return False
        with open(source.path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                return False
    except OSError:
        return False
    import importlib.util

    return importlib.util.find_spec("traceql.ingest._kscan") is not None


# ---------------------------------------------------------------- the worker side


def _vm_size() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def out_of_memory(e: BaseException) -> bool:
    """Whether an exception is how an allocation failed at the address-space limit (or with no memory left)."""
    import errno

    if isinstance(e, MemoryError):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:  # mmap of the file, a thread's stack
        return True
    text = str(e)
    return (isinstance(e, RuntimeError) and "can't start new thread" in text) or "failed to map segment" in text \
        or "memory allocation" in text and "failed" in text


@contextmanager
def memory_limit(limits: Budget | None, source: Source):
    """In a worker, the address space may grow by the budget + the file's size (its read-only mapping) + the slack
    inside: the backstop under the parent's RssAnon watch. In-process, nothing: an allocation refused inside Rust
    code aborts the process, which would take the whole command down with one source."""
    if limits is None or limits.max_bytes is None or resource is None or not _IN_WORKER:
        yield
        return
    try:
        file_size = source.path.stat().st_size if source.path.is_file() else 0
    except OSError:
        file_size = 0
    _start_thread_pool()
    _set_as_limit(limits.max_bytes + file_size + limits.slack)
    try:
        yield
    finally:
        _set_as_limit(None)




def _start_thread_pool() -> None:
    """Start polars' thread pool (its threads' stacks and arenas) before a limit is set, not inside the first read."""
    import polars as pl

    pl.thread_pool_size()


_IN_WORKER = False  # set by _worker
_CONN = None  # the worker's connection to its parent, for progress messages
_SEND_LOCK = None  # progress may come from a reader's thread (gzip inflates in one): one send at a time
_PROGRESS_EVERY_S = 0.25
_last_progress = 0.0


def report_progress(done: int, total: int) -> None:
    """An importer's position in the file it reads (bytes of `total`): sent to the parent at most every 0.25 s, which
    shows it for a long single-file read. In this process, where a large file is read under a memory watch
    (watched()), the place where the watch looks; elsewhere outside a worker a no-op."""
    global _last_progress
    if _WATCH is not None:
        _WATCH.look(done, total)
    now = time.monotonic()
    if _CONN is None or now - _last_progress < _PROGRESS_EVERY_S:
        return
    _last_progress = now
    try:
        with _SEND_LOCK:
            _CONN.send(("progress", int(done), int(total)))
    except (OSError, ValueError):
        pass  # the parent is gone or stopped listening: the read goes on

_AS_BEFORE: list[int] = []  # the soft limits that _set_as_limit(extra) replaced, restored by _set_as_limit(None)


def _set_as_limit(extra: int | None) -> None:
    """Lower the soft RLIMIT_AS to the current size + extra (never above the hard limit), or restore the previous."""
    if resource is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if extra is None:
        if _AS_BEFORE:
            resource.setrlimit(resource.RLIMIT_AS, (_AS_BEFORE.pop(), hard))
        return
    _AS_BEFORE.append(soft)
    cap = hard if hard != resource.RLIM_INFINITY else 1 << 62
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (min(cap, _vm_size() + extra), hard))


def _quiet() -> None:
    """Nothing a worker prints may reach the command's output (a JSON or SARIF report on stdout) or its stderr (Rust's
    "memory allocation failed" and backtrace at the limit): each source comes back with its one-line reason."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _worker(conn, threads: str | None = None, forked: bool = False) -> None:
    """Read sources sent over `conn` one at a time until told to stop (None). forked: by the zygote, which imported
    what a worker imports and silenced its output already."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the parent's to handle; it kills the workers
    import traceql.ingest.budget as this  # run as __main__, this file is also imported under its name: flag that one

    this._IN_WORKER = True
    this._CONN, this._SEND_LOCK = conn, threading.Lock()
    # A parent killed outright (a service's job stopped with SIGKILL) cannot stop its workers, and they run in their
    # own sessions: a worker whose parent is gone exits within a second, also in the middle of a read. Polled, not
    # PR_SET_PDEATHSIG: that fires when the parent's starting *thread* ends, and pools are started from Dask threads.
    # (A forked worker's parent is the zygote, which goes when the checking process does.)
    parent = os.getppid()

    def orphaned() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=orphaned, daemon=True, name="traceql-orphan-watch").start()
    if not forked:
        _quiet()
    if threads is not None and "POLARS_MAX_THREADS" not in os.environ:
        os.environ["POLARS_MAX_THREADS"] = threads  # read by polars' import, below (forked: the zygote's, same)
    from traceql.ingest import formats
    from traceql.ingest.loader import _ingest_one

    formats()  # import every importer now: mapping their libraries later would count against a budget
    _start_thread_pool()
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        source, use_cache, budget, env, inline_max = msg
        # the parent's settings now (a persistent worker outlives changes to them): TRACEQL_* as the parent has them
        for k in [k for k in os.environ if k.startswith("TRACEQL_") and k not in env]:
            del os.environ[k]
        os.environ.update(env)
        this._last_progress = 0.0  # a new read: its first position goes out at once
        try:
            out = _ingest_one(source, use_cache, budget)
        except BaseException as e:  # whatever escapes the importer, the parent gets a reason, not a dead pipe
            source.status = "error"
            source.detail = (budget.memory_reason(source.path) if out_of_memory(e) else
                             f"internal error reading it ({type(e).__name__}: {e}); please report it with the file")
            out = (source, {})
        packed = (out[0], _pack(out[1], inline_max))
        with this._SEND_LOCK:
            conn.send(packed)
        if out[0].status == "error" and out[0].detail == budget.memory_reason(source.path):
            return  # after an allocation failure the heap may be in any state: a fresh worker reads the next one


# ---------------------------------------------------------------- the zygote: workers forked, not started
#
# A worker started as a fresh interpreter imports polars and the readers before it reads: 0.35-0.85 CPU s, paid by
# every worker (16 of them on a 16-core machine, whatever the rank count) and again by every replacement. The zygote
# (`python -m traceql.ingest.budget --zygote FD`) pays it once: it imports what a worker imports and then forks a
# worker for each request, which costs milliseconds. It never runs polars itself: its only other threads are
# jemalloc's background threads (stopped by jemalloc's own fork handlers; a child allocates without them) and polars'
# spill cleaner, idle since nothing ran, so no lock is held as it forks; each child starts polars' thread pool itself,
# of the size the zygote's environment gave (POLARS_MAX_THREADS, read by polars' import): the zygote forks only
# workers of its own size, others start afresh. A forked worker is its own process as before (its own address-space
# limit, killed by the parent, gone when orphaned); the parent signals it through a pidfd (never a reused pid) and the
# zygote reaps it when the parent asks, which gives the parent its exit status. Where the zygote cannot start, stops
# answering or dies, workers are started as fresh interpreters again.


def _zygote(conn) -> None:
    """Fork a worker (_worker) for each ("fork", threads) request, whose socket end follows it (SCM_RIGHTS); reap one
    when asked (("reap", pid) -> its wait status); on None, end of file, or a parent gone, kill what is left and go."""
    from multiprocessing import reduction

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    _quiet()
    from traceql.ingest import formats

    formats()  # what a worker imports; polars' thread pool is not started here (each child starts its own)
    import gc

    gc.freeze()  # the imports' objects: a child's collections do not touch (and copy) their pages
    live: set[int] = set()
    conn.send("ready")
    try:
        while True:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    return
                continue
            msg = conn.recv()
            if msg is None:
                return
            if msg[0] == "fork":
                fd = reduction.recv_handle(conn)
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        conn.close()
                        _worker(_connection(fd), msg[1], forked=True)
                        code = 0
                    finally:
                        os._exit(code)
                os.close(fd)
                live.add(pid)
                conn.send(("forked", pid))
            elif msg[0] == "reap":
                try:
                    status = os.waitpid(msg[1], 0)[1]
                except ChildProcessError:
                    status = None
                live.discard(msg[1])
                conn.send(("reaped", status))
    except (EOFError, OSError):
        return
    finally:
        for pid in live:  # the parent is done or gone: so are its workers (their CPU counted, as reaped)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _connection(fd: int):
    from multiprocessing.connection import Connection

    return Connection(fd)


# Tables up to this size travel back pickled over the socket; larger ones as Arrow IPC files that the parent maps
# (pickling 10 GB of tables would hold them twice in the worker and twice again in the parent while they travel).
# Measured on one 46 MB trace's tables (20 MB): pickled there and back 0.14 CPU s, written and mapped 0.03 (0.11 s
# of every rank of a 128-rank run); the files' fixed cost is a few ms and the parent's one import of pyarrow ~55 ms,
# so from a few MB on the files are cheaper. The parent maps them with pyarrow (imported only then, so that a run
# whose tables all travel inline never imports it): polars 2.1's read_ipc has no memory_map and copies (measured on
# 460 MB of tables: 0.52 CPU s and +330 MB anonymous memory, against pyarrow's mapping at 0.16 s and file pages).
INLINE_MAX_BYTES = 4 * MB


def _pack(tables: dict, inline_max: int = INLINE_MAX_BYTES) -> tuple:
    if sum(df.estimated_size() for df in tables.values()) <= inline_max:
        return ("inline", tables)
    import tempfile

    try:
        d = tempfile.mkdtemp(prefix="traceql-ingest-")
    except OSError:  # no writable temporary folder: over the socket after all
        return ("inline", tables)
    paths = {}
    try:
        for name, df in tables.items():
            paths[name] = os.path.join(d, f"{name}.arrow")
            df.write_ipc(paths[name], compression="uncompressed")
    except BaseException as e:
        import shutil

        shutil.rmtree(d, ignore_errors=True)
        if isinstance(e, OSError):  # the temporary folder is full: over the socket after all
            return ("inline", tables)
        raise
    return ("files", d, paths)


def _unpack(packed: tuple) -> dict:
    if packed[0] == "inline":
        return packed[1]
    import shutil

    import polars as pl

    import pyarrow as pa

    _, d, paths = packed
    try:
        # mapped, not copied (pl.read_ipc copies): the pages stay readable after the files are unlinked, and the
        # kernel can drop them under memory pressure, as it does the page cache
        return {name: pl.from_arrow(pa.ipc.open_file(pa.memory_map(p)).read_all(), rechunk=False)
                for name, p in paths.items()}
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- the parent side


def _rss_anon(pid: int) -> int:
    """Resident anonymous memory of a process: its heap and anonymous mappings, not the pages of files it maps."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _interpreter(args: list[str], threads: str | None, malloc_conf: str | None = None):
    """`python -m traceql.ingest.budget ARGS... FD`: a fresh interpreter (not multiprocessing's spawn, which would
    import the caller's __main__ again: a script without a main guard, or stdin), talking over one end of a socket
    pair. (process, connection)."""
    import socket
    import subprocess
    import sys

    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    # the same traceql (and everything else) as this process, wherever it was imported from
    # (first the folder this traceql was imported from: sys.path's '' stands for a cwd the worker may not share)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *(p for p in sys.path if p and os.path.isdir(p) and p != here)])
    if threads is not None:
        env.setdefault("POLARS_MAX_THREADS", threads)
    if malloc_conf is not None:
        env.setdefault("_RJEM_MALLOC_CONF", malloc_conf)
    polars_env.unpinned_env(env)  # a check that kept itself to one CPU: its workers run on every CPU it had
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "traceql.ingest.budget", *args, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True,  # ^C in the terminal goes to the command, which stops its workers itself
        )
    finally:
        theirs.close()
    return proc, _connection(ours.detach())


_ZYGOTE_REPLY_S = 30.0  # a fork or a reap answered within this, or the zygote is taken as gone


class _Zygote:
    """The parent's end of the zygote (_zygote): fork a worker, reap one. A zygote that dies, or does not answer in
    time, is stopped and taken as gone (broken): the pool starts its workers as fresh interpreters instead."""

    def __init__(self, threads: str | None):
        from traceql.polars_env import KEEP_FREED_PAGES

        # A forked child allocates without jemalloc's background threads, which purge freed pages in the background
        # of a started worker; purged in line instead, as they age, they cost a read of 36 MB ~0.03-0.05 CPU s more.
        # Freed pages kept for a minute (as the checking process keeps them) are neither: the forked workers then
        # read at a started worker's cost or less. What they keep counts against RECYCLE_BYTES as before.
        # polars reads POLARS_MAX_THREADS as it is imported, so the zygote's children have the thread pool its
        # environment gave it: it forks only workers of that size (a 1-thread worker with a pool of every core beside
        # 15 others cost 128 reads of 36 MB on 16 cores 3-4 CPU s more than fresh workers).
        self.threads = threads
        self.proc, self.conn = _interpreter(["--zygote"], threads, KEEP_FREED_PAGES)
        self.ready = False
        self.broken = False
        self.lock = threading.Lock()  # one request and its answer at a time

    def _ask(self, msg, fd: int | None = None):
        with self.lock:
            if self.broken:
                return None
            try:
                if not self.ready:  # the first request waits for its imports (a worker's start, once)
                    if not self.conn.poll(_READY_TIMEOUT_S) or self.conn.recv() != "ready":
                        raise EOFError
                    self.ready = True
                self.conn.send(msg)
                if fd is not None:
                    from multiprocessing import reduction

                    reduction.send_handle(self.conn, fd, self.proc.pid)
                if not self.conn.poll(_ZYGOTE_REPLY_S):
                    raise EOFError
                return self.conn.recv()
            except (EOFError, OSError, ValueError):
                self._stop()
                return None

    def fork(self, threads: str | None):
        """(process, connection) of a worker forked now, or None (the zygote is gone)."""
        import socket

        ours, theirs = socket.socketpair()
        try:
            got = self._ask(("fork", threads), theirs.fileno())
        finally:
            theirs.close()
        if not got or got[0] != "forked":
            ours.close()
            return None
        try:
            return _Forked(got[1], self), _connection(ours.detach())
        except OSError:  # no pidfd for it (it cannot have been reaped: the zygote reaps only when asked)
            ours.close()
            return None

    def reap(self, pid: int) -> int | None:
        got = self._ask(("reap", pid))
        return got[1] if got and got[0] == "reaped" else None

    def _stop(self) -> None:
        self.broken = True
        try:
            self.proc.kill()
            self.proc.wait(5)
        except Exception:  # noqa: BLE001 - gone already, or a zombie for the system to reap
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    def close(self) -> None:
        """Its workers were stopped (the pool's close): it goes too, reaping any left, and is waited for (so that
        their CPU time and its own count as this process's children's)."""
        with self.lock:
            if self.broken:
                return
            try:
                self.conn.send(None)
                self.proc.wait(5)
            except Exception:  # noqa: BLE001 - it does not go: stop it
                pass
            self._stop()


class _Forked:
    """A worker forked by the zygote, as _Worker uses a Popen (pid, poll, kill, wait): signalled through a pidfd,
    which names this process and no later one with its pid, and reaped by the zygote, which reports its status."""

    def __init__(self, pid: int, zygote: _Zygote):
        self.pid = pid
        self.zygote = zygote
        self.returncode: int | None = None
        self.pidfd = os.pidfd_open(pid)

    def _ended(self, timeout: float | None) -> bool:
        import select

        return bool(select.select([self.pidfd], [], [], timeout)[0])

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            self.wait()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except OSError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            # the zygote's waitpid blocks until the process ends: asked only once it has
            if not self._ended(timeout):
                import subprocess

                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            status = self.zygote.reap(self.pid)
            # with the zygote gone, the system reaped the process and its status is lost
            self.returncode = os.waitstatus_to_exitcode(status) if status is not None else -1
            os.close(self.pidfd)
        return self.returncode


_PIDFDS: bool | None = None


def _can_fork() -> bool:
    """Workers may be forked by a zygote: Linux with pidfds (5.3), where a signal cannot reach a reused pid, unless
    TRACEQL_FORK_WORKERS=0 asks for fresh interpreters."""
    global _PIDFDS
    if os.environ.get("TRACEQL_FORK_WORKERS", "1").strip() == "0":
        return False
    if _PIDFDS is None:
        _PIDFDS = False
        if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
            try:
                os.close(os.pidfd_open(os.getpid()))
                _PIDFDS = True
            except OSError:  # a kernel without them
                pass
    return _PIDFDS


class _Worker:
    """A budget worker: forked by the zygote (forked: its process and connection) or, without one, a fresh
    interpreter (_interpreter)."""

    def __init__(self, threads: str | None, forked=None):
        self.proc, self.conn = forked if forked is not None else _interpreter([], threads)
        self.ready = False
        self.base_rss = 0
        self.fresh_rss = 0
        self.started = time.monotonic()
        self.task: tuple[Source, Budget, float] | None = None  # source, budget, deadline

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except (OSError, ValueError):
            pass
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: a zombie is the system's to reap now
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None


class Pool:
    """Worker processes kept between ingests: the first read pays the start (about a second: polars' import), later
    ones do not. Workers that were killed or retired are replaced on demand."""

    def __init__(self):
        self.idle: list[_Worker] = []
        self.spawned = 0
        self.max_spawn = 0  # raised by run(): every task may cost one worker, plus a few that die while starting
        self.zygote: _Zygote | None = None
        self.zygotes = 0  # started: a second that breaks too leaves fresh interpreters for good

    def _take(self, n: int, threads: str | None) -> list[_Worker]:
        ws = [w for w in self.idle if w.alive()]
        for w in self.idle:
            if w not in ws:
                w.kill()
        self.idle = []
        while len(ws) < n:
            ws.append(self._spawn(threads))
        self.idle = ws[n:]
        return ws[:n]

    def _spawn(self, threads: str | None) -> _Worker:
        self.spawned += 1
        if self.spawned > self.max_spawn:
            raise RuntimeError("ingest workers keep dying as they start; set TRACEQL_SOURCE_ISOLATION=0 to read in-process")
        if self.zygote is not None and self.zygote.broken:
            self.zygote = None
        if self.zygote is None and self.zygotes < 2 and _can_fork():
            self.zygotes += 1
            try:
                self.zygote = _Zygote(threads)
            except OSError:
                self.zygotes = 2
        same = self.zygote is not None and self.zygote.threads == threads  # else started afresh, at its own size
        forked = self.zygote.fork(threads) if same else None
        return _Worker(threads, forked)

    def close(self) -> None:
        for w in self.idle:
            try:
                w.conn.send(None)
            except OSError:
                pass
            w.kill()
        self.idle = []
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def run(self, tasks: list[tuple[Source, bool, Budget]], workers: int, inline_max: int = INLINE_MAX_BYTES, on_progress=None):
        """Yield (source, tables) for every task, each read under its budget. Largest first: better packing.
        on_progress(source, done, total): a worker's position in the file it reads (see report_progress)."""
        from multiprocessing.connection import wait

        pending = sorted(tasks, key=lambda t: -t[2].est)
        threads = "1" if workers > 1 else None
        self.max_spawn = self.spawned + len(pending) + workers + 3
        ws = self._take(min(workers, len(pending)), threads)
        try:
            while pending or any(w.task for w in ws):
                now = time.monotonic()
                for w in ws:
                    if w.ready and w.task is None and pending:
                        source, use_cache, budget = pending.pop(0)
                        deadline = now + max(0.0, budget.timeout_s - budget.spent_s) if budget.timeout_s else float("inf")
                        try:
                            env = {k: v for k, v in os.environ.items() if k.startswith("TRACEQL_")}
                            w.base_rss = _rss_anon(w.proc.pid)
                            w.conn.send((source, use_cache, budget, env, inline_max))
                            w.task = (source, budget, deadline)
                        except OSError:
                            pending.insert(0, (source, use_cache, budget))
                            w.ready = False
                            w.kill()
                waits = [w.task[2] for w in ws if w.task] + [now + _READY_TIMEOUT_S]
                if any(w.task and w.task[1].max_bytes is not None for w in ws):
                    waits.append(now + _POLL_S)
                ready = wait([w.conn for w in ws if not w.conn.closed], timeout=max(0.0, min(waits) - now))
                now = time.monotonic()
                for i, w in enumerate(ws):
                    if not w.conn.closed and w.conn in ready:
                        try:
                            msg = w.conn.recv()
                        except (EOFError, OSError):
                            msg = None
                        if msg == "ready":
                            w.ready = True
                            w.fresh_rss = _rss_anon(w.proc.pid)
                            continue
                        if isinstance(msg, tuple) and len(msg) == 3 and msg[0] == "progress":
                            if on_progress is not None and w.task:
                                on_progress(w.task[0], msg[1], msg[2])
                            continue
                        if msg is not None and w.task:
                            budget = w.task[1]
                            w.task = None
                            msg = (msg[0], _unpack(msg[1]))
                            yield msg
                            retired = msg[0].status == "error" and msg[0].detail == budget.memory_reason(msg[0].path)
                            # a worker that kept much freed memory would read the next source partly for free: the
                            # budget is growth over the start of a read, so keep what a warm worker holds small
                            if retired or _rss_anon(w.proc.pid) - w.fresh_rss > RECYCLE_BYTES:
                                w.kill()
                                if pending:
                                    ws[i] = self._spawn(threads)
                                else:
                                    w.ready = False
                            continue
                        # the worker died: while reading (an abort at the memory limit, a crash) or while starting
                        if w.task:
                            source, budget, _ = w.task
                            yield _died(source, budget, w.proc)
                        elif not pending:
                            w.kill()
                            continue
                        w.kill()
                        ws[i] = self._spawn(threads)
                    elif w.task and now >= w.task[2]:
                        source, budget, _ = w.task
                        w.kill()
                        source.status, source.detail = "error", budget.time_reason(source.path)
                        yield source, {}
                        ws[i] = self._spawn(threads)
                    elif w.task and w.task[1].max_bytes is not None and \
                            _rss_anon(w.proc.pid) - w.base_rss > w.task[1].max_bytes:
                        source, budget, _ = w.task
                        w.kill()
                        source.status, source.detail = "error", budget.memory_reason(source.path)
                        yield source, {}
                        ws[i] = self._spawn(threads)
                if any(not w.ready and now - w.started > _READY_TIMEOUT_S for w in ws):
                    raise RuntimeError(f"an ingest worker did not start in {_READY_TIMEOUT_S:g} s; set "
                                       "TRACEQL_SOURCE_ISOLATION=0 to read in-process")
        except BaseException:
            for w in ws:
                w.kill()
            raise
        for w in ws:
            if w.alive() and w.ready and not w.task:
                self.idle.append(w)
            else:
                w.kill()


def _died(source: Source, budget: Budget, proc) -> tuple[Source, dict]:
    try:
        code = proc.wait(5)
    except Exception:  # noqa: BLE001 - it did not exit after closing its end: stop it
        proc.kill()
        code = proc.wait()
    source.status = "error"
    if code in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV) and budget.max_bytes is not None:
        # Rust aborts when an allocation fails at the address-space limit; the kernel's OOM killer sends SIGKILL
        source.detail = budget.memory_reason(source.path)
    else:
        source.detail = (f"{source.path}: the reader crashed (exit {code}) reading it; please report it with the file, "
                         "or set TRACEQL_SOURCE_ISOLATION=0 to see the error")
    return source, {}


_POOL: Pool | None = None


def pool() -> Pool:
    global _POOL
    if _POOL is None:
        _POOL = Pool()
        atexit.register(_POOL.close)
    return _POOL


if __name__ == "__main__":
    import sys

    polars_env.restore_cpus()
    if sys.argv[1] == "--zygote":
        _zygote(_connection(int(sys.argv[2])))
    else:
        _worker(_connection(int(sys.argv[1])))
