"""Text report for people: sources, then findings grouped by rule, coloured on a terminal, plain in a log.

Lines are wrapped at `width` by words, continuation lines indented under their text; a token longer than the line
(a kernel name, a path) is kept whole rather than cut, so it can be searched and copied.

Colour is a handful of SGR codes written here, as rich wrote them before (bold red: ESC[1;31m ... ESC[0m): importing
rich cost every `check` ~25 ms for these few styles. Sentences shared with the HTML report ("Start here", "No
findings") are built in a small markup, `[bold]text[/]`, with `\\[` and `\\\\` for a literal bracket and backslash
(`_t` escapes input-derived text); `plain` and `first_style` read it.
"""

from __future__ import annotations

import re
import textwrap

from traceql.model.ranks import format_ranks
from traceql.model.text_safety import visible
from traceql.model.result import CheckResult

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS = {"ok": "green", "partial": "yellow", "skipped": "dim", "error": "red"}
# SGR parameters of the styles above, attributes before the colour (the order rich wrote them in)
_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_ORDER = ("bold", "dim", "red", "green", "yellow", "cyan")
_MARKUP = re.compile(r"\\([\\\[])|\[(/?)([a-z ]*)\]")


def _t(text) -> str:
    """Input-derived text as markup (the Start here lines are built as markup): control characters shown as escapes,
    then backslashes and brackets escaped, so that no input can open or close a style."""
    return visible(str(text)).replace("\\", "\\\\").replace("[", "\\[")


def _spans(markup: str) -> tuple[str, list[str]]:
    """(the plain text, the style of each span in order of opening) of a markup string; an unknown or unbalanced tag
    is kept as text, never an error."""
    out: list[str] = []
    styles: list[str] = []
    pos = 0
    depth = 0
    for m in _MARKUP.finditer(markup):
        out.append(markup[pos:m.start()])
        pos = m.end()
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(2):
            if depth:
                depth -= 1
            else:
                out.append(m.group(0))
        elif m.group(3) and all(w in _SGR for w in m.group(3).split()):
            styles.append(m.group(3))
            depth += 1
        else:
            out.append(m.group(0))
    out.append(markup[pos:])
    return "".join(out), styles


def plain(markup: str) -> str:
    """The text of a markup string, its tags gone and its escapes undone."""
    return _spans(markup)[0]


def first_style(markup: str) -> str:
    """The style of the first span of a markup string ("" where none)."""
    styles = _spans(markup)[1]
    return styles[0] if styles else ""


class _Out:
    """The report's lines, with colour (SGR codes) or without."""

    def __init__(self, color: bool):
        self.color = color
        self.lines: list[str] = []

    def styled(self, text: str, style: str) -> str:
        if not (self.color and style and text):
            return text
        words = style.split()
        return f"\x1b[{';'.join(_SGR[w] for w in _ORDER if w in words)}m{text}\x1b[0m"

    def print(self, *parts: str) -> None:
        self.lines.append("".join(parts))

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def _wrap(con: _Out, width: int | None, head: str, text: str, style: str = "", indent: int | None = None) -> None:
    """Print `head` + `text` wrapped at `width` (None: one line): `head` (plain, e.g. "  - ") styled with `style`,
    continuation lines indented by `indent` (default: under the text). Input-derived text is made visible here."""
    rest = " " * (len(head) if indent is None else indent)
    if width is None:
        lines = [head + visible(text)]
    else:
        lines = textwrap.wrap(visible(text), width=width, initial_indent=head, subsequent_indent=rest,
                              break_long_words=False, break_on_hyphens=False) or [head.rstrip()]
    for i, line in enumerate(lines):
        if style and not head.strip():  # no head: the whole text carries the style ("No findings" in green)
            con.print(con.styled(line, style))
        elif i == 0 and style:
            con.print(con.styled(head, style), line[len(head):])
        else:
            con.print(line)


def _of_world(run) -> str:
    """The header's "of world size 8, 7 missing (1-7)" where the sources state more ranks than the run holds (TQL002)."""
    sp = run.tables.get("source_problems")
    if sp is None or "n_missing" not in sp.columns:
        return ""
    for r in sp.filter(sp["problem"] == "missing-rank").iter_rows(named=True):
        return f" of world size {r['world_size']}, {r['n_missing']} missing ({r['missing']})"
    return ""


def render(result: CheckResult, color: bool = False, verbose: bool = False, width: int | None = None) -> str:
    """The report as text; width None: one line per entry (logs, grep), else wrapped at `width` columns."""
    con = _Out(color)
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    ranks = run.ranks
    _wrap(con, width, "traceql check ", f"{run.path}: {len(ranks)} rank(s){' ' + _ranges(ranks) if ranks else ''}"
          f"{_of_world(run)}, {len(run.sources)} source(s)", "bold", indent=2)
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
        _wrap(con, width, f"  {s.status:8} ", f"{j['path']} ({s.kind}{rank}){': ' + s.detail if s.detail else ''}", _STATUS[s.status])
    ok = sum(1 for s in run.sources if s.status == "ok" and (verbose or not s.rank_origin.startswith("assumed")))
    if not verbose and ok:
        _wrap(con, width, "  ok       ", f"{ok} source(s) read fully", "green")
    if quiet_skips and not verbose:
        _wrap(con, width, "  skipped  ", f"{len(quiet_skips)} other file(s): not traceql inputs (-v lists them)", "dim")
    skipped = [r for r in result.results if r.status != "ran"]
    if skipped and verbose:
        con.print(con.styled("rules not run:", "dim"))
        for r in skipped:
            _wrap(con, width, f"  {r.rule.id} ", f"{r.rule.name}: {r.reason}", "dim")
    errors = [r for r in result.results if r.status == "error"]
    for r in errors:
        _wrap(con, width, "  rule error ", f"{r.rule.id}: {r.reason}", "red")
    con.print()
    ran = sum(1 for r in result.results if r.status == "ran")
    not_run = len(skipped) - len(errors)
    if not result.findings:
        # one sentence (shared with the HTML report, as markup): wrapped as plain text, in its first style
        sentence = _no_findings(ran, not_run, len(errors), bool(ranks))
        _wrap(con, width, "", plain(sentence), first_style(sentence))
        return con.text()
    from traceql.report import start_here

    top = start_here.start_here(result, _t)
    for i, line in enumerate(top):
        line = plain(line)
        head = re.match(r"\s*(\d+\.\s)?", line).group(0)
        _wrap(con, width, head, line[len(head):], "bold" if i == 0 else "", indent=len(head))
    if top:
        con.print()
    # consequences are printed under their cause, not again under their own rule
    kids = start_here.children(result.findings)
    by_rule: dict[str, list] = {}
    for f in start_here.roots(result.findings):
        by_rule.setdefault(f.rule, []).append(f)
    for rid, fs in by_rule.items():
        f0 = fs[0]
        _wrap(con, width, f"{f0.severity} ", f"{rid} {f0.name} ({len(fs)})", _STYLE[f0.severity], indent=2)
        for f in fs[:20]:
            _finding(con, width, f, kids)
        if len(fs) > 20:
            _wrap(con, width, "  ... ", f"{len(fs) - 20} more (use --format json for all)")
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in ("error", "warning", "info")}
    con.print()
    _wrap(con, width, "", (
        f"{len(result.findings)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info"
        + (f"; {result.suppressed} suppressed" if result.suppressed else "")
        + (f"; {len(errors)} rule(s) failed (listed above), so this report is incomplete" if errors else "")
        + ". `traceql rules explain ID` says why each matters and how to fix it."
    ))
    return con.text()


def _finding(con: _Out, width: int | None, f, kids: dict, depth: int = 1, seen: set | None = None) -> None:
    """The finding's line, then the findings its cause explains indented under it (each printed once)."""
    from traceql.report.start_here import cost_text

    seen = set() if seen is None else seen
    seen.add(f.fingerprint)
    pad = "  " * depth
    if depth == 1:
        _wrap(con, width, f"{pad}- ", f.message + cost_text(f))
    else:
        _wrap(con, width, f"{pad}- caused by the above: ", f"{f.rule} {f.message}{cost_text(f)}", "dim",
              indent=len(pad) + 2)
    for k in kids.get(f.fingerprint, []):
        if k.fingerprint not in seen:
            _finding(con, width, k, kids, depth + 1, seen)


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
