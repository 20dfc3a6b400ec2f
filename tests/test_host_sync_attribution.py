"""Host syncs (TQL201, TQL211) named by the op or NVTX range behind them, one finding per rank and op, in nsys-only
runs as in Kineto ones."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from traceql import link, pipeline
from traceql.link.host_sync import NO_OP
from traceql.pipeline import load_run

REPO = Path(__file__).resolve().parents[1]


def _findings(path, rule, sets=None):
    res = pipeline.check(path, select=[rule], sets=sets, use_cache=False, jobs=1)
    return [f for f in res.findings if f.rule == rule]


@pytest.mark.parametrize("fixture,call", [("h200-host-sync-per-step-nsys", "cudaStreamSynchronize"),
                                          ("h200-sync-memcpy-nsys", "cudaMemcpy")])
def test_nsys_host_sync_is_one_finding_per_rank_not_per_step(fixture, call):
    path = REPO / "fixtures" / fixture
    calls = link.ensure(load_run(path, use_cache=False, jobs=1), "blocking_calls")
    in_steps = calls.filter(calls["step"].is_not_null())
    # the step's own NVTX range ("step 3") never names the cause
    assert not in_steps["host_op"].str.starts_with("step ").any()
    found = _findings(path, "TQL201")
    assert [(f.ranks, f.evidence["call"], f.evidence["host_op"]) for f in found] == [([0], call, NO_OP)]
    assert found[0].evidence["n_rows"] >= 3  # the steps it happened in, in one finding


def _wrap_calls_in_nvtx(src: Path, dst: Path, call: str, text: str) -> int:
    """A copy of an nsys run whose blocking calls inside the steps each sit in an NVTX range of their own."""
    shutil.copytree(src, dst)
    db = next(dst.glob("*.sqlite"))
    con = sqlite3.connect(db)
    steps = con.execute("SELECT start, \"end\" FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchall()
    rows = con.execute(
        "SELECT r.start, r.\"end\", r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value LIKE ? ", (call + "_v%",)).fetchall()
    rows = [r for r in rows if any(a <= r[0] and r[1] <= b for a, b in steps)]
    con.executemany("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, ?, 0)",
                    [(s - 1000, e + 1000, text, g) for s, e, g in rows])
    con.commit()
    con.close()
    return len(rows)


def test_nsys_host_sync_is_named_by_the_innermost_nvtx_range_inside_the_step(tmp_path):
    src = REPO / "fixtures" / "h200-sync-memcpy-nsys"
    assert _wrap_calls_in_nvtx(src, tmp_path / "run", "cudaMemcpy", "read_loss") >= 3
    found = _findings(tmp_path / "run", "TQL201")
    assert [(f.ranks, f.evidence["call"], f.evidence["host_op"]) for f in found] == [([0], "cudaMemcpy", "read_loss")]


def test_cheap_host_sync_is_named_with_its_op_at_info():
    # samples/demo reads the loss with .item() every step: 0.1-0.4 ms blocked, above TQL201's default threshold;
    # raised above it, TQL201 goes quiet for aten::_local_scalar_dense and TQL211 names it instead, at info
    demo = REPO / "samples" / "demo"
    assert _findings(demo, "TQL211") == []
    warn = _findings(demo, "TQL201", sets=["TQL201.min_blocked_ms=0.5"])
    assert "aten::_local_scalar_dense" not in {f.evidence["host_op"] for f in warn}
    info = _findings(demo, "TQL211", sets=["TQL211.max_blocked_ms=0.5"])
    assert {(tuple(f.ranks), f.evidence["host_op"]) for f in info} == {((0,), "aten::_local_scalar_dense"),
                                                                       ((1,), "aten::_local_scalar_dense")}
    assert all(f.severity == "info" and f.evidence["blocked_ms_max"] < 0.5 for f in info)


def test_tql211_never_reports_what_tql201_reports():
    path = REPO / "fixtures" / "h200-host-sync-per-step-nsys"
    warn = {(tuple(f.ranks), f.evidence["call"], f.evidence["host_op"]) for f in _findings(path, "TQL201")}
    info = {(tuple(f.ranks), f.evidence["call"], f.evidence["host_op"]) for f in _findings(path, "TQL211")}
    assert info and warn and not (info & warn)
    assert info == {((0,), "cudaEventSynchronize", NO_OP)}


def test_tql207_names_the_op_whose_calls_blocked_longest():
    found = _findings(REPO / "fixtures" / "h200-host-sync-per-step", "TQL207")
    by_call = {f.evidence["call"]: f for f in found}
    assert by_call["cudaStreamSynchronize"].evidence["host_op"] == "aten::_local_scalar_dense"
    assert "mostly from aten::_local_scalar_dense" in by_call["cudaStreamSynchronize"].message
    # nsys-only: no op encloses the per-step syncs, and they outweigh the NCCL init range's
    found = _findings(REPO / "fixtures" / "h200-host-sync-per-step-nsys", "TQL207")
    assert {f.evidence["call"]: f.evidence["host_op"] for f in found}["cudaStreamSynchronize"] == NO_OP


def test_syncs_of_a_warm_up_step_alone_are_not_a_host_sync_finding():
    # h200-cold-start is profiled from step 0, whose model.to(device) copies and lazy initialisation synchronise;
    # the later steps do not. The warm-up step is marked and TQL201/TQL211 judge only the others.
    run = load_run(REPO / "fixtures" / "h200-cold-start", use_cache=False)
    syncs = link.ensure(run, "host_syncs")
    assert syncs.height > 0 and syncs["warmup"].all()  # step 0's copies are its only syncs
    assert _findings(REPO / "fixtures" / "h200-cold-start", "TQL201") == []
    # the same syncs every step still fire (the planted .item() per step)
    assert _findings(REPO / "fixtures" / "h200-host-sync-per-step", "TQL201")
