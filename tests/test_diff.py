"""`traceql diff RUN_A RUN_B`: per-rank deltas and findings new, resolved and persisting."""

from __future__ import annotations

import dataclasses

import orjson
import polars as pl
import pytest
from _report_helpers import DEMO, TRACE_FILTER, checked
from conftest import FIXTURES

from traceql.report import diff as d
from traceql.model.result import CheckResult

AUTO_DYNAMIC, RECOMPILE_STORM = FIXTURES / "compile-auto-dynamic", FIXTURES / "compile-recompile-storm"
# (a two-rank run, one file of it: a run of rank 1 alone): the committed sample always, the corpus where present
RUNS = [
    pytest.param(DEMO, DEMO / "rank1.pt.trace.json.gz", id="demo"),
    pytest.param(TRACE_FILTER, TRACE_FILTER / "sampled_rank-1.json.gz", id="corpus-trace_filter", marks=pytest.mark.corpus),
]


def _need(*paths):
    for p in paths:
        if not p.exists():
            pytest.skip(f"{p} not present")


@pytest.mark.parametrize("run_dir, rank1_only", RUNS)
def test_a_run_against_itself_changes_nothing(run_dir, rank1_only):
    _need(run_dir)
    r = checked(str(run_dir))
    out = d.diff(r, r)
    assert out["findings"]["new"] == [] and out["findings"]["resolved"] == []
    assert len(out["findings"]["persisting"]) == len(r.findings)
    for rank, row in out["ranks"].items():
        for k, *_ in d.METRICS:
            if row[k]["a"] is not None:
                assert row[k]["delta"] == 0, (rank, k)


def test_diff_is_antisymmetric():
    _need(AUTO_DYNAMIC, RECOMPILE_STORM)
    a, b = checked(str(AUTO_DYNAMIC)), checked(str(RECOMPILE_STORM))
    ab, ba = d.diff(a, b), d.diff(b, a)
    assert ab["findings"]["new"] or ab["findings"]["resolved"]
    fps = lambda fs: sorted(f["fingerprint"] for f in fs)  # noqa: E731
    assert fps(ab["findings"]["new"]) == fps(ba["findings"]["resolved"])
    assert fps(ab["findings"]["resolved"]) == fps(ba["findings"]["new"])
    for rank in ab["ranks"]:
        for k, *_ in d.METRICS:
            x, y = ab["ranks"][rank][k]["delta"], ba["ranks"][rank][k]["delta"]
            assert (x is None and y is None) or abs(x + y) < 1e-6, (rank, k, x, y)


@pytest.mark.parametrize("run_dir, rank1_only", RUNS)
def test_step_metrics_follow_step_metrics(run_dir, rank1_only):
    """diff's per-rank numbers are per-step medians of link's step_metrics (the table the rules read)."""
    _need(rank1_only)
    from traceql import link

    a, b = checked(str(run_dir)), checked(str(rank1_only))
    out = d.diff(a, b)
    for res, side in ((a, "a"), (b, "b")):
        sm = link.ensure(res.run, "step_metrics")
        for rank in res.run.ranks:
            per = sm.filter(pl.col("rank") == rank)
            assert out["ranks"][str(rank)]["exposed_comm_ms_median"][side] == pytest.approx(per["exposed_comm_ms"].median(), abs=1e-3)
            assert out["ranks"][str(rank)]["wait_ms_median"][side] == pytest.approx(per["wait_ms"].median(), abs=1e-3)
            assert out["ranks"][str(rank)]["kernels_median"][side] == pytest.approx(per["kernels"].median(), abs=0.1)
    # a rank that only one run has is reported, with nothing to compare
    assert out["ranks"]["0"]["present"] == {"a": True, "b": False}
    assert out["ranks"]["0"]["step_time_ms_median"]["delta"] is None


@pytest.mark.parametrize("run_dir, rank1_only", RUNS)
def test_findings_with_other_step_numbers_persist_by_rule_and_rank(run_dir, rank1_only):
    _need(run_dir)
    a = checked(str(run_dir))
    assert a.findings
    moved = [dataclasses.replace(f, step=(f.step or 0) + 1000) for f in a.findings]
    b = CheckResult(a.run, a.results, findings=moved)
    assert {f.fingerprint for f in moved}.isdisjoint({f.fingerprint for f in a.findings})
    out = d.diff(a, b)
    assert out["findings"]["new"] == [] and out["findings"]["resolved"] == []
    assert sum(1 for f in out["findings"]["persisting"] if "was" in f) == len(a.findings)
    # dropping one finding's twin makes it resolved, adding a rule makes it new
    extra = dataclasses.replace(a.findings[0], rule="TQL999", ranks=[7])
    c = CheckResult(a.run, a.results, findings=moved[1:] + [extra])
    out = d.diff(a, c)
    assert [f["rule"] for f in out["findings"]["new"]] == ["TQL999"]
    assert [f["fingerprint"] for f in out["findings"]["resolved"]] == [a.findings[0].fingerprint]


def test_recompiles_and_graph_breaks_from_compile_events():
    _need(AUTO_DYNAMIC, RECOMPILE_STORM)
    a, b = checked(str(AUTO_DYNAMIC)), checked(str(RECOMPILE_STORM))
    out = d.diff(a, b)
    for res, side in ((a, "a"), (b, "b")):
        ce = res.run.table("compile_events").filter(pl.col("rank") == 0)
        assert out["ranks"]["0"]["recompiles"][side] == ce.filter(pl.col("kind") == "recompile").height
        assert out["ranks"]["0"]["graph_breaks"][side] == ce.filter(pl.col("kind") == "graph_break").height
    assert out["ranks"]["0"]["recompiles"]["delta"] > 0
    assert any("recompiles" in h for h in out["hints"])


@pytest.mark.parametrize("run_dir, rank1_only", RUNS)
def test_cli_json_and_text(run_dir, rank1_only):
    _need(rank1_only)
    from click.testing import CliRunner

    from traceql.cli import main

    args = ["diff", str(run_dir), str(rank1_only), "--quiet"]
    res = CliRunner().invoke(main, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    data = orjson.loads(res.stdout)
    assert set(data) >= {"a", "b", "ranks", "findings", "hints"}
    text = d.render_text(data)
    assert "new findings" in text and "step time" in text and str(rank1_only) in text


def test_cli_fails_cleanly_on_missing_run(tmp_path):
    from click.testing import CliRunner

    from traceql.cli import main

    res = CliRunner().invoke(main, ["diff", str(tmp_path / "nope"), str(tmp_path / "nope2"), "--quiet"])
    assert res.exit_code == 2 and "no such file" in res.output
