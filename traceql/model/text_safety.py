"""Input-derived text made safe for a terminal: control characters become visible escapes.

A run dir is untrusted (DESIGN.md, trust boundary): a kernel name, a file name or a log line can carry ESC sequences
(OSC 52 writes the user's clipboard, OSC 0 sets the window title, CSI 2J clears the screen), BEL, carriage returns
or newlines that forge a line of the report ("No findings"). Every text renderer for people passes such text
through `visible` before printing it; JSON needs nothing (its encoder escapes), HTML and SARIF escape their own way.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(code: int) -> str:
    ch = chr(code)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


# C0 (U+0000-U+001F), DEL and C1 (U+0080-U+009F: U+009B is a one-character CSI on many terminals), plus the
# Unicode line and paragraph separators and the bidirectional overrides and isolates, which reorder what is shown.
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TABLE = {c: _escape(c) for c in _CONTROLS}


def visible(text) -> str:
    """`text` (any value, str()-ed) with every control character shown as an escape: ESC -> \\x1b, LF -> \\n,
    U+009B -> \\u009b. Printable text, backslashes included, is unchanged."""
    return str(text).translate(_TABLE)
