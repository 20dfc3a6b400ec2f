"""The HTML report's torch.compile section: compile time per rank, every compile id, graph breaks with reasons and
user frames, recompiles with their guards, FX graph cache keys per rank with the ranks that differ highlighted,
and compile failures. It reads compile_events and link's compile tables (compile_time, compile_frames,
graph_break_cost, compile_cache_divergence, compile_rank_divergence, compile_failures) through link.ensure;
a table this version lacks loses its part of the section, not the report."""

from __future__ import annotations

import statistics
from collections import Counter

import polars as pl

from traceql import link
from traceql.model.ranks import format_ranks
from traceql.model.result import CheckResult
from traceql.report.html_assets import e as _e

MAX_ROWS = 300  # per table; the rest is counted
MAX_KEY_RANKS = 32  # rank columns in the cache-key table


# The compile rules' numbers live in their YAML (rules/TQL40x): the section shows the rules' own rows for them
_RULE_ROWS = {"compile_time": "TQL405", "graph_break_cost": "TQL402", "compile_frames": "TQL401",
              "compile_failures": "TQL406"}


def _table(run, name: str, rules: dict | None = None) -> pl.DataFrame | None:
    """A link table, or for the compile rules' numbers the rule's own rows: the rule as this check ran it (its pack,
    --rules included), else the bundled one."""
    if name in _RULE_ROWS:
        from traceql.rules.engine import rows
        from traceql.rules.loader import load_rules

        rule = (rules or {}).get(_RULE_ROWS[name]) or next((r for r in load_rules() if r.id == _RULE_ROWS[name]), None)
        try:
            return None if rule is None else rows(run, rule)
        except Exception:  # one compile table failing loses its part, not the section
            return None
    if name not in link.derived_tables() and name not in run.tables:
        return None
    try:
        return link.ensure(run, name)
    except Exception:  # one compile table failing loses its part, not the section
        return None


def _more(n: int, shown: int, what: str) -> str:
    return f"<p class=cut>{n - shown:,} more {what} not shown; `traceql query RUN` lists all.</p>" if n > shown else ""


def compile_section(result: CheckResult) -> str:
    run = result.run
    rules = {r.rule.id: r.rule for r in result.results}
    ce = run.table("compile_events")
    out = ["<section id=compile><h2>torch.compile</h2>"]
    if ce.height == 0:
        out.append("<p class=note>No torch.compile record in this run (no TORCH_TRACE, TORCH_COMPILE_DEBUG or TORCH_LOGS "
                   "source): nothing compiled, or it was not logged. Set TORCH_TRACE=DIR on every rank to record it.</p></section>")
        return "\n".join(out)
    kinds = Counter(ce["kind"].to_list())
    out.append(_per_rank(run, ce, rules))
    out.append(_compile_ids(ce))
    out.append(_graph_breaks(run, ce, kinds, rules))
    out.append(_recompiles(run, ce, kinds, rules))
    out.append(_cache_keys(run, ce, result.findings))
    out.append(_failures(run, rules))
    out.append("</section>")
    return "\n".join(out)


def _per_rank(run, ce: pl.DataFrame, rules: dict) -> str:
    counts = (ce.filter(pl.col("rank").is_not_null()).group_by("rank").agg(
        *[(pl.col("kind") == k).sum().alias(k) for k in ("recompile", "cache_hit", "cache_miss", "cache_bypass", "cache_limit")],
        pl.col("compile_id").drop_nulls().n_unique().alias("ids")).sort("rank"))
    breaks = _breaks(ce.filter(pl.col("kind") == "graph_break")).group_by("rank").agg(pl.len().alias("graph_break"))
    counts = counts.join(breaks, on="rank", how="left").with_columns(pl.col("graph_break").fill_null(0))
    ct = _table(run, "compile_time", rules)
    times = {r["rank"]: r for r in ct.iter_rows(named=True)} if ct is not None else {}
    med = None
    if times:
        med = statistics.median(float(r["compile_s"] or 0) for r in times.values())
    out = [("<h3>Per rank</h3><table class=grid><thead><tr><th>rank</th><th class=num>compile time (s)</th><th class=num>share of run</th>"
            "<th class=num>compile ids</th><th class=num>graph breaks</th><th class=num>recompiles</th><th class=num>cache hit / miss / bypass</th>"
            "<th>note</th></tr></thead><tbody>")]
    for r in counts.iter_rows(named=True):
        t = times.get(r["rank"])
        cs = None if t is None else t["compile_s"]
        hot = " hot" if (cs is not None and med and len(times) > 1 and abs(cs - med) > max(0.2 * med, 1.0)) else ""
        share = "-" if t is None or t["share_pct"] is None else f"{t['share_pct']:.0f}%"
        note = [] if t is None else [t["steps_note"] or ""]
        if r["cache_limit"]:
            note.append("hit the recompile limit: fell back to eager")
        out.append(
            f"<tr><td>{_e(r['rank'])}</td><td class='num{hot}'>{'-' if cs is None else f'{cs:.2f}'}</td><td class=num>{_e(share)}</td>"
            f"<td class=num>{r['ids']}</td><td class=num>{r['graph_break']}</td><td class=num>{r['recompile']}</td>"
            f"<td class=num>{r['cache_hit']} / {r['cache_miss']} / {r['cache_bypass']}</td><td>{_e('; '.join(n for n in note if n))}</td></tr>")
    out.append("</tbody></table>")
    if med and len(times) > 1:
        out.append("<p class=note>A red cell: that rank's compile time differs from the ranks' median by more than 20% (and 1 s); "
                   "the others wait for it at the first collective.</p>")
    return "\n".join(out)


def _compile_ids(ce: pl.DataFrame) -> str:
    """One row per compile id (frame/attempt), as tlparse's index lists them, across ranks."""
    c = ce.filter(pl.col("compile_id").is_not_null())
    if c.height == 0:
        return ""
    # the frame's own function and place: the compile record's, before a graph break's (which names its caller)
    c = c.sort(pl.col("kind") != "compile", "ts", nulls_last=True)
    g = c.group_by("compile_id").agg(
        pl.col("function").drop_nulls().first(),
        pl.format("{}:{}", pl.col("filename"), pl.col("line")).drop_nulls().first().alias("location"),
        pl.col("rank").drop_nulls().unique().sort().alias("ranks"),
        pl.col("dur").filter(pl.col("kind") == "compile").sum().alias("_dur"),
        (pl.col("kind") == "graph_op").sum().alias("ops"),
        (pl.col("kind") == "cache_hit").sum().alias("hits"),
        (pl.col("kind") == "cache_miss").sum().alias("misses"),
        pl.col("reason").filter(pl.col("kind") == "recompile").drop_nulls().first().alias("recompile_reason"),
        pl.col("frame_id").first(), pl.col("attempt").first(),
    ).sort(["frame_id", "attempt"], nulls_last=True)
    breaks = _breaks(ce.filter(pl.col("kind") == "graph_break")).group_by("compile_id").agg(pl.len().alias("breaks"))
    g = g.join(breaks, on="compile_id", how="left").with_columns(pl.col("breaks").fill_null(0))
    n = g.height
    out = [("<h3>Compile ids</h3><p class=note>Each frame torch.compile traced (frame/attempt; an attempt above 0 is a recompile), "
            "on the ranks that logged it. Compile time and graph breaks are summed over those ranks.</p>"),
           ("<table class=grid><thead><tr><th>compile id</th><th>function</th><th>location</th><th>ranks</th><th class=num>compile (s)</th>"
            "<th class=num>graph breaks</th><th class=num>graph ops</th><th class=num>cache hit / miss</th><th>recompiled because</th></tr></thead><tbody>")]
    for r in g.head(MAX_ROWS).iter_rows(named=True):
        out.append(f"<tr><td>{_e(r['compile_id'])}</td><td>{_e(r['function'])}</td><td class=mono>{_e(r['location'])}</td>"
                   f"<td>{_e(format_ranks(r['ranks']))}</td><td class=num>{(r['_dur'] or 0) / 1e9:.2f}</td><td class=num>{r['breaks']}</td>"
                   f"<td class=num>{r['ops']}</td><td class=num>{r['hits']} / {r['misses']}</td><td class='mono pre'>{_e(r['recompile_reason'])}</td></tr>")
    out.append("</tbody></table>" + _more(n, min(n, MAX_ROWS), "compile ids"))
    return "\n".join(out)


def _graph_breaks(run, ce: pl.DataFrame, kinds: Counter, rules: dict) -> str:
    gb = ce.filter(pl.col("kind") == "graph_break")
    out = ["<h3 id=graph-breaks>Graph breaks</h3>"]
    if gb.height == 0:
        out.append("<p class=note>No graph break recorded.</p>")
        return "\n".join(out)
    cost = _table(run, "graph_break_cost", rules)
    g = (_breaks(gb).group_by("compile_id", "reason", "user_frame")
         .agg(pl.col("rank").drop_nulls().unique().sort().alias("ranks"), pl.len().alias("n"))
         .join(_frame_functions(ce), on="compile_id", how="left"))
    if cost is not None and cost.height:
        per = cost.group_by("compile_id", "reason").agg(pl.col("ms_per_step").max(), pl.col("calls_per_step").max())
        g = g.join(per, on=["compile_id", "reason"], how="left")
    else:
        g = g.with_columns(pl.lit(None, pl.Float64).alias("ms_per_step"), pl.lit(None, pl.Float64).alias("calls_per_step"))
    g = g.sort(["ms_per_step", "compile_id"], descending=[True, False], nulls_last=True)
    out.append(f"<p class=note>{g.height} distinct graph break(s) (the same compile id, reason and user frame on several ranks, "
               "or read from both TORCH_TRACE and TORCH_LOGS, count once); function is the compiled frame's. Time per step is what the compiled code after the break ran per step (graph_break_cost).</p>")
    out.append("<table class=grid><thead><tr><th>compile id</th><th>reason</th><th>user frame</th><th>function</th><th>ranks</th>"
               "<th class=num>calls / step</th><th class=num>ms / step</th></tr></thead><tbody>")
    for r in g.head(MAX_ROWS).iter_rows(named=True):
        out.append(f"<tr><td>{_e(r['compile_id'])}</td><td>{_e(r['reason'])}</td><td class=mono>{_e(r['user_frame'])}</td>"
                   f"<td>{_e(r['function'])}</td><td>{_e(format_ranks(r['ranks']))}</td>"
                   f"<td class=num>{_opt(r['calls_per_step'], 1)}</td><td class=num>{_opt(r['ms_per_step'], 2)}</td></tr>")
    out.append("</tbody></table>" + _more(g.height, min(g.height, MAX_ROWS), "graph breaks"))
    if kinds.get("ddp_split"):
        out.append(f"<p class=note>{kinds['ddp_split']} DDPOptimizer bucket split(s) are not graph breaks and are not listed.</p>")
    return "\n".join(out)


def _breaks(gb: pl.DataFrame) -> pl.DataFrame:
    """Graph break records, one per (rank, compile id, reason, user frame): the same break read twice (TORCH_TRACE with
    its compile id and user frame, TORCH_LOGS text without them) counts once, the fuller record kept."""
    g = gb.group_by("rank", "compile_id", "reason", "user_frame").agg(pl.col("function").drop_nulls().first())
    full = g.filter(pl.col("compile_id").is_not_null())
    return pl.concat([
        full.filter(pl.col("user_frame").is_not_null()),
        full.filter(pl.col("user_frame").is_null()).join(full.filter(pl.col("user_frame").is_not_null()),
                                                         on=["rank", "compile_id", "reason"], how="anti", nulls_equal=True),
        g.filter(pl.col("compile_id").is_null()).join(full.select("rank", "reason").unique(), on=["rank", "reason"],
                                                      how="anti", nulls_equal=True),
    ])


def _frame_functions(ce: pl.DataFrame) -> pl.DataFrame:
    """compile id -> the compiled frame's function (its compile record's, else any record's)."""
    return (ce.filter(pl.col("compile_id").is_not_null()).sort(pl.col("kind") != "compile", nulls_last=True)
            .group_by("compile_id").agg(pl.col("function").drop_nulls().first()))


def _recompiles(run, ce: pl.DataFrame, kinds: Counter, rules: dict) -> str:
    out = ["<h3 id=recompiles>Recompiles and their guards</h3>"]
    fr = _table(run, "compile_frames", rules)
    if fr is not None and fr.height:
        fr = fr.filter((pl.col("recompiles") > 0) | pl.col("limit_hit"))
    rc = ce.filter(pl.col("kind").is_in(["recompile", "cache_limit"]))
    if (fr is None or fr.height == 0) and rc.height == 0:
        out.append("<p class=note>No recompile recorded: every frame compiled once.</p>")
        return "\n".join(out)
    if fr is not None and fr.height:
        g = fr.group_by("location", "function", "compiles", "recompiles", "limit_hit", "limit", "top_guard", "top_guard_count", "last_guard").agg(
            pl.col("rank").unique().sort().alias("ranks")).sort("recompiles", descending=True)
        out.append("<table class=grid><thead><tr><th>frame</th><th>ranks</th><th class=num>compiles</th><th class=num>recompiles</th>"
                   "<th>recompile limit</th><th>most frequent failed guard</th><th>last failed guard</th></tr></thead><tbody>")
        for r in g.head(MAX_ROWS).iter_rows(named=True):
            lim = "hit: fell back to eager" if r["limit_hit"] else ("-" if r["limit"] is None else f"{r['limit']} (not hit)")
            out.append(f"<tr><td class=mono>{_e(r['function'])} {_e(r['location'])}</td><td>{_e(format_ranks(r['ranks']))}</td>"
                       f"<td class=num>{r['compiles']}</td><td class=num>{r['recompiles']}</td><td{' class=hot' if r['limit_hit'] else ''}>{_e(lim)}</td>"
                       f"<td class=mono>{_e(r['top_guard'])} ({r['top_guard_count']}x)</td><td class=mono>{_e(r['last_guard'])}</td></tr>")
        out.append("</tbody></table>" + _more(g.height, min(g.height, MAX_ROWS), "frames"))
    if rc.height:
        g = rc.group_by("compile_id", "kind", "reason", "guard").agg(pl.col("rank").drop_nulls().unique().sort().alias("ranks"),
                                                                      pl.col("frame_id").first(), pl.col("attempt").first()
                                                                      ).sort(["frame_id", "attempt"], nulls_last=True)
        out.append(f"<details><summary>Each recompile ({g.height}) with its reason</summary><table class=grid><thead><tr><th>compile id</th>"
                   "<th>ranks</th><th>reason</th><th>failed guard</th></tr></thead><tbody>")
        for r in g.head(MAX_ROWS).iter_rows(named=True):
            out.append(f"<tr><td>{_e(r['compile_id'])}</td><td>{_e(format_ranks(r['ranks']))}</td><td class='mono pre'>{_e(r['reason'])}</td>"
                       f"<td class=mono>{_e(r['guard'])}</td></tr>")
        out.append("</tbody></table>" + _more(g.height, min(g.height, MAX_ROWS), "recompiles") + "</details>")
    return "\n".join(out)


def _cache_keys(run, ce: pl.DataFrame, findings: list) -> str:
    """FX graph cache keys per compile id and rank, in the order each rank logged them; a key that differs from the
    key most ranks have in that cell is highlighted (rank-local shapes, config or process-group names)."""
    out = ["<h3 id=cache-keys>FX graph cache keys per rank</h3>"]
    k = ce.filter(pl.col("cache_key").is_not_null() & pl.col("rank").is_not_null() & pl.col("compile_id").is_not_null())
    if k.height == 0:
        out.append("<p class=note>No FX graph cache key recorded (no cache hit or miss records with their keys).</p>")
        return "\n".join(out)
    k = k.sort("rank", "compile_id", "ts", nulls_last=True).with_columns(pl.int_range(pl.len()).over("rank", "compile_id").alias("graph"))
    ranks = sorted(k["rank"].unique().to_list())
    shown_ranks = ranks[:MAX_KEY_RANKS]
    cells: dict[tuple, dict[int, tuple[str, str]]] = {}
    for r in k.iter_rows(named=True):
        cells.setdefault((r["compile_id"], r["graph"]), {})[r["rank"]] = (r["cache_key"], r["kind"])
    # compile ids in numeric order; a compiled-autograd id ("!0/0/0") sorts after the others, never against a number
    order = sorted(cells, key=lambda t: ([(0, int(x), "") if x.isdigit() else (1, 0, x) for x in str(t[0]).split("/")],
                                         t[1]))
    diverging = 0
    rows = []
    for cid, gi in order:
        per = cells[(cid, gi)]
        maj, _ = Counter(v[0] for v in per.values()).most_common(1)[0]
        odd = {r for r, v in per.items() if v[0] != maj}
        diverging += bool(odd)
        tds = []
        for r in shown_ranks:
            if r not in per:
                tds.append("<td class=note>-</td>")
                continue
            key, kind = per[r]
            cls = "mono diverge" if r in odd else "mono"
            tds.append(f"<td class='{cls}' title='{_e(key)} ({_e(kind)})'>{_e(key[:10])} <span class=note>{_e(kind.replace('cache_', ''))}</span></td>")
        rows.append((bool(odd), f"<tr><td>{_e(cid)}</td><td class=num>{gi}</td>{''.join(tds)}</tr>"))
    # the diverging rows first where there are too many to show
    if len(rows) > MAX_ROWS:
        rows = sorted(rows, key=lambda t: not t[0])
    out.append(f"<p class=note>{len(order)} graph(s) with keys; {diverging} differ between ranks (highlighted). A key is shown by its "
               "first 10 characters (hover for all of it), with hit or miss.</p>")
    out.append("<div class=scroll><table class=grid><thead><tr><th>compile id</th><th class=num>graph</th>"
               + "".join(f"<th>rank {_e(r)}</th>" for r in shown_ranks) + "</tr></thead><tbody>")
    out += [r for _, r in rows[:MAX_ROWS]]
    out.append("</tbody></table></div>" + _more(len(rows), min(len(rows), MAX_ROWS), "graphs"))
    if len(ranks) > len(shown_ranks):
        out.append(f"<p class=cut>{len(ranks) - len(shown_ranks)} more rank column(s) not shown.</p>")
    # what the divergence rules concluded (TQL407-409: schedules, cache patterns, graph inputs), then the key diffs
    notes = [f.message for f in findings if f.rule in ("TQL407", "TQL408", "TQL409")][:50]
    for name in ("compile_cache_divergence",):
        t = _table(run, name)
        if t is None or t.height == 0:
            continue
        for r in t.head(50).iter_rows(named=True):
            notes.append(f"rank {r['rank']}, compile {r['compile_id']}: key {str(r['cache_key'])[:10]} vs {str(r['majority_key'])[:10]} on "
                             f"rank(s) {r['majority_ranks']}; differing components: {r['differing']}")
    if notes:
        out.append("<p><b>Why the ranks differ</b></p><ul>" + "".join(f"<li class=mono>{_e(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(out)


def _failures(run, rules: dict) -> str:
    f = _table(run, "compile_failures", rules)
    out = ["<h3 id=compile-failures>Compile failures</h3>"]
    if f is None or f.height == 0:
        out.append("<p class=note>No compile failure recorded.</p>")
        return "\n".join(out)
    out.append("<table class=grid><thead><tr><th>ranks</th><th>compile ids</th><th>function</th><th>type</th><th>reason</th>"
               "<th>outcome</th><th>user frame</th></tr></thead><tbody>")
    for r in f.head(MAX_ROWS).iter_rows(named=True):
        out.append(f"<tr><td>{_e(r['ranks_text'])}</td><td>{_e(r['compile_ids'])}</td><td class=mono>{_e(r['function'])} {_e(r['location'])}</td>"
                   f"<td>{_e(r['fail_type'])}</td><td class='mono pre'>{_e(r['reason'])}</td><td>{_e(r['outcome'])}</td><td class=mono>{_e(r['user_frame'])}</td></tr>")
    out.append("</tbody></table>" + _more(f.height, min(f.height, MAX_ROWS), "failures"))
    return "\n".join(out)


def _opt(v, nd: int) -> str:
    return "-" if v is None else f"{float(v):.{nd}f}"
