"""`traceql summary`: per-rank headline numbers over the profiled steps (or the whole trace where there are none).

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
    from traceql.rules.measures import coverage

    us = 1000
    out: dict[int, float | None] = {}
    seen_comm_ms: dict[int, float] = {}
    kernels = run.table("kernels").filter(pl.col("kind").is_in(["comm", "compute"]) & pl.col("ts").is_not_null())
    for (rank, source), k in kernels.partition_by(["rank", "source"], as_dict=True).items():
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


def summarize(run: Run) -> dict:
    bd = link.ensure(run, "step_breakdown")
    steps = run.table("steps")
    out: dict[str, dict] = {}
    overlap_hta = _hta_overlap(run)
    for rank in run.ranks:
        srows = steps.filter(pl.col("rank") == rank)
        b = bd.filter(pl.col("rank") == rank)
        comm = b["comm_ms"].sum() if b.height else 0.0
        overlap = b["overlap_ms"].sum() if b.height else 0.0
        out[str(rank)] = {
            "steps": srows["step"].n_unique() if srows.height else 0,
            "step_time_ms": _r(srows["dur"].median() / 1e6) if srows.height else None,
            "kernel_time_ms": _r(b["kernel_time_ms"].sum()),
            "compute_ms": _r(b["compute_ms"].sum()),
            "comm_ms": _r(comm),
            "exposed_comm_ms": _r(b["exposed_comm_ms"].sum()),
            "comm_comp_overlap_pct": _r(overlap_hta.get(rank), 2),
            "comm_comp_overlap_pct_steps": _r(overlap / comm * 100.0, 2) if comm else None,
            "idle_ms": _r(b["idle_ms"].sum()),
            "kernels": int(b["kernels"].sum()) if b.height else 0,
            "window": "steps" if srows.height else "trace",
        }
    return {"ranks": out}
