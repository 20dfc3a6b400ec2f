"""The same program (benchmarks/compile_programs/versions/probe.py: two graph breaks in forward, a recompile storm
that reaches the recompile limit, a backend that raises under suppress_errors=True) captured with torch 2.1.2,
2.3.1, 2.5.1 and 2.13.0, whose TORCH_TRACE / TORCH_LOGS encodings differ. Each version's logs must give the same facts."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from conftest import FIXTURES, REPO
from traceql import link

PROBES = {"2.13": FIXTURES / "compile-torch213-probe", "2.5": FIXTURES / "compile-torch251-probe",
          "2.3": FIXTURES / "compile-torch231-probe", "2.1": FIXTURES / "compile-torch212-probe"}
PROBE = "benchmarks/compile_programs/versions/probe.py"


def _run(path: Path):
    from traceql.pipeline import load_run

    return load_run(path, use_cache=False)


def _findings(path: Path, rule_id: str):
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    (rule,) = [r for r in load_rules([REPO / "rules"]) if r.id == rule_id]
    res = evaluate(_run(path), rule)
    assert res.status == "ran", res
    return res.findings


def _evidence(path: Path) -> pl.DataFrame:
    return link.ensure(_run(path), "compile_evidence")


@pytest.mark.parametrize("version", sorted(PROBES))
def test_each_version_counts_two_graph_breaks_at_their_user_lines(version):
    gb = _evidence(PROBES[version]).filter(pl.col("kind") == "graph_break")
    lines = sorted({uf.rsplit(":", 1)[1] for uf in gb["user_frame"].drop_nulls()})
    assert gb.height == 2 and lines == ["21", "22"]
    assert gb["reason"].null_count() == 0  # every version says why (from TORCH_LOGS where TORCH_TRACE does not)


@pytest.mark.parametrize("version,recompiles,limit", [("2.13", 8, True), ("2.5", 8, True), ("2.3", 8, True),
                                                                ("2.1", 11, False)])
def test_each_version_counts_the_recompile_storm(version, recompiles, limit):
    (finding,) = _findings(PROBES[version], "TQL401")
    f = finding.evidence
    # 12 input shapes: 2.3 and 2.13 stop at the recompile limit (8); 2.1.2 recompiled all 11 without hitting it
    assert (f["recompiles"], f["limit_hit"]) == (recompiles, limit)
    assert "size mismatch at index 0" in f["top_guard"]
    assert finding.ranks == [0] and "storm" in finding.message


@pytest.mark.parametrize("version", sorted(PROBES))
def test_each_version_reports_the_failing_backend(version):
    (f,) = _findings(PROBES[version], "TQL406")
    assert f.ranks == [0] and f.severity == "error"
    assert f.evidence["fail_type"] == "BackendCompilerFailed" and f.evidence["backend"] == "failing_backend"
    assert f.evidence["function"] == "broken"
    assert "RuntimeError: failing_backend: refusing to compile this graph" in f.message
    assert "suppress_errors=True" in f.message  # the frame ran eager: said, not guessed


def test_the_recompile_limit_is_not_a_compile_failure():
    # torch 2.13 logs the limit as compilation_metrics fail_type Unsupported ("recompile limit exceeded") for 3/8
    ev = _evidence(PROBES["2.13"])
    assert ev.filter((pl.col("kind") == "cache_limit") & (pl.col("compile_id") == "3/8")).height == 1
    assert ev.filter(pl.col("kind") == "compile_failure")["compile_id"].to_list() == ["4/0"]


def test_torch_2_3_trace_alone_still_counts_breaks_recompiles_and_frames(tmp_path):
    # without stderr: torch 2.3.1 TORCH_TRACE has no compilation_metrics and no graph-break/recompile artifacts
    d = tmp_path / "tt_only"
    shutil.copytree(PROBES["2.3"] / "tt", d / "tt")
    ev = _evidence(d)
    comp = ev.filter(pl.col("kind") == "compile")
    assert comp.height == 12  # 0/0, 1/0, 2/0, 3/0-3/7, 4/0: one per dynamo_start
    assert set(comp["function"]) == {"forward", "torch_dynamo_resume_in_forward_at_21",
                                     "torch_dynamo_resume_in_forward_at_22", "storm", "broken"}
    gb = ev.filter(pl.col("kind") == "graph_break").sort("compile_id")
    # each resume frame is one graph break, in the frame compiled just before it
    assert gb.select("compile_id", "function").rows() == [("0/0", "forward"), ("1/0", "torch_dynamo_resume_in_forward_at_21")]
    assert [uf.rsplit(":", 1)[1] for uf in gb["user_frame"]] == ["21", "22"]
    rec = ev.filter(pl.col("kind") == "recompile")
    assert sorted(rec["compile_id"]) == [f"3/{i}" for i in range(1, 8)] and rec["reason"].null_count() == 7


def test_torch_2_1_logs_are_read_in_their_own_format():
    ev = _evidence(PROBES["2.1"])
    assert ev.height and ev["rank"].unique().to_list() == [0]
    rec = ev.filter(pl.col("kind") == "recompile")
    assert rec.height == 11 and rec["guard"].str.contains("size mismatch at index 0").all()
    gb = ev.filter(pl.col("kind") == "graph_break").sort("user_frame")
    assert gb["reason"].to_list()[0] == "Tensor.item"
    assert gb["function"].to_list() == ["forward", "<resume in forward>"]


def test_probe_messages_name_the_version_independent_facts():
    # one program, three encodings: TQL402's two findings name the same user lines on every version
    for version, path in PROBES.items():
        msgs = [f.message for f in _findings(path, "TQL402")]
        assert len(msgs) == 2, version
        assert any(f"{PROBE}:21" in m for m in msgs) and any(f"{PROBE}:22" in m for m in msgs), (version, msgs)


def test_torch_2_5_cache_hash_artifact_reads_as_hits_and_misses():
    # torch 2.5 logs one fx_graph_cache_hash artifact per graph, its cache_state saying hit or miss
    ev = _evidence(PROBES["2.5"])
    assert ev.filter(pl.col("kind") == "cache_miss").height == 12 and ev["cache_key"].drop_nulls().str.starts_with("f").all()
    # its graph breaks come from restart_reasons (no user line), so TORCH_LOGS' reports, which name it, are used
    gb = ev.filter(pl.col("kind") == "graph_break")
    assert gb["user_frame"].null_count() == 0 and gb["reason"].to_list()[0] == "Tensor.item"
