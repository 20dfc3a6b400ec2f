"""SARIF 2.1.0 for code-scanning UIs: one run, the rules that ran as reportingDescriptors, one result per finding.

A finding has no source line: its physical location is the input file it came from (relative to the run dir,
under the uriBaseId RUNDIR) and its logical location is where in the run it is (rank3/step12/stream7).
"""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import orjson

from traceql import __version__
from traceql.model.result import CheckResult

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}
FINGERPRINT_KEY = "traceqlFingerprint/v1"


def render(result: CheckResult) -> str:
    return orjson.dumps(to_sarif(result), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


def to_sarif(result: CheckResult) -> dict:
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    rules = []
    index: dict[str, int] = {}
    for r in result.results:
        if r.rule.id in index:
            continue
        index[r.rule.id] = len(rules)
        rules.append(_descriptor(r.rule))
    # a finding whose rule did not come through result.results (hand-built results) still gets a descriptor
    for f in result.findings:
        if f.rule not in index:
            index[f.rule] = len(rules)
            rules.append({"id": f.rule, "name": f.name, "defaultConfiguration": {"level": LEVEL[f.severity]}})
    results = [_result(f, index, root) for f in result.findings]
    notifications = []
    for r in result.results:
        if r.status == "error":
            notifications.append(_note("error", f"rule {r.rule.id} failed: {r.reason}", r.rule.id, index))
        elif r.status != "ran":
            notifications.append(_note("note", f"rule {r.rule.id} not run: {r.reason}", r.rule.id, index))
    for s in run.sources:
        if s.status in ("error", "partial"):
            rel = s.to_json(root)["path"]
            notifications.append(
                {"level": "error" if s.status == "error" else "warning", "message": {"text": f"{rel} ({s.kind}): {s.status}: {s.detail}"},
                 "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(rel), "uriBaseId": "RUNDIR"}}}]}
            )
    invocation = {"executionSuccessful": not any(r.status == "error" for r in result.results)}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    sarif_run = {
        "tool": {"driver": {"name": "traceql", "version": __version__, "semanticVersion": _semver(__version__), "rules": rules}},
        "originalUriBaseIds": {"RUNDIR": {"uri": _dir_uri(root)}},
        "invocations": [invocation],
        "results": results,
        "columnKind": "unicodeCodePoints",
    }
    if result.suppressed:
        sarif_run["properties"] = {"suppressed": result.suppressed}
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [sarif_run]}


def _descriptor(rule) -> dict:
    docs = rule.docs or {}
    why = _text(docs.get("why")) or rule.summary
    fix = _text(docs.get("fix"))
    refs = [str(x) for x in docs.get("references") or []]
    md = [f"**{rule.summary}**", "", "## Why it matters", why]
    txt = [rule.summary, "", "Why it matters: " + why]
    if fix:
        md += ["", "## How to fix it", fix]
        txt += ["", "How to fix it: " + fix]
    if docs.get("example"):
        md += ["", "## Example", "```", _text(docs["example"]), "```"]
    if rule.params:
        md += ["", f"## Thresholds (override with `--set {rule.id}.NAME=VALUE`)"]
        md += [f"- `{k}` = `{v.get('default')!r}`: {v.get('doc', '')}" for k, v in rule.params.items()]
    if refs:
        md += ["", "## References"] + [f"- {x}" for x in refs]
        txt += ["", "References: " + "; ".join(refs)]
    d = {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": why},
        "help": {"text": "\n".join(txt), "markdown": "\n".join(md)},
        "defaultConfiguration": {"level": LEVEL.get(rule.severity, "warning")},
        "properties": {"tags": list(rule.tags or []), "parameters": {k: v.get("default") for k, v in (rule.params or {}).items()}},
    }
    help_uri = next((x.split()[0] for x in refs if x.startswith(("https://", "http://"))), None)
    if help_uri:
        d["helpUri"] = help_uri
    return d


def _result(f, index: dict[str, int], root: Path) -> dict:
    logical = logical_name(f.ranks, f.step, f.location)
    loc: dict = {"logicalLocations": [{"name": logical, "fullyQualifiedName": logical, "kind": "module"}]}
    paths = [_rel(p, root) for p in f.sources]
    if paths:
        loc["physicalLocation"] = {"artifactLocation": {"uri": _uri(paths[0]), "uriBaseId": "RUNDIR"}}
    out = {
        "ruleId": f.rule,
        "ruleIndex": index[f.rule],
        "level": LEVEL.get(f.severity, "warning"),
        "message": {"text": f.message},
        "locations": [loc],
        "partialFingerprints": {FINGERPRINT_KEY: f.fingerprint},
        "properties": {"ranks": list(f.ranks), "step": f.step, "evidence": _clean(f.evidence), "location": _clean(f.location),
                       "cost_ms_per_step": f.cost_ms_per_step, "cost_pct": f.cost_pct, "caused_by": f.caused_by},
    }
    if len(paths) > 1:
        out["relatedLocations"] = [
            {"id": i, "physicalLocation": {"artifactLocation": {"uri": _uri(p), "uriBaseId": "RUNDIR"}}} for i, p in enumerate(paths[1:], 1)
        ]
    return out


def logical_name(ranks: list[int], step: int | None, location: dict | None = None) -> str:
    """rank3/step12/stream7: where in the run a finding is. Several ranks read rank0,2,5; none reads 'run'."""
    parts = []
    if ranks:
        parts.append("rank" + ",".join(str(r) for r in ranks))
    if step is not None:
        parts.append(f"step{step}")
    for k in sorted(location or {}):
        if k in ("rank", "step"):
            continue
        parts.append(f"{k}{location[k]}")
    return "/".join(parts) or "run"


def _note(level: str, text: str, rule_id: str, index: dict[str, int]) -> dict:
    return {"level": level, "message": {"text": text}, "associatedRule": {"id": rule_id, "index": index[rule_id]}}


def _rel(path: str, root: Path) -> str:
    p = Path(path)
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return p.name if p.is_absolute() else p.as_posix()


def _uri(rel: str) -> str:
    return quote(str(PurePosixPath(rel)), safe="/")


def _dir_uri(root: Path) -> str:
    uri = root.resolve().as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _semver(v: str) -> str:
    parts = v.split("+", 1)[0].split(".")
    return ".".join((parts + ["0", "0", "0"])[:3]) if all(p.isdigit() for p in parts[:3]) else "0.0.0"


def _text(v) -> str:
    return " ".join(str(v).split()) if v else ""


def _clean(v):
    """Evidence as JSON: NaN and infinities become null (SARIF is strict JSON)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v
