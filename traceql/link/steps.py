"""Give every row of the per-rank tables the training step it belongs to.

Host-side rows (host ops, runtime calls, collectives) belong to the step whose window holds their start, on the
same rank and source (two sources of one rank have different clocks). GPU rows (kernels, syncs) belong to the
step of the runtime call that launched them (by correlation), because GPU work runs after its host step may have
ended; rows without a launch fall back to their own start time.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

_BY = ["rank", "source"]


def _by_time(df: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    if df.height == 0 or steps.height == 0:
        return pl.Series("step", [None] * df.height, dtype=pl.Int64)
    left = df.select(*_BY, "ts").with_row_index("_i").with_columns(pl.col("ts").fill_null(-(1 << 62)))
    right = steps.select(*_BY, pl.col("ts").alias("_sts"), pl.col("end").alias("_send"), pl.col("step").alias("_step")).sort("_sts")
    j = left.sort("ts").join_asof(right, left_on="ts", right_on="_sts", by=_BY, strategy="backward", check_sortedness=False)
    j = j.with_columns(pl.when(pl.col("ts") < pl.col("_send")).then(pl.col("_step")).otherwise(None).alias("step")).sort("_i")
    return j["step"]


def assign_steps(run: Run) -> None:
    steps = run.table("steps").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    steps = steps.with_columns(pl.col(c).cast(t) for c, t in (("rank", pl.Int32), ("source", pl.Int32)))
    for name in ("host_ops", "runtime", "collectives"):
        df = run.table(name)
        if df.height:
            run.tables[name] = df.with_columns(_by_time(df, steps).alias("step"))
    runtime = run.table("runtime")
    launch_step = (
        runtime.filter(pl.col("correlation").is_not_null() & pl.col("step").is_not_null())
        .select(*_BY, "correlation", pl.col("step").alias("_lstep"))
        .unique(subset=[*_BY, "correlation"], keep="first")
    )
    for name in ("kernels", "syncs"):
        df = run.table(name)
        if df.height == 0:
            continue
        by_launch = df.select(*_BY, "correlation").with_row_index("_i").join(launch_step, on=[*_BY, "correlation"], how="left").sort("_i")["_lstep"]
        by_time = _by_time(df, steps)
        run.tables[name] = df.with_columns(by_launch.fill_null(by_time).alias("step"))
