"""`traceql rules test`: each rule against its fixtures, and each fixture's findings against the rule's snapshot.

Two checks per rule, both able to fail:

- fire/quiet: every fixture under `fixtures.fire` gives at least one finding (on the ranks listed), every fixture
  under `fixtures.quiet` gives none, whatever the severity (info findings count);
- snapshot: the findings on each of its fixtures (ranks, step, message, evidence rounded to 4 significant digits,
  fingerprint, and the rule's status there) equal those recorded in `snapshots/TQLnnn.yaml` beside the rule files.
  `--update` rewrites the snapshot files; they are written in a fixed order, so the same findings give the same
  bytes and a change shows as a plain diff in review.

Each fixture is loaded and evaluated once, for every rule under test that names it.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from traceql.rules.loader import Rule

SNAPSHOT_DIR = "snapshots"
HEADER = ("# Findings of this rule on its fixtures. Written by `traceql rules test --update`; "
          "`traceql rules test` fails when they drift.\n")


@dataclass
class FixtureOutcome:
    rule: str
    fixture: str
    expect: str  # fire | quiet | snapshot
    ok: bool
    detail: str
    diff: list[str] = field(default_factory=list)


def _entries(rule: Rule, kind: str) -> list[dict]:
    out = []
    for e in rule.fixtures.get(kind) or []:
        out.append(e if isinstance(e, dict) else {"path": e})
    return out


def snapshot_path(rule: Rule) -> Path:
    return rule.path.parent / SNAPSHOT_DIR / f"{rule.id}.yaml"


def _round(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        r = float(f"{v:.4g}")
        return int(r) if r.is_integer() and abs(r) < 1e15 else r
    if isinstance(v, (list, tuple)):
        return [_round(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _round(v[k]) for k in sorted(v, key=str)}
    return v


def finding_record(f) -> dict:
    return {"ranks": sorted(f.ranks), "step": f.step, "message": f.message, "evidence": _round(f.evidence),
            "fingerprint": f.fingerprint}


def render(rule: Rule, per_fixture: dict[str, dict]) -> str:
    """The snapshot file's text: fixtures in path order, findings in (ranks, step, fingerprint, message) order."""
    body = {"rule": rule.id, "fixtures": {}}
    for rel in sorted(per_fixture):
        rec = per_fixture[rel]
        fs = sorted(rec["findings"], key=lambda x: (x["ranks"], x["step"] if x["step"] is not None else -1,
                                                     x["fingerprint"], x["message"]))
        body["fixtures"][rel] = {"status": rec["status"], **({"reason": rec["reason"]} if rec.get("reason") else {}),
                                 "findings": fs}
    return HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=100, default_flow_style=None)


def test_rules(rules: list[Rule], root: Path, use_cache: bool = True, update: bool = False) -> list[FixtureOutcome]:
    from traceql.pipeline import load_run
    from traceql.rules.engine import run_rules

    wanted: dict[str, list[Rule]] = {}
    for rule in rules:
        for kind in ("fire", "quiet"):
            for e in _entries(rule, kind):
                wanted.setdefault(e["path"], [])
                if rule not in wanted[e["path"]]:
                    wanted[e["path"]].append(rule)
    results: dict[tuple[str, str], object] = {}  # (rule id, fixture) -> RuleResult
    missing: set[str] = set()
    for rel in sorted(wanted):
        path = (root / rel).resolve()
        if not path.exists():
            missing.add(rel)
            continue
        run = load_run(path, use_cache=use_cache)
        for res in run_rules(run, wanted[rel]):  # once per fixture, every rule that names it
            results[(res.rule.id, rel)] = res
    outcomes = []
    for rule in rules:
        seen: dict[str, dict] = {}
        for kind in ("fire", "quiet"):
            for e in _entries(rule, kind):
                rel = e["path"]
                if rel in missing:
                    outcomes.append(FixtureOutcome(rule.id, rel, kind, False, f"fixture {rel} does not exist"))
                    continue
                res = results[(rule.id, rel)]
                seen[rel] = {"status": res.status, "reason": res.reason if res.status != "ran" else "",
                             "findings": [finding_record(f) for f in res.findings]}
                if res.status != "ran":
                    outcomes.append(FixtureOutcome(rule.id, rel, kind, False, f"rule {res.status}: {res.reason}"))
                    continue
                if kind == "fire":
                    want = set(e.get("ranks") or [])
                    got = {r for f in res.findings for r in f.ranks}
                    ok = bool(res.findings) and want <= got
                    detail = f"{len(res.findings)} finding(s) on ranks {sorted(got)}" + (f", expected ranks {sorted(want)}" if want else "")
                else:
                    ok = not res.findings  # info findings count: an info rule can fail a quiet fixture too
                    detail = "quiet" if ok else f"{len(res.findings)} finding(s): {res.findings[0].message}"
                outcomes.append(FixtureOutcome(rule.id, rel, kind, ok, detail))
        if seen:
            outcomes.append(_snapshot(rule, seen, update))
    return outcomes


def _snapshot(rule: Rule, seen: dict[str, dict], update: bool) -> FixtureOutcome:
    p = snapshot_path(rule)
    text = render(rule, seen)
    rel = f"{SNAPSHOT_DIR}/{p.name}"
    old = p.read_text(encoding="utf-8") if p.is_file() else None
    if update:
        if old != text:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
            return FixtureOutcome(rule.id, rel, "snapshot", True, "written" if old is None else "updated")
        return FixtureOutcome(rule.id, rel, "snapshot", True, "unchanged")
    if old is None:
        return FixtureOutcome(rule.id, rel, "snapshot", False, f"no snapshot {p}; run `traceql rules test --update "
                                                                f"{rule.id}` and review it")
    if old == text:
        return FixtureOutcome(rule.id, rel, "snapshot", True, f"{sum(len(x['findings']) for x in seen.values())} "
                                                              f"finding(s) as recorded")
    diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), f"{rel} (recorded)", f"{rel} (now)",
                                     lineterm="", n=2))
    changed = sum(1 for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
    return FixtureOutcome(rule.id, rel, "snapshot", False, f"findings drifted ({changed} line(s) differ); "
                                                           "`--update` records them if intended", diff)
