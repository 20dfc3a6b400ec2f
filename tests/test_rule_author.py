"""The rule author's commands: `rules new` writes a skeleton that loads and refuses a used id; `rules explain` says
where a rule's logic is; and a rule written from the skeleton goes from nothing to a passing snapshot test."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from traceql.cli import main
from traceql.rules.loader import load_rule, load_rules

REPO = Path(__file__).resolve().parents[1]


def test_rules_new_writes_a_skeleton_that_loads_and_refuses_a_used_id(tmp_path):
    r = CliRunner().invoke(main, ["rules", "new", "tql150", "my-first-rule", "--rules", str(tmp_path)])
    assert r.exit_code == 0, r.output
    p = tmp_path / "TQL150-my-first-rule.yaml"
    rule = load_rule(p)
    assert rule.id == "TQL150" and rule.name == "my-first-rule" and rule.select and rule.condition
    text = p.read_text()
    for section in ("why:", "fix:", "example:", "references:", "fire:", "quiet:", "fact:", "collapse:", "location:"):
        assert section in text, section
    again = CliRunner().invoke(main, ["rules", "new", "TQL150", "another", "--rules", str(tmp_path)])
    assert again.exit_code == 2 and "already used" in again.stderr and "TQL150-my-first-rule.yaml" in again.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["TQL150-my-first-rule.yaml"]
    bad = CliRunner().invoke(main, ["rules", "new", "TQL15", "x", "--rules", str(tmp_path)])
    assert bad.exit_code == 2 and "not a rule id" in bad.stderr


def test_from_skeleton_to_a_passing_snapshot_test(tmp_path):
    CliRunner().invoke(main, ["rules", "new", "TQL150", "many-comm-kernels", "--rules", str(tmp_path)])
    p = tmp_path / "TQL150-many-comm-kernels.yaml"
    # the README's walk-through: set the threshold, name a fixture that fires and one that stays quiet
    p.write_text(p.read_text().replace("default: 4", "default: 1")
                 .replace("  fire: []", "  fire: [{path: fixtures/h200x2-exposed-allreduce, ranks: [0]}]")
                 .replace("  quiet: []", "  quiet: [fixtures/h200-plain-loop]"))
    args = ["rules", "test", "TQL150", "--rules", str(tmp_path), "--root", str(REPO)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 1 and "no snapshot" in first.output
    assert CliRunner().invoke(main, [*args, "--update"]).exit_code == 0
    snap = (tmp_path / "snapshots" / "TQL150.yaml").read_text()
    assert "fixtures/h200x2-exposed-allreduce" in snap and "communication kernels" in snap
    ok = CliRunner().invoke(main, args)
    assert ok.exit_code == 0 and ok.output.splitlines()[-1] == "3 passed, 0 failed", ok.output


def test_explain_shows_where_the_logic_is():
    r = CliRunner().invoke(main, ["rules", "explain", "TQL105"])
    assert r.exit_code == 0
    logic = r.output.split("## Where the logic is")[1]
    assert "TQL105-comm-bound-step.yaml: select (measure join" in logic
    m = re.search(r"derived table collective_instances: traceql\.link\.collectives:collective_instances \((\S+):(\d+)\)", logic)
    assert m, logic
    src = (REPO / m.group(1)).read_text().splitlines()
    assert src[int(m.group(2)) - 1].startswith("def collective_instances(")
    r = CliRunner().invoke(main, ["rules", "explain", "TQL204"])
    assert "view runtime_memops: " in r.output and "view best_source: " in r.output


def test_explain_shows_a_fact_function(tmp_path):
    src = next(x for x in load_rules() if x.id == "TQL512").path.read_text()
    (tmp_path / "TQL512-x.yaml").write_text(src.replace("\nselect:", "\nfact: traceql.link.nccl:nccl_event_info\nselect:", 1))
    r = CliRunner().invoke(main, ["rules", "explain", "TQL512", "--rules", str(tmp_path)])
    assert r.exit_code == 0, r.output
    m = re.search(r"fact \(Python\): traceql\.link\.nccl:nccl_event_info \((\S+):(\d+)\)", r.output)
    assert m and (REPO / m.group(1)).read_text().splitlines()[int(m.group(2)) - 1].startswith("def nccl_event_info(")
