"""Where work ran, as compute or communication intervals, on whichever side of the rank carries the facts.

GPU ranks: compute and communication kernels (kind compute / comm). Ranks with no GPU activity at all (gloo on
CPU, CPU-only traces): communication is the host-side execution of each collective (the collectives table's
span: gloo:all_reduce on the worker thread) and compute is every other CPU op. Rules that ask "did
communication overlap compute?" read this table, so they work on both.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

_COMM_OP = r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms|gloo:|nccl:|ProcessGroup|allreduce|all_reduce)"
SCHEMA = {"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64, "ts": pl.Int64, "end": pl.Int64, "name": pl.Utf8, "kind": pl.Utf8, "side": pl.Utf8}


def activity(run: Run) -> pl.DataFrame:
    k = run.table("kernels").filter(pl.col("kind").is_in(["compute", "comm"]))
    gpu_ranks = k["rank"].drop_nulls().unique().to_list()
    parts = [k.select("rank", "source", "step", "ts", "end", "name", "kind", pl.lit("gpu").alias("side"))]
    coll = run.table("collectives").filter(~pl.col("rank").is_in(gpu_ranks) & pl.col("ts").is_not_null())
    if coll.height:
        parts.append(coll.select("rank", "source", "step", "ts", "end", pl.col("op").alias("name"), pl.lit("comm").alias("kind"), pl.lit("host").alias("side")))
        host_ranks = coll["rank"].unique().to_list()
        ops = run.table("host_ops").filter(
            pl.col("rank").is_in(host_ranks) & (pl.col("cat") == "cpu_op") & ~pl.col("name").str.contains(_COMM_OP)
        )
        parts.append(ops.select("rank", "source", "step", "ts", "end", "name", pl.lit("compute").alias("kind"), pl.lit("host").alias("side")))
    return pl.concat([p.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]) for p in parts]).sort(["rank", "ts"])


DERIVED = {"activity": activity}
