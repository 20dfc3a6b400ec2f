"""`traceql rules list|explain|check|new|test`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceql.cli import main
from traceql.cli._common import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, _fail


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


@rules.command("check")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--write-manifest", is_flag=True,
              help="Rewrite the bundled pack's validation manifest (rules/manifest.json) from this full validation.")
def rules_check(rules_dirs, write_manifest):
    """Validate every rule in full (tables, columns, message, evidence, location, collapse and the outputs inferred
    on the declared schemas), whatever the bundled pack's manifest says, and say whether that manifest is current."""
    from traceql.rules import manifest
    from traceql.rules.loader import RuleError, default_rules_dir, load_rules

    dirs = list(rules_dirs) or [default_rules_dir()]
    if write_manifest and (len(dirs) != 1 or not manifest.bundled(dirs[0])):
        _fail(f"--write-manifest writes the bundled pack's manifest only ({default_rules_dir()}); a pack given with "
              "--rules is validated in full on every load")
    try:
        rs = load_rules(dirs, trust_manifest=False)
        if write_manifest:
            click.echo(f"wrote {manifest.write(dirs[0])}")
    except RuleError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"{dirs[0] / manifest.FILE}: cannot write: {e}")
    click.echo(f"{len(rs)} rules valid")
    bundled = [d for d in dirs if manifest.bundled(d)]
    if bundled and not write_manifest:
        why = manifest.stale(bundled[0])
        click.echo(f"manifest: {why}; refresh it with `{manifest.REFRESH}` (until then the pack is validated in full "
                   "on every command)" if why else f"manifest: {bundled[0] / manifest.FILE} is current")


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
    lines += ["", "## Where the logic is", *_logic(r)]
    if d.get("references"):
        lines += ["", "## References"] + [f"- {x}" for x in d["references"]]
    click.echo("\n".join(lines))


def _where(target: str) -> str:
    """module:function -> "module:function (file:line)", or what is wrong with it."""
    import importlib
    import inspect

    mod, _, fn = target.partition(":")
    try:
        obj = getattr(importlib.import_module(mod), fn)
        src = Path(inspect.getsourcefile(obj)).resolve()
        line = inspect.getsourcelines(obj)[1]
    except (ImportError, AttributeError, TypeError, OSError) as e:
        return f"{target} (cannot be found: {type(e).__name__})"
    return f"{target} ({_rel(src)}:{line})"


def _rel(p: Path) -> Path:
    p = Path(p).resolve()
    return p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p


def _logic(r) -> list[str]:
    """Where a rule's logic lives: its YAML (vocabulary or SQL), the views it reads, the link/ builders of the derived
    tables it reads, and the fact function it names."""
    from traceql.model.derived import DERIVED, SCHEMAS
    from traceql.rules.views import named

    out = []
    if r.fact:
        out.append(f"- fact (Python): {_where(r.fact)}")
    tables: list[str] = []
    if r.select is not None:
        def walk(s):
            if s["measure"] == "join":
                return walk(s["left"]) + walk(s["right"])
            return [s["table"]] + ([s["against"]["table"]] if s.get("against") else [])
        tables = list(dict.fromkeys(walk(r.select)))
        st = [k for k in ("compute", "filter", "steps", "across_ranks", "then") if r.select.get(k) is not None]
        shape = f"measure {r.select['measure']}" + (f" with {', '.join(st)}" if st else "")
        out.append(f"- {r.path.name}: select ({shape}) over {', '.join(tables)}"
                   + (f", condition {r.condition!r}" if r.condition else ""))
    else:
        tables = named(r.sql, sorted(set(DERIVED) | set(r.views) | set(SCHEMAS)))
        out.append(f"- {r.path.name}: SQL{' (across ranks)' if r.cross_rank else ' (per rank)'} over {', '.join(tables)}"
                   + (f", condition {r.condition!r}" if r.condition else ""))
    for t in tables:
        if t in r.views:
            v = r.views[t]
            out.append(f"- view {t}: {_rel(v.path)} (reads {', '.join(v.reads)})")
        elif t in DERIVED:
            out.append(f"- derived table {t}: {_where(DERIVED[t].builder)}")
    return out


@rules.command("new")
@click.argument("rule_id")
@click.argument("name")
@click.option("--rules", "rules_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder to write the rule file in [default: the bundled rule pack].")
def rules_new(rule_id, name, rules_dir):
    """Write a rule skeleton RULES/ID-NAME.yaml (every field, docs sections, fixture slots) that loads as it is."""
    from traceql.rules.loader import ID_RE, NAME_RE, RuleError, default_rules_dir, load_rule
    from traceql.rules.skeleton import skeleton

    rid = rule_id.upper()
    if not ID_RE.match(rid):
        _fail(f"{rule_id!r} is not a rule id: TQL, an area digit and two digits (TQL1xx communication, TQL2xx host "
              "and GPU, TQL3xx across ranks, TQL4xx torch.compile, TQL5xx NCCL, TQL6xx Flight Recorder), e.g. TQL150")
    if not NAME_RE.match(name):
        _fail(f"{name!r} is not a kebab-case name, e.g. exposed-communication")
    d = Path(rules_dir) if rules_dir else default_rules_dir()
    if not d.is_dir():
        _fail(f"{d}: no such folder; create it or point --rules at a rule pack")
    taken = sorted(d.glob(f"{rid}-*.y*ml")) + sorted(d.glob(f"{rid}.y*ml"))
    if taken:
        _fail(f"{taken[0]}: {rid} is already used; pick a free id (`traceql rules list`)")
    p = d / f"{rid}-{name}.yaml"
    p.write_text(skeleton(rid, name), encoding="utf-8")
    try:
        load_rule(p)
    except RuleError as e:  # the skeleton must load; if it does not, say so rather than leave a broken file
        p.unlink()
        _fail(f"internal error: the skeleton does not load ({e}); please report it", EXIT_INTERNAL)
    click.echo(f"wrote {p}")
    click.echo(f"next: edit it, name fixtures under fixtures:, then `traceql rules test {rid} --update` and review "
               f"{d / 'snapshots' / (rid + '.yaml')}")


@rules.command("test")
@click.argument("rule_ids", nargs=-1)
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--root", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None, help="Folder fixture paths are relative to [default: the rule folder's parent].")
@click.option("--update", is_flag=True, help="Rewrite the snapshots (rules/snapshots/TQLnnn.yaml) with the findings of now.")
def rules_test(rule_ids, rules_dirs, root, update):
    """Run each rule on its fixtures (those that must fire, those that must stay quiet) and compare the findings
    with the rule's snapshot; exit 1 on any failure or drift."""
    from traceql.rule_tests import test_rules
    from traceql.rules import manifest
    from traceql.rules.loader import RuleError, default_rules_dir, load_rules, matches

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
    if update and all(manifest.bundled(d) for d in (rules_dirs or [default_rules_dir()])):
        try:  # the rule files may have changed with their snapshots: the manifest follows them
            click.echo(f"wrote {manifest.write(default_rules_dir())}")
        except (RuleError, OSError) as e:
            click.echo(f"manifest not written: {e}")
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
