"""TQL204 (synchronous-memcpy) and TQL206 (synchronous-memset) on a real capture.

fixtures/h200-sync-memcpy{,-nsys}: `traceql capture sync-memcpy --ranks 1 --steps 2 --backend cuda [--nsys]` on an
H200 (torch 2.11, CUDA 13.0). Inside every step, between forward and backward, the loop calls libcudart through
ctypes, as a custom extension would: a synchronous cudaMemcpy of the loss (4 B, DtoH) into a pageable buffer, a
cudaMemset of a 64 KiB pinned host buffer and a cudaMemset of a 4 MiB device buffer. The clean twin,
fixtures/h200-ddp-eager, is the same kind of loop without them (PyTorch itself only uses the Async forms).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceql.pipeline import load_run
from traceql.rules.engine import evaluate
from traceql.rules.loader import load_rules

REPO = Path(__file__).resolve().parents[1]
KINETO = REPO / "fixtures" / "h200-sync-memcpy"
NSYS = REPO / "fixtures" / "h200-sync-memcpy-nsys"
CLEAN = REPO / "fixtures" / "h200-ddp-eager"
RULES = {r.id: r for r in load_rules([REPO / "rules"]) if r.id in ("TQL204", "TQL206")}


@pytest.fixture(scope="module")
def runs():
    return {p.name: load_run(p, use_cache=False) for p in (KINETO, NSYS, CLEAN)}


def _findings(run, rule_id):
    res = evaluate(run, RULES[rule_id])
    assert res.status == "ran", res.reason
    return res.findings


def test_the_captures_plant_both_rules_on_rank_0():
    for run in (KINETO, NSYS):
        m = json.loads((run / "manifest.json").read_text())
        assert m["scenario"] == "sync-memcpy" and m["exit_codes"] == [0]
        assert m["expected"] == [{"rule": "TQL204", "ranks": [0]}, {"rule": "TQL206", "ranks": [0]}]


@pytest.mark.parametrize("run, steps, calls", [(KINETO.name, 2, 2), (NSYS.name, 4, 4)])
def test_tql204_names_the_synchronous_cudamemcpy_once_per_step(runs, run, steps, calls):
    # Kineto profiles the 2 active steps; nsys records the whole process (4 NVTX step ranges).
    (f,) = _findings(runs[run], "TQL204")
    assert f.rule == "TQL204" and f.ranks == [0]
    ev = f.evidence
    got = (ev["call"], ev["copy_kind"], ev["n"], ev["steps"], ev["per_step"])
    assert got == ("cudaMemcpy", "DtoH", calls, steps, 1.0)
    assert ev["bytes"] == 4 * calls  # the loss, one float32 per call
    # cudaMemcpy waits for the forward queued before it: milliseconds on the host for microseconds of copying
    assert ev["host_ms"] > 1.0 and ev["gpu_ms"] < 0.1 and ev["host_ms_per_step"] > 0.5
    assert "synchronous cudaMemcpy (DtoH)" in f.message and "1.0 per step" in f.message


def test_tql206_names_the_synchronous_cudamemset_of_pinned_memory(runs):
    (f,) = _findings(runs[NSYS.name], "TQL206")
    assert f.rule == "TQL206" and f.ranks == [0]
    ev = f.evidence
    assert (ev["call"], ev["memory"], ev["n"], ev["per_step"]) == ("cudaMemset", "pinned", 4, 1.0)
    assert ev["bytes"] == 4 * 65536  # the device-memory cudaMemset (4 MiB each) is not host-synchronous: left out
    assert "synchronous cudaMemset call(s) on pinned memory" in f.message


def test_tql206_on_the_kineto_twin(runs):
    """Kineto names the activity "Memset (Pinned)": the importer reads the memory kind from it, as nsys gives it."""
    import polars as pl

    from traceql import link

    k = link.ensure(runs[KINETO.name], "kernels")
    assert k.filter(pl.col("name") == "Memset (Pinned)").height == 2  # the activity is there, one per step
    (f,) = _findings(runs[KINETO.name], "TQL206")
    assert (f.ranks, f.evidence["memory"]) == ([0], "pinned")


@pytest.mark.parametrize("rule_id", ["TQL204", "TQL206"])
def test_clean_twin_stays_quiet(runs, rule_id):
    assert _findings(runs[CLEAN.name], rule_id) == []
