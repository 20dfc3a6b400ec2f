"""Ingest every source of a run, in parallel processes where it pays, through the Parquet cache."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl

from traceql.ingest import IngestError, cache, module_for, read_source
from traceql.model import SCHEMAS, Run, Source, concat

PARALLEL_MIN_BYTES = 8 << 20  # below this, process start-up costs more than it saves


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
        try:
            key = cache.digest(source)
            hit = cache.load(source, key)
            if hit is not None:
                return source, hit
        except OSError:
            key = None
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
    return source, tables


def _size(s: Source) -> int:
    try:
        return s.path.stat().st_size if s.path.is_file() else 0
    except OSError:
        return 0


def ingest(run_path: Path, sources: list[Source], use_cache: bool = True, jobs: int | None = None, progress=None) -> Run:
    todo = [s for s in sources if s.status in ("ok", "partial")]
    results: list[tuple[Source, dict]] = []
    total = sum(_size(s) for s in todo)
    jobs = jobs or min(len(todo), os.cpu_count() or 1)
    if jobs > 1 and len(todo) > 1 and total >= PARALLEL_MIN_BYTES:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            futs = [ex.submit(_ingest_one, s, use_cache) for s in todo]
            for f in futs:
                results.append(f.result())
                if progress:
                    progress(results[-1][0])
    else:
        for s in todo:
            results.append(_ingest_one(s, use_cache))
            if progress:
                progress(s)
    by_id = {s.id: s for s, _ in results}
    merged_sources = [by_id.get(s.id, s) for s in sources]
    frames: dict[str, list[pl.DataFrame]] = {}
    for _, tables in results:
        for name, df in tables.items():
            frames.setdefault(name, []).append(df)
    tables = {name: concat(name, frames.get(name, [])) for name in SCHEMAS}
    return Run(path=Path(run_path), sources=merged_sources, tables=tables)
