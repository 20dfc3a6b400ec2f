"""Detection accuracy of the rule pack over the recorded fixtures.

For every run dir with a manifest.json (fixtures/*, samples/*), run `traceql check DIR --format json` and compare
its findings with the manifest's `expected` list. Prints one table row per rule:

    expected      (fixture, rule) pairs the manifests ask for
    found         ... that the check produced, on (at least) the expected ranks
    wrong ranks   ... that fired, but not on every expected rank
    missed        ... that did not fire
    false alarms  warning/error findings of the rule on clean runs (manifest "clean": true)
    other         findings of the rule on planted runs that did not ask for it (informational)
    not yet       expected pairs whose rule id has no file in rules/ yet (not counted as missed)

    python benchmarks/accuracy.py                                   # the table
    python benchmarks/accuracy.py --write-baseline benchmarks/accuracy_baseline.json
    python benchmarks/accuracy.py --check-baseline benchmarks/accuracy_baseline.json   # CI: exit 1 on regression

A pair regresses when it passed in the baseline (found, or a clean run that stayed quiet) and does not now.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = [sys.executable, "-c", "import sys; from traceql.cli import main; sys.exit(main())", "check"]
QUIET = "quiet"  # the pseudo-rule of a clean run: passes while no warning or error fires


def rule_ids(rules_dir: Path) -> set[str]:
    return {p.name.split("-", 1)[0] for p in rules_dir.glob("TQL*.y*ml")}


def run_dirs(roots: list[Path]) -> list[Path]:
    out = []
    for root in roots:
        for m in sorted(root.glob("*/manifest.json")):
            if has_expectations(m.parent):
                out.append(m.parent)
    return out


def check(run: Path, timeout_s: float) -> tuple[dict | None, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([*CHECK, str(run), "--format", "json", "--no-cache"], capture_output=True, text=True,
                           timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f}s", time.perf_counter() - t0
    dt = time.perf_counter() - t0
    try:
        return json.loads(p.stdout), "", dt
    except ValueError:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {p.returncode}: {last[:200]}", dt


def expectations(manifest: dict) -> tuple[list[dict], bool] | None:
    """(expected [{rule, ranks}], clean) from a manifest; None when it states no expectations.

    Two shapes exist in fixtures/: `traceql capture`'s {"expected": [{"rule", "ranks"}], "clean"} and the
    hand-made logs' {"expect": {"fire": [rule ids]}} (ranks unstated: any rank counts)."""
    if isinstance(manifest.get("expected"), list):
        exp = manifest["expected"]
        return exp, bool(manifest.get("clean", not exp))
    fire = (manifest.get("expect") or {}).get("fire") if isinstance(manifest.get("expect"), dict) else None
    if isinstance(fire, list):
        return [{"rule": r, "ranks": []} for r in fire], not fire
    return None


def has_expectations(run: Path) -> bool:
    try:
        return expectations(json.loads((run / "manifest.json").read_text())) is not None
    except (OSError, ValueError):
        return False


def evaluate(run: Path, report: dict | None, error: str, known: set[str]) -> list[dict]:
    """One row per (fixture, rule) pair: status pass | wrong_ranks | missed | not_yet | error, plus alarms."""
    manifest = json.loads((run / "manifest.json").read_text())
    expected, clean = expectations(manifest)
    name = run.relative_to(REPO).as_posix() if run.is_relative_to(REPO) else str(run)
    findings = (report or {}).get("findings", [])
    by_rule: dict[str, list[dict]] = {}
    for f in findings:
        by_rule.setdefault(f.get("rule"), []).append(f)
    rows = []
    expected_ids = {e["rule"] for e in expected}
    for e in expected:
        rule = e["rule"]
        want = set(e.get("ranks") or [])
        if report is None:
            status = "error"
        elif rule not in known:
            status = "not_yet"
        elif rule not in by_rule:
            status = "missed"
        else:
            got = set()
            for f in by_rule[rule]:
                r = f.get("ranks")
                got.update(r if isinstance(r, list) else [r] if r is not None else [])
            status = "pass" if want <= got else "wrong_ranks"
        rows.append({"fixture": name, "rule": rule, "status": status, "ranks": sorted(want), "error": error})
    alarms = {}
    for rule, fs in by_rule.items():
        if rule in expected_ids:
            continue
        serious = [f for f in fs if f.get("severity") in ("warning", "error")]
        if serious:
            alarms[rule] = len(serious)
    if clean:
        status = "error" if report is None else ("pass" if not alarms else "false_alarm")
        rows.append({"fixture": name, "rule": QUIET, "status": status, "alarms": alarms, "error": error})
    else:
        rows.append({"fixture": name, "rule": "other", "status": "info", "alarms": alarms, "error": error})
    return rows


def table(rows: list[dict], known: set[str]) -> str:
    cols = ("expected", "found", "wrong", "missed", "false", "other", "not_yet", "error")
    rules = sorted({r["rule"] for r in rows if r["rule"] not in (QUIET, "other")} | known)
    stats = {k: dict.fromkeys(cols, 0) for k in rules}
    for r in rows:
        if r["rule"] in stats:
            s = stats[r["rule"]]
            s["expected"] += 1
            key = {"pass": "found", "wrong_ranks": "wrong", "missed": "missed", "not_yet": "not_yet",
                   "error": "error"}[r["status"]]
            s[key] += 1
        for rule, n in r.get("alarms", {}).items():
            stats.setdefault(rule, dict.fromkeys(cols, 0))
            stats[rule]["false" if r["rule"] == QUIET else "other"] += n
    head = f"{'rule':<8} {'exists':>6} {'expected':>8} {'found':>5} {'wrong ranks':>11} {'missed':>6} " \
           f"{'false alarms':>12} {'other':>5} {'not yet':>7} {'error':>5}"
    lines = [head, "-" * len(head)]
    for rule in sorted(stats):
        s = stats[rule]
        lines.append(f"{rule:<8} {'yes' if rule in known else 'no':>6} {s['expected']:>8} {s['found']:>5} "
                     f"{s['wrong']:>11} {s['missed']:>6} {s['false']:>12} {s['other']:>5} {s['not_yet']:>7} "
                     f"{s['error']:>5}")
    quiet = [r for r in rows if r["rule"] == QUIET]
    lines.append(f"clean runs quiet: {sum(r['status'] == 'pass' for r in quiet)} of {len(quiet)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Rule-pack accuracy over the recorded fixtures.")
    ap.add_argument("roots", nargs="*", type=Path, default=[REPO / "fixtures", REPO / "samples"])
    ap.add_argument("--rules", type=Path, default=REPO / "rules")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per check")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--format", choices=["text", "json"], default="text")
    ap.add_argument("--write-baseline", type=Path)
    ap.add_argument("--check-baseline", type=Path)
    args = ap.parse_args(argv)

    known = rule_ids(args.rules)
    runs = run_dirs([r.resolve() for r in args.roots])
    if not runs:
        print(f"no run dirs with manifest.json under {', '.join(map(str, args.roots))}", file=sys.stderr)
        return 2
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda d: (d, *check(d, args.timeout)), runs))
    rows = []
    for run, report, error, dt in results:
        rows += evaluate(run, report, error, known)
        if error:
            print(f"{run.name}: check failed: {error}", file=sys.stderr)

    if args.format == "json":
        print(json.dumps({"rows": rows, "seconds": {r.name: round(dt, 2) for r, _, _, dt in results}}, indent=2))
    else:
        print(table(rows, known))
        for r in rows:
            if r["status"] in ("missed", "wrong_ranks", "false_alarm", "error"):
                extra = r.get("alarms") or r.get("error") or ""
                print(f"  {r['status']:<11} {r['fixture']}  {r['rule']}  {extra}")
        print("check seconds: " + ", ".join(f"{r.name} {dt:.1f}" for r, _, _, dt in results))

    current = {f"{r['fixture']}::{r['rule']}": r["status"] for r in rows if r["rule"] != "other"}
    if args.write_baseline:
        args.write_baseline.write_text(json.dumps({"pairs": dict(sorted(current.items()))}, indent=2) + "\n")
        print(f"wrote {args.write_baseline}")
    if args.check_baseline:
        base = json.loads(args.check_baseline.read_text()).get("pairs", {})
        regressed = [(k, v) for k, v in sorted(base.items()) if v == "pass" and current.get(k) != "pass"]
        for k, _ in regressed:
            print(f"REGRESSION {k}: passed in the baseline, now {current.get(k, 'absent')}", file=sys.stderr)
        if regressed:
            return 1
        print(f"baseline {args.check_baseline}: no regressions ({sum(v == 'pass' for v in base.values())} "
              "passing pairs held)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
