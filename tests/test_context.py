"""link/context.enclosing_op: the innermost host op spanning a moment on a thread, by an as-of join and a parent walk.

The walk goes point by point in Python for a few points, by row (ids packed into one searchable key) where ids
allow it and by a join per level otherwise; all three must name the same ops. Hand-made forests here, nested as Kineto's host ops are (one stack per thread).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceql.link.context import enclosing_op
from traceql.model import Run


def _forest(spans: list[tuple[int, int, int]], id0: int = 0) -> pl.DataFrame:
    """(tid, ts, dur) -> properly nested host ops: a span crossing an open one on its thread is dropped; parent and
    depth from the per-thread stack, ids from id0 in start order."""
    rows, stacks = [], {}
    for tid, ts, dur in sorted(spans, key=lambda s: (s[0], s[1], -s[2])):
        end = ts + dur
        stack = stacks.setdefault(tid, [])
        while stack and stack[-1]["end"] < ts:
            stack.pop()
        if stack and end > stack[-1]["end"]:
            continue  # crosses the open op: not nested
        rows.append({"rank": 0, "source": 0, "tid": tid, "ts": ts, "end": end, "id": id0 + len(rows),
                     "parent": stack[-1]["id"] if stack else None, "depth": len(stack), "name": f"op{len(rows)}"})
        stack.append(rows[-1])
    schema = {"rank": pl.Int64, "source": pl.Int64, "tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64, "id": pl.Int64,
              "parent": pl.Int64, "depth": pl.Int32, "name": pl.Utf8}
    return pl.DataFrame(rows, schema=schema)


def _run(ops: pl.DataFrame) -> Run:
    return Run(path=Path("."), sources=[], tables={"host_ops": ops})


def _points(mids: list[int], tids: list[int] | None = None) -> pl.DataFrame:
    cols = {"_gid": pl.Series(range(len(mids)), dtype=pl.UInt32), "rank": pl.Series([0] * len(mids), dtype=pl.Int32),
            "source": pl.Series([0] * len(mids), dtype=pl.Int32), "_mid": pl.Series(mids, dtype=pl.Int64)}
    if tids is not None:
        cols["tid"] = pl.Series(tids, dtype=pl.Int64)
    return pl.DataFrame(cols)


def _named(run: Run, pts: pl.DataFrame, **kw) -> dict[int, str]:
    out = enclosing_op(run, pts, tables=("host_ops",), **kw)
    return dict(zip(out["_gid"].to_list(), out["host_op"].to_list()))


def test_a_moment_after_the_last_started_op_ended_is_named_by_the_ancestor_spanning_it():
    # op0 [0, 100] holds op1 [10, 60] which holds op2 [20, 30]; op3 [70, 80] on the same thread
    ops = _forest([(1, 0, 100), (1, 10, 50), (1, 20, 10), (1, 70, 10)])
    got = _named(_run(ops), _points([25, 40, 65, 75, 95, 150]))
    # 40: op2 started last but ended, op1 spans it; 65: op1 ended too, op0; 95: op3 ended, op0; 150: nothing
    assert got == {0: "op2", 1: "op1", 2: "op0", 3: "op3", 4: "op0"}


def test_an_excluded_op_ends_the_walk_so_its_ancestors_are_not_reached():
    # the walk goes through parents: an excluded range (a step's own NVTX range) stops it, as the join per level did
    ops = _forest([(1, 0, 100), (1, 10, 50), (1, 20, 10)])
    excl = pl.DataFrame({"rank": [0], "source": [0], "id": [1]})
    got = _named(_run(ops), _points([25, 40, 65]), exclude=excl)
    # 40 and 65: op2 ended, its parent op1 is excluded: op0, spanning both, is not reached
    assert got == {0: "op2"}


# one start per thread and moment: of a parent and child starting together the as-of join may return either (an
# unstable sort), and the walk from the parent never reaches the child
_spans = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 200), st.integers(0, 80)), max_size=40,
                  unique_by=lambda s: (s[0], s[1]))


@settings(max_examples=120, deadline=None)
@given(_spans, st.lists(st.integers(-5, 300), min_size=1, max_size=30), st.booleans())
def test_the_walk_by_searched_rows_names_what_the_walk_by_joins_names(spans, mids, own_thread):
    ops = _forest(spans)
    # negative ids cannot be packed into one key (link/_keys.packed_key): that run takes the join per level
    shifted = _forest(spans, id0=-1000)
    tids = [1 + i % 3 for i in range(len(mids))] if own_thread else None
    pts = _points(mids, tids)
    from traceql.link import context

    listed = _named(_run(ops), pts, tids=own_thread)  # a few points: the walk over lists in Python
    few = context._WALK_IN_PYTHON
    try:  # the vectorised walks, as from _WALK_IN_PYTHON points on
        context._WALK_IN_PYTHON = 0
        searched = _named(_run(ops), pts, tids=own_thread)
        joined = _named(_run(shifted), pts, tids=own_thread)
    finally:
        context._WALK_IN_PYTHON = few
    assert searched == joined == listed
    # and both are the innermost op spanning the moment (deepest; ties by latest start, then thread, then name)
    want = {}
    for g, m in enumerate(mids):
        live = [r for r in ops.iter_rows(named=True) if r["ts"] <= m <= r["end"] and (not own_thread or r["tid"] == tids[g])]
        if live:
            want[g] = sorted(live, key=lambda r: (-r["depth"], -r["ts"], r["tid"], r["name"]))[0]["name"]
    assert searched == want
