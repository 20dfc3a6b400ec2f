"""`traceql summary`: per-rank headline numbers over the profiled steps (or the whole trace where there are none)."""

from __future__ import annotations

import polars as pl

from traceql import link
from traceql.model import Run


def _r(v, nd=3):
    return None if v is None else round(float(v), nd)


def summarize(run: Run) -> dict:
    bd = link.ensure(run, "step_breakdown")
    steps = run.table("steps")
    out: dict[str, dict] = {}
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
            "comm_comp_overlap_pct": _r(overlap / comm * 100.0, 2) if comm else None,
            "idle_ms": _r(b["idle_ms"].sum()),
            "kernels": int(b["kernels"].sum()) if b.height else 0,
            "window": "steps" if srows.height else "trace",
        }
    return {"ranks": out}
