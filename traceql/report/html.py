"""`traceql check --format html`: one self-contained page for people. Nothing is fetched; one inline script, allowed
by its hash (html_assets.SCRIPT_CSP), draws the timeline.

Sections: run overview (ranks, steps, sources); every step's time per rank and where it went (step_metrics, the
numbers `summary` and `diff` show); a zoomable timeline of every rank (html_timeline: lanes per host thread and GPU
stream, a step selector, collectives linked across ranks, findings at their evidence); collective waits
(collective_instances); top kernels by time, total and per rank; torch.compile (html_compile); the findings by
severity, costliest first, consequences under their cause, each with a link that zooms the timeline to its evidence.
Every string that came from an input goes through html.escape, or travels as JSON that the script writes with
textContent: kernel names, file names, messages and evidence are data, never markup. Everything that can grow with
the input (rows, events, names, ranks) is capped, and the page says what was cut.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import orjson
import polars as pl

from traceql import __version__, link
from traceql.model.finding import SEVERITY_ORDER
from traceql.model.ranks import format_ranks
from traceql.model.result import CheckResult
from traceql.report.html_assets import CSS, SCRIPT, SCRIPT_CSP, cut, e
from traceql.report.html_compile import compile_section
from traceql.report.html_timeline import timeline_data

HEAT_MAX_COLS = 160
MAX_STEP_ROWS = 2_000  # rows of the per-step breakdown (rank x step)
MAX_MATRIX_STEPS = 500  # rows of the step-time-per-rank matrix
MAX_MATRIX_RANKS = 64
TOP_KERNELS = 25
TOP_KERNELS_PER_RANK = 8
MAX_KERNEL_RANKS = 16
MAX_FINDINGS = 1_000
SEV_COLOR = {"error": "#c0392b", "warning": "#d68910", "info": "#2e86c1"}
PARTS = [
    ("compute_ms", "compute", "#4e79a7"),
    ("exposed_comm_ms", "exposed communication", "#e15759"),
    ("copy_ms", "copies only", "#f28e2b"),
    ("idle_part_ms", "GPU idle", "#d0d0d0"),
    ("host_ms", "host (no GPU work)", "#9c9c9c"),
    ("other_ms", "other host time (communication on the host)", "#bab0ac"),
]


def render(result: CheckResult, step: int | None = None) -> str:
    """The page. `step` is the step the timeline opens on (default: the one most findings name)."""
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    body = [
        _overview(result, root),
        _step_matrix(run),
        _breakdown(run),
        _timeline(result, step),
        _heatmap(run),
        _top_kernels(run),
        compile_section(result),
        _findings(result, root),
    ]
    title = f"traceql: {run.path.name}"
    return _PAGE.format(title=e(title), css=CSS, body="\n".join(body), version=e(__version__), csp=SCRIPT_CSP, script=SCRIPT)


def _json_for_script(data) -> str:
    """JSON safe inside <script type=application/json>: no '<', '>' or '&' that could end the element or start
    markup, and no line separators that older parsers treat as newlines."""
    s = orjson.dumps(data).decode()
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


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


def _step_matrix(run) -> str:
    """Every step's time on every rank (step_metrics.step_ms), the slowest rank of each step marked: where a
    straggler or a slow step shows at a glance. A step links to the timeline at that step."""
    sm = link.ensure(run, "step_metrics")
    out = ["<section id=steps><h2>Every step, per rank</h2>"]
    sm = sm.filter(pl.col("step").is_not_null() & pl.col("rank").is_not_null())
    if sm.height == 0:
        out.append("<p class=note>No profiler steps in this run: the breakdown below covers the whole trace.</p></section>")
        return "\n".join(out)
    ranks = sorted(sm["rank"].unique().to_list())
    steps = sorted(sm["step"].unique().to_list())
    shown_r, shown_s = ranks[:MAX_MATRIX_RANKS], steps[:MAX_MATRIX_STEPS]
    val = {(r, s): (ms, ex, ov, idle) for r, s, ms, ex, ov, idle in
           sm.select("rank", "step", "step_ms", "exposed_comm_ms", "comm_comp_overlap_pct", "gpu_idle_ms").iter_rows()}
    out.append("<p class=note>Step time in ms (step_metrics, the numbers `traceql summary` takes medians of); under it exposed "
               "communication / overlap % / GPU idle. Red: the slowest rank of the step, where it is 5% or more above the "
               "step's median. Click a step to open it on the timeline.</p>")
    out.append("<div class=scroll><table class=grid><thead><tr><th>step</th>" + "".join(f"<th class=num>rank {e(r)}</th>" for r in shown_r)
               + "<th class=num>median</th><th class=num>max / median</th></tr></thead><tbody>")
    for s in shown_s:
        vals = [val[(r, s)][0] for r in shown_r if (r, s) in val and val[(r, s)][0] is not None]
        med = statistics.median(vals) if vals else None
        worst = max(vals) if vals else None
        cells = []
        for r in shown_r:
            v = val.get((r, s))
            if v is None or v[0] is None:
                cells.append("<td class=num>-</td>")
                continue
            hot = len(vals) > 1 and v[0] == worst and med and worst >= 1.05 * med
            cells.append(f"<td class='num{' hot' if hot else ''}'>{v[0]:.2f}<br><span class=note>{_ms(v[1])} / {_num(v[2], 0)}% / {_ms(v[3])}</span></td>")
        ratio = "-" if not med else f"{worst / med:.2f}"
        out.append(f"<tr><td><a href='#timeline' class=go-step data-step='{e(s)}'>step {e(s)}</a></td>{''.join(cells)}"
                   f"<td class=num>{_ms(med)}</td><td class=num>{ratio}</td></tr>")
    out.append("</tbody></table></div>")
    if len(steps) > len(shown_s) or len(ranks) > len(shown_r):
        out.append(f"<p class=cut>{len(steps) - len(shown_s):,} more step(s) and {len(ranks) - len(shown_r):,} more rank(s) not shown; "
                   "`traceql query RUN \"SELECT * FROM step_metrics\"` lists all.</p>")
    out.append("</section>")
    return "\n".join(out)


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
    shown = rows[:MAX_STEP_ROWS]
    for r in shown:
        out.append(
            f"<tr><td>{e(r['rank'])}</td><td>{e('whole trace' if r['step'] is None else r['step'])}</td><td>{_ms(r['step_ms'])}</td>"
            f"<td class=bar>{_stacked(r, scale)}</td><td>{_ms(r['compute_ms'])}</td><td>{_ms(r['exposed_comm_ms'])}</td>"
            f"<td>{_num(r['comm_comp_overlap_pct'], 0)}</td><td>{_ms(r['wait_ms'])}</td><td>{_ms(r['idle_ms'])}</td>"
            f"<td>{_ms(r['host_ms'] + r['other_ms'])}</td><td>{e(r['kernels'])}</td></tr>"
        )
    out.append("</tbody></table>")
    if len(rows) > len(shown):
        out.append(f"<p class=cut>{len(rows) - len(shown):,} more rows not shown; `traceql query RUN \"SELECT * FROM step_metrics\"` lists all.</p>")
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
    data = timeline_data(result)
    if not data["lanes"]:
        return "<section id=timeline><h2>Timeline</h2><p class=note>No GPU kernels or host ops with a rank in this run: no timeline.</p></section>"
    step = step if step is not None else choose_step(result)
    data["initial"] = step if any(s["step"] == step for s in data["steps"]) else None
    legend = " ".join(f"<span class=sw style='background:{c}'></span>{e(n)}" for n, c in
                      (("compute", "#4e79a7"), ("communication", "#e15759"), ("memcpy", "#f28e2b"), ("memset", "#edc948"),
                       ("host op", "#a8a8a8"), ("wait in a collective", "rgba(125,60,152,0.45)")))
    clock = ("Ranks on one clock: " + data["note"]) if data["aligned"] else ("Each rank drawn from its own first event: " + data["note"])
    cut = "".join(f"<li>{e(c)}</li>" for c in data["cut"])
    return (
        "<section id=timeline><h2>Timeline of every rank</h2>"
        f"<p class=note>{e(clock)}. Lanes: each rank's busiest host threads (top-level ops) and one lane per GPU stream. "
        "A black tick is a rank's arrival at a collective matched across ranks (dark red: the last to arrive), joined by a line "
        "across the ranks; the purple shade is the time a rank waited for the last one. Triangles are findings at their evidence. "
        "Wheel or w/s to zoom, drag or a/d to pan, shift+wheel to scroll, double-click to reset.</p>"
        f"<p class=legend>{legend}</p>"
        + (f"<ul class=cut>{cut}</ul>" if cut else "")
        + "<div class=tl-bar><label>step <select id=tl-step><option value=all>all steps</option></select></label>"
        "<button id=tl-in type=button>zoom in</button><button id=tl-out type=button>zoom out</button>"
        "<button id=tl-reset type=button>reset</button><label><input id=tl-links type=checkbox checked> collective links</label>"
        "<span id=tl-range class=note></span></div>"
        "<div id=tl class=tl><canvas id=tl-canvas tabindex=0 role=img aria-label='timeline of every rank'></canvas>"
        "<div id=tl-tip class=tip hidden></div></div>"
        "<noscript><p class=warn>The timeline needs JavaScript; every number on it is also in the tables.</p></noscript>"
        f"<script type=application/json id=tl-data>{_json_for_script(data)}</script>"
        "</section>"
    )


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


# ---------------------------------------------------------------------------------------------------- kernels


def _top_kernels(run) -> str:
    """Kernels by total GPU time: over all ranks, then per rank. Names are cut at 160 characters; the tables are
    bounded however many distinct names a run has."""
    k = run.table("kernels").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    out = ["<section id=kernels><h2>Top kernels by time</h2>"]
    if k.height == 0:
        out.append("<p class=note>No GPU kernels in this run.</p></section>")
        return "\n".join(out)
    k = k.with_columns(((pl.col("end") - pl.col("ts")) / 1e6).alias("_ms"))
    total_ms = float(k["_ms"].sum()) or 1.0
    n_names = k["name"].n_unique()
    # sums first, the rest only for the top names: a run with a million distinct names stays cheap
    g = k.group_by("name").agg(pl.col("_ms").sum().alias("ms")).top_k(TOP_KERNELS, by="ms")
    g = (k.join(g.select("name"), on="name", how="semi").group_by("name")
         .agg(pl.col("_ms").sum().alias("ms"), pl.len().alias("n"), pl.col("kind").first(), pl.col("rank").n_unique().alias("ranks"))
         .sort(["ms", "name"], descending=[True, False], nulls_last=True))
    out.append(f"<p class=note>{k.height:,} kernels, {n_names:,} distinct names, {total_ms:.2f} ms of GPU time over all ranks; "
               f"the {min(TOP_KERNELS, n_names)} with the most time:</p>")
    out.append("<table class=grid><thead><tr><th>kernel</th><th>kind</th><th class=num>total ms</th><th class=num>share</th>"
               "<th class=num>calls</th><th class=num>mean us</th><th class=num>ranks</th></tr></thead><tbody>")
    for r in g.iter_rows(named=True):
        out.append(f"<tr><td class=mono title='{e(cut(r['name'], 2000))}'>{e(cut(r['name']))}</td><td>{e(r['kind'])}</td>"
                   f"<td class=num>{r['ms']:.2f}</td><td class=num>{100 * r['ms'] / total_ms:.1f}%</td><td class=num>{r['n']:,}</td>"
                   f"<td class=num>{1000 * r['ms'] / max(r['n'], 1):.1f}</td><td class=num>{r['ranks']}</td></tr>")
    out.append("</tbody></table>")
    k = k.filter(pl.col("rank").is_not_null())
    ranks = sorted(k["rank"].unique().to_list())
    shown = ranks[:MAX_KERNEL_RANKS]
    if shown:
        per = (k.filter(pl.col("rank").is_in(shown)).group_by("rank", "name").agg(pl.col("_ms").sum().alias("ms"), pl.len().alias("n"))
               .with_columns((100 * pl.col("ms") / pl.col("ms").sum().over("rank")).alias("pct"))
               .filter(pl.col("ms").rank("ordinal", descending=True).over("rank") <= TOP_KERNELS_PER_RANK)
               .sort(["rank", "ms", "name"], descending=[False, True, False], nulls_last=True))
        out.append(f"<h3>Per rank (top {TOP_KERNELS_PER_RANK})</h3><table class=grid><thead><tr><th>rank</th><th>kernel</th>"
                   "<th class=num>ms</th><th class=num>share of the rank</th><th class=num>calls</th></tr></thead><tbody>")
        for r in per.iter_rows(named=True):
            out.append(f"<tr><td>{e(r['rank'])}</td><td class=mono title='{e(cut(r['name'], 2000))}'>{e(cut(r['name']))}</td>"
                       f"<td class=num>{r['ms']:.2f}</td><td class=num>{r['pct']:.1f}%</td><td class=num>{r['n']:,}</td></tr>")
        out.append("</tbody></table>")
        if len(ranks) > len(shown):
            out.append(f"<p class=cut>{len(ranks) - len(shown)} more rank(s) not shown per rank.</p>")
    out.append("</section>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------- findings


def _findings(result: CheckResult, root: Path) -> str:
    """By severity, the costliest rule first; a finding whose cause is another finding (caused_by) sits under it."""
    out = ["<section id=findings><h2>Findings</h2>"]
    rules = {r.rule.id: r.rule for r in result.results}
    if not result.findings:
        # the text report's sentence: "No findings" only where every rule ran, else what did not run
        from traceql.report.text import _no_findings, plain

        ran = sum(1 for r in result.results if r.status == "ran")
        errored = sum(1 for r in result.results if r.status == "error")
        sentence = plain(_no_findings(ran, len(result.results) - ran - errored, errored, bool(result.run.ranks)))
        clean = sentence.startswith("No findings")
        out.append(f"<p class={'ok' if clean else 'warn'}>{e(sentence)}</p>")
    findings = result.findings[:MAX_FINDINGS]
    if len(result.findings) > MAX_FINDINGS:
        out.append(f"<p class=cut>{len(result.findings) - MAX_FINDINGS:,} more findings not shown; `--format json` lists all.</p>")
    by_fp = {f.fingerprint: f for f in findings}
    children: dict[str, list] = defaultdict(list)
    top = []
    for f in findings:
        cause = f.caused_by
        if cause and cause in by_fp and cause != f.fingerprint and not _is_cycle(f, by_fp):
            children[cause].append(f)
        else:
            top.append(f)

    def cost(f) -> float:
        return -1.0 if f.cost_ms_per_step is None else float(f.cost_ms_per_step)

    for sev in sorted({f.severity for f in top}, key=lambda s: -SEVERITY_ORDER[s]):
        by_rule: dict[str, list] = defaultdict(list)
        for f in top:
            if f.severity == sev:
                by_rule[f.rule].append(f)
        n = sum(len(v) for v in by_rule.values())
        out.append(f"<h3 class=sevhead><span class='sev {e(sev)}'>{e(sev)}</span> {n} finding(s)</h3>")
        for rid, fs in sorted(by_rule.items(), key=lambda kv: (-max(cost(f) for f in kv[1]), kv[0])):
            rule = rules.get(rid)
            f0 = fs[0]
            out.append(f"<div class='rule {e(sev)}'><h3>{e(rid)} {e(f0.name)} ({len(fs)})</h3>")
            if rule is not None:
                d = rule.docs or {}
                out.append(f"<p>{e(rule.summary)}</p><details><summary>Why it matters and how to fix it</summary>")
                out.append(f"<h4>Why it matters</h4><p>{e(_squash(d.get('why')))}</p><h4>How to fix it</h4><p>{e(_squash(d.get('fix')))}</p>")
                refs = d.get("references") or []
                if refs:
                    out.append("<h4>References</h4><ul>" + "".join(f"<li>{_ref(x)}</li>" for x in refs) + "</ul>")
                out.append("</details>")
            for f in sorted(fs, key=lambda f: -cost(f)):
                out.append(_finding(f, root, children, set()))
            out.append("</div>")
    skipped = [r for r in result.results if r.status != "ran"]
    if skipped:
        out.append(f"<details><summary>{len(skipped)} rule(s) did not run</summary><ul>")
        out += [f"<li>{e(r.rule.id)} {e(r.rule.name)}: {e(r.status)}: {e(r.reason)}</li>" for r in skipped]
        out.append("</ul></details>")
    out.append("</section>")
    return "\n".join(out)


def _is_cycle(f, by_fp: dict) -> bool:
    """True where following caused_by from f comes back to f: such findings stay at the top level."""
    seen, cur = {f.fingerprint}, f.caused_by
    while cur in by_fp:
        if cur in seen:
            return True
        seen.add(cur)
        cur = by_fp[cur].caused_by
    return False


def _finding(f, root: Path, children: dict, seen: set) -> str:
    seen = seen | {f.fingerprint}
    out = [f"<div class=finding id='f-{e(f.fingerprint)}'><p class=msg>"
           + (f"<span class='sev {e(f.severity)}'>{e(f.severity)}</span> {e(f.rule)} " if seen and len(seen) > 1 else "")
           + f"{e(f.message)}</p>"]
    if f.cost_ms_per_step is not None or f.cost_pct is not None:
        parts = []
        if f.cost_ms_per_step is not None:
            parts.append(f"{float(f.cost_ms_per_step):.2f} ms per step")
        if f.cost_pct is not None:
            parts.append(f"{float(f.cost_pct):.1f}% of the step time")
        out.append(f"<p class=cost>costs {e(', '.join(parts))} (what the run would save without it)</p>")
    meta = [f"ranks {e(format_ranks(f.ranks))}" if f.ranks else "whole run"]
    if f.step is not None:
        meta.append(f"step {e(f.step)}")
    meta.append(f"fingerprint <code>{e(f.fingerprint)}</code>")
    meta.append(f"<a href='#timeline' class=show-tl data-fp='{e(f.fingerprint)}'>show on the timeline</a>")
    out.append(f"<p class=meta>{' · '.join(meta)}</p>")
    if f.evidence:
        out.append("<div class=ev>" + "".join(f"<span><b>{e(k)}</b> {e(_fmt(v))}</span>" for k, v in f.evidence.items()) + "</div>")
    if f.sources:
        rel = []
        for p in f.sources:
            try:
                rel.append(str(Path(p).relative_to(root)))
            except ValueError:
                rel.append(Path(p).name)
        out.append(f"<p class=meta>from {e(', '.join(rel))}</p>")
    kids = [c for c in children.get(f.fingerprint, []) if c.fingerprint not in seen]
    if kids:
        out.append(f"<p class=caused>{len(kids)} consequence(s) of this finding:</p>")
        out += [_finding(c, root, children, seen) for c in kids]
    out.append("</div>")
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


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src {csp}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<nav><a href="#overview">run</a> · <a href="#steps">steps</a> · <a href="#breakdown">breakdown</a> · <a href="#timeline">timeline</a> · <a href="#waits">collective waits</a> · <a href="#kernels">kernels</a> · <a href="#compile">torch.compile</a> · <a href="#findings">findings</a></nav>
{body}
<footer>traceql {version}. Self-contained: this page loads nothing from the network.</footer>
<script>{script}</script>
</body>
</html>
"""
