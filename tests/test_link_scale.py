"""The fast paths taken for scale give what the plain definitions give (benchmarks/rules.py times them)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceql.link._keys import first_match, in_order, packed_key, sorted_by
from traceql.pipeline import load_run
from traceql.rules.engine import evaluate
from traceql.rules.loader import load_rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

_small = st.one_of(st.none(), st.integers(0, 3))
_rows = st.lists(st.tuples(_small, _small, st.one_of(st.none(), st.integers(0, 6))), max_size=30)
_rows_neg = st.lists(st.tuples(_small, _small, st.one_of(st.none(), st.integers(-2, 6))), max_size=30)


def _plain(left: pl.DataFrame, right: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    return left.join(right.unique(on, keep="first", maintain_order=True), on=on, how="left", maintain_order="left")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.tuples(_rows, _rows), st.tuples(_rows_neg, _rows_neg)))
def test_first_match_is_a_left_join_on_the_first_right_row(frames):
    lrows, rrows = frames
    schema = {"rank": pl.Int32, "source": pl.Int32, "correlation": pl.Int64}
    left = pl.DataFrame(lrows, schema=schema, orient="row")
    right = pl.DataFrame(rrows, schema=schema, orient="row").with_row_index("pos").with_columns(pl.col("pos").cast(pl.Int64))
    got = first_match(left, right, ["rank", "source", "correlation"])
    want = _plain(left, right, ["rank", "source", "correlation"])
    assert got.equals(want), (got, want)


@settings(max_examples=200, deadline=None)
@given(_rows, st.sampled_from([["rank"], ["rank", "source"], ["rank", "source", "correlation"], ["correlation", "rank"]]))
def test_in_order_says_whether_a_sort_would_leave_the_rows_as_they_are(rows, by):
    df = pl.DataFrame(rows, schema={"rank": pl.Int32, "source": pl.Int32, "correlation": pl.Int64}, orient="row")
    has_nulls = any(df[c].null_count() for c in by)
    unchanged = df.equals(df.sort(by, maintain_order=True))
    assert in_order(df, by) == (unchanged and (not has_nulls or df.height < 2))
    assert sorted_by(df, by).select(by).equals(df.sort(by, maintain_order=True).select(by))


def test_packed_key_refuses_what_would_collide():
    wide = pl.DataFrame({"a": [1 << 40], "b": [1 << 30]})
    assert packed_key([wide], ["a", "b"]) is None  # 41 + 31 bits do not fit
    neg = pl.DataFrame({"a": [-1], "b": [2]})
    assert packed_key([neg], ["a", "b"]) is None
    ok = pl.DataFrame({"a": [0, 1, 1], "b": [3, 0, 3]})
    keys = ok.select(packed_key([ok], ["a", "b"]))["_key"].to_list()
    assert len(set(keys)) == 3


_kernel = st.tuples(st.integers(0, 1), st.one_of(st.none(), st.integers(0, 1)), st.integers(0, 50), st.integers(0, 20))


@settings(max_examples=150, deadline=None)
@given(st.lists(_kernel, min_size=1, max_size=25))
def test_prev_on_device_is_the_latest_ending_earlier_activity(rows):
    k = pl.DataFrame([(r, 0, d, ts, ts + dur) for r, d, ts, dur in rows],
                     schema={"rank": pl.Int32, "source": pl.Int32, "device": pl.Int32, "ts": pl.Int64, "end": pl.Int64}, orient="row")
    import traceql.link.critical_path as cp

    few, pack = cp._PREV_IN_PYTHON, cp._PACK_DEVICES
    try:  # every path: polars on one packed key and per device (from _PREV_IN_PYTHON kernels on), Python below it
        cp._PREV_IN_PYTHON = 0
        big = cp._prev_and_order(k)
        cp._PACK_DEVICES = False
        loop = cp._prev_and_order(k)
        cp._PREV_IN_PYTHON = 1 << 30
        got, order = cp._prev_and_order(k)
    finally:
        cp._PREV_IN_PYTHON, cp._PACK_DEVICES = few, pack
    assert got.equals(big[0]) and order.equals(big[1]), (got, big)
    assert got.equals(loop[0]) and order.equals(loop[1]), (got, loop)
    dev = [(-1 if d is None else d) for _, d, _, _ in rows]
    for i, (r, _, ts, _) in enumerate(rows):
        # rows of the device ordered by (end, row): the last one that ended at or before i started, other than i
        cands = sorted((j for j, (r2, _, _, _) in enumerate(rows) if r2 == r and dev[j] == dev[i]),
                       key=lambda j: (rows[j][2] + rows[j][3], j))
        before = [j for j in cands if rows[j][2] + rows[j][3] <= ts]
        if before and before[-1] == i:
            before.pop()
        assert got[i] == (before[-1] if before else None), (i, rows, got)


def test_gap_names_and_host_context_after_the_condition_change_nothing():
    """TQL202's condition reads only gap_ms, so its names and host ops are added after it; a condition that reads
    host_op takes the other path. Both must give the same findings."""
    run = load_run(FIXTURES / "h200-straggler", jobs=1)
    rule = next(r for r in load_rules() if r.id == "TQL202")
    late = evaluate(run, rule)
    early = evaluate(run, replace(rule, condition=f"({rule.condition}) and (host_op is null or host_op is not null)"))
    assert late.status == early.status == "ran"
    assert late.findings, "the fixture is expected to have idle gaps"
    assert [f.message for f in late.findings] == [f.message for f in early.findings]
    assert [f.evidence for f in late.findings] == [f.evidence for f in early.findings]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 10)), min_size=1, max_size=25))
def test_segments_merge_touching_intervals_and_name_their_ends(rows):
    from traceql.intervals import segments

    df = pl.DataFrame([(r, ts, ts + d, f"k{i}") for i, (r, ts, d) in enumerate(rows)],
                      schema={"rank": pl.Int32, "ts": pl.Int64, "end": pl.Int64, "name": pl.Utf8}, orient="row")
    got = segments(df, ["rank"]).rows()
    want = []
    for r in sorted({r for r, _, _ in rows}):
        # rows of the rank by start (stable), merged while the next starts at or before the furthest end so far
        mine = sorted(((ts, ts + d, f"k{i}") for i, (r2, ts, d) in enumerate(rows) if r2 == r), key=lambda x: x[0])
        seg = None
        for ts, end, name in mine:
            if seg is not None and ts <= seg["end"]:
                seg["n"] += 1
                if end >= seg["end"]:
                    seg["end"], seg["last"] = end, name
            else:
                if seg is not None:
                    want.append((r, seg["ts"], seg["end"], seg["n"], seg["first"], seg["last"]))
                seg = {"ts": ts, "end": end, "n": 1, "first": name, "last": name}
        want.append((r, seg["ts"], seg["end"], seg["n"], seg["first"], seg["last"]))
    assert got == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 60), st.integers(0, 15)), max_size=30))
def test_union_is_the_sweeps_selected_time(rows):
    from traceql.intervals import coverage, union

    df = pl.DataFrame([(r, s, ts, ts + d) for r, s, ts, d in rows],
                      schema={"rank": pl.Int32, "step": pl.Int64, "ts": pl.Int64, "end": pl.Int64}, orient="row")
    got = union(df, ["rank", "step"])
    want = coverage(df, None, ["rank", "step"]).select("rank", "step", pl.col("sel_ms").alias("union_ms"), "n")
    assert got.equals(want), (got, want)
    # and by hand: the covered integer instants
    for r, s, ms in got.select("rank", "step", "union_ms").rows():
        covered = set()
        for r2, s2, ts, d in rows:
            if (r2, s2) == (r, s):
                covered.update(range(ts, ts + d))
        assert round(ms * 1e6) == len(covered)


@pytest.mark.parametrize("name", ["h200-host-sync-per-step", "h200-loader-bound", "h200-straggler", "h200-exposed-allreduce-nsys"])
def test_host_ops_named_by_the_walk_in_python_equal_the_vectorised_walks(name, monkeypatch):
    # gpu_idle_gaps and blocking_calls name what the host was doing; a few points walk their parents in Python
    from polars.testing import assert_frame_equal

    from traceql import link

    tables = ("gpu_idle_gaps", "blocking_calls")
    run = load_run(FIXTURES / name, use_cache=False)
    shipped = [link.ensure(run, t) for t in tables]
    monkeypatch.setattr("traceql.link.context._WALK_IN_PYTHON", 0)
    run = load_run(FIXTURES / name, use_cache=False)
    for got, t in zip(shipped, tables):
        assert_frame_equal(got, link.ensure(run, t))
    assert shipped[0]["host_op"].drop_nulls().len() > 0


_GPU = sorted(p.parent.name for p in FIXTURES.glob("h200*/manifest.json"))


@pytest.mark.parametrize("name", _GPU)
def test_step_breakdown_unions_in_one_sweep_are_intervals_coverage_and_union(name):
    # step_breakdown takes its four unions from one keyed sweep; the plain definitions: intervals.union of all and of
    # the compute kernels, intervals.coverage of comm against compute, per rank and step
    from polars.testing import assert_frame_equal

    from traceql import intervals, link

    run = load_run(FIXTURES / name, use_cache=False)
    got = link.ensure(run, "step_breakdown").filter(pl.col("step").is_not_null())
    k = run.table("kernels").filter(pl.col("step").is_not_null() & pl.col("rank").is_in(got["rank"].unique().implode()))
    per = ["rank", "step"]
    want = intervals.union(k, per).select(*per, pl.col("union_ms").alias("busy_ms")).join(
        intervals.union(k.filter(pl.col("kind") == "compute"), per).select(*per, pl.col("union_ms").alias("compute_ms")),
        on=per, how="left")
    comm = k.filter(pl.col("kind") == "comm")
    cols = ["comm_ms", "overlap_ms", "exposed_comm_ms", "comm_comp_overlap_pct"]
    if comm.height:
        cov = intervals.coverage(comm, k.filter(pl.col("kind") == "compute"), per).select(
            *per, pl.col("sel_ms").alias("comm_ms"), "overlap_ms", pl.col("exposed_ms").alias("exposed_comm_ms"),
            pl.col("overlap_pct").alias("comm_comp_overlap_pct"))
        want = want.join(cov, on=per, how="left")
    else:
        want = want.with_columns(pl.lit(None, pl.Float64).alias(c) for c in cols)
    want = want.with_columns(pl.col("compute_ms", *cols[:3]).fill_null(0.0))
    want = want.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64)).sort(per)
    assert_frame_equal(got.select(want.columns), want, check_exact=True)
    if name.startswith("h200x2-ddp"):  # NCCL kernels under compute: the overlap's identity is exercised, not only unions
        assert got["comm_ms"].sum() > 0 and got["overlap_ms"].sum() > 0


@pytest.mark.parametrize("name", ["h200x2-ddp-eager", "h200x2-straggler", "cpu-exposed-allreduce", "cpu8-fsdp2-eager"])
def test_comm_coverage_from_one_sweep_is_intervals_coverage(name):
    # comm_coverage's three unions come from one keyed sweep: the numbers intervals.coverage gives, GPU and host side
    from polars.testing import assert_frame_equal

    from traceql import intervals, link

    run = load_run(FIXTURES / name, use_cache=False)
    got = link.ensure(run, "comm_coverage")
    a = link.ensure(run, "activity").filter(pl.col("step").is_not_null())
    per = ["rank", "step", "side", "source"]
    cov = intervals.coverage(a.filter(pl.col("kind") == "comm"), a.filter(pl.col("kind") == "compute"), per)
    want = cov.select(*per, pl.col("sel_ms").alias("comm_ms"), pl.col("against_ms").alias("compute_ms"), "overlap_ms",
                      pl.col("exposed_ms").alias("exposed_comm_ms"), pl.col("overlap_pct").alias("comm_comp_overlap_pct"))
    assert a.group_by("rank").agg(pl.col("source").n_unique())["source"].max() == 1  # no source to pick between
    assert got.height == want.height > 0
    keys = ["rank", "step", "side"]
    assert_frame_equal(got.sort(keys), want.select(got.columns).sort(keys), check_dtypes=False, check_exact=True)


_RUN_DIRS = sorted(p.parent for p in FIXTURES.glob("*/manifest.json")) + [FIXTURES.parent / "samples/demo"]


@pytest.mark.parametrize("walk", ["listed", "searched"])
@pytest.mark.parametrize("run_dir", _RUN_DIRS, ids=lambda p: p.name)
def test_enclosing_ops_on_packed_keys_equal_the_joins(run_dir, walk, monkeypatch):
    """link.context tests membership of the points' threads (and of the excluded step ranges) on one packed integer,
    and finds each rank's threads on one: the host ops named for idle gaps and blocking calls must be those the
    semi-join, anti-join and unique over the key columns give (both parent walks: in Python and by search), and the
    ops found by searching one packed (thread, start) integer those polars' as-of join by thread finds."""
    from polars.testing import assert_frame_equal

    from traceql import link
    from traceql.link import context

    monkeypatch.setattr(context, "_SEARCH_OPS_FROM", 0)  # the search of ops by (thread, start) at any size
    if walk == "searched":
        monkeypatch.setattr(context, "_WALK_IN_PYTHON", 0)
    run = load_run(run_dir, use_cache=False, jobs=1)
    names = ("gpu_idle_gaps", "blocking_calls")
    got = {n: link.ensure(run, n) for n in names}
    for n in names:
        run.tables.pop(n)
    monkeypatch.setattr(context, "PACKED", False)
    for n in names:
        assert_frame_equal(got[n], link.ensure(run, n))


def _raw_gaps_reference(run) -> pl.DataFrame:
    """breakdown._raw_gaps as it was written first: the previous operation's name filled forward as a string column."""
    k = run.table("kernels").lazy().select("rank", "source", "device", "step", "ts", "end", "name").filter(
        pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null())
    k = k.with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), pl.col("device").fill_null(-1).cast(pl.Int32))
    key = ["rank", "source", "device"]
    k = k.sort([*key, "ts"], maintain_order=True).with_columns(pl.struct(key).rle_id().alias("_g"))
    k = k.with_columns(pl.col("end").cum_max().over("_g").alias("_cm"))
    k = k.with_columns(
        pl.col("_cm").shift(1).over("_g").alias("_busy_until"),
        pl.when(pl.col("end") == pl.col("_cm")).then(pl.col("name")).forward_fill().over("_g").shift(1).over("_g").alias("prev_name"),
        pl.when(pl.col("end") == pl.col("_cm")).then(pl.col("step")).forward_fill().over("_g").shift(1).over("_g").alias("_prev_step"),
    )
    g = k.filter(pl.col("step").is_not_null() & (pl.col("ts") > pl.col("_busy_until")))
    st = run.table("steps").lazy().select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step", "ts")
    st = st.group_by("rank", "source", "step").agg(pl.col("ts").min().alias("_host_ts")).sort("rank", "source", "step")
    st = st.with_columns(pl.col("_host_ts").shift(1).over("rank", "source").fill_null(pl.col("_host_ts")).alias("_floor"))
    g = g.join(st.select("rank", "source", "step", "_floor"), on=["rank", "source", "step"], how="left")
    lead = pl.col("_prev_step").is_null() | (pl.col("_prev_step") != pl.col("step"))
    g = g.with_columns(lead.alias("lead"), pl.when(lead & pl.col("_floor").is_not_null()).then(
        pl.max_horizontal("_busy_until", "_floor")).otherwise(pl.col("_busy_until")).alias("gap_ts")).filter(pl.col("ts") > pl.col("gap_ts"))
    return g.select("rank", "source", "device", "step", "gap_ts", pl.col("ts").alias("gap_end"),
                    ((pl.col("ts") - pl.col("gap_ts")) / 1e6).alias("gap_ms"), "lead", "prev_name",
                    pl.col("name").alias("next_name")).collect(engine="in-memory")


@pytest.mark.parametrize("run_dir", _RUN_DIRS, ids=lambda p: p.name)
def test_idle_gaps_name_the_previous_kernel_by_its_row(run_dir):
    """_raw_gaps fetches the previous operation's name by row for the gaps only: the frame the string fill gave."""
    from polars.testing import assert_frame_equal

    from traceql.link.breakdown import _raw_gaps

    run = load_run(run_dir, use_cache=False, jobs=1)
    if run.table("kernels").height == 0:  # no GPU activity (compile logs, NCCL logs, CPU runs): no gaps at all
        assert _raw_gaps(run).height == 0
        return
    assert_frame_equal(_raw_gaps(run), _raw_gaps_reference(run))


@pytest.mark.parametrize("run_dir", _RUN_DIRS, ids=lambda p: p.name)
def test_idle_gaps_keep_their_order_as_the_table_of_the_sorted_parts(run_dir):
    """gpu_idle_gaps puts host_op back at the named gaps' rows and keeps _raw_gaps' order, which must be the table's:
    the frame of the named and the other gaps concatenated and sorted, as it was built before."""
    from polars.testing import assert_frame_equal

    from traceql import intervals
    from traceql.link.breakdown import GAP_SCHEMA, HOST_OP_MIN_GAP_MS, _raw_gaps, gpu_idle_gaps
    from traceql.link.context import host_context
    from traceql.link.input_pipeline import input_wait_ns

    run = load_run(run_dir, use_cache=False, jobs=1)
    got = gpu_idle_gaps(run)
    g = _raw_gaps(run)
    if g.height == 0:
        assert got.height == 0
        return
    g = intervals.short_names(g, ["prev_name", "next_name"])
    named = host_context(run, g.filter(pl.col("gap_ms") >= HOST_OP_MIN_GAP_MS))
    rest = g.filter(pl.col("gap_ms") < HOST_OP_MIN_GAP_MS).with_columns(pl.lit(None, pl.Utf8).alias("host_op"))
    g = pl.concat([named.select(rest.columns), rest])
    g = g.with_columns((input_wait_ns(run, g, "gap_ts", "gap_end") / 1e6).alias("input_wait_ms"))
    want = g.select([pl.col(c).cast(t) for c, t in GAP_SCHEMA.items()]).sort("rank", "source", "device", "gap_ts")
    assert_frame_equal(got, want)
    assert in_order(got, ["rank", "source", "device", "gap_ts"])
