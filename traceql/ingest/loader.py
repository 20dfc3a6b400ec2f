"""Ingest every source of a run, in parallel processes where it pays, through the Parquet cache."""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import time
from pathlib import Path

import polars as pl

from traceql import cache, remote
from traceql.ingest import _MODULES as _READERS
from traceql.ingest import IngestError, _gz, budget, module_for, read_source
from traceql.model import SCHEMAS, Run, Source, concat
from traceql.model.run import Pending, Tables

PARALLEL_MIN_BYTES = 8 << 20  # below this, process start-up costs more than it saves


def _supported(source: Source) -> bool:
    mod = module_for(source.kind)
    return mod is not None and getattr(mod, "SUPPORTED", False)


# The kinds whose module says SUPPORTED = False (tests/test_startup_imports.py pins this to the modules). A cache hit
# needs no reader, and importing one just to read its flag (kineto: pyarrow, msgspec, the scanner) cost a warm re-check
# of 8 ranks ~0.1 CPU s; only read kinds are ever stored, under a key that covers the importers' code.
RECOGNISED_ONLY = frozenset({"manifest", "nsys_report"})


def _may_be_cached(source: Source) -> bool:
    return source.kind in _READERS and source.kind not in RECOGNISED_ONLY


def _cached(source: Source, lazy: bool = False) -> tuple[str | None, dict[str, pl.DataFrame] | None]:
    """(cache key, tables) for a cache hit; (key, None) for a miss; (None, None) where the cache cannot be used.
    lazy: tables may be model.run.Pending, read when the check reads them (only in the process that checks)."""
    try:
        key = cache.digest(source)
        return key, cache.load(source, key, reread=_rereader(source) if lazy else None)
    except OSError:
        return None, None


def _rereader(source: Source):
    """reread(name) for a cache entry found damaged only when a table is read: the source read again (once)."""
    got: list[dict] = []

    def reread(name: str) -> pl.DataFrame:
        if not got:
            src = copy.deepcopy(source)
            try:
                limits = budget.budget_for(src)
            except ValueError:
                limits = None
            got.append(_ingest_one(src, False, limits)[1])
        return got[0].get(name) if name in got[0] else concat(name, [])  # the source failed now: no rows

    return reread


# Formats read as files of bytes that are never sparse: a hole (a run of NULs the file system does not store, as
# `truncate -s 5G` leaves after a valid header) is not text, JSON or a pickle, and reading through it would take as
# long as gigabytes of real data. SQLite files (nsys) may legitimately hold zeroed pages, so they are not checked.
_NO_HOLES = {"kineto", "torch_trace", "nccl_log", "torch_logs", "manifest", "flight_recorder"}


def _first_hole(path: Path) -> int | None:
    """Offset of the file's first hole before its end, where the file system tells (SEEK_HOLE); None if none."""
    if not hasattr(os, "SEEK_HOLE"):
        return None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            hole = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
    except OSError:
        return None
    return hole if hole < size else None


def _precheck(source: Source) -> str | None:
    """A reason to refuse the source before any reading (and before the cache hashes its content), or None."""
    if source.kind in _NO_HOLES and source.path.is_file():
        hole = _first_hole(source.path)
        if hole is not None:
            size = source.path.stat().st_size
            return (f"{source.path}: holds unwritten space (a sparse hole) from byte {hole} of {size}: runs of NUL bytes "
                    "are not trace data; the file was preallocated or cut short, copy the real file")
    return None


def _ingest_one(source: Source, use_cache: bool, limits: budget.Budget | None = None,
                lazy: bool = False) -> tuple[Source, dict[str, pl.DataFrame]]:
    """lazy: tables no rule reads may come back unread (model.run.Pending: read_source), in this process only."""
    mod = module_for(source.kind)
    if mod is None or not getattr(mod, "SUPPORTED", False):
        if source.kind not in ("unknown",) and source.status == "ok":
            source.status = "skipped"
            hint = getattr(mod, "HINT", None) if mod else None
            source.detail = source.detail or (hint or f"{source.kind} input recognised; not yet supported")
        return source, {}
    key = None
    if use_cache:
        key, hit = _cached(source)
        if hit is not None:
            source.cache_key = key
            return source, hit
    try:
        with budget.memory_limit(limits, source):  # only the read: the cache write and the hand-back are not charged
            tables = read_source(source, lazy)
    except IngestError as e:
        source.status = "error"
        source.detail = str(e)
        return source, {}
    except Exception as e:  # an importer bug must not take the other sources down
        source.status = "error"
        if budget.out_of_memory(e):
            source.detail = (limits.memory_reason(source.path) if limits is not None and limits.max_bytes is not None
                             else "ran out of memory reading it; split the trace or ingest on a larger machine")
        else:
            source.detail = f"internal error reading it ({type(e).__name__}: {e}); please report it with the file"
            source.meta["internal_error"] = True  # a bug, not a bad input: `check` exits 3
        return source, {}
    remote.named_back(source)  # a source at a URL is named by it again, also in what the cache keeps
    if key is not None:
        cache.store(source, key, tables)
        source.cache_key = key
    return source, tables


def _ingest_here(source: Source, use_cache: bool, limits: budget.Budget | None):
    return _ingest_one(source, use_cache, limits, lazy=True)


def _read_here(task: tuple, allowance: _gz.Allowance) -> tuple[Source, dict] | None:
    """One source read in this process under the allowance (its format's bytes weighted, budget.STREAMED); None when
    it inflated past it (nothing of the read is kept: the source is as it was before, for a worker to read)."""
    source, use_cache, limits = task
    weight = budget.STREAMED.get(source.kind, 1)
    before = copy.deepcopy(source)
    mine = _gz.Allowance(max(0, allowance.left) // weight)
    start = mine.left
    try:
        with _gz.capped(mine):
            out = budget.run_here(_ingest_here, source, use_cache, limits)
    except _gz.OverCap:  # what it inflated is dropped and not charged: the allowance bounds what this process holds
        source.__dict__.update(before.__dict__)
        return None
    allowance.left -= (start - mine.left) * weight
    return out


def _read_large_here(task: tuple, read_progress) -> tuple[Source, dict] | tuple[Source, bool, budget.Budget]:
    """The run's one large plain Kineto file read in this process under the memory watch and its time budget
    (budget.large_here); where it grew past the watch, or would be parsed whole, the task for a worker instead: the
    source as it was before, its budget charged with the time spent here."""
    source, use_cache, limits = task
    before = copy.deepcopy(source)
    began = time.monotonic()
    progress = (lambda done, total: read_progress(source, done, total)) if read_progress else None
    try:
        with _gz.capped(_gz.Allowance(0)), budget.watched(limits, progress):
            return budget.run_here(_ingest_here, source, use_cache, limits)
    except (budget.LargeHere, _gz.OverCap):
        pass  # what it read is dropped here, outside the handler (the traceback holds its frames)
    source.__dict__.update(before.__dict__)
    return source, use_cache, dataclasses.replace(limits, spent_s=limits.spent_s + time.monotonic() - began)


def _here_then_workers(tasks: list, allowance: int, jobs: int, read_progress, large: tuple | None = None):
    al = _gz.Allowance(allowance)
    later = []
    for task in tasks:
        out = _read_here(task, al)
        if out is None:
            later.append(task)
        else:
            yield out
    if large is not None:
        out = _read_large_here(large, read_progress)
        if len(out) == 3:
            later.append(out)
        else:
            yield out
    if later:
        yield from _in_workers(later, sum(_size(t[0]) for t in later), min(jobs, len(later)), read_progress)


def _in_workers(tasks: list, total: int, jobs: int, read_progress):
    workers = jobs if total >= PARALLEL_MIN_BYTES else 1  # one worker for small runs: one start, not many
    return budget.pool().run(tasks, max(1, workers), on_progress=read_progress)


def _size(s: Source) -> int:
    if remote.is_remote(s):  # at a URL: what its listing said
        return remote.size(s)
    try:
        if s.path.is_dir():  # a folder source (TORCH_COMPILE_DEBUG) holds its files' bytes, not zero
            return budget.estimated_bytes(s.path)
        return s.path.stat().st_size if s.path.is_file() else 0
    except OSError:
        return 0


def ingest(run_path: Path, sources: list[Source], use_cache: bool = True, jobs: int | None = None, progress=None,
           read_progress=None, began: float | None = None) -> Run:
    """Read every source into the canonical tables. progress(source) after each source; read_progress(source, done,
    total) while a worker reads a large file (its position in bytes). `began`: when the check began, where this
    reads part of it (a Dask read task): its entries since then are this check's (cache.begin_run)."""
    if use_cache:
        cache.begin_run(began)
    run = _ingest(run_path, sources, use_cache, jobs, progress, read_progress)
    note = cache.over_cap_note() if use_cache else None
    if note:
        run.notes.append(note)
    return run


def _ingest(run_path: Path, sources: list[Source], use_cache: bool, jobs: int | None, progress, read_progress=None) -> Run:
    todo = [s for s in sources if s.status in ("ok", "partial")]
    results: list[tuple[Source, dict]] = []
    for s in list(todo):
        reason = _precheck(s)
        if reason:
            s.status, s.detail = "error", reason
            todo.remove(s)
            results.append((s, {}))
    keys: dict[int, str | None] = {}  # cache keys of the misses: their tables are stored here once read
    if use_cache:
        # Cache hits load here: a Parquet read takes milliseconds, a worker process (spawned, importing polars)
        # takes about a second, so only the misses go to the pool.
        misses = []
        for s in todo:
            key, hit = _cached(s, lazy=True) if _may_be_cached(s) else (None, None)
            if hit is None:
                misses.append(s)
                keys[s.id] = key
                continue
            s.cache_key = key
            results.append((s, hit))
            if progress:
                progress(s)
        todo = misses
    # sources at a URL: copied here (a Dask worker under --scheduler) into private temporary files, read as local
    # files by the usual readers under the usual budgets, named by their URL again after (traceql.remote)
    spool = remote.Spool(todo, _supported)
    try:
        run = _read(run_path, sources, spool.ready, [*results, *((s, {}) for s in spool.failed)], keys, use_cache,
                    jobs, progress, read_progress)
    finally:
        spool.close()
    for s in run.sources:
        remote.named_back(s)
    return run


def _concat(name: str, frames: list) -> pl.DataFrame | Pending:
    """concat, or a Pending of it where a part is a cache hit not read yet (its rows are known: no read to count them)."""
    if not any(isinstance(f, Pending) for f in frames):
        return concat(name, frames)
    return Pending(sum(f.rows if isinstance(f, Pending) else f.height for f in frames),
                   lambda: concat(name, [f.read() if isinstance(f, Pending) else f for f in frames]))


def _read(run_path: Path, sources: list[Source], todo: list[Source], results: list, keys: dict, use_cache: bool,
          jobs: int | None, progress, read_progress) -> Run:
    total = sum(_size(s) for s in todo)
    jobs = jobs or min(len(todo), os.cpu_count() or 1)
    mode = budget.isolation_mode()
    if mode != "off" and any(_supported(s) for s in todo):
        try:
            limits = {s.id: budget.budget_for(s) for s in todo if _supported(s)}
        except ValueError as e:  # a budget variable set to nonsense: every source to read says so, none is read
            for s in todo:
                if _supported(s):
                    s.status, s.detail = "error", str(e)
                    results.append((s, {}))
            todo, limits = [s for s in todo if not _supported(s)], {}
        tasks = []
        for s in todo:
            if _supported(s):
                tasks.append((s, False, limits[s.id]))  # the cache is written here, not by the reader
            else:  # recognised-only formats are marked skipped here; nothing is read
                results.append(_ingest_one(s, False))
                if progress:
                    progress(s)
        allowance = large = None
        if mode == "auto" and threading.current_thread() is threading.main_thread():
            allowance = budget.in_process_allowance([t[0] for t in tasks])
            big = [t for t in tasks if budget.large_here(t[0], t[2])]
            if allowance is None and len(big) == 1:
                # one large plain trace and small sources beside it: all here, the large one under the memory watch
                rest = [t for t in tasks if t is not big[0]]
                allowance = budget.in_process_allowance([t[0] for t in rest]) if rest else budget.INFLATE_CAP
                if allowance is not None:
                    tasks, large = rest, big[0]
        if allowance is not None:
            # a worker's start (~0.4 CPU s) would cost more than reading these: in-process, under the watchdog
            # (budget.run_here) and the inflate cap; what inflates past it goes to a worker after all
            done_iter = _here_then_workers(tasks, allowance, jobs, read_progress, large)
        else:
            done_iter = _in_workers(tasks, total, jobs, read_progress)
        for src, tables in done_iter:
            remote.named_back(src)
            key = keys.get(src.id)
            if key is not None and src.status in ("ok", "partial"):
                cache.store(src, key, tables)
                src.cache_key = key
            results.append((src, tables))
            if progress:
                progress(src)
    elif jobs > 1 and len(todo) > 1 and total >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp  # here: a check that reads in-process (most) never pays ~10 ms to import them
        from concurrent.futures import ProcessPoolExecutor

        # One polars thread per worker: the workers already use every core, and more threads than cores only cost
        # switching and memory (each thread's allocator arena). Spawned workers read it from the environment as
        # they start; a value the user set is kept.
        env_was = os.environ.get("POLARS_MAX_THREADS")
        if env_was is None:
            os.environ["POLARS_MAX_THREADS"] = "1"
        try:
            with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
                futs = [ex.submit(_ingest_one, s, use_cache) for s in todo]
                for f in futs:
                    results.append(f.result())
                    if progress:
                        progress(results[-1][0])
        finally:
            if env_was is None:
                os.environ.pop("POLARS_MAX_THREADS", None)
    else:
        for s in todo:
            results.append(_ingest_one(s, use_cache))
            if progress:
                progress(s)
    order = {s.id: i for i, s in enumerate(sources)}
    results.sort(key=lambda r: order.get(r[0].id, len(order)))  # source order, hits and misses alike (workers return copies)
    by_id = {s.id: s for s, _ in results}
    merged_sources = [by_id.get(s.id, s) for s in sources]
    frames: dict[str, list[pl.DataFrame]] = {}
    for _, tables in results:
        for name, df in dict.items(tables):  # a Pending stays unread (a Tables' items() would read it)
            frames.setdefault(name, []).append(df)
    tables = Tables({name: _concat(name, frames.get(name, [])) for name in SCHEMAS})
    run = Run(path=run_path if remote.is_url(run_path) else Path(run_path), sources=merged_sources, tables=tables)
    read = [s for s in merged_sources if s.status in ("ok", "partial")]
    if use_cache and read and all(s.cache_key for s in read):
        run.derived_cache = cache.run_dir([(s.id, s.cache_key) for s in read])
    return run
