"""The text report writes its own colour codes (no rich import on every check): the same bytes rich wrote, and
input text that can neither open nor close a style."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceql.report import text

STYLES = ["bold", "dim", "red", "green", "yellow", "cyan", "bold red"]


def _rich(markup: str) -> str:
    """What rich prints for one line of markup on a colour terminal (the renderer before this one)."""
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, no_color=False, color_system="standard", width=200, highlight=False,
                  soft_wrap=True, emoji=False)
    con.print(markup)
    return buf.getvalue()


@pytest.mark.parametrize("style", STYLES)
def test_a_styled_head_is_the_sgr_sequence_rich_wrote(style):
    from rich.markup import escape

    out = text._Out(color=True)
    text._wrap(out, None, "  ok       ", "2 source(s) read fully [x] \\ done", style)
    assert out.text() == _rich(f"[{style}]  ok       [/]" + escape("2 source(s) read fully [x] \\ done"))


@pytest.mark.parametrize("style", STYLES)
def test_a_whole_styled_line_and_a_plain_one(style):
    out = text._Out(color=True)
    text._wrap(out, 30, "", "No findings (51 rule(s) ran) and some more words to wrap", style)
    lines = out.text().splitlines()
    assert len(lines) == 2 and all(line.startswith("\x1b[") and line.endswith("\x1b[0m") for line in lines)
    plain = text._Out(color=False)
    text._wrap(plain, 30, "", "No findings (51 rule(s) ran) and some more words to wrap", style)
    assert "\x1b" not in plain.text()
    assert [line[line.index("m") + 1:-len("\x1b[0m")] for line in lines] == plain.text().splitlines()


def test_markup_reads_as_rich_read_it():
    line = "  1. [bold]TQL302[/] straggler-rank rank 1: 51.7 ms per step (39%). Fix it."
    assert text.plain(line) == "  1. TQL302 straggler-rank rank 1: 51.7 ms per step (39%). Fix it."
    assert text.first_style("[green]No findings[/] (3 rule(s) ran).") == "green"
    assert text.first_style("3 rule(s) ran and found nothing") == ""
    assert text.plain("[red]2 rule(s) failed[/] (listed above)") == "2 rule(s) failed (listed above)"


@given(st.lists(st.sampled_from(list("ab[]/\\ :x") + ["[bold]", "[/]", "[red]", "\\[", "\x1b", "\n"]),
                max_size=20).map("".join))
def test_input_text_round_trips_and_opens_no_style(s):
    """Whatever a kernel or file name holds (brackets, backslashes, tags, control characters), escaped by _t it
    reads back as itself, made visible, and adds no span."""
    from traceql.model.text_safety import visible

    marked = f"[bold]x[/] {text._t(s)}"
    assert text.plain(marked) == "x " + visible(s)
    assert text._spans(marked)[1] == ["bold"]


def test_unknown_or_unbalanced_tags_stay_text():
    assert text.plain("[nope]a[/] b [/]") == "[nope]a[/] b [/]"
    assert text.plain("[bold]a") == "a"
