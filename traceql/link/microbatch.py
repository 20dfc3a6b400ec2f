"""Gradient accumulation: does every micro-batch of an optimizer step synchronise gradients?

A micro-batch is one forward of the data-parallel wrapper (DistributedDataParallel.forward,
FullyShardedDataParallel.forward) inside a step. With no_sync() (DDP) or set_requires_gradient_sync(False)
(FSDP2), only the last micro-batch of the step all-reduces; without it every one does. A micro-batch counts as
synchronised when a gradient collective starts between its forward and the next micro-batch's forward.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

FORWARD = r"^(DistributedDataParallel|FullyShardedDataParallel|FSDP)\.forward$|^## forward ##$"
GRAD_OPS = ["all_reduce", "reduce_scatter", "all_reduce_coalesced", "reduce_scatter_tensor_coalesced"]


def microbatches(run: Run) -> pl.DataFrame:
    """Per rank, step and micro-batch (mb: its order in the step): when its forward started (ts), until when it ran
    (the next micro-batch's forward, else the step's end) and how many gradient collectives started in it."""
    schema = {"rank": pl.Int32, "step": pl.Int64, "mb": pl.Int64, "ts": pl.Int64, "until": pl.Int64, "grad_collectives": pl.UInt32}
    fw = run.table("host_ops").filter(pl.col("name").str.contains(FORWARD) & pl.col("step").is_not_null())
    if fw.height == 0:
        return pl.DataFrame(schema=schema)
    # outermost forwards only (a wrapper may nest another)
    fw = fw.sort(["rank", "step", "ts"]).filter(pl.col("depth") == pl.col("depth").min().over(["rank", "step"]))
    fw = fw.with_columns(pl.col("ts").shift(-1).over(["rank", "step"]).alias("next_ts"), pl.int_range(pl.len()).over(["rank", "step"]).alias("mb"))
    steps = run.table("steps").select("rank", "source", "step", pl.col("end").alias("step_end"))
    fw = fw.join(steps, on=["rank", "source", "step"], how="left").with_columns(pl.col("next_ts").fill_null(pl.col("step_end")).alias("until"))
    coll = run.table("collectives").filter(pl.col("op").is_in(GRAD_OPS) & pl.col("step").is_not_null()).select("rank", "source", "step", pl.col("ts").alias("c_ts"))
    # each collective belongs to the last micro-batch that started before it (as-of join, no cartesian product)
    left = coll.sort("c_ts")
    right = fw.select("rank", "source", "step", "mb", "ts", "until").sort("ts")
    j = left.join_asof(right, left_on="c_ts", right_on="ts", by=["rank", "source", "step"], strategy="backward", check_sortedness=False)
    j = j.filter(pl.col("mb").is_not_null() & (pl.col("c_ts") < pl.col("until")))
    per_mb = j.group_by(["rank", "step", "mb"]).agg(pl.len().alias("grad_collectives"))
    out = fw.select("rank", "step", "mb", "ts", "until").join(per_mb, on=["rank", "step", "mb"], how="left")
    out = out.with_columns(pl.col("grad_collectives").fill_null(0))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(["rank", "step", "mb"])


DERIVED = {"microbatches": microbatches}
