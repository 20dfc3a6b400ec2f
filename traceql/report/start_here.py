"""Causes before consequences in the text report: "Start here" (the costliest causes, one line each with the first
sentence of the fix), and each finding's consequences indented under it."""

from __future__ import annotations

import re

from traceql.model.ranks import format_ranks

TOP = 3  # causes listed under "Start here"


def cost_text(f) -> str:
    """' (costs 51.7 ms per step, 39%)' where the what-if replay gave the finding a cost, else ''."""
    if f.cost_ms_per_step is None or f.cost_ms_per_step < 0.05:
        return ""  # none, or nothing measurable: the JSON report carries the exact number
    pct = f", {f.cost_pct:.0f}% of the step" if f.cost_pct is not None else ""
    return f" (costs {f.cost_ms_per_step:.1f} ms per step{pct})"


def first_sentence(text: str) -> str:
    text = " ".join(str(text or "").split())
    m = re.search(r"(?<=[.!?])\s+(?=[A-Z(])", text)
    return text[: m.start()] if m else text


def children(findings: list) -> dict[str, list]:
    """cause fingerprint -> the findings it explains (only causes that are themselves in the report)."""
    here = {f.fingerprint for f in findings}
    out: dict[str, list] = {}
    for f in findings:
        if f.caused_by and f.caused_by in here and f.caused_by != f.fingerprint:
            out.setdefault(f.caused_by, []).append(f)
    return out


def roots(findings: list) -> list:
    """The findings no other finding of the report explains."""
    here = {f.fingerprint for f in findings}
    return [f for f in findings if not (f.caused_by and f.caused_by in here and f.caused_by != f.fingerprint)]


def _count(fp: str, kids: dict[str, list], seen: set[str]) -> int:
    n = 0
    for k in kids.get(fp, []):
        if k.fingerprint not in seen:
            seen.add(k.fingerprint)
            n += 1 + _count(k.fingerprint, kids, seen)
    return n


def start_here(result, esc) -> list[str]:
    """Lines of the "Start here" block (empty where no cause has a cost): the TOP costliest causes, each with its
    ranks, its cost, how many findings it explains and the first sentence of its rule's fix."""
    fixes = {r.rule.id: (r.rule.docs or {}).get("fix", "") for r in result.results}
    # what tells one cause of a rule from another (its collapse columns besides the rank, its location): named on
    # the line, so two host syncs of one rule are told apart
    keys = {r.rule.id: list(dict.fromkeys(c for c in (r.rule.collapse or []) + (r.rule.location or [])
                                          if c != r.rule.ranks_column)) for r in result.results}
    kids = children(result.findings)
    causes = sorted((f for f in roots(result.findings) if (f.cost_ms_per_step or 0) >= 0.05 and f.severity != "info"),
                    key=lambda f: (-f.cost_ms_per_step, f.rule, f.fingerprint))
    # one line per cause: the same rule's findings on several ranks with one replayed cost are one fix
    top: list = []
    ranks_of: dict[int, set] = {}
    members: dict[int, list] = {}
    for f in causes:
        twin = next((t for t in top if t.rule == f.rule and t.cost_ms_per_step == f.cost_ms_per_step), None)
        if twin is not None:
            ranks_of[id(twin)].update(f.ranks)
            members[id(twin)].append(f)
        elif len(top) < TOP:
            top.append(f)
            ranks_of[id(f)] = set(f.ranks)
            members[id(f)] = [f]
    if not top:
        return []
    lines = ["[bold]Start here[/] (causes by what they cost per step; the what-if replay, `traceql whatif RUN`):"]
    for i, f in enumerate(top, 1):
        rs = sorted(ranks_of[id(f)])
        ranks = f" rank{'s' if len(rs) > 1 else ''} {format_ranks(rs)}" if rs else ""
        seen = {m.fingerprint for m in members[id(f)]}
        n = sum(_count(m.fingerprint, kids, seen) for m in members[id(f)])
        explains = f"; explains {n} other finding(s)" if n else ""
        what = [str(v) for v in ({**f.evidence, **f.location}.get(c) for c in keys.get(f.rule, [])) if v not in (None, "")]
        what = f" ({esc(', '.join(what))})" if what else ""
        lines.append(f"  {i}. [bold]{esc(f.rule)}[/] {esc(f.name)}{ranks}{what}: {f.cost_ms_per_step:.1f} ms per step"
                     + (f" ({f.cost_pct:.0f}%)" if f.cost_pct is not None else "") + f"{explains}. "
                     + esc(first_sentence(fixes.get(f.rule, ""))))
    return lines
