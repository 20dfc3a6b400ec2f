"""Canonical table schemas.

Every importer fills these tables, whatever its input format; every rule reads them. A fact that two formats
both carry has one table here. All timestamps are int64 nanoseconds on the clock of the rank that recorded them
(`ts`, `end`, `dur`); cross-rank comparisons go through link/ clock alignment first.

Importers may produce a subset of a table's columns: `conform` adds the missing ones as nulls, casts the rest and
orders them, so that every source's table concatenates with every other's.
"""

from __future__ import annotations

import polars as pl

I32 = pl.Int32
I64 = pl.Int64
F64 = pl.Float64
STR = pl.Utf8
BOOL = pl.Boolean

# Columns every table carries.
_KEY = {"rank": I32, "source": I32}
_SPAN = {"ts": I64, "end": I64, "dur": I64}

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # GPU activity: kernels, memcpy, memset. kind is one of KERNEL_KINDS.
    "kernels": {
        **_KEY,
        "id": I64,  # unique within (rank, source)
        "device": I32,
        "stream": I64,
        "name": STR,
        "kind": STR,
        **_SPAN,
        "correlation": I64,  # joins runtime.correlation (within one process)
        "external_id": I64,  # joins host_ops.external_id (Kineto)
        "pid": I64,  # host process that launched it (nsys; Kineto: null)
        "bytes": I64,  # memcpy/memset size
        "copy_kind": STR,  # HtoD, DtoH, DtoD, HtoH, PtoP for memcpy
        "src_memory": STR,  # pageable, pinned, device, managed, array (nsys and newer Kineto)
        "dst_memory": STR,
        "collective": STR,  # canonical op name (all_reduce, ...) when kind == comm
        "step": I64,  # filled by link/: the training step the kernel belongs to
    },
    # CPU-side ops and annotations: aten ops, user annotations, ProfilerStep#N, compiled regions, NVTX ranges.
    "host_ops": {
        **_KEY,
        "id": I64,
        "pid": I64,
        "tid": I64,
        "name": STR,
        "cat": STR,  # cpu_op, user_annotation, python_function, nvtx, ...
        **_SPAN,
        "parent": I64,  # id of the enclosing op on the same thread, null at top level
        "depth": I32,
        "external_id": I64,
        "step": I64,
    },
    # CUDA runtime / driver calls. kind is one of RUNTIME_KINDS. Names carry no _vNNNN suffix.
    "runtime": {
        **_KEY,
        "id": I64,
        "pid": I64,
        "tid": I64,
        "name": STR,
        "kind": STR,
        **_SPAN,
        "correlation": I64,
        "external_id": I64,
        "step": I64,
    },
    # Synchronisation as the GPU/driver saw it (Kineto cuda_sync, nsys CUPTI_ACTIVITY_KIND_SYNCHRONIZATION).
    # kind: stream_sync, device_sync, event_sync, stream_wait_event, context_sync.
    "syncs": {
        **_KEY,
        "id": I64,
        "device": I32,
        "stream": I64,
        "kind": STR,
        **_SPAN,
        "correlation": I64,
        "event": I64,
        "pid": I64,
        "step": I64,
    },
    # One row per collective call per rank.
    "collectives": {
        **_KEY,
        "id": I64,
        "op": STR,  # canonical: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send, recv, barrier...
        "backend": STR,  # nccl, gloo, hccl, ... when known
        "pg_name": STR,
        "pg_desc": STR,
        "pg_ranks": STR,  # JSON list of global ranks, as the trace gives it
        "group_size": I32,
        "seq": I64,  # sequence number within its group, where the trace records one
        "in_nelems": I64,
        "out_nelems": I64,
        "dtype": STR,
        "bytes": I64,  # message size in bytes (in_nelems x dtype size) where computable
        **_SPAN,  # the host-side call
        "host_op_id": I64,
        "kernel_ts": I64,  # first kernel carrying it (null for host-only backends such as gloo)
        "kernel_end": I64,
        "step": I64,
        "state": STR,  # Flight Recorder: scheduled, started, completed (null where the source has no state)
    },
    # Training steps per rank. origin: profiler_step, nvtx, marker.
    "steps": {
        **_KEY,
        "step": I64,
        **_SPAN,
        "origin": STR,
    },
    # Explicit edges: CPU->GPU launches (ac2g), forward->backward (fwdbwd), and others.
    "flows": {
        **_KEY,
        "kind": STR,
        "flow_id": I64,
        "src_pid": I64,
        "src_tid": I64,
        "src_ts": I64,
        "dst_pid": I64,
        "dst_tid": I64,
        "dst_ts": I64,
    },
    # torch.compile events per rank and compile id ("frame/attempt"). kind: compile, graph_break, recompile,
    # cache_hit, cache_miss, cache_bypass, graph_op, ddp_split, restart, cache_limit, unknown.
    "compile_events": {
        **_KEY,
        "compile_id": STR,
        "frame_id": I64,
        "attempt": I64,
        "kind": STR,
        "ts": I64,
        "dur": I64,
        "function": STR,  # co_name of the compiled frame
        "filename": STR,
        "line": I64,
        "reason": STR,  # graph break reason, recompile reason, ...
        "guard": STR,  # the failed guard of a recompile
        "user_frame": STR,  # file:line of the user code that broke the graph
        "cache_key": STR,  # FX graph cache key
        "components": STR,  # JSON object: cache-key component name -> hash/value
        "op": STR,  # graph_op: target (e.g. _c10d_functional.all_reduce.default)
        "op_index": I64,
        "detail": STR,  # JSON with whatever else the record held
    },
    # NCCL communicators as their init lines describe them.
    "nccl_comms": {
        **_KEY,
        "comm_id": STR,
        "comm_rank": I32,
        "nranks": I32,
        "nnodes": I32,
        "host": STR,
        "pid": I64,
        "cuda_dev": I32,
        "bus_id": STR,
        "version": STR,
        "network": STR,
        "transports": STR,  # JSON list, e.g. ["P2P/CUMEM", "SHM"]
        "channels": I32,
        "trees": STR,
        "rings": STR,
        "env": STR,  # JSON object of NCCL_* echoes
        "init_ms": F64,
        "detail": STR,
    },
    # Warnings, errors, watchdog timeouts, desync reports from NCCL and ProcessGroupNCCL logs, Flight Recorder.
    "nccl_events": {
        **_KEY,
        "kind": STR,
        "ts": I64,  # wall-clock ns where the log carries a time, else null
        "line": I64,
        "level": STR,
        "comm_id": STR,
        "pg_name": STR,
        "seq": I64,
        "op": STR,
        "numel_in": I64,
        "numel_out": I64,
        "timeout_ms": I64,
        "ran_ms": I64,
        "text": STR,
        "detail": STR,
    },
}

KERNEL_KINDS = ("compute", "comm", "memcpy", "memset")
RUNTIME_KINDS = ("launch", "sync", "memcpy", "memset", "event_record", "event_wait", "malloc", "free", "other")

# Sort order of each table once conformed: rank, then time where the table has time.
_SORT = {name: [c for c in ("rank", "ts") if c in cols] for name, cols in SCHEMAS.items()}


def empty(table: str) -> pl.DataFrame:
    """An empty frame with the table's schema."""
    return pl.DataFrame(schema=SCHEMAS[table])


def conform(table: str, df: pl.DataFrame | None) -> pl.DataFrame:
    """Cast `df` to the canonical schema of `table`: missing columns become nulls, extra columns are an error.

    Extra columns are refused rather than dropped so that an importer cannot quietly grow a table per format.
    """
    schema = SCHEMAS[table]
    if df is None or df.width == 0:
        return empty(table)
    extra = [c for c in df.columns if c not in schema]
    if extra:
        raise ValueError(f"table {table!r} has no column(s) {extra}; valid columns: {list(schema)}")
    have = df.schema
    if len(have) == len(schema) and all(a == b and x.is_(y) for (a, x), (b, y) in zip(have.items(), schema.items())):
        return df  # in the schema already (the readers build most tables so): the casts and select would copy nothing
    cols = []
    for name, dtype in schema.items():
        if name in df.columns:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(cols)


def concat(table: str, frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [conform(table, f) for f in frames if f is not None and f.height]
    if not frames:
        return empty(table)
    return pl.concat(frames, how="vertical")
