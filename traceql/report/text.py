"""Text report for people: sources, then findings grouped by rule, coloured on a terminal, plain in a log."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape

from traceql.model.ranks import format_ranks
from traceql.model.text_safety import visible
from traceql.model.result import CheckResult

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "partial": "yellow", "skipped": "dim", "error": "red"}


def _t(text) -> str:
    """Input-derived text for the console: control characters shown as escapes, then rich markup escaped."""
    return escape(visible(text))


def render(result: CheckResult, color: bool = False, verbose: bool = False, width: int = 120) -> str:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=color, no_color=not color, width=width, highlight=False, soft_wrap=True)
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    ranks = run.ranks
    con.print(f"[bold]traceql check[/] {_t(run.path)}: {len(ranks)} rank(s) {escape(_ranges(ranks))}, {len(run.sources)} source(s)")
    # links not followed and empty traces stay visible: each may be an input the user meant, and it was not read
    quiet_skips = [s for s in run.sources if s.status == "skipped" and s.kind in ("unknown", "manifest")
                   and not s.meta.get("shown")]
    for s in run.sources:
        if s.status == "ok" and not verbose and not s.rank_origin.startswith("assumed"):
            continue
        if s in quiet_skips and not verbose:
            continue
        j = s.to_json(root)
        rank = f" rank {j['rank']}" if j["rank"] is not None else ""
        con.print(f"  [{_STATUS[s.status]}]{s.status:8}[/] {_t(j['path'])} ({s.kind}{rank}){': ' + _t(s.detail) if s.detail else ''}")
    ok = sum(1 for s in run.sources if s.status == "ok" and (verbose or not s.rank_origin.startswith("assumed")))
    if not verbose and ok:
        con.print(f"  [green]ok[/]       {ok} source(s) read fully")
    if quiet_skips and not verbose:
        con.print(f"  [dim]skipped  {len(quiet_skips)} other file(s): not traceql inputs (-v lists them)[/]")
    skipped = [r for r in result.results if r.status != "ran"]
    if skipped and verbose:
        con.print("[dim]rules not run:[/]")
        for r in skipped:
            con.print(f"  [dim]{r.rule.id} {_t(r.rule.name)}: {_t(r.reason)}[/]")
    errors = [r for r in result.results if r.status == "error"]
    for r in errors:
        con.print(f"  [red]rule error[/] {r.rule.id}: {_t(r.reason)}")
    con.print()
    ran = sum(1 for r in result.results if r.status == "ran")
    not_run = len(skipped) - len(errors)
    if not result.findings:
        con.print(_no_findings(ran, not_run, len(errors), bool(ranks)))
        return buf.getvalue()
    from traceql.report import start_here

    for line in start_here.start_here(result, _t) + [""] * bool(start_here.start_here(result, _t)):
        con.print(line)
    # consequences are printed under their cause, not again under their own rule
    kids = start_here.children(result.findings)
    by_rule: dict[str, list] = {}
    for f in start_here.roots(result.findings):
        by_rule.setdefault(f.rule, []).append(f)
    for rid, fs in by_rule.items():
        f0 = fs[0]
        con.print(f"[{_STYLE[f0.severity]}]{f0.severity}[/] [bold]{_t(rid)}[/] {_t(f0.name)} ({len(fs)})")
        for f in fs[:20]:
            for line in start_here.finding_lines(f, kids, _t):
                con.print(line)
        if len(fs) > 20:
            con.print(f"  ... {len(fs) - 20} more (use --format json for all)")
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    con.print()
    con.print(
        f"{len(result.findings)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info"
        + (f"; {result.suppressed} suppressed" if result.suppressed else "")
        + (f"; [red]{len(errors)} rule(s) failed[/] (listed above), so this report is incomplete" if errors else "")
        + ". `traceql rules explain ID` says why each matters and how to fix it."
    )
    return buf.getvalue()


def _no_findings(ran: int, not_run: int, errored: int, any_rank: bool) -> str:
    """"No findings" only where every rule ran; otherwise what did not run, so a quiet report is never mistaken for a
    clean run."""
    if errored:
        return (f"[red]{errored} rule(s) failed[/] (listed above); the {ran} rule(s) that ran found nothing"
                + (f", {not_run} skipped" if not_run else "") + ": this report is incomplete.")
    if not any_rank:
        return f"Nothing analysed: no source was read and attributed to a rank ({ran} rule(s) ran, {not_run} skipped)."
    if not_run:
        return (f"{ran} rule(s) ran and found nothing; {not_run} rule(s) skipped (their inputs are not in this run"
                " or ranks collided; -v lists why).")
    return f"[green]No findings[/] ({ran} rule(s) ran)."


def _ranges(ranks: list[int]) -> str:
    return f"[{format_ranks(ranks)}]" if ranks else ""
