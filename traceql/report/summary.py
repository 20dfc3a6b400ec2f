"""`traceql summary`: per-rank headline numbers over the profiled steps (or the whole trace where there are none).

The numbers come from link's step_metrics, the derived table the rules read (TQL101's exposed communication,
TQL301's waits, the step times of step_times), so summary, diff, the HTML report and check agree.
comm_comp_overlap_pct is computed in Holistic Trace Analysis' window (see _hta_overlap) so it can be compared
with HTA's get_comm_comp_overlap; comm_comp_overlap_pct_steps is the same ratio over the profiled steps only.
"""

from __future__ import annotations

import polars as pl

from traceql import link
from traceql.model import Run


def _r(v, nd=3):
    return None if v is None else round(float(v), nd)


def _hta_overlap(run: Run) -> dict[int, float | None]:
    """comm_comp_overlap_pct in Holistic Trace Analysis' window, so the two tools' numbers compare directly.

    HTA (0.5.0, get_comm_comp_overlap) takes the kernels launched (by a runtime call with the same correlation)
    before the last ProfilerStep starts, when there are two or more steps (the last step may be cut short);
    rounds their float-microsecond times inward to whole microseconds; and divides
    |union(comm) & union(compute)| by |union(comm)|.
    """
    from traceql.intervals import coverage

    us = 1000
    out: dict[int, float | None] = {}
    seen_comm_ms: dict[int, float] = {}
    kernels = run.table("kernels").filter(pl.col("kind").is_in(["comm", "compute"]) & pl.col("ts").is_not_null())
    for (rank, source), k in kernels.partition_by(["rank", "source"], as_dict=True).items():
        if rank is None:  # a trace that names no rank: not one of run.ranks, nothing to report it under
            continue
        k = k.with_columns(ts=((pl.col("ts") + us - 1) // us) * us, end=(pl.col("end") // us) * us).filter(pl.col("end") >= pl.col("ts"))
        st = run.table("steps").filter((pl.col("rank") == rank) & (pl.col("source") == source))
        if st.height >= 2:
            last_start = st["ts"].max()
            rt = run.table("runtime").filter((pl.col("rank") == rank) & (pl.col("source") == source) & (pl.col("ts") < last_start))
            k = k.join(rt.select("correlation").unique(), on="correlation", how="semi")
        comm, comp = k.filter(pl.col("kind") == "comm"), k.filter(pl.col("kind") == "compute")
        if comm.height == 0:
            continue
        row = coverage(comm, comp, ["rank"]).row(0, named=True)
        # one rank, several sources: keep the source that saw the most communication
        comm_ms = row["sel_ms"] or 0.0
        if rank not in out or comm_ms > seen_comm_ms[rank]:
            out[rank] = row["overlap_pct"]
            seen_comm_ms[rank] = comm_ms
    return out


# Every column says what it is: `_median` is the median over the rank's steps of a per-step value, `_total` its
# sum over the steps; the definitions are link.metrics.step_metrics', the table the rules read too.
COLUMNS = {
    "steps": "profiled steps of the rank (1 window when the trace has no step markers: window 'trace')",
    "step_time_ms_median": "per-step median of the step time: the longer of the host range and the GPU span",
    "step_time_ms_total": "sum over the steps of the step time",
    "compute_ms_median": "per-step median of compute: union of compute kernels (CPU ops where communication runs on the host)",
    "compute_ms_total": "sum over the steps of compute",
    "comm_ms_median": "per-step median of communication: union of NCCL kernels, or of host-side collectives (gloo)",
    "comm_ms_total": "sum over the steps of communication",
    "exposed_comm_ms_median": "per-step median of communication with no compute beside it (what TQL101 reports)",
    "exposed_comm_ms_total": "sum over the steps of exposed communication",
    "comm_comp_overlap_pct": "share of communication overlapping compute in Holistic Trace Analysis' window (GPU kernels)",
    "comm_comp_overlap_pct_steps": "share of communication overlapping compute over the steps (total overlap / total comm)",
    "comm_side": "where communication runs: gpu (NCCL kernels) or host (collectives with no kernel, gloo)",
    "wait_ms_median": "per-step median of the time waiting for later ranks in collectives (union of the waits)",
    "wait_ms_total": "sum over the steps of the waits",
    "busy_ms_median": "per-step median of the step time minus the waits (what TQL301 compares)",
    "idle_ms_median": "per-step median of GPU idle: the GPU span minus the union of all kernels",
    "idle_ms_total": "sum over the steps of GPU idle",
    "kernel_time_ms_total": "sum of compute and communication kernel durations inside the steps",
    "kernels_in_steps": "compute and communication kernels inside the steps",
    "kernels_median": "per-step median of the count of compute and communication kernels",
    "kernels_total": "compute and communication kernels in the whole trace, in steps or not",
    "window": "steps, or trace where the rank has no step markers",
}

_PER_STEP = {"step_time_ms": "step_ms", "compute_ms": "compute_ms", "comm_ms": "comm_ms", "exposed_comm_ms": "exposed_comm_ms",
             "wait_ms": "wait_ms", "idle_ms": "gpu_idle_ms"}


def summarize(run: Run) -> dict:
    sm = link.ensure(run, "step_metrics")
    kernels = run.table("kernels")
    k_total = dict(kernels.filter(pl.col("kind").is_in(["compute", "comm"])).group_by("rank").len().iter_rows()) if kernels.height else {}
    out: dict[str, dict] = {}
    overlap_hta = _hta_overlap(run)
    for rank in run.ranks:
        b = sm.filter(pl.col("rank") == rank)
        in_steps = b.filter(pl.col("step").is_not_null())
        window = "steps" if in_steps.height else "trace"
        b = in_steps if in_steps.height else b
        row: dict = {"steps": in_steps.height if in_steps.height else (1 if b.height else 0)}
        for key, col in _PER_STEP.items():
            row[f"{key}_median"] = _r(b[col].median()) if b.height else None
            row[f"{key}_total"] = _r(b[col].sum()) if b.height else None
        comm, overlap = (float(b["comm_ms"].sum()), float(b["overlap_ms"].sum())) if b.height else (0.0, 0.0)
        sides = b["side"].drop_nulls().unique().to_list() if b.height else []
        row.update({
            "busy_ms_median": _r(b["busy_ms"].median()) if b.height else None,
            "comm_comp_overlap_pct": _r(overlap_hta.get(rank), 2),
            "comm_comp_overlap_pct_steps": _r(overlap / comm * 100.0, 2) if comm else None,
            "comm_side": sides[0] if len(sides) == 1 else (None if not sides else ",".join(sorted(sides))),
            "kernel_time_ms_total": _r(b["kernel_time_ms"].sum()) if b.height else None,
            "kernels_in_steps": int(b["kernels"].sum()) if b.height else 0,
            "kernels_median": _r(b["kernels"].median(), 1) if b.height else None,
            "kernels_total": int(k_total.get(rank, 0)),
            "window": window,
        })
        out[str(rank)] = {k: row.get(k) for k in COLUMNS}
    return {"columns": COLUMNS, "ranks": out}
