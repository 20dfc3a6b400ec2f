"""`traceql rules test`: each rule against its fixtures: those that must fire and those that must stay quiet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from traceql.rules.loader import Rule


@dataclass
class FixtureOutcome:
    rule: str
    fixture: str
    expect: str  # fire | quiet
    ok: bool
    detail: str


def _entries(rule: Rule, kind: str) -> list[dict]:
    out = []
    for e in rule.fixtures.get(kind) or []:
        out.append(e if isinstance(e, dict) else {"path": e})
    return out


def test_rules(rules: list[Rule], root: Path, use_cache: bool = True) -> list[FixtureOutcome]:
    from traceql.pipeline import load_run
    from traceql.rules.engine import evaluate

    runs: dict[str, object] = {}
    outcomes = []
    for rule in rules:
        for kind in ("fire", "quiet"):
            for e in _entries(rule, kind):
                rel = e["path"]
                path = (root / rel).resolve()
                if not path.exists():
                    outcomes.append(FixtureOutcome(rule.id, rel, kind, False, f"fixture {rel} does not exist"))
                    continue
                if rel not in runs:
                    runs[rel] = load_run(path, use_cache=use_cache)
                res = evaluate(runs[rel], rule)
                if res.status != "ran":
                    outcomes.append(FixtureOutcome(rule.id, rel, kind, False, f"rule {res.status}: {res.reason}"))
                    continue
                found = [f for f in res.findings if f.severity != "info" or kind == "fire"]
                if kind == "fire":
                    want = set(e.get("ranks") or [])
                    got = {r for f in res.findings for r in f.ranks}
                    ok = bool(res.findings) and want <= got
                    detail = f"{len(res.findings)} finding(s) on ranks {sorted(got)}" + (f", expected ranks {sorted(want)}" if want else "")
                else:
                    ok = not found
                    detail = "quiet" if ok else f"{len(found)} finding(s): {found[0].message}"
                outcomes.append(FixtureOutcome(rule.id, rel, kind, ok, detail))
    return outcomes
