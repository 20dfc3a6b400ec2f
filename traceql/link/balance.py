"""Per rank and step: the step's time, how much of it the rank spent waiting for other ranks in collectives, and
the rest (its own work). TQL301 compares that work across ranks in its YAML.

In synchronous training every rank's step takes as long as the slowest rank's, because the fast ranks wait inside
the step's collectives; the wall-clock step times come out equal and hide the imbalance. What differs is the time
each rank spends outside those waits.

The wait of a step is the union of the rank's wait intervals ([arrival, last rank's arrival) of each matched
collective, link.collectives), not their sum: collectives in flight together (DDP buckets, async gloo work) wait
for the same late rank at the same time. Waits are measured across ranks, so they are only as good as the clock
alignment: clock_error_ms (link.clock) says how far off they can be.
"""

from __future__ import annotations

import polars as pl

from traceql import link
from traceql.link.collectives import wait_union
from traceql.model import Run

SCHEMA = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "wait_ms": pl.Float64, "busy_ms": pl.Float64}


def step_balance(run: Run) -> pl.DataFrame:
    # the step time every report uses: the longer of the host range and the GPU span (link.steps.step_times)
    steps = link.ensure(run, "step_times").select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "step_ms")
    if steps.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    ci = link.ensure(run, "collective_instances")
    if ci.height and "wait_end" in ci.columns:
        w = ci.filter(pl.col("step").is_not_null())
        waits = wait_union(w, ["rank", "step"]).select(
            pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), (pl.col("_u") / 1e6).alias("wait_ms"))
        out = steps.join(waits, on=["rank", "step"], how="left")
    else:
        out = steps.with_columns(pl.lit(None, pl.Float64).alias("wait_ms"))
    # a wait can reach past the step's own range (a collective issued late in the step): no more than the step
    out = out.with_columns(pl.min_horizontal(pl.col("wait_ms").fill_null(0.0), "step_ms").alias("wait_ms"))
    out = out.with_columns((pl.col("step_ms") - pl.col("wait_ms")).clip(lower_bound=0.0).alias("busy_ms"))
    return out.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort(["rank", "step"])


DERIVED = {"step_balance": step_balance}
