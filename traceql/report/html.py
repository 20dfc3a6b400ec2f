"""`traceql check --format html`: one self-contained page for people. No script, no network, no external asset.

Sections: run overview (ranks, steps, sources), per-rank breakdown per step (step_metrics), a timeline of one
step on every rank with findings marked (inline SVG), a collective wait heatmap (collective_instances), and the
findings with their evidence and the rules' docs. Every string that came from an input goes through html.escape:
kernel names, file names, messages and evidence are data, never markup. A Content-Security-Policy without
script-src makes any markup that slipped through inert.
"""

from __future__ import annotations

import html as _html
import math
from collections import defaultdict
from pathlib import Path

import polars as pl

from traceql import __version__, link
from traceql.model.ranks import format_ranks
from traceql.report._align import aligner
from traceql.model.result import CheckResult

MAX_LANE_RECTS = 4000  # per lane, after merging what falls into one pixel
TIMELINE_W = 1100
HEAT_MAX_COLS = 160
KIND_COLOR = {"compute": "#4e79a7", "comm": "#e15759", "memcpy": "#f28e2b", "memset": "#edc948", "host": "#9c9c9c"}
SEV_COLOR = {"error": "#c0392b", "warning": "#d68910", "info": "#2e86c1"}
PARTS = [
    ("compute_ms", "compute", "#4e79a7"),
    ("exposed_comm_ms", "exposed communication", "#e15759"),
    ("copy_ms", "copies only", "#f28e2b"),
    ("idle_part_ms", "GPU idle", "#d0d0d0"),
    ("host_ms", "host (no GPU work)", "#9c9c9c"),
    ("other_ms", "other host time (communication on the host)", "#bab0ac"),
]


def e(v) -> str:
    return _html.escape("" if v is None else str(v), quote=True)


def render(result: CheckResult, step: int | None = None) -> str:
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    body = [
        _overview(result, root),
        _breakdown(run),
        _timeline(result, step),
        _heatmap(run),
        _findings(result, root),
    ]
    title = f"traceql: {run.path.name}"
    return _PAGE.format(title=e(title), css=_CSS, body="\n".join(body), version=e(__version__))


# ---------------------------------------------------------------------------------------------------- overview


def _overview(result: CheckResult, root: Path) -> str:
    run = result.run
    steps = run.table("steps")
    n_steps = steps.select("rank", "step").unique().group_by("rank").len() if steps.height else None
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    ran = sum(1 for r in result.results if r.status == "ran")
    out = [f"<h1>traceql report <span class=dim>{e(run.path)}</span></h1>", "<section id=overview><h2>Run</h2><table class=kv>"]
    out.append(f"<tr><th>ranks</th><td>{len(run.ranks)}: {e(_ranges(run.ranks))}</td></tr>")
    if n_steps is not None and n_steps.height:
        per = sorted(n_steps.iter_rows())
        lo, hi = min(n for _, n in per), max(n for _, n in per)
        out.append(f"<tr><th>steps</th><td>{lo if lo == hi else f'{lo} to {hi}'} per rank</td></tr>")
    else:
        out.append("<tr><th>steps</th><td>none found: the whole trace is one window</td></tr>")
    out.append(f"<tr><th>sources</th><td>{len(run.sources)}</td></tr>")
    out.append(
        "<tr><th>findings</th><td>"
        + " ".join(f"<span class='sev {s}'>{counts[s]} {s}</span>" for s in counts)
        + (f" ({result.suppressed} suppressed)" if result.suppressed else "")
        + f"; {ran} rule(s) ran, {len(result.results) - ran} did not</td></tr></table>"
    )
    out.append("<table class=grid><thead><tr><th>source</th><th>kind</th><th>rank(s)</th><th>status</th><th>detail</th></tr></thead><tbody>")
    for s in run.sources:
        j = s.to_json(root)
        out.append(
            f"<tr class='st-{e(s.status)}'><td>{e(j['path'])}</td><td>{e(s.kind)}</td><td>{e(_ranges(j['ranks']))}</td>"
            f"<td>{e(s.status)}</td><td>{e(s.detail)}</td></tr>"
        )
    out.append("</tbody></table>")
    if run.notes:
        out.append("<ul class=notes>" + "".join(f"<li>{e(n)}</li>" for n in run.notes) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------- breakdown


def breakdown_rows(run) -> pl.DataFrame:
    """step_metrics (the numbers `summary` and the rules use) with the parts that add up to the step time.

    Communication on the GPU: compute, exposed communication, copy_ms (GPU busy with memcpy/memset only), GPU idle
    and host_ms (step time outside the GPU's first..last kernel). Communication on the host (gloo): compute, exposed
    communication and other_ms (the rest of the step), because host-side communication and GPU idle overlap."""
    sm = link.ensure(run, "step_metrics")
    if sm.height == 0:
        return sm
    host_side = pl.col("side") == "host"
    rest = (pl.col("step_ms") - pl.col("compute_ms") - pl.col("exposed_comm_ms")).clip(lower_bound=0.0)
    return sm.with_columns(
        pl.col("gpu_idle_ms").alias("idle_ms"),
        pl.when(host_side).then(0.0).otherwise(
            (pl.col("gpu_busy_ms") - pl.col("compute_ms") - pl.col("exposed_comm_ms")).clip(lower_bound=0.0)).fill_null(0.0).alias("copy_ms"),
        pl.when(host_side).then(0.0).otherwise(
            (pl.col("step_ms") - pl.col("gpu_span_ms")).clip(lower_bound=0.0)).fill_null(0.0).alias("host_ms"),
        pl.when(host_side).then(rest).otherwise(0.0).fill_null(0.0).alias("other_ms"),
    ).with_columns(
        # GPU idle overlaps host-side communication: a part of the step only where communication runs on the GPU
        pl.when(host_side).then(0.0).otherwise(pl.col("idle_ms")).fill_null(0.0).alias("idle_part_ms"))


def _breakdown(run) -> str:
    bd = breakdown_rows(run)
    out = ["<section id=breakdown><h2>Where each step's time went, per rank</h2>"]
    if bd.height == 0:
        out.append("<p class=note>No steps and no GPU kernels in this run: no breakdown.</p></section>")
        return "\n".join(out)
    out.append("<p class=legend>" + " ".join(f"<span class=sw style='background:{c}'></span>{e(n)}" for _, n, c in PARTS) + "</p>")
    scale = max(float(sum((r.get(p) or 0.0) for p, _, _ in PARTS)) for r in bd.iter_rows(named=True)) or 1.0
    out.append(
        "<p class=note>Per step; `traceql summary` gives their per-step medians and totals. Exposed communication is "
        "what TQL101 reports (NCCL kernels, or host-side collectives for gloo), waits are the union of the rank's "
        "waits for later ranks in collectives, GPU idle is the GPU span minus its kernels.</p>"
        "<table class=grid><thead><tr><th>rank</th><th>step</th><th>step ms</th><th class=bar>split</th><th>compute</th>"
        "<th>exposed comm</th><th>overlap %</th><th>wait</th><th>GPU idle</th><th>host</th><th>kernels</th></tr></thead><tbody>"
    )
    rows = list(bd.iter_rows(named=True))
    shown = rows[:400]
    for r in shown:
        out.append(
            f"<tr><td>{e(r['rank'])}</td><td>{e('whole trace' if r['step'] is None else r['step'])}</td><td>{_ms(r['step_ms'])}</td>"
            f"<td class=bar>{_stacked(r, scale)}</td><td>{_ms(r['compute_ms'])}</td><td>{_ms(r['exposed_comm_ms'])}</td>"
            f"<td>{_num(r['comm_comp_overlap_pct'], 0)}</td><td>{_ms(r['wait_ms'])}</td><td>{_ms(r['idle_ms'])}</td>"
            f"<td>{_ms(r['host_ms'] + r['other_ms'])}</td><td>{e(r['kernels'])}</td></tr>"
        )
    out.append("</tbody></table>")
    if len(rows) > len(shown):
        out.append(f"<p class=note>{len(rows) - len(shown)} more rows not shown; `traceql query RUN \"SELECT * FROM step_metrics\"` lists all.</p>")
    out.append("</section>")
    return "\n".join(out)


def _stacked(r: dict, scale: float, w: int = 260, h: int = 14) -> str:
    x = 0.0
    parts = []
    for key, name, color in PARTS:
        v = float(r.get(key) or 0.0)
        if v <= 0:
            continue
        pw = v / scale * w
        parts.append(f"<rect x='{x:.2f}' y='0' width='{pw:.2f}' height='{h}' fill='{color}'><title>{e(name)}: {v:.2f} ms</title></rect>")
        x += pw
    return f"<svg width='{w}' height='{h}' role=img aria-label='step split'>{''.join(parts)}</svg>"


# ---------------------------------------------------------------------------------------------------- timeline


def _finding_steps(f) -> set:
    s = set()
    if f.step is not None:
        s.add(f.step)
    steps = (f.evidence or {}).get("steps")
    # the collapsed findings' list of steps; some rules' evidence has a count of steps under that name instead
    for x in steps if isinstance(steps, list) else []:
        s.add(x)
    return s


def choose_step(result: CheckResult) -> int | None:
    """The step to draw: the one most findings name among the steps every rank has, else the middle common step."""
    steps = result.run.table("steps")
    if steps.height == 0:
        return None
    ranks = steps["rank"].n_unique()
    common = steps.group_by("step").agg(pl.col("rank").n_unique().alias("n")).filter(pl.col("n") == ranks)["step"].sort().to_list()
    if not common:
        common = steps["step"].unique().sort().to_list()
    votes: dict[int, int] = defaultdict(int)
    for f in result.findings:
        for s in _finding_steps(f):
            if s in common:
                votes[s] += 1
    if votes:
        best = max(votes.values())
        return min(s for s, v in votes.items() if v == best)
    return common[len(common) // 2]


def _timeline(result: CheckResult, step: int | None) -> str:
    run = result.run
    out = ["<section id=timeline>"]
    # a trace that names no rank (amd_trace, triton_example in HTA's tests) has kernels, but no lane to draw them in
    k = run.table("kernels").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null())
    if k.height == 0:
        return "<section id=timeline><h2>Timeline</h2><p class=note>No GPU kernels in this run: no timeline.</p></section>"
    step = step if step is not None else choose_step(result)
    al = aligner(run)
    steps = run.table("steps")
    windows: dict[int, tuple[int, int]] = {}
    if step is not None:
        sw = al(steps.filter((pl.col("step") == step) & pl.col("rank").is_not_null()), ["ts", "end"])
        for r, ts, end in sw.group_by("rank").agg(pl.col("ts").min(), pl.col("end").max()).iter_rows():
            windows[int(r)] = (ts, end)
        k = k.filter(pl.col("step") == step)
        host = run.table("host_ops").filter((pl.col("step") == step) & (pl.col("depth") == 0) & pl.col("ts").is_not_null()
                                            & pl.col("rank").is_not_null())
    else:
        host = run.table("host_ops").filter((pl.col("depth") == 0) & pl.col("ts").is_not_null() & pl.col("rank").is_not_null())
    k = al(k, ["ts", "end"])
    host = al(host, ["ts", "end"])
    for r, ts, end in k.group_by("rank").agg(pl.col("ts").min(), pl.col("end").max()).iter_rows():
        if int(r) not in windows:
            windows[int(r)] = (ts, end)
        else:  # GPU work of a step can run past its host window: widen to show it
            a, b = windows[int(r)]
            windows[int(r)] = (min(a, ts), max(b, end))
    if not windows:
        return "<section id=timeline><h2>Timeline</h2><p class=note>No kernels in the chosen step.</p></section>"
    title = f"Timeline of step {step}" if step is not None else "Timeline of the whole trace"
    out.append(f"<h2>{e(title)} on every rank</h2>")
    if al.aligned:
        base = min(a for a, _ in windows.values())
        span = max(b for _, b in windows.values()) - base
        offs = {r: base for r in windows}
        out.append(f"<p class=note>{e(al.note)}.</p>")
    else:
        offs = {r: a for r, (a, _) in windows.items()}
        span = max(b - a for a, b in windows.values())
        out.append(f"<p class=note>Each rank drawn from its own step start ({e(al.note)}).</p>")
    span = max(span, 1)
    px = (TIMELINE_W - 170) / span
    marks = _marks_by_rank(result, step)
    lane_h, gap = 12, 3
    rows_svg = []
    y = 18
    for rank in sorted(windows):
        kr = k.filter(pl.col("rank") == rank)
        hr = host.filter(pl.col("rank") == rank)
        lanes = []
        if hr.height:
            lanes.append(("host", hr.with_columns(pl.lit("host").alias("kind"))))
        for (dev, stream), g in sorted(kr.group_by(["device", "stream"]), key=lambda t: (t[0][0] if t[0][0] is not None else -1, t[0][1] if t[0][1] is not None else -1)):
            lanes.append((f"gpu{dev} s{stream}", g))
        block_top = y
        rows_svg.append(f"<text x='4' y='{y + 10}' class=rk>rank {e(rank)}</text>")
        for label, g in lanes:
            rows_svg.append(f"<text x='82' y='{y + 10}' class=ln>{e(label)}</text>")
            rows_svg.append(_lane(g, offs[rank], px, 170, y, lane_h))
            y += lane_h + gap
        fs = marks.get(rank, [])
        if fs:
            sev = max(fs, key=lambda f: {"info": 0, "warning": 1, "error": 2}[f.severity]).severity
            tip = "\n".join(f"{f.rule} {f.name}: {f.message}" for f in fs)
            rows_svg.append(
                f"<a href='#f-{e(fs[0].fingerprint)}'><path d='M4 {block_top + 16} l8 0 l-4 8 z' fill='{SEV_COLOR[sev]}' class=mark>"
                f"<title>{e(tip)}</title></path><text x='15' y='{block_top + 24}' class=mk>{len(fs)} finding(s)</text></a>"
            )
            rows_svg.append(f"<rect x='168' y='{block_top - 1}' width='2' height='{y - block_top - gap + 2}' fill='{SEV_COLOR[sev]}'/>")
        y += 8
    axis = _axis(span, px, 170, y)
    height = y + 22
    legend = " ".join(f"<span class=sw style='background:{c}'></span>{e(n)}" for n, c in KIND_COLOR.items())
    out.append(f"<p class=legend>{legend} <span class=sw style='background:{SEV_COLOR['warning']}'></span>finding on this rank and step</p>")
    out.append(f"<div class=scroll><svg width='{TIMELINE_W}' height='{height}' class=timeline role=img aria-label='{e(title)}'>{''.join(rows_svg)}{axis}</svg></div>")
    out.append("</section>")
    return "\n".join(out)


def _lane(g: pl.DataFrame, off: int, px: float, x0: float, y: int, h: int) -> str:
    """Kernels of one lane as rects; neighbours of one kind that meet within a pixel merge into one rect."""
    g = g.sort("ts")
    rects = []
    cur = None  # [x0, x1, kind, n, first_name, busy_ns]
    for ts, end, kind, name in g.select("ts", "end", "kind", "name").iter_rows():
        a = x0 + (ts - off) * px
        b = max(x0 + (end - off) * px, a + 0.5)
        if cur is not None and kind == cur[2] and a <= cur[1] + 1.0:
            cur[1] = max(cur[1], b)
            cur[3] += 1
            cur[5] += end - ts
            continue
        if cur is not None:
            rects.append(cur)
        cur = [a, b, kind, 1, name, end - ts]
    if cur is not None:
        rects.append(cur)
    dropped = 0
    if len(rects) > MAX_LANE_RECTS:  # keep the longest; a note in the lane says how many were left out
        dropped = len(rects) - MAX_LANE_RECTS
        rects = sorted(sorted(rects, key=lambda r: r[1] - r[0], reverse=True)[:MAX_LANE_RECTS], key=lambda r: r[0])
    parts = []
    for a, b, kind, n, name, busy in rects:
        tip = f"{name} ({busy / 1e6:.3f} ms)" if n == 1 else f"{n} {kind} kernels, {busy / 1e6:.3f} ms busy; first: {name}"
        parts.append(
            f"<rect x='{a:.2f}' y='{y}' width='{b - a:.2f}' height='{h}' fill='{KIND_COLOR.get(kind, '#777')}'><title>{e(tip)}</title></rect>"
        )
    if dropped:
        parts.append(f"<text x='{x0}' y='{y + h - 2}' class=ln>{dropped} short blocks not drawn</text>")
    return "".join(parts)


def _axis(span_ns: int, px: float, x0: float, y: int) -> str:
    span_ms = span_ns / 1e6
    raw = span_ms / 8
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    tick = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    parts = [f"<line x1='{x0}' y1='{y}' x2='{x0 + span_ns * px:.1f}' y2='{y}' stroke='#888'/>"]
    t = 0.0
    while t <= span_ms + 1e-9:
        x = x0 + t * 1e6 * px
        parts.append(f"<line x1='{x:.1f}' y1='{y}' x2='{x:.1f}' y2='{y + 4}' stroke='#888'/><text x='{x:.1f}' y='{y + 15}' class=tk text-anchor=middle>{t:g} ms</text>")
        t += tick
    return "".join(parts)


def _marks_by_rank(result: CheckResult, step: int | None) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for f in result.findings:
        fs = _finding_steps(f)
        if step is not None and fs and step not in fs:
            continue
        for r in f.ranks:
            out[r].append(f)
    return out


# ---------------------------------------------------------------------------------------------------- heatmap


def _heatmap(run) -> str:
    out = ["<section id=waits><h2>Collective waits across ranks</h2>"]
    if "collective_instances" not in link.derived_tables() and "collective_instances" not in run.tables:
        out.append("<p class=note>Not available: this version of traceql has no collective_instances table.</p></section>")
        return "\n".join(out)
    try:
        ci = link.ensure(run, "collective_instances")
    except Exception as ex:  # a linking failure loses this section, not the report
        out.append(f"<p class=note>Not available: matching collectives failed ({e(type(ex).__name__)}: {e(ex)}).</p></section>")
        return "\n".join(out)
    need = {"rank", "match_id", "wait_ms"}
    if ci.height == 0 or not need <= set(ci.columns):
        why = "no collective was matched across ranks" if ci.height == 0 else f"collective_instances lacks {sorted(need - set(ci.columns))}"
        out.append(f"<p class=note>Not available: {e(why)}.</p></section>")
        return "\n".join(out)
    ci = ci.filter(pl.col("wait_ms").is_not_null())
    if ci.height == 0:
        out.append("<p class=note>No collective ran on two or more ranks: nothing to compare.</p></section>")
        return "\n".join(out)
    order = ci.group_by("match_id").agg(pl.col("wait_ms").max().alias("_w"), pl.col("arrival").min().alias("_a") if "arrival" in ci.columns else pl.lit(0).alias("_a"))
    total = order.height
    if total > HEAT_MAX_COLS:  # the instances with the largest waits, in time order
        order = order.sort("_w", descending=True).head(HEAT_MAX_COLS)
    order = order.sort(["_a", "match_id"])
    ids = order["match_id"].to_list()
    col = {m: i for i, m in enumerate(ids)}
    ranks = sorted(ci["rank"].unique().to_list())
    vmax = float(ci["wait_ms"].max() or 0.0) or 1.0
    cw, ch, x0, y0 = max(4, min(18, 900 // max(len(ids), 1))), 16, 70, 6
    cells = []
    sub = ci.filter(pl.col("match_id").is_in(ids))
    for row in sub.iter_rows(named=True):
        i, j = col[row["match_id"]], ranks.index(row["rank"])
        w = float(row["wait_ms"])
        t = min(w / vmax, 1.0)
        fill = f"rgb(255,{int(255 - 200 * t)},{int(255 - 230 * t)})"
        tip = f"rank {row['rank']}: waited {w:.3f} ms in {row.get('op') or 'collective'} seq {row.get('seq')} ({row.get('pg') or row.get('group') or ''}); step {row.get('step')}; last to arrive: rank {row.get('last_arriver')}"
        stroke = " stroke='#000' stroke-width='1'" if row.get("is_last") else ""
        cells.append(f"<rect x='{x0 + i * cw}' y='{y0 + j * ch}' width='{cw - 1}' height='{ch - 1}' fill='{fill}'{stroke}><title>{e(tip)}</title></rect>")
    labels = "".join(f"<text x='4' y='{y0 + j * ch + 12}' class=rk>rank {e(r)}</text>" for j, r in enumerate(ranks))
    w, h = x0 + len(ids) * cw + 10, y0 + len(ranks) * ch + 10
    out.append(
        f"<p class=note>Each column is one collective matched across ranks (group and sequence number); the colour is how long "
        f"the rank waited for the last arriver (white 0, red {vmax:.2f} ms); a black border marks the last arriver."
        + (f" The {HEAT_MAX_COLS} of {total} with the longest waits are shown." if total > HEAT_MAX_COLS else "")
        + "</p>"
    )
    out.append(f"<div class=scroll><svg width='{w}' height='{h}' class=heat role=img aria-label='collective wait heatmap'>{labels}{''.join(cells)}</svg></div>")
    # who made the others wait, from the facts TQL302 reads: calls matched on two or more ranks, and per waiting rank
    # the union of its waits (collective_waits), so collectives in flight together count once
    m = link.ensure(run, "collective_instances").filter((pl.col("n_ranks") >= 2) & pl.col("wait_ms").is_not_null())
    ss = m.group_by("rank").agg(pl.len().alias("n_collectives"), pl.col("is_last").sum().alias("n_last"),
                                pl.col("step").fill_null(-1).n_unique().alias("_steps"))
    caused = link.ensure(run, "collective_waits").group_by("waited_for").agg(
        pl.col("wait_ms").sum().alias("wait_caused_ms"), pl.col("rank").n_unique().alias("_waiters"))
    ss = (ss.join(caused.rename({"waited_for": "rank"}), on="rank", how="left")
          .join(link.ensure(run, "clock_error"), on="rank", how="left").filter(pl.col("n_last") > 0)
          .with_columns(pl.col("wait_caused_ms").fill_null(0.0))
          .with_columns((pl.col("wait_caused_ms") / pl.col("_waiters") / pl.col("_steps")).fill_null(0.0).alias("wait_caused_per_step_ms")))
    if ss.height:
        out.append("<table class=grid><thead><tr><th>rank</th><th>arrived last</th><th>wait it caused (ms, total)</th>"
                   "<th>per other rank and step (ms)</th><th>clock error (ms)</th></tr></thead><tbody>")
        for r in ss.sort("wait_caused_ms", descending=True).iter_rows(named=True):
            out.append(f"<tr><td>{e(r['rank'])}</td><td>{e(r['n_last'])} of {e(r['n_collectives'])}</td><td>{_ms(r['wait_caused_ms'])}</td>"
                       f"<td>{_ms(r['wait_caused_per_step_ms'])}</td><td>{_num(r['clock_error_ms'], 3)}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------- findings


def _findings(result: CheckResult, root: Path) -> str:
    out = ["<section id=findings><h2>Findings</h2>"]
    rules = {r.rule.id: r.rule for r in result.results}
    if not result.findings:
        # the text report's sentence: "No findings" only where every rule ran, else what did not run
        from rich.text import Text

        from traceql.report.text import _no_findings

        ran = sum(1 for r in result.results if r.status == "ran")
        errored = sum(1 for r in result.results if r.status == "error")
        sentence = Text.from_markup(_no_findings(ran, len(result.results) - ran - errored, errored,
                                                 bool(result.run.ranks))).plain
        clean = sentence.startswith("No findings")
        out.append(f"<p class={'ok' if clean else 'warn'}>{_html.escape(sentence)}</p>")
    by_rule: dict[str, list] = defaultdict(list)
    for f in result.findings:
        by_rule[f.rule].append(f)
    for rid, fs in by_rule.items():
        rule = rules.get(rid)
        f0 = fs[0]
        out.append(f"<div class=rule><h3><span class='sev {e(f0.severity)}'>{e(f0.severity)}</span> {e(rid)} {e(f0.name)} ({len(fs)})</h3>")
        if rule is not None:
            d = rule.docs or {}
            out.append(f"<p>{e(rule.summary)}</p><details><summary>Why it matters and how to fix it</summary>")
            out.append(f"<h4>Why it matters</h4><p>{e(_squash(d.get('why')))}</p><h4>How to fix it</h4><p>{e(_squash(d.get('fix')))}</p>")
            refs = d.get("references") or []
            if refs:
                out.append("<h4>References</h4><ul>" + "".join(f"<li>{_ref(x)}</li>" for x in refs) + "</ul>")
            out.append("</details>")
        for f in fs:
            out.append(f"<div class=finding id='f-{e(f.fingerprint)}'><p class=msg>{e(f.message)}</p>")
            meta = [f"ranks {e(_ranges(f.ranks))}" if f.ranks else "whole run"]
            if f.step is not None:
                meta.append(f"step {e(f.step)}")
            meta.append(f"fingerprint <code>{e(f.fingerprint)}</code>")
            out.append(f"<p class=meta>{' · '.join(meta)}</p>")
            if f.evidence:
                out.append("<table class=kv>" + "".join(f"<tr><th>{e(k)}</th><td>{e(_fmt(v))}</td></tr>" for k, v in f.evidence.items()) + "</table>")
            if f.sources:
                rel = []
                for p in f.sources:
                    try:
                        rel.append(str(Path(p).relative_to(root)))
                    except ValueError:
                        rel.append(Path(p).name)
                out.append(f"<p class=meta>from {e(', '.join(rel))}</p>")
            out.append("</div>")
        out.append("</div>")
    skipped = [r for r in result.results if r.status != "ran"]
    if skipped:
        out.append(f"<details><summary>{len(skipped)} rule(s) did not run</summary><ul>")
        out += [f"<li>{e(r.rule.id)} {e(r.rule.name)}: {e(r.status)}: {e(r.reason)}</li>" for r in skipped]
        out.append("</ul></details>")
    out.append("</section>")
    return "\n".join(out)


def _ref(x) -> str:
    s = str(x)
    url = s.split()[0] if s.startswith(("https://", "http://")) else None
    if url:
        return f"<a href='{e(url)}' rel='noreferrer noopener'>{e(s)}</a>"
    return e(s)


# ---------------------------------------------------------------------------------------------------- helpers


def _squash(v) -> str:
    return " ".join(str(v).split()) if v else ""


def _ms(v) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def _num(v, nd=2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{float(v):.{nd}f}"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v[:50]) + (" ..." if len(v) > 50 else "")
    return str(v)


def _ranges(ranks) -> str:
    return format_ranks(ranks)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h1 .dim{font-weight:normal;color:#666;font-size:14px}h2{margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 8px;text-align:left;vertical-align:top}
table.grid td,table.grid th{border-bottom:1px solid #eee}table.grid th{background:#f6f6f6}
table.kv th{color:#555;font-weight:600;padding-right:16px}
.sev{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:12px}
.sev.error{background:#c0392b}.sev.warning{background:#d68910}.sev.info{background:#2e86c1}
.st-error td{color:#c0392b}.st-skipped td{color:#888}.st-partial td{color:#b9770e}
.note{color:#555}.ok{color:#1e8449}.warn{color:#b9770e}.notes{color:#555}
.sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.scroll{overflow-x:auto}svg text{font:11px system-ui,sans-serif;fill:#333}svg text.rk{font-weight:600}
svg text.ln{fill:#666;font-size:10px}svg text.tk{fill:#666;font-size:10px}svg text.mk{font-size:10px;fill:#a04000}
td.bar{padding:2px 8px}
.rule{margin:16px 0;padding:8px 12px;border-left:4px solid #ddd}.finding{margin:8px 0 8px 8px;padding:6px 10px;background:#fafafa}
.finding:target{outline:2px solid #d68910}.msg{margin:0 0 4px 0}.meta{color:#666;font-size:12px;margin:2px 0}
code{font-size:12px}footer{margin-top:40px;color:#888;font-size:12px}
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<nav><a href="#overview">run</a> · <a href="#breakdown">breakdown</a> · <a href="#timeline">timeline</a> · <a href="#waits">collective waits</a> · <a href="#findings">findings</a></nav>
{body}
<footer>traceql {version}. Self-contained: this page loads nothing from the network.</footer>
</body>
</html>
"""
