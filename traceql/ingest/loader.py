"""Ingest every source of a run, in parallel processes where it pays, through the Parquet cache."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl

from traceql.ingest import IngestError, cache, module_for, read_source
from traceql.model import SCHEMAS, Run, Source, concat

PARALLEL_MIN_BYTES = 8 << 20  # below this, process start-up costs more than it saves


def _supported(source: Source) -> bool:
    mod = module_for(source.kind)
    return mod is not None and getattr(mod, "SUPPORTED", False)


def _cached(source: Source) -> tuple[str | None, dict[str, pl.DataFrame] | None]:
    """(cache key, tables) for a cache hit; (key, None) for a miss; (None, None) where the cache cannot be used."""
    try:
        key = cache.digest(source)
        return key, cache.load(source, key)
    except OSError:
        return None, None


def _ingest_one(source: Source, use_cache: bool) -> tuple[Source, dict[str, pl.DataFrame]]:
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
        tables = read_source(source)
    except IngestError as e:
        source.status = "error"
        source.detail = str(e)
        return source, {}
    except MemoryError:
        source.status = "error"
        source.detail = "ran out of memory reading it; split the trace or ingest on a larger machine"
        return source, {}
    except Exception as e:  # an importer bug must not take the other sources down
        source.status = "error"
        source.detail = f"internal error reading it ({type(e).__name__}: {e}); please report it with the file"
        return source, {}
    if key is not None:
        cache.store(source, key, tables)
        source.cache_key = key
    return source, tables


def _size(s: Source) -> int:
    try:
        return s.path.stat().st_size if s.path.is_file() else 0
    except OSError:
        return 0


RANKLESS = "rank unknown: no distributedInfo and no rank in the file name"


def _single_process_rank(results: list[tuple[Source, dict]]) -> None:
    """The run's one Kineto trace names no rank (no distributedInfo, no rank in its name): it is a single-process run
    (torch.profiler.tensorboard_trace_handler's HOST_PID.TIMESTAMP.pt.trace.json), rank 0 as torch.distributed would
    number it. With several such traces nothing is guessed: their order says nothing about their ranks."""
    kineto = [r for r in results if r[0].kind == "kineto"]
    if len(kineto) != 1 or kineto[0][0].rank is not None:
        return
    source, tables = kineto[0]
    source.rank, source.ranks = 0, [0]
    source.rank_origin = "assumed"  # the word link/ranks (ranks branch) uses for the same assumption
    kept = [p for p in (source.detail or "").split("; ") if p and p != RANKLESS]
    source.detail = "; ".join([*kept, "rank 0 assumed: no rank in its content or name (a single-process run)"])
    for name, df in tables.items():
        if "rank" in df.columns and df.height and df["rank"].null_count() == df.height:
            tables[name] = df.with_columns(pl.lit(0, dtype=df.schema["rank"]).alias("rank"))


def ingest(run_path: Path, sources: list[Source], use_cache: bool = True, jobs: int | None = None, progress=None) -> Run:
    todo = [s for s in sources if s.status in ("ok", "partial")]
    results: list[tuple[Source, dict]] = []
    if use_cache:
        # Cache hits load here: a Parquet read takes milliseconds, a worker process (spawned, importing polars)
        # takes about a second, so only the misses go to the pool.
        misses = []
        for s in todo:
            key, hit = _cached(s) if _supported(s) else (None, None)
            if hit is None:
                misses.append(s)
                continue
            s.cache_key = key
            results.append((s, hit))
            if progress:
                progress(s)
        todo = misses
    total = sum(_size(s) for s in todo)
    jobs = jobs or min(len(todo), os.cpu_count() or 1)
    if jobs > 1 and len(todo) > 1 and total >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp

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
    _single_process_rank(results)
    order = {id(s): i for i, s in enumerate(sources)}
    results.sort(key=lambda r: order.get(id(r[0]), len(order)))  # source order, hits and misses alike
    by_id = {s.id: s for s, _ in results}
    merged_sources = [by_id.get(s.id, s) for s in sources]
    frames: dict[str, list[pl.DataFrame]] = {}
    for _, tables in results:
        for name, df in tables.items():
            frames.setdefault(name, []).append(df)
    tables = {name: concat(name, frames.get(name, [])) for name in SCHEMAS}
    run = Run(path=Path(run_path), sources=merged_sources, tables=tables)
    read = [s for s in merged_sources if s.status in ("ok", "partial")]
    if use_cache and read and all(s.cache_key for s in read):
        run.derived_cache = cache.run_dir([(s.id, s.cache_key) for s in read])
    return run
