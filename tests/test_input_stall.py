"""Input-pipeline stalls (TQL210), idle time between steps, and warm-up steps, on real captures.

Fixtures (plan h200-stall, one H200, torch 2.11): h200-loader-bound feeds the model from DataLoader(num_workers=0)
with a per-sample CPU cost of 2.5x one step's compute; h200-loader-fixed is its twin with four workers, pinned
memory and prefetching; -nsys twins add an Nsight Systems export; cpu-* twins ran with --backend cpu. None of them
uses torch.distributed: the trace is tensorboard_trace_handler's HOST_PID.TIMESTAMP.pt.trace.json.gz.
The oracle for loader time is the raw trace JSON (the __next__ ranges per ProfilerStep), never traceql's tables.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from conftest import FIXTURES
from traceql import link
from traceql.pipeline import check, load_run

BOUND = FIXTURES / "h200-loader-bound"
FIXED = FIXTURES / "h200-loader-fixed"
BOUND_NSYS = FIXTURES / "h200-loader-bound-nsys"
CPU_BOUND = FIXTURES / "cpu-loader-bound"
CPU_FIXED = FIXTURES / "cpu-loader-fixed"
PLAIN = FIXTURES / "h200-plain-loop"
PLAIN_NSYS = FIXTURES / "h200-plain-loop-nsys"
DDP_NSYS = FIXTURES / "h200x2-ddp-eager-nsys"
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _findings(path, rule):
    return [f for f in check(path, select=[rule], use_cache=False).findings if f.rule == rule]


def _raw_loader_ms(run_dir) -> dict[int, float]:
    """ProfilerStep number -> ms of DataLoader __next__ ranges that start inside it, read from the trace JSON."""
    (path,) = run_dir.glob("*.pt.trace.json.gz")
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    nxt = [e for e in ev if e["name"].startswith("enumerate(DataLoader)#")]
    out = {}
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        out[int(s["name"].split("#")[1])] = sum(e["dur"] for e in nxt if a <= e["ts"] < b) / 1e3
    return out


def test_tql210_fires_on_the_loader_bound_run_with_its_cost_per_step():
    (f,) = _findings(BOUND, "TQL210")
    assert f.ranks == [0]
    ev = f.evidence
    assert ev["iterator"] == "_SingleProcessDataLoaderIter" and ev["workers"] == "0" and ev["gpu_side"] is True
    # the GPU-side cost is the idle time inside the fetch: positive, at most the fetch itself
    assert 20.0 < ev["stall_ms"] <= ev["loader_ms"]
    assert 40.0 < ev["stall_pct"] < 95.0
    assert "num_workers" in f.message and "pin_memory" in f.message  # the fix: workers, and the pageable copies
    assert f"{ev['stall_pct']:.0f}% of" in f.message


def test_input_stall_loader_time_matches_the_raw_trace():
    raw = _raw_loader_ms(BOUND)
    t = link.ensure(load_run(BOUND, use_cache=False), "input_stall")
    assert sorted(t["step"].to_list()) == sorted(raw)
    for step, loader_ms, stall_ms, step_ms in t.select("step", "loader_ms", "stall_ms", "step_ms").iter_rows():
        assert loader_ms == pytest.approx(raw[step], abs=0.01)
        assert 0 < stall_ms <= loader_ms < step_ms


@pytest.mark.parametrize("run_dir", [FIXED, CPU_FIXED, PLAIN, PLAIN_NSYS], ids=lambda p: p.name)
def test_tql210_stays_quiet_when_the_loader_keeps_up(run_dir):
    assert _findings(run_dir, "TQL210") == []


def test_fixed_twin_still_records_its_loader_but_waits_almost_nothing():
    t = link.ensure(load_run(FIXED, use_cache=False), "input_stall")
    assert t.height == 4 and set(t["iterator"]) == {"_MultiProcessingDataLoaderIter"} and set(t["workers"]) == {">0"}
    assert t["stall_pct"].max() < 2.0


def test_cpu_loader_bound_counts_the_whole_fetch():
    # no GPU: the host is the step's critical path, so the loader's share of the step is the cost
    (f,) = _findings(CPU_BOUND, "TQL210")
    assert f.ranks == [0] and f.evidence["gpu_side"] is False
    assert f.evidence["stall_ms"] == pytest.approx(f.evidence["loader_ms"])
    raw = _raw_loader_ms(CPU_BOUND)
    assert min(raw.values()) - 0.01 <= f.evidence["loader_ms"] <= max(raw.values()) + 0.01  # a median of them


def test_nsys_twin_fires_from_the_host_side_kineto_trace():
    (f,) = _findings(BOUND_NSYS, "TQL210")
    assert f.ranks == [0] and f.evidence["gpu_side"] is False  # under nsys, Kineto holds host events only


def test_tql203_does_not_call_the_loader_wait_launch_bound():
    assert _findings(BOUND, "TQL203") == []
    run = load_run(BOUND, use_cache=False)
    lb = link.ensure(run, "launch_bound").sort("step")
    st = link.ensure(run, "input_stall").sort("step")
    j = lb.join(st.select("step", "stall_ms"), on="step")
    # the gaps are there (the GPU idles ~35 ms a step) but almost none of it is charged to launches
    assert (j["gap_ms"] > 25.0).all()
    assert (j["launch_gap_ms"] <= j["gap_ms"] - 0.9 * j["stall_ms"]).all()
    assert (j["launch_gap_pct"] < 10.0).all()


def test_idle_before_a_step_is_charged_to_the_step_it_delays():
    run = load_run(BOUND, use_cache=False)
    gaps = link.ensure(run, "gpu_idle_gaps")
    big = gaps.filter(pl.col("gap_ms") > 25.0)
    # one long gap per profiled step, while the host was fetching the batch
    assert big["step"].n_unique() == big.height == 4
    assert set(big["host_op"]) == {NEXT}
    assert (big["input_wait_ms"] > 0.9 * big["gap_ms"]).all()
    bd = link.ensure(run, "step_breakdown")
    j = bd.join(big.select("step", "gap_ms"), on="step")
    assert (j["idle_ms"] >= j["gap_ms"]).all()


def test_nsys_wait_between_step_ranges_is_idle_of_the_next_step():
    # the loop fetches its batch before the step's NVTX range opens, so in the nsys export the wait lies between ranges
    run = load_run(BOUND_NSYS, use_cache=False)
    src = run.table("steps").filter(pl.col("origin") == "nvtx")["source"].unique().to_list()
    assert len(src) == 1
    steps = run.table("steps").filter(pl.col("source") == src[0]).sort("step")
    gaps = link.ensure(run, "gpu_idle_gaps").filter((pl.col("source") == src[0]) & (pl.col("gap_ms") > 20.0))
    assert gaps.height >= 6 and gaps["lead"].all()
    starts = dict(zip(steps["step"].to_list(), steps["ts"].to_list()))
    for step, gap_ts, gap_end in gaps.select("step", "gap_ts", "gap_end").iter_rows():
        # most of the gap lies before the step's own range: only the lead-gap rule gives it a step
        assert gap_ts < starts[step] and starts[step] - gap_ts > 0.5 * (gap_end - gap_ts)
    bd = link.ensure(run, "step_breakdown").join(gaps.select("step", "gap_ms"), on="step")
    assert (bd["idle_ms"] >= bd["gap_ms"]).all()
    assert _findings(BOUND_NSYS, "TQL202")[0].ranks == [0]


def test_a_lone_trace_without_distributed_info_is_rank_0():
    run = load_run(PLAIN, use_cache=False)
    (src,) = [s for s in run.sources if s.kind == "kineto"]
    assert src.path.name.endswith(".pt.trace.json.gz") and "rank" not in src.path.name
    assert src.rank == 0 and src.rank_origin.startswith("assumed")
    assert run.table("kernels")["rank"].unique().to_list() == [0]


@pytest.mark.parametrize("rule", ["TQL202", "TQL203", "TQL205"])
@pytest.mark.parametrize("run_dir", [DDP_NSYS, PLAIN_NSYS], ids=lambda p: p.name)
def test_warm_up_step_and_start_up_copies_raise_nothing_on_their_own(run_dir, rule):
    assert _findings(run_dir, rule) == []


def test_warm_up_steps_are_the_ones_loading_cuda_modules():
    run = load_run(PLAIN_NSYS, use_cache=False)
    w = link.ensure(run, "warmup_steps")
    assert w["step"].to_list() == [0] and w["load_ms"][0] > 10.0
    # and that step really is idle-heavy: the gaps that no longer count would have fired TQL202 alone
    gaps = link.ensure(run, "gpu_idle_gaps")
    assert gaps.filter((pl.col("step") == 0) & (pl.col("gap_ms") >= 1.0)).height >= 5
    # the steps' habit (TQL202's typical_max_gap_ms): the median over steps with GPU work of their largest gap
    steps = run.table("kernels").filter(pl.col("step").is_not_null()).select("rank", "source", "step").unique()
    worst = gaps.group_by("rank", "source", "step").agg(pl.col("gap_ms").max())
    typical = steps.join(worst, on=["rank", "source", "step"], how="left").fill_null(0.0)
    assert typical.group_by("rank", "source").agg(pl.col("gap_ms").median())["gap_ms"].max() < 1.0


def test_tql208_spans_the_steps_not_the_start_up():
    assert _findings(PLAIN_NSYS, "TQL208") == []
    (f,) = _findings(BOUND_NSYS, "TQL208")
    assert f.ranks == [0]


STARVED = FIXTURES / "h200-loader-starved-workers"
COLD = FIXTURES / "h200-cold-start"
FIXED_NSYS = FIXTURES / "h200-loader-fixed-nsys"


def test_workers_that_fall_behind_are_named_as_such():
    (f,) = _findings(STARVED, "TQL210")
    assert f.ranks == [0] and f.evidence["workers"] == ">0"
    assert f.evidence["iterator"] == "_MultiProcessingDataLoaderIter"
    assert "worker processes do not keep up" in f.message
    assert _findings(FIXED_NSYS, "TQL210") == []


def test_cold_start_first_step_is_a_warm_up_step():
    run = load_run(COLD, use_cache=False)
    st = run.table("steps").sort("step")
    assert st["step"].to_list() == [0, 1, 2, 3]
    # the oracle: step 0 is far longer than every other step in the trace itself
    assert st["dur"][0] > 20 * st["dur"][1:].max()
    w = link.ensure(run, "warmup_steps")
    assert w["step"].to_list() == [0] and w["reason"][0].startswith("first step")
    # step 0 holds the weights' pageable copies (model.to(device)) and a launch-bound stretch: alone, neither counts
    lb = link.ensure(run, "launch_bound").sort("step")
    assert lb["launch_gap_pct"][0] > 50.0 and lb["typical_launch_gap_pct"][0] < 25.0


@pytest.mark.parametrize("rule", ["TQL202", "TQL203", "TQL205", "TQL208", "TQL210"])
def test_cold_start_raises_no_per_step_finding_on_its_own(rule):
    assert _findings(COLD, rule) == []
