"""Per rank and step: the step's time, how much of it the rank spent waiting for other ranks in collectives, and
the rest (its own work).

In synchronous training every rank's step takes as long as the slowest rank's, because the fast ranks wait inside
the step's collectives; the wall-clock step times come out equal and hide the imbalance. What differs is the time
each rank spends outside those waits.
"""

from __future__ import annotations

import polars as pl

from traceql import link
from traceql.model import Run


def step_balance(run: Run) -> pl.DataFrame:
    schema = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "wait_ms": pl.Float64, "busy_ms": pl.Float64}
    steps = run.table("steps").group_by(["rank", "step"]).agg((pl.col("dur").max() / 1e6).alias("step_ms"))
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    ci = link.ensure(run, "collective_instances")
    if ci.height and "wait_ms" in ci.columns:
        waits = ci.filter(pl.col("step").is_not_null()).group_by(["rank", "step"]).agg(pl.col("wait_ms").sum().alias("wait_ms"))
        waits = waits.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64))
        out = steps.with_columns(pl.col("rank").cast(pl.Int32)).join(waits, on=["rank", "step"], how="left")
    else:
        out = steps.with_columns(pl.col("rank").cast(pl.Int32), pl.lit(None, pl.Float64).alias("wait_ms"))
    out = out.with_columns(pl.col("wait_ms").fill_null(0.0))
    out = out.with_columns((pl.col("step_ms") - pl.col("wait_ms")).clip(lower_bound=0.0).alias("busy_ms"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(["rank", "step"])


DERIVED = {"step_balance": step_balance}
