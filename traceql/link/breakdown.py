"""Per rank and step: where the GPU time went (compute, communication, exposed communication, idle).

Communication is NCCL/RCCL kernels (kind comm); compute is every other kernel except memcpy/memset: the
definitions Holistic Trace Analysis uses, so the numbers can be compared with it. Kernels belong to the step
that launched them (link.steps). A rank without steps gets one row with step null covering its whole trace.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run
from traceql.rules import measures

_PER = ["rank", "step"]


def step_breakdown(run: Run) -> pl.DataFrame:
    # only the columns used below: filtering the wide kernel table copies every column
    k = run.table("kernels").select("rank", "step", "kind", "ts", "end", "dur").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    schema = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "gpu_span_ms": pl.Float64, "busy_ms": pl.Float64,
              "compute_ms": pl.Float64, "comm_ms": pl.Float64, "overlap_ms": pl.Float64, "exposed_comm_ms": pl.Float64,
              "comm_comp_overlap_pct": pl.Float64, "idle_ms": pl.Float64, "kernel_time_ms": pl.Float64, "kernels": pl.Int64}
    if k.height == 0:
        return pl.DataFrame(schema=schema)
    steps = run.table("steps")
    ranks_with_steps = set(steps["rank"].drop_nulls().to_list())
    # ranks without steps: the whole trace is one window (step stays null, kept as a group by a sentinel)
    k = k.with_columns(
        pl.when(pl.col("rank").is_in(list(ranks_with_steps))).then(pl.col("step")).otherwise(pl.lit(-1)).alias("step")
    ).filter(pl.col("step").is_not_null())
    comm = k.filter(pl.col("kind") == "comm")
    compute = k.filter(pl.col("kind") == "compute")
    cov = measures.coverage(comm, compute, _PER) if comm.height else pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64})
    busy = measures.union(k, _PER).rename({"n": "n_all"})
    comp_u = measures.union(compute, _PER).select(*_PER, pl.col("union_ms").alias("compute_ms"))
    span = k.group_by(_PER).agg(((pl.col("end").max() - pl.col("ts").min()) / 1e6).alias("gpu_span_ms"))
    kt = k.filter(pl.col("kind").is_in(["compute", "comm"])).group_by(_PER).agg(
        (pl.col("dur").sum() / 1e6).alias("kernel_time_ms"), pl.len().cast(pl.Int64).alias("kernels")
    )
    out = span.join(busy.select(*_PER, pl.col("union_ms").alias("busy_ms")), on=_PER, how="left")
    out = out.join(comp_u, on=_PER, how="left").join(kt, on=_PER, how="left")
    if comm.height:
        out = out.join(cov.select(*_PER, pl.col("sel_ms").alias("comm_ms"), "overlap_ms", pl.col("exposed_ms").alias("exposed_comm_ms"), pl.col("overlap_pct").alias("comm_comp_overlap_pct")), on=_PER, how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("comm_ms", "overlap_ms", "exposed_comm_ms", "comm_comp_overlap_pct"))
    out = out.with_columns(
        pl.col("compute_ms", "kernel_time_ms").fill_null(0.0),
        pl.col("kernels").fill_null(0),
        pl.col("comm_ms", "overlap_ms", "exposed_comm_ms").fill_null(0.0),
        (pl.col("gpu_span_ms") - pl.col("busy_ms")).clip(lower_bound=0.0).alias("idle_ms"),
    )
    st = steps.select("rank", "source", "step", (pl.col("dur") / 1e6).alias("step_ms")).group_by(["rank", "step"]).agg(pl.col("step_ms").max())
    out = out.join(st.with_columns(pl.col("rank").cast(out.schema["rank"])), on=_PER, how="left")
    out = out.with_columns(pl.when(pl.col("step") == -1).then(None).otherwise(pl.col("step")).alias("step"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(_PER, nulls_last=True)


DERIVED = {"step_breakdown": step_breakdown}
