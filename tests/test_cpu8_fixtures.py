"""The eight-rank gloo captures (fixtures/cpu8-*, issue 22 as far as CPUs allow): the planted rank is named among
eight, the desync's Flight Recorder dumps come from every rank, and the FSDP2 scenarios are what they claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceql.capture.scenarios import SCENARIOS
from traceql.pipeline import check

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"
EIGHT = sorted(p.parent for p in FIX.glob("cpu8-*/manifest.json"))


def _findings(run: Path, rule: str):
    return [f for f in check(run, select=[rule], use_cache=False).findings if f.rule == rule]


def test_the_eight_rank_set_is_complete():
    names = {p.name for p in EIGHT}
    assert {"cpu8-ddp-eager", "cpu8-ddp-compiled", "cpu8-fsdp2-eager", "cpu8-fsdp2-compiled", "cpu8-straggler",
            "cpu8-desync", "cpu8-exposed-allreduce"} <= names
    for run in EIGHT:
        m = json.loads((run / "manifest.json").read_text())
        assert m["ranks"] == 8 and m["environment"]["process_group"] == "gloo", run.name
        assert "not NCCL" in m["notes"], run.name  # says plainly that these are not GPU runs
        assert sorted(int(p.name[4:].split(".")[0]) for p in run.glob("rank*.pt.trace.json.gz")) == list(range(8))


def test_straggler_among_eight_is_rank_7_alone():
    found = _findings(FIX / "cpu8-straggler", "TQL302")
    assert [f.ranks for f in found] == [[7]]


def test_desync_among_eight_names_rank_7_from_traces_and_flight_recorder():
    run = FIX / "cpu8-desync"
    assert sorted(p.name for p in run.glob("nccl_trace_rank_*")) == [f"nccl_trace_rank_{r}" for r in range(8)]
    found = _findings(run, "TQL303")
    assert found and all(f.ranks == [7] for f in found)
    fr = _findings(run, "TQL601")  # read from gloo's Flight Recorder dumps alone
    assert fr and all(f.ranks == [7] for f in fr)


def test_fsdp2_runs_all_gather_and_reduce_scatter_per_block():
    """FSDP2's collectives, not DDP's all-reduce buckets: one all-gather and one reduce-scatter per sharded module."""
    import gzip

    for name, per_step in (("cpu8-fsdp2-eager", 18), ("cpu8-fsdp2-prefetch-off", 27)):
        with gzip.open(FIX / name / "rank0.pt.trace.json.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        names = [e["name"] for e in events if e.get("ph") == "X"]
        gathers = names.count("c10d::_allgather_base_")
        scatters = names.count("c10d::_reduce_scatter_base_")
        steps = sum(n.startswith("ProfilerStep#") for n in names)
        assert steps == 3
        # 9 sharded modules (8 blocks and the root); prefetch off gathers each block again in backward
        assert scatters == 9 * steps
        assert gathers + scatters == per_step * steps, name


@pytest.mark.parametrize("name", ["fsdp2-eager", "fsdp2-compiled", "fsdp2-prefetch-off"])
def test_fsdp2_scenarios_need_two_ranks_and_say_what_they_expect(name):
    sc = SCENARIOS[name]
    assert sc.min_ranks == 2 and sc.distributed
    assert sc.compiled == (name == "fsdp2-compiled")
    assert sc.expected_for(8, "cpu") == ([{"rule": "TQL101", "ranks": list(range(8))}] if name.endswith("off") else [])
