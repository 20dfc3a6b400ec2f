"""What-if replay, costs per finding and causes before consequences, on captured twins.

The validation pairs (benchmarks/README.md, "What-if replay"): a run with one planted cause, replayed without it,
against the measured step of its clean twin (same scenario code without the pathology, same machine). The error
bound each test states is the one the note measured, rounded up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql import pipeline
from traceql.cli import main
from traceql.link import whatif
from traceql.model import Finding
from traceql.rules.loader import RuleError, parse_rule

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures"


def _run(name):
    return pipeline.load_run(FIX / name if not name.startswith("samples") else ROOT / name)


def _measured(name) -> float:
    r = whatif.replay(_run(name), whatif._empty_save())
    return r.measured_ms


def _err_pct(pred, meas):
    return 100.0 * (pred - meas) / meas


@pytest.mark.parametrize("sick,clean,late,bound", [
    ("h200x2-straggler", "h200x2-ddp-eager", 1, 15.0),  # measured +11.0%
    ("cpu-straggler", "cpu-ddp-eager", 1, 30.0),  # measured -24.6%: gloo on CPU, the twin's steps vary 7.6-19 ms
])
def test_straggler_removed_predicts_the_clean_twin(sick, clean, late, bound):
    run = _run(sick)
    r = whatif.replay(run, whatif.straggler_saves(run, [late]))
    assert r.measured_ms > 3 * _measured(clean)  # the planted sleep dominates the sick run
    assert abs(_err_pct(r.predicted_ms, _measured(clean))) <= bound


def test_exposed_allreduce_overlapped_predicts_the_eager_twin():
    run = _run("h200x2-exposed-allreduce")
    r = whatif.replay(run, whatif.exposed_comm_saves(whatif.base_steps(run), None))
    assert r.cost_ms_per_step > 0
    assert abs(_err_pct(r.predicted_ms, _measured("h200x2-ddp-eager"))) <= 8.0  # measured -5.2%


def test_lockstep_ranks_gain_only_when_the_slowest_does():
    """Ranks joined by collectives take the slowest rank's step: time saved on one rank alone is spent waiting."""
    run = _run("h200x2-exposed-allreduce")
    base = whatif.base_steps(run)
    one = whatif.replay(run, whatif.fixed_saves(base, [0], 2.0))
    both = whatif.replay(run, whatif.fixed_saves(base, [0, 1], 2.0))
    assert one.cost_ms_per_step == pytest.approx(0.0, abs=0.05)
    assert both.cost_ms_per_step == pytest.approx(2.0, abs=0.05)


def test_a_single_rank_saves_what_it_loses():
    run = _run("h200-plain-loop")
    base = whatif.base_steps(run)
    r = whatif.replay(run, whatif.fixed_saves(base, None, 1.5))
    assert r.cost_ms_per_step == pytest.approx(1.5, abs=1e-6)
    assert r.cost_pct == pytest.approx(100 * 1.5 / r.measured_ms)


def _check(name):
    return pipeline.check(FIX / name if not name.startswith("samples") else ROOT / name)


def test_every_costed_finding_has_cost_and_pct_and_others_none():
    res = _check("samples/demo")
    rules = {r.rule.id: r.rule for r in res.results}
    for f in res.findings:
        if rules[f.rule].cost is None:
            assert f.cost_ms_per_step is None and f.cost_pct is None
        else:
            assert f.cost_ms_per_step is not None and f.cost_ms_per_step >= 0
            assert (f.cost_pct is None) == (f.cost_ms_per_step is None)
    j = json.loads(json.dumps([f.to_json() for f in res.findings]))
    assert all({"cost_ms_per_step", "cost_pct", "caused_by"} <= set(x) for x in j)


@pytest.mark.parametrize("name", ["samples/demo", "h200x2-straggler", "cpu-straggler"])
def test_straggler_is_the_top_cause_and_its_victims_sit_under_it(name):
    res = _check(name)
    from traceql.report import start_here

    roots = [f for f in start_here.roots(res.findings) if f.cost_ms_per_step and f.severity != "info"]
    top = max(roots, key=lambda f: f.cost_ms_per_step)
    assert top.rule == "TQL302" and top.ranks == [1]  # the planted late rank (manifest: last rank straggles)
    fp = top.fingerprint
    victims = [f for f in res.findings if f.caused_by == fp]
    assert any(f.rule == "TQL301" for f in victims)
    assert all(f.rule in ("TQL101", "TQL104", "TQL202", "TQL203", "TQL208", "TQL301") for f in victims)
    assert top.caused_by is None


def test_start_here_opens_the_text_report_with_the_planted_cause():
    from traceql.report import text

    out = text.render(_check("samples/demo"), width=400)
    lines = out.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("Start here"))
    assert "TQL302 straggler-rank rank 1" in lines[i + 1]
    assert "ms per step" in lines[i + 1]
    # a consequence is printed under its cause, not again under its own rule
    assert not any(l.startswith("warning TQL301") for l in lines)
    assert any("caused by the above: TQL301" in l for l in lines)


def test_exposed_allreduce_cost_is_the_exposed_time():
    res = _check("h200x2-exposed-allreduce")
    tql101 = [f for f in res.findings if f.rule == "TQL101"]
    assert tql101 and all(f.caused_by is None for f in tql101)
    # the finding covers the first step only (13 ms exposed on rank 1): the median step does not change
    assert all(f.cost_ms_per_step is not None for f in tql101)


def test_sarif_carries_cost_properties():
    from traceql.report import sarif

    doc = json.loads(sarif.render(_check("h200x2-straggler")))
    props = [r["properties"] for r in doc["runs"][0]["results"]]
    assert any(p["cost_ms_per_step"] and p["cost_ms_per_step"] > 40 for p in props)
    assert any(p["caused_by"] for p in props)


def test_whatif_cli_text_and_json():
    r = CliRunner().invoke(main, ["whatif", str(FIX / "h200x2-straggler"), "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    late = [c for c in doc["causes"] if c["cause"] == "straggler_delay (rank 1)"]
    assert late and late[0]["predicted_ms"] < late[0]["measured_ms"] / 3
    fp = next(c["fingerprint"] for c in doc["causes"] if c["cause"].startswith("TQL302"))
    r = CliRunner().invoke(main, ["whatif", str(FIX / "h200x2-straggler"), "--finding", fp])
    assert r.exit_code == 0 and "TQL302" in r.output and "TQL301" not in r.output
    r = CliRunner().invoke(main, ["whatif", str(FIX / "h200x2-straggler"), "--finding", "nope"])
    assert r.exit_code == 2 and "no finding with fingerprint" in r.output


def _rule(cost):
    return {"id": "TQL999", "name": "x", "severity": "info", "summary": "s", "message": "m", "docs": {"why": "w", "fix": "f"},
            "select": {"measure": "rows", "table": "steps"}, "cost": cost}


@pytest.mark.parametrize("cost,msg", [
    ({"removes": "magic"}, "is not one of"),
    ({"removes": "host_sync"}, "needs ms:"),
    ({"removes": "exposed_comm", "ms": "x"}, "takes no ms:"),
    ({"removes": "exposed_comm", "explain": []}, "unknown field 'explain'"),
    ("exposed_comm", "must be a mapping"),
])
def test_cost_mapping_is_checked_at_load(cost, msg):
    with pytest.raises(RuleError, match=msg):
        parse_rule(_rule(cost), Path("TQL999-x.yaml"))


def test_a_finding_without_the_evidence_field_gets_no_cost():
    run = _run("h200-plain-loop")
    f = Finding(rule="TQL999", name="x", severity="info", message="m", ranks=[0], evidence={})
    whatif.apply_costs(run, [f], {"TQL999": {"removes": "host_sync", "ms": "blocked_ms"}})
    assert f.cost_ms_per_step is None and f.cost_pct is None


def test_a_mild_cause_does_not_explain_a_costlier_finding():
    from traceql.rules.causes import link_causes

    run = _run("h200x2-straggler")
    late = Finding(rule="TQL302", name="s", severity="warning", message="m", ranks=[1], cost_ms_per_step=1.0)
    big = Finding(rule="TQL101", name="e", severity="warning", message="m", ranks=[0], step=3, cost_ms_per_step=20.0)
    small = Finding(rule="TQL101", name="e", severity="warning", message="m", ranks=[0], step=4, cost_ms_per_step=1.5)
    other_rule = Finding(rule="TQL201", name="h", severity="warning", message="m", ranks=[0], cost_ms_per_step=0.1)
    link_causes(run, [late, big, small, other_rule], {"TQL302": {"removes": "straggler_delay", "explains": ["TQL101"]}})
    assert big.caused_by is None and other_rule.caused_by is None
    assert small.caused_by == late.fingerprint  # across ranks: the late rank 1 explains rank 0's wait
    assert late.caused_by is None


def test_a_cause_without_ranks_or_steps_costs_nothing_rather_than_failing():
    run = _run("h200x2-straggler")
    assert whatif.straggler_saves(run, []).height == 0
    f = Finding(rule="TQL302", name="s", severity="warning", message="m", ranks=[])
    whatif.apply_costs(run, [f], {"TQL302": {"removes": "straggler_delay"}})
    assert f.cost_ms_per_step == 0.0
    cpu = _run("cpu-ddp-eager")  # gloo on CPU: steps, no GPU; the GPU-idle cause has nothing to close
    assert whatif.replay(cpu, whatif.gpu_idle_saves(whatif.base_steps(cpu), None)).cost_ms_per_step == 0.0


@pytest.mark.parametrize("name", ["samples/demo", "h200x2-straggler", "cpu8-straggler", "compile-recompile-storm",
                                  "h200-launch-bound"])
def test_costs_in_one_plan_are_each_findings_own_replay(name):
    """apply_costs replays every finding in one plan (replay_costs); each cost must be the one its own replay gives."""
    from traceql.rules.causes import cost_specs
    from traceql.rules.loader import load_rules

    res = pipeline.check(FIX / name if not name.startswith("samples") else ROOT / name, use_cache=False)
    specs, keys = cost_specs(load_rules(None))
    todo = [f for f in res.findings if specs.get(f.rule)]
    assert todo
    base, groups, peers = whatif.base_steps(res.run), whatif.sync_groups(res.run), whatif._peers(todo, keys)
    for f in todo:
        r = whatif.finding_replay(res.run, f, specs[f.rule], base, groups, peers[id(f)])
        own = None if r is None or r.cost_ms_per_step is None else round(r.cost_ms_per_step, 3)
        assert f.cost_ms_per_step == own, f"{f.rule} {f.ranks}"
        assert f.cost_pct == (None if own is None or r.cost_pct is None else round(r.cost_pct, 1))


def test_replay_costs_keeps_items_apart():
    """One plan for several items: an item on every rank, one on a rank of no step, one with no saves, in any order."""
    run = _run("h200x2-straggler")
    base, groups = whatif.base_steps(run), whatif.sync_groups(run)
    items = [(whatif.fixed_saves(base, None, 1.5), None), (whatif.fixed_saves(base, [0], 2.0), [999]),
             (whatif._empty_save(), [0]), (whatif.fixed_saves(base, [0, 1], 2.0), [0, 1])]
    got = whatif.replay_costs(base, groups, items)
    for (saves, only), (cost, pct) in zip(items, got):
        r = whatif.replay(run, saves, base=base, groups=groups, only_ranks=only)
        assert (cost, pct) == (r.cost_ms_per_step, r.cost_pct)
    assert got[1] == (None, None) and got[2][0] == 0.0 and got[0][0] > 0
