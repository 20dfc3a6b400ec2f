"""`traceql diff RUN_A RUN_B`: what changed between two runs, per rank, and which findings came and went.

The question it answers first: why did compiling (or any change) make it slower. Per rank: step time, overlap of
communication with compute, exposed communication, waits, idle, kernels (per-step medians, from `traceql summary`,
whose numbers are the rules'), and from compile_events the recompiles and graph breaks. Findings are matched by fingerprint; where fingerprints differ (the step numbers of two runs rarely agree)
a finding of the same rule on the same ranks counts as persisting, not as one resolved and one new.
"""

from __future__ import annotations

import io

import polars as pl

from traceql.model.result import CheckResult
from traceql.report.summary import summarize
from traceql.model.text_safety import visible

# Per-step medians from `traceql summary` (link.metrics.step_metrics, the table the rules read): two runs rarely
# profile the same number of steps, so totals would not compare.
METRICS = [
    # key, label, unit, better when lower
    ("step_time_ms_median", "step time (per-step median)", "ms", True),
    ("comm_comp_overlap_pct_steps", "comm/compute overlap (over the steps)", "%", False),
    ("exposed_comm_ms_median", "exposed communication (per-step median)", "ms", True),
    ("wait_ms_median", "waiting for other ranks (per-step median)", "ms", True),
    ("idle_ms_median", "GPU idle (per-step median)", "ms", True),
    ("compute_ms_median", "compute (per-step median)", "ms", True),
    ("comm_ms_median", "communication (per-step median)", "ms", True),
    ("kernels_median", "kernels (per-step median)", "", None),
    ("recompiles", "recompiles (total)", "", True),
    ("graph_breaks", "graph breaks (total)", "", True),
]


def compile_counts(run) -> dict[int, dict[str, int]]:
    ce = run.table("compile_events")
    if ce.height == 0:
        return {}
    c = ce.group_by("rank").agg(
        (pl.col("kind") == "recompile").sum().alias("recompiles"), (pl.col("kind") == "graph_break").sum().alias("graph_breaks")
    )
    return {int(r): {"recompiles": int(a), "graph_breaks": int(b)} for r, a, b in c.iter_rows() if r is not None}


def _per_rank(result: CheckResult) -> dict[str, dict]:
    s = summarize(result.run)["ranks"]
    cc = compile_counts(result.run)
    for r, row in s.items():
        row.update(cc.get(int(r), {"recompiles": None, "graph_breaks": None}))
    for r, counts in cc.items():  # ranks with compile logs and no trace
        if str(r) not in s:
            s[str(r)] = {**dict.fromkeys(k for k, *_ in METRICS), **counts}
    return s


def _delta(a, b) -> dict:
    d = {"a": a, "b": b, "delta": None, "pct": None}
    if a is not None and b is not None:
        d["delta"] = round(b - a, 3)
        if a:
            d["pct"] = round((b - a) / abs(a) * 100.0, 1)
    return d


def diff(a: CheckResult, b: CheckResult) -> dict:
    sa, sb = _per_rank(a), _per_rank(b)
    ranks = sorted(set(sa) | set(sb), key=int)
    per_rank = {}
    for r in ranks:
        ra, rb = sa.get(r, {}), sb.get(r, {})
        per_rank[r] = {k: _delta(ra.get(k), rb.get(k)) for k, *_ in METRICS}
        per_rank[r]["present"] = {"a": r in sa, "b": r in sb}
    fa = {f.fingerprint: f for f in a.findings}
    fb = {f.fingerprint: f for f in b.findings}
    only_a = [f for fp, f in fa.items() if fp not in fb]
    only_b = [f for fp, f in fb.items() if fp not in fa]
    # second pass: same rule on the same ranks with a different fingerprint (other step numbers, other location)
    key = lambda f: (f.rule, tuple(sorted(f.ranks)))  # noqa: E731
    pool: dict[tuple, list] = {}
    for f in only_a:
        pool.setdefault(key(f), []).append(f)
    new, changed = [], []
    for f in only_b:
        twins = pool.get(key(f))
        if twins:
            changed.append((twins.pop(0), f))
        else:
            new.append(f)
    resolved = [f for fs in pool.values() for f in fs]
    unchanged = [f for fp, f in fb.items() if fp in fa]
    return {
        "a": {"path": str(a.run.path), "ranks": a.run.ranks, "findings": len(a.findings)},
        "b": {"path": str(b.run.path), "ranks": b.run.ranks, "findings": len(b.findings)},
        "ranks": per_rank,
        "overall": _overall(per_rank),
        "findings": {
            "new": [f.to_json() for f in new],
            "resolved": [f.to_json() for f in resolved],
            "persisting": [f.to_json() for f in unchanged] + [{**fb_.to_json(), "was": fa_.to_json()} for fa_, fb_ in changed],
        },
        "hints": _hints(per_rank, new),
    }


def _overall(per_rank: dict) -> dict:
    out = {}
    for k, *_ in METRICS:
        a = [v[k]["a"] for v in per_rank.values() if v[k]["a"] is not None]
        b = [v[k]["b"] for v in per_rank.values() if v[k]["b"] is not None]
        if not a and not b:
            continue
        # the slowest rank's step time, the mean rank's overlap, and the other per-step medians summed over ranks
        agg = max if k == "step_time_ms_median" else (lambda xs: sum(xs) / len(xs)) if k == "comm_comp_overlap_pct_steps" else sum
        out[k] = _delta(round(agg(a), 3) if a else None, round(agg(b), 3) if b else None)
    return out


def _hints(per_rank: dict, new: list) -> list[str]:
    """Plain sentences linking the deltas to their usual causes. Only what the numbers show."""
    o = _overall(per_rank)
    hints = []
    st = o.get("step_time_ms_median", {})
    if st.get("pct") is not None and st["pct"] > 2:
        hints.append(f"the slowest rank's median step time grew {st['pct']:.1f}% ({st['a']:.2f} -> {st['b']:.2f} ms)")
    ov = o.get("comm_comp_overlap_pct_steps", {})
    ex = o.get("exposed_comm_ms_median", {})
    if ov.get("delta") is not None and ov["delta"] < -5:
        hints.append(
            f"communication overlaps compute less ({ov['a']:.0f}% -> {ov['b']:.0f}%)"
            + (f", exposed communication {ex['a']:.2f} -> {ex['b']:.2f} ms per step (median, summed over ranks)" if ex.get("delta") is not None else "")
            + ": collectives start later or wait together (see TQL101; with torch.compile check DDPOptimizer / bucket splits)"
        )
    for k, label in (("recompiles", "recompiles"), ("graph_breaks", "graph breaks")):
        d = o.get(k, {})
        if d.get("b") and (d.get("a") or 0) < d["b"]:
            hints.append(f"{label}: {d.get('a') or 0} -> {d['b']} over all ranks (see the TQL4xx findings)")
    idle = o.get("idle_ms_median", {})
    if idle.get("pct") is not None and idle["pct"] > 10 and idle["delta"] > 1:
        hints.append(f"GPU idle time per step grew {idle['pct']:.0f}% ({idle['a']:.2f} -> {idle['b']:.2f} ms, median, summed over ranks): "
                     "host-side work or syncs between kernels (TQL2xx)")
    if new:
        rules = sorted({f.rule for f in new})
        hints.append(f"{len(new)} new finding(s): {', '.join(rules)}")
    return hints


def render_text(d: dict, width: int = 140) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=True, highlight=False, soft_wrap=True)
    con.print(f"traceql diff\n  A: {escape(visible(d['a']['path']))} ({len(d['a']['ranks'])} rank(s), {d['a']['findings']} finding(s))")
    con.print(f"  B: {escape(visible(d['b']['path']))} ({len(d['b']['ranks'])} rank(s), {d['b']['findings']} finding(s))")
    t = Table("rank", "metric", "A", "B", "delta", "%", box=None, pad_edge=False)
    for r, row in d["ranks"].items():
        first = True
        for k, label, unit, _ in METRICS:
            v = row[k]
            if v["a"] is None and v["b"] is None:
                continue
            t.add_row(r if first else "", f"{label}{' (' + unit + ')' if unit else ''}", _f(v["a"]), _f(v["b"]), _f(v["delta"], signed=True),
                      "" if v["pct"] is None else f"{v['pct']:+.1f}")
            first = False
    con.print(t)
    if d["hints"]:
        con.print("\nwhat changed:")
        for h in d["hints"]:
            con.print(f"  - {escape(visible(h))}")
    for kind in ("new", "resolved"):
        fs = d["findings"][kind]
        con.print(f"\n{kind} findings ({len(fs)}):")
        for f in fs[:50]:
            con.print(f"  {f['severity']:8} {f['rule']} {escape(visible(f['message']))}")
        if len(fs) > 50:
            con.print(f"  ... {len(fs) - 50} more (use --format json)")
    con.print(f"\npersisting findings: {len(d['findings']['persisting'])}")
    return buf.getvalue()


def _f(v, signed: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:+.2f}" if signed else f"{v:.2f}"
    return f"{v:+}" if signed else str(v)
