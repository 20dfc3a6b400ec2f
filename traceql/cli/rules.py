"""`traceql rules list|explain|test`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceql.cli import main
from traceql.cli._common import EXIT_FINDINGS, EXIT_OK, _fail


@main.group()
def rules():
    """List, explain and test the rule pack."""


@rules.command("list")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
def rules_list(rules_dirs):
    """Every rule: id, name, severity and summary."""
    from traceql.rules.loader import RuleError, load_rules

    try:
        rs = load_rules(list(rules_dirs) or None)
    except RuleError as e:
        _fail(str(e))
    for r in rs:
        click.echo(f"{r.id}  {r.name:38} {r.severity:8} {r.summary}")


@rules.command("explain")
@click.argument("rule_id")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
def rules_explain(rule_id, rules_dirs):
    """The docs of one rule: what it finds, why it matters, how to fix it, its thresholds."""
    from traceql.rules.loader import RuleError, load_rules

    try:
        rs = load_rules(list(rules_dirs) or None)
    except RuleError as e:
        _fail(str(e))
    r = next((x for x in rs if x.id == rule_id.upper() or x.name == rule_id), None)
    if r is None:
        _fail(f"no rule {rule_id!r}; see `traceql rules list`")
    d = r.docs
    lines = [f"{r.id} {r.name} ({r.severity})", "", r.summary, "", "## Why it matters", str(d.get("why", "")).strip(), "", "## How to fix it", str(d.get("fix", "")).strip()]
    if d.get("example"):
        lines += ["", "## Example", str(d["example"]).strip()]
    if r.params:
        lines += ["", "## Thresholds (override with --set " + r.id + ".NAME=VALUE)"]
        lines += [f"- {k} = {v.get('default')!r}: {v.get('doc', '')}" for k, v in r.params.items()]
    if r.needs:
        lines += ["", "## Needs", ", ".join(" + ".join(n) if isinstance(n, list) else n for n in r.needs)]
    if d.get("references"):
        lines += ["", "## References"] + [f"- {x}" for x in d["references"]]
    click.echo("\n".join(lines))


@rules.command("test")
@click.argument("rule_ids", nargs=-1)
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--root", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None, help="Folder fixture paths are relative to [default: the rule folder's parent].")
@click.option("--update", is_flag=True, help="Rewrite the snapshots (rules/snapshots/TQLnnn.yaml) with the findings of now.")
def rules_test(rule_ids, rules_dirs, root, update):
    """Run each rule on its fixtures (those that must fire, those that must stay quiet) and compare the findings
    with the rule's snapshot; exit 1 on any failure or drift."""
    from traceql.rules.loader import RuleError, default_rules_dir, load_rules, matches
    from traceql.rules.testing import test_rules

    try:
        rs = load_rules(list(rules_dirs) or None)
    except RuleError as e:
        _fail(str(e))
    if rule_ids:
        unknown = [p for p in rule_ids if not any(matches(r.id, [p]) for r in rs)]
        if unknown:
            _fail(f"no rule matches {unknown[0]!r}; see `traceql rules list`")
        rs = [r for r in rs if matches(r.id, list(rule_ids))]
    base = root or (Path(rules_dirs[0]) if rules_dirs else default_rules_dir()).resolve().parent
    outcomes = test_rules(rs, base, update=update)
    bad = 0
    for o in outcomes:
        bad += not o.ok
        click.echo(f"{'PASS' if o.ok else 'FAIL'}  {o.rule}  {o.expect:8} {o.fixture}: {o.detail}")
        for ln in o.diff:
            click.echo(f"      {ln}")
    untested = [r.id for r in rs if not (r.fixtures.get("fire") or r.fixtures.get("quiet"))]
    if untested:
        click.echo(f"no fixtures: {', '.join(untested)}")
    click.echo(f"{len(outcomes) - bad} passed, {bad} failed")
    sys.exit(EXIT_FINDINGS if bad else EXIT_OK)
