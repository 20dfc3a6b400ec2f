"""A warm check takes what the rules concluded from the run's cache folder (pipeline._run_rules) where the input,
the rules as loaded, their parameters, the sources' statuses and the engine's code are those of the last check;
anything else evaluates the rules again. conftest gives every test its own cache folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from traceql import pipeline
from traceql.rules import engine

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "fixtures" / "h200x2-straggler"


def _all(res) -> tuple:
    findings = sorted((f.rule, tuple(f.ranks), f.step, f.message, f.fingerprint, repr(f.evidence), tuple(f.sources),
                       f.cost_ms_per_step, f.cost_pct, f.caused_by) for f in res.findings)
    return findings, [(r.rule.id, r.status, r.reason) for r in res.results], res.run.notes


def _counting(monkeypatch) -> list:
    calls: list = []
    real = pipeline.run_rules
    monkeypatch.setattr(pipeline, "run_rules", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_a_warm_check_reuses_what_the_rules_concluded_and_reports_the_same(monkeypatch):
    cold = pipeline.check(GPU, use_cache=False)
    calls = _counting(monkeypatch)
    costed: list = []
    real = pipeline.attribute
    monkeypatch.setattr(pipeline, "attribute", lambda *a: (costed.append(1), real(*a))[1])
    first = pipeline.check(GPU)
    warm = pipeline.check(GPU)
    assert calls == [1] and costed == [1]  # the second check evaluated no rule and costed no finding
    assert _all(warm) == _all(first) == _all(cold)
    assert any(f.cost_ms_per_step is not None for f in warm.findings)  # the costs came back with the findings
    assert any(r.status == "skipped" for r in warm.results) and warm.findings


def test_other_parameters_rules_or_sources_evaluate_again(monkeypatch, tmp_path):
    calls = _counting(monkeypatch)
    pipeline.check(GPU)
    pipeline.check(GPU, sets=["TQL101.min_exposed_ms=0.001"])  # a parameter changed
    assert len(calls) == 2
    pipeline.check(GPU, select=["TQL1"])  # another choice of rules
    assert len(calls) == 3
    copy = tmp_path / "run"
    shutil.copytree(GPU, copy)  # the same content at another path: the findings name other source files
    moved = pipeline.check(copy)
    assert len(calls) == 4
    assert all(str(copy) in p for f in moved.findings for p in f.sources)


def test_a_failed_rule_is_not_kept(monkeypatch):
    real = engine._evaluate  # what run_rules calls for each rule that can run

    def broken(run, rule, *a, **k):
        if rule.id == "TQL101":
            raise RuntimeError("boom")
        return real(run, rule, *a, **k)

    monkeypatch.setattr(engine, "_evaluate", broken)
    first = pipeline.check(GPU)
    assert [r.rule.id for r in first.results if r.status == "error"] == ["TQL101"]
    monkeypatch.setattr(engine, "_evaluate", real)
    calls = _counting(monkeypatch)
    again = pipeline.check(GPU)
    assert calls == [1] and all(r.status != "error" for r in again.results)
