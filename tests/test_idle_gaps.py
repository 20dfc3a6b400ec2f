"""The interval arithmetic behind gpu_idle_gaps and input_stall, against plain definitions on small integer sets."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from traceql.link import breakdown
from traceql.link.breakdown import _raw_gaps
from traceql.link.input_pipeline import _segments, covered_ns
from traceql.model import Run
from traceql.model.tables import conform

_iv = st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 12))


def _points(ivs, rank):
    return {t for r, a, d in ivs if r == rank for t in range(a, a + d)}


@settings(max_examples=100, deadline=None)
@given(st.lists(_iv, max_size=20), st.lists(_iv, min_size=1, max_size=10))
def test_covered_ns_is_the_length_of_the_intersection_with_the_union(busy, queries):
    key = ["rank", "source"]
    seg = _segments(pl.DataFrame([(r, 0, a, a + d) for r, a, d in busy],
                                 schema={"rank": pl.Int32, "source": pl.Int32, "ts": pl.Int64, "end": pl.Int64}, orient="row"), key)
    q = pl.DataFrame([(r, 0, a, a + d) for r, a, d in queries],
                     schema={"rank": pl.Int32, "source": pl.Int32, "ts": pl.Int64, "end": pl.Int64}, orient="row")
    got = covered_ns(q, seg, key).to_list()
    want = [len(_points(busy, r) & set(range(a, a + d))) for r, a, d in queries]
    assert got == want, (busy, queries, got, want)


_kernel = st.tuples(st.integers(0, 60), st.integers(1, 8), st.integers(0, 3))


@settings(max_examples=100, deadline=None)
@given(st.lists(_kernel, min_size=1, max_size=25))
def test_idle_gaps_of_one_device_are_its_span_minus_its_busy_time(rows):
    # one device; step windows wide enough that no lead gap is clipped: then the gaps charged to steps are exactly the
    # idle points between the device's first and last operation, and each gap belongs to the operation after it
    k = conform("kernels", pl.DataFrame({
        "rank": [0] * len(rows), "source": [0] * len(rows), "device": [0] * len(rows),
        "ts": [a for a, _, _ in rows], "end": [a + d for a, d, _ in rows], "dur": [d for _, d, _ in rows],
        "name": [f"k{i}" for i in range(len(rows))], "step": [s for _, _, s in rows]}))
    steps = conform("steps", pl.DataFrame({"rank": [0] * 4, "source": [0] * 4, "step": [0, 1, 2, 3],
                                           "ts": [-1000] * 4, "end": [1000] * 4, "dur": [2000] * 4}))
    run = Run(path=Path("."), sources=[], tables={"kernels": k, "steps": steps})
    g = _raw_gaps(run)
    busy = {t for a, d, _ in rows for t in range(a, a + d)}
    lo, hi = min(a for a, _, _ in rows), max(a + d for a, d, _ in rows)
    assert round(g["gap_ms"].sum() * 1e6) == (hi - lo) - len(busy)
    for step, gap_end in g.select("step", "gap_end").iter_rows():
        assert step in {s for a, _, s in rows if a == gap_end}


_on_device = st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 60), st.integers(0, 8),
                       st.one_of(st.none(), st.integers(0, 3)))


@settings(max_examples=100, deadline=None)
@given(st.lists(_on_device, min_size=1, max_size=30))
@example([(0, 0, 0, 5, 0), (0, 0, 5, 5, None), (0, 0, 20, 5, 0)])  # the gap's previous step skips the stepless kernel
def test_idle_gaps_by_one_packed_running_end_equal_the_windows_per_device(rows):
    # several ranks and devices (one with no device), zero-length kernels and kernels without a step: the running end
    # as one cum_max over a packed (device, end) integer gives the windows' gaps, previous rows and steps
    k = conform("kernels", pl.DataFrame({
        "rank": [r for r, *_ in rows], "source": [r for r, *_ in rows],
        "device": [None if d == 2 else d for _, d, *_ in rows],
        "ts": [a for _, _, a, _, _ in rows], "end": [a + d for _, _, a, d, _ in rows], "dur": [d for *_, d, _ in rows],
        "name": [f"k{i}" for i in range(len(rows))], "step": [s for *_, s in rows]}))
    steps = conform("steps", pl.DataFrame({"rank": [0, 0, 1, 1], "source": [0, 0, 1, 1], "step": [0, 1, 0, 2],
                                           "ts": [0, 20, 5, 30], "end": [20, 70, 30, 70], "dur": [20, 50, 25, 40]}))
    run = Run(path=Path("."), sources=[], tables={"kernels": k, "steps": steps})
    packed = _raw_gaps(run)
    breakdown._PACK_DEVICES = False
    try:
        windows = _raw_gaps(run)
    finally:
        breakdown._PACK_DEVICES = True
    assert_frame_equal(packed, windows)
