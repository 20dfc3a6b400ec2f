"""link.steps._by_time: the step whose [ts, end) window holds each row's start, on the row's own rank and source,
whether each (rank, source) holds its rows in one run (slices) or they come back (partition_by)."""

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceql.link.steps import _by_time

_KEYS = st.tuples(st.sampled_from([0, 1, None]), st.sampled_from([0, 1]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_KEYS, st.one_of(st.none(), st.integers(0, 60))), max_size=40),
       st.lists(st.tuples(_KEYS, st.integers(0, 5), st.integers(0, 50), st.integers(1, 20)), max_size=8),
       st.booleans())
def test_each_row_gets_the_step_holding_its_start(rows, steps, grouped):
    if grouped:  # each (rank, source) in one run, as a run's tables hold them
        rows = sorted(rows, key=lambda r: (r[0][0] is None, r[0][0] or 0, r[0][1]))
    df = pl.DataFrame({"rank": [k[0] for k, _ in rows], "source": [k[1] for k, _ in rows], "ts": [t for _, t in rows]},
                      schema={"rank": pl.Int32, "source": pl.Int32, "ts": pl.Int64})
    # steps of one (rank, source) do not overlap (each starts after the previous ends), as ProfilerStep ranges
    windows, at = [], {}
    for key, n, gap, dur in steps:
        if key[0] is None:
            continue
        t0 = at.get(key, 0) + gap
        windows.append((key, n, t0, t0 + dur))
        at[key] = t0 + dur
    st_df = pl.DataFrame({"rank": [w[0][0] for w in windows], "source": [w[0][1] for w in windows],
                          "step": [w[1] for w in windows], "ts": [w[2] for w in windows], "end": [w[3] for w in windows]},
                         schema={"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64, "ts": pl.Int64, "end": pl.Int64})
    want = []
    for key, t in rows:
        hit = [n for k, n, a, b in windows if k == key and t is not None and a <= t < b]
        want.append(hit[0] if hit else None)
    assert _by_time(df, st_df).to_list() == want
