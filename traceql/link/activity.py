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
    # only the columns used: filtering the wide kernel table would copy every column
    k = run.table("kernels").select("rank", "source", "step", "ts", "end", "name", "kind").filter(pl.col("kind").is_in(["compute", "comm"]))
    comm_ranks = k.filter(pl.col("kind") == "comm")["rank"].drop_nulls().unique().to_list()
    gpu_ranks = k["rank"].drop_nulls().unique().to_list()
    cols = ("rank", "source", "step", "ts", "end")
    parts = [k.filter(pl.col("rank").is_in(comm_ranks)).select(*cols, "name", "kind", pl.lit("gpu").alias("side"))]
    # ranks whose collectives leave no GPU kernel (gloo, also on CUDA tensors): the host-side execution is the
    # communication; compute is their GPU kernels where they have any, else their CPU ops
    coll = run.table("collectives").filter(~pl.col("rank").is_in(comm_ranks) & pl.col("ts").is_not_null())
    if coll.height:
        host_ranks = coll["rank"].unique().to_list()
        parts.append(coll.select(*cols, pl.col("op").alias("name"), pl.lit("comm").alias("kind"), pl.lit("host").alias("side")))
        on_gpu = [r for r in host_ranks if r in gpu_ranks]
        parts.append(k.filter(pl.col("rank").is_in(on_gpu) & (pl.col("kind") == "compute")).select(*cols, "name", "kind", pl.lit("host").alias("side")))
        ops = run.table("host_ops").filter(
            pl.col("rank").is_in([r for r in host_ranks if r not in gpu_ranks]) & (pl.col("cat") == "cpu_op") & ~pl.col("name").str.contains(_COMM_OP)
        )
        parts.append(ops.select(*cols, "name", pl.lit("compute").alias("kind"), pl.lit("host").alias("side")))
    out = pl.concat([p.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]) for p in parts])
    if coll.height:
        out = _split_at_steps(out, run.table("steps"))
    return out.sort(["rank", "ts"], maintain_order=True)


def _split_at_steps(a: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Host-side intervals cut at the step windows they cross, each piece in the step it lies in.

    A gloo collective runs on its worker thread and can end after the step that started it (gloo:all_reduce of
    step 2 still running when ProfilerStep#3 begins). Counted whole in its first step, it made that step's exposed
    communication longer than the step itself; cut at the boundary, each step holds only what ran inside it.
    The host side's step window is its ProfilerStep range: nothing else bounds it (GPU work, which can run past the
    host range, is never on this side). Only rows that cross a boundary are touched."""
    st = steps.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("step").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), pl.col("step").cast(pl.Int64).alias("_step"),
        pl.col("ts").cast(pl.Int64).alias("_sts"), pl.col("end").cast(pl.Int64).alias("_send"))
    if st.height == 0:
        return a
    a = a.with_row_index("_i")
    crosses = a.filter((pl.col("side") == "host") & pl.col("step").is_not_null()).join(
        st, left_on=["rank", "source", "step"], right_on=["rank", "source", "_step"], how="inner"
    ).filter(pl.col("end") > pl.col("_send")).select("_i", *SCHEMA)
    if crosses.height == 0:
        return a.drop("_i")
    pieces = crosses.join(st, on=["rank", "source"], how="inner").filter(
        (pl.col("_sts") < pl.col("end")) & (pl.col("_send") > pl.col("ts"))
    ).select(
        "rank", "source", pl.col("_step").alias("step"), pl.max_horizontal("ts", "_sts").alias("ts"),
        pl.min_horizontal("end", "_send").alias("end"), "name", "kind", "side")
    keep = a.filter(~pl.col("_i").is_in(crosses["_i"].implode())).drop("_i")
    return pl.concat([keep, pieces.select([pl.col(c).cast(t) for c, t in SCHEMA.items()])])


DERIVED = {"activity": activity}
