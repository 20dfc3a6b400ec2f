"""Blocking host synchronisation per rank and step, attributed to the host op that caused it.

A runtime call blocks the host when it is a synchronisation (stream/device/event synchronize, context sync) or a
synchronous copy (cudaMemcpy without Async, DtoH to pageable memory). The causing host op is the innermost host
op with the call's external id (Kineto), else the innermost op or NVTX range spanning the call on its thread, never
the range that is the step itself (an nsys run's "step 3" NVTX range would name every step's syncs differently,
one finding per step, and say nothing about the code that synchronised).
"""

from __future__ import annotations

import polars as pl

from traceql.ingest.kernel_names import BLOCKING_COPY
from traceql.link import POLARS_ENGINE
from traceql.model import Run



# The host op of a blocking call that no op or NVTX range (other than the step's own) encloses.
NO_OP = "code outside any op or NVTX range"


def _step_ranges(run: Run) -> pl.DataFrame:
    """(rank, source, id) of the host ops that are steps: the NVTX ranges (or annotations) the steps table was
    made from, found by their exact span."""
    steps = run.table("steps")
    ops = run.table("host_ops")
    if steps.height == 0 or ops.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "source": pl.Int32, "id": pl.Int64})
    key = ["rank", "source", "ts", "end"]
    steps = steps.select(pl.col(c).cast(ops.schema[c]) for c in key).unique()
    # the ops starting when some step starts (one column against a few values) before the join on the whole span:
    # the same rows, without hashing four columns of every op
    ops = ops.lazy().select(*key, "id").filter(pl.col("ts").is_in(steps["ts"].unique().implode()))
    return ops.join(steps.lazy(), on=key, how="semi").select("rank", "source", "id").collect(engine=POLARS_ENGINE)


def blocking_calls(run: Run) -> pl.DataFrame:
    rt = run.table("runtime")
    # regexes over the distinct names only (a few dozen), not over millions of rows
    names = rt.select(pl.col("name").unique().drop_nulls())
    copies = names.filter(pl.col("name").str.contains(BLOCKING_COPY))["name"].to_list()
    queries = names.filter(pl.col("name").str.contains("Query"))["name"].to_list()
    # synchronisations are runtime kind "sync" (kernel_names.RUNTIME_KINDS); queries return at once
    blocking = rt.lazy().filter(
        ((pl.col("kind") == "sync") & pl.col("name").is_not_null() & ~pl.col("name").is_in(queries)) | pl.col("name").is_in(copies)
    ).with_columns(pl.col("rank").cast(pl.Int32))
    ops = run.table("host_ops")
    rank_t = ops.schema["rank"]
    ops = ops.lazy().select("rank", "source", "external_id", "name", "depth").filter(pl.col("external_id").is_not_null())
    # only ops that carry a blocking call's external id can name its cause
    ops = ops.join(blocking.select(pl.col("rank").cast(rank_t), "source", "external_id").unique(),
                   on=["rank", "source", "external_id"], how="semi")
    ops = ops.filter(~pl.col("name").str.starts_with("ProfilerStep#"))
    # innermost op per external id (the deepest one carrying it)
    by_ext = (
        ops.sort("depth", descending=True)
        .unique(subset=["rank", "source", "external_id"], keep="first")
        .select("rank", "source", "external_id", pl.col("name").alias("host_op"))
        .with_columns(pl.col("rank").cast(pl.Int32))
    )
    # one lazy query (on the in-memory engine) instead of a dozen eager ones
    out = blocking.join(by_ext, on=["rank", "source", "external_id"], how="left").collect(engine=POLARS_ENGINE)
    # no op carries the call's external id (older Kineto, nsys): the innermost op spanning it on its thread
    miss = out.filter(pl.col("host_op").is_null())
    if miss.height:
        from traceql.link.context import enclosing_op

        pts = out.with_row_index("_gid").filter(pl.col("host_op").is_null()).select("_gid", "rank", "source", "tid", pl.col("ts").alias("_mid"))
        found = enclosing_op(run, pts, tids=True, tables=("host_ops",), exclude=_step_ranges(run))
        out = out.with_row_index("_gid").join(found.with_columns(pl.col("_gid").cast(pl.UInt32)).rename({"host_op": "_by_time"}), on="_gid", how="left")
        out = out.with_columns(pl.col("host_op").fill_null(pl.col("_by_time"))).drop("_gid", "_by_time")
    out = out.with_columns(pl.col("host_op").fill_null(NO_OP))
    return out.select(
        "rank", "source", "step", "ts", "end", "tid", pl.col("name").alias("call"),
        "host_op", (pl.col("dur") / 1e6).alias("blocked_ms"),
    ).sort(["rank", "ts"])


def host_syncs(run: Run) -> pl.DataFrame:
    """Per rank, step, call and causing host op: how many blocking calls and how long the host was blocked."""
    from traceql.link import ensure

    calls = ensure(run, "blocking_calls").filter(pl.col("step").is_not_null())
    calls = calls.with_columns(pl.col("host_op").str.replace(r": \d+/\d+$", "").alias("region"))
    # warm-up steps (CUDA modules loaded, a first step many times the others: model.to(device) copies, lazy init)
    # say how the process started, not how it trains: rules judge the other steps
    warm = ensure(run, "warmup_steps").select("rank", pl.col("step").cast(pl.Int64)).unique()
    out = (
        calls.group_by(["rank", "step", "call", "host_op", "region"])
        .agg(pl.len().alias("n"), pl.col("blocked_ms").sum().alias("blocked_ms"))
        .sort(["rank", "step", "blocked_ms"], descending=[False, False, True])
    )
    warm = warm.with_columns(pl.col("rank").cast(out.schema["rank"]), pl.col("step").cast(out.schema["step"]),
                             pl.lit(True).alias("warmup"))
    return out.join(warm, on=["rank", "step"], how="left").with_columns(pl.col("warmup").fill_null(False))


DERIVED = {"blocking_calls": blocking_calls, "host_syncs": host_syncs}
