"""The interval measures against a brute-force reference on a millisecond grid, on arbitrary interval sets."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceql import intervals as measures

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=25)


def _frame(iv, rank=0, step=1, name="k"):
    return pl.DataFrame(
        {"rank": [rank] * len(iv), "step": [step] * len(iv), "ts": [a * 1_000_000 for a, _ in iv],
         "end": [(a + d) * 1_000_000 for a, d in iv], "name": [f"{name}{i}" for i in range(len(iv))]},
        schema={"rank": pl.Int32, "step": pl.Int64, "ts": pl.Int64, "end": pl.Int64, "name": pl.Utf8},
    )


def _cells(iv):
    return {t for a, d in iv for t in range(a, a + d)}


@settings(max_examples=80, deadline=None)
@given(intervals, intervals)
def test_coverage_matches_brute_force(a, b):
    if not a:
        return
    out = measures.coverage(_frame(a), _frame(b), ["rank", "step"]).row(0, named=True)
    ca, cb = _cells(a), _cells(b)
    assert out["sel_ms"] == len(ca)
    assert out["against_ms"] == len(cb)
    assert out["overlap_ms"] == len(ca & cb)
    assert out["exposed_ms"] == len(ca - cb)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), max_size=25))
def test_gaps_are_the_holes_of_the_union(a):
    g = measures.gaps(_frame(a), ["rank", "step"])
    cells = _cells(a)
    if not cells:
        assert g.height == 0
        return
    holes = set(range(min(cells), max(cells))) - cells
    assert g["gap_ms"].sum() == len(holes)
    # every gap lies strictly between busy time
    for row in g.iter_rows(named=True):
        assert (row["gap_ts"] // 1_000_000 - 1) in cells
        assert (row["gap_end"] // 1_000_000) in cells


def test_coverage_is_per_group():
    a = pl.concat([_frame([(0, 10)], rank=0), _frame([(0, 10)], rank=1)])
    b = _frame([(5, 10)], rank=0)
    out = measures.coverage(a, b, ["rank"]).sort("rank")
    assert out["overlap_ms"].to_list() == [5.0, 0.0]
    assert out["overlap_pct"].to_list() == [50.0, 0.0]


def test_touching_intervals_do_not_overlap():
    out = measures.coverage(_frame([(0, 10)]), _frame([(10, 5)]), ["rank"]).row(0, named=True)
    assert out["overlap_ms"] == 0


def test_distinct_names_the_odd_rank_and_the_majority():
    df = pl.DataFrame({"rank": [0, 1, 2, 3], "compile_id": ["0/0"] * 4, "cache_key": ["a", "a", "b", "a"]})
    out = measures.distinct(df, ["compile_id"], "cache_key")
    assert out["rank"].to_list() == [2]
    row = out.row(0, named=True)
    assert row["value"] == "b" and row["majority"] == "a" and row["majority_ranks"] == [0, 1, 3]


def test_spread_ratio_against_median_of_ranks():
    df = pl.DataFrame({"rank": [0, 0, 1, 1, 2, 2], "dur": [10, 10, 10, 10, 20, 20]})
    out = measures.spread(df, "dur").sort("rank")
    assert out["ratio"].to_list() == [1.0, 1.0, 2.0]
