"""Cross-rank time for the reports: the derived clock_offsets through link.clock where they exist, else each rank's
own clock (and a note that says so). Reports never compare raw timestamps of two ranks without saying which."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceql.model import Run


@dataclass
class Aligner:
    aligned: bool
    note: str
    _offsets: pl.DataFrame | None = None

    def __call__(self, df: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
        """df with its time columns `cols` moved to the common clock (unchanged when not aligned)."""
        if not self.aligned or df.height == 0:
            return df
        from traceql.link import clock

        cols = [c for c in cols if c in df.columns]
        return clock.align(df, self._offsets, cols)


def aligner(run: Run) -> Aligner:
    from traceql import link

    if len(run.ranks) < 2:
        return Aligner(False, "one rank: no clock alignment needed")
    if "clock_offsets" not in link.derived_tables() and "clock_offsets" not in run.tables:
        return Aligner(False, "ranks shown on their own clocks: no clock_offsets table in this version of traceql")
    try:
        from traceql.link import clock  # noqa: F401

        offsets = link.ensure(run, "clock_offsets")
    except Exception as e:  # alignment is an improvement, never a reason to lose the report
        return Aligner(False, f"ranks shown on their own clocks: clock alignment failed ({type(e).__name__}: {e})")
    if offsets is None or offsets.height == 0:
        return Aligner(False, "ranks shown on their own clocks: no matched collectives to align them by")
    return Aligner(True, "ranks aligned on one clock from matched collectives (link.clock)", offsets)
