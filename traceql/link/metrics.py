"""Per rank and step: the numbers every report shows, with one definition each (summary, diff, html, and the rules
that read the same tables).

- step_ms: the longer of the step's host range and its GPU span (link.steps.step_times).
- comm_ms, compute_ms, overlap_ms, exposed_comm_ms, comm_comp_overlap_pct: the activity table's communication
  against its compute, on the side where the rank's communication runs (side: "gpu" for NCCL kernels, "host" for
  collectives with no kernel, gloo), exactly what TQL101 measures. A rank without communication (side null) has
  the union of its compute kernels as compute_ms.
- wait_ms: the union of the rank's waits for later ranks in matched collectives; busy_ms = step_ms - wait_ms
  (link.balance.step_balance).
- gpu_busy_ms, gpu_idle_ms, kernel_time_ms, kernels: the GPU's view (link.breakdown.step_breakdown): union of all
  kernels, the GPU span minus it, the summed duration and the count of compute and communication kernels.

A rank without steps gets one row with step null covering its whole trace (its step_ms is its GPU span).
"""

from __future__ import annotations

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.model import Run

SCHEMA = {
    "rank": pl.Int32, "step": pl.Int64, "host_ms": pl.Float64, "gpu_span_ms": pl.Float64, "step_ms": pl.Float64,
    "side": pl.Utf8, "comm_ms": pl.Float64, "compute_ms": pl.Float64, "overlap_ms": pl.Float64,
    "exposed_comm_ms": pl.Float64, "comm_comp_overlap_pct": pl.Float64, "wait_ms": pl.Float64, "busy_ms": pl.Float64,
    "gpu_busy_ms": pl.Float64, "gpu_idle_ms": pl.Float64, "kernel_time_ms": pl.Float64, "kernels": pl.Int64,
}
_PER = ["rank", "step"]
_NO_STEP = -1  # sentinel for "the whole trace" of a rank without steps, so it groups like a step


def comm_coverage(run: Run) -> pl.DataFrame:
    """Per rank and step: activity comm against compute, as TQL101's exposed measure computes it (per rank, step,
    side and source); where a rank has two sources (two clocks), the one with the most communication is kept. A rank
    without steps has one row, step _NO_STEP, for its whole trace. step_metrics' per-rank half: a rank task builds it
    where the rank was read, so that the activity intervals never leave it (traceql.executor)."""
    from traceql.link import ensure
    from traceql import intervals as measures

    ranks_with_steps = set(ensure(run, "step_times")["rank"].drop_nulls().to_list())
    a = ensure(run, "activity")
    cols = {"rank": pl.Int32, "step": pl.Int64, "side": pl.Utf8, "comm_ms": pl.Float64, "compute_ms": pl.Float64,
            "overlap_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "comm_comp_overlap_pct": pl.Float64}
    if a.height == 0:
        return pl.DataFrame(schema=cols)
    a = a.with_columns(pl.when(pl.col("rank").is_in(list(ranks_with_steps))).then(pl.col("step"))
                       .otherwise(pl.lit(_NO_STEP, pl.Int64)).alias("step"))
    per = ["rank", "step", "side", "source"]
    comm, compute = a.filter(pl.col("kind") == "comm"), a.filter(pl.col("kind") == "compute")
    if comm.height == 0:
        # no communication: compute alone, so that compute_ms is the same number whichever side
        u = measures.union(compute, per).select(*per, pl.col("union_ms").alias("compute_ms"))
        u = u.with_columns(pl.lit(0.0).alias("comm_ms"), pl.lit(0.0).alias("overlap_ms"), pl.lit(0.0).alias("exposed_comm_ms"),
                           pl.lit(None, pl.Float64).alias("comm_comp_overlap_pct"))
    else:
        # intervals.coverage's numbers over the groups with communication, its three unions in one sweep
        from traceql.link.breakdown import keyed_unions, overlap_columns

        u = keyed_unions([comm, compute, pl.concat([comm, compute])], per)
        one = {t: u.filter(pl.col("_t") == t).select(*per, pl.col("_u").alias(c)) for t, c in enumerate(("_comm", "_comp", "_both"))}
        u = one[0].join(one[1], on=per, how="left", nulls_equal=True).join(one[2], on=per, how="left", nulls_equal=True)
        u = overlap_columns(u, "_comm", "_comp", "_both").with_columns(
            (pl.col("_comp").fill_null(0) / measures.NS_PER_MS).alias("compute_ms")).sort(per).collect(engine=POLARS_ENGINE)
    best = u.group_by("rank", "source").agg(pl.col("comm_ms").sum().alias("_c"), pl.len().alias("_n")) \
        .sort(["rank", "_c", "_n", "source"], descending=[False, True, True, False]).unique("rank", keep="first")
    u = u.join(best.select("rank", "source"), on=["rank", "source"], how="semi")
    return u.select([pl.col(c).cast(t) for c, t in cols.items()])


def step_metrics(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    st = ensure(run, "step_times").select("rank", "step", "host_ms", "gpu_span_ms", "step_ms")
    ranks_with_steps = set(st["rank"].drop_nulls().to_list())
    bd = ensure(run, "step_breakdown").select(
        pl.col("rank").cast(pl.Int32), pl.col("step").fill_null(_NO_STEP).cast(pl.Int64), pl.col("gpu_span_ms").alias("_bd_span"),
        pl.col("busy_ms").alias("gpu_busy_ms"), pl.col("compute_ms").alias("_bd_compute"), pl.col("idle_ms").alias("gpu_idle_ms"), "kernel_time_ms", "kernels")
    cov = ensure(run, "comm_coverage")
    bal = ensure(run, "step_balance").select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "wait_ms")
    # the rows: every step of every rank, plus the whole trace of ranks without steps that have activity
    no_step = sorted(({*bd["rank"].to_list(), *cov["rank"].to_list()}) - ranks_with_steps)
    keys = pl.concat([
        st.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "host_ms", "gpu_span_ms", "step_ms"),
        pl.DataFrame({"rank": no_step, "step": [_NO_STEP] * len(no_step)}, schema={"rank": pl.Int32, "step": pl.Int64})
        .with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("host_ms", "gpu_span_ms", "step_ms")),
    ])
    if keys.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    out = keys.join(bd, on=_PER, how="left").join(cov, on=_PER, how="left").join(bal, on=_PER, how="left")
    whole = pl.col("step") == _NO_STEP
    out = out.with_columns(
        # a rank with no communication at all is not in activity: its compute is its compute kernels' union
        pl.coalesce("compute_ms", "_bd_compute").alias("compute_ms"),
    ).with_columns(
        pl.when(whole).then(pl.col("_bd_span")).otherwise(pl.col("gpu_span_ms")).alias("gpu_span_ms"),
        pl.when(whole).then(pl.col("_bd_span")).otherwise(pl.col("step_ms")).alias("step_ms"),
        pl.col("comm_ms", "compute_ms", "overlap_ms", "exposed_comm_ms", "wait_ms", "kernel_time_ms").fill_null(0.0),
        pl.col("kernels").fill_null(0),
    ).with_columns(
        (pl.col("step_ms") - pl.col("wait_ms")).clip(lower_bound=0.0).alias("busy_ms"),
        pl.when(whole).then(None).otherwise(pl.col("step")).alias("step"),
    )
    return out.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort(_PER, nulls_last=True)


DERIVED = {"comm_coverage": comm_coverage, "step_metrics": step_metrics}
