"""Text report for people: sources, then findings grouped by rule, coloured on a terminal, plain in a log."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape

from traceql.model.ranks import format_ranks
from traceql.report.result import CheckResult

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "partial": "yellow", "skipped": "dim", "error": "red"}


def render(result: CheckResult, color: bool = False, verbose: bool = False, width: int = 120) -> str:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=color, no_color=not color, width=width, highlight=False, soft_wrap=True)
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    ranks = run.ranks
    con.print(f"[bold]traceql check[/] {escape(str(run.path))}: {len(ranks)} rank(s) {escape(_ranges(ranks))}, {len(run.sources)} source(s)")
    quiet_skips = [s for s in run.sources if s.status == "skipped" and s.kind in ("unknown", "manifest")]
    for s in run.sources:
        if s.status == "ok" and not verbose:
            continue
        if s in quiet_skips and not verbose:
            continue
        j = s.to_json(root)
        rank = f" rank {j['rank']}" if j["rank"] is not None else ""
        con.print(f"  [{_STATUS[s.status]}]{s.status:8}[/] {escape(j['path'])} ({s.kind}{rank}){': ' + escape(s.detail) if s.detail else ''}")
    ok = sum(1 for s in run.sources if s.status == "ok")
    if not verbose and ok:
        con.print(f"  [green]ok[/]       {ok} source(s) read fully")
    if quiet_skips and not verbose:
        con.print(f"  [dim]skipped  {len(quiet_skips)} other file(s): not traceql inputs (-v lists them)[/]")
    skipped = [r for r in result.results if r.status != "ran"]
    if skipped and verbose:
        con.print("[dim]rules not run:[/]")
        for r in skipped:
            con.print(f"  [dim]{r.rule.id} {r.rule.name}: {escape(r.reason)}[/]")
    errors = [r for r in result.results if r.status == "error"]
    for r in errors:
        con.print(f"  [red]rule error[/] {r.rule.id}: {escape(r.reason)}")
    con.print()
    if not result.findings:
        ran = sum(1 for r in result.results if r.status == "ran")
        con.print(f"[green]No findings[/] ({ran} rule(s) ran, {len(skipped)} skipped).")
        return buf.getvalue()
    by_rule: dict[str, list] = {}
    for f in result.findings:
        by_rule.setdefault(f.rule, []).append(f)
    for rid, fs in by_rule.items():
        f0 = fs[0]
        con.print(f"[{_STYLE[f0.severity]}]{f0.severity}[/] [bold]{rid}[/] {f0.name} ({len(fs)})")
        for f in fs[:20]:
            con.print(f"  - {escape(f.message)}")
        if len(fs) > 20:
            con.print(f"  ... {len(fs) - 20} more (use --format json for all)")
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    con.print()
    con.print(
        f"{len(result.findings)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info"
        + (f"; {result.suppressed} suppressed" if result.suppressed else "")
        + ". `traceql rules explain ID` says why each matters and how to fix it."
    )
    return buf.getvalue()


def _ranges(ranks: list[int]) -> str:
    return f"[{format_ranks(ranks)}]" if ranks else ""
