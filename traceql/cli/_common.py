"""What every command shares: exit codes and the one-line error."""

from __future__ import annotations

import sys

import click

from traceql.exit_codes import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE  # noqa: F401  (the contract)


def _say(msg: str) -> None:
    """One line to stderr; the message may quote input (a file name, a detail): its control characters are escaped."""
    from traceql.model.text_safety import visible

    click.echo(f"traceql: {visible(msg)}", err=True)


def _fail(msg: str, code: int = EXIT_USAGE) -> None:
    _say(msg)
    sys.exit(code)




def _width(given: int | None, to_file: bool = False) -> int | None:
    """Text width: --width, else $COLUMNS, else the terminal's (stdout on a tty, not --out); None off a terminal
    (a log, a pipe, a file): one line per entry there, so that grep finds a whole message."""
    import os
    import shutil

    if given:
        return max(given, 40)
    if os.environ.get("COLUMNS", "").strip().isdigit():
        return max(int(os.environ["COLUMNS"]), 40)
    if not to_file and sys.stdout.isatty():
        return max(shutil.get_terminal_size((120, 24)).columns, 40)
    return None


def _color(mode: str, to_file: bool = False) -> bool:
    """--color always|never, or auto: a terminal (stdout on a tty, not --out) and NO_COLOR unset or empty."""
    import os

    if mode == "always":
        return True
    if mode == "never":
        return False
    return not to_file and sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def text_options(f):
    """--width and --color, shared by every command that prints a text report."""
    f = click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
                     help="Colour the text report: auto = on a terminal unless NO_COLOR is set.")(f)
    return click.option("--width", type=click.IntRange(min=1), default=None,
                        help="Wrap text at N columns [default: $COLUMNS or the terminal's; no wrapping off a terminal].")(f)


def _check_out(out) -> None:
    """Fail at once (exit 2, one line) where --out cannot be written: before minutes of ingest, not after."""
    import os
    from pathlib import Path

    if out is None:
        return
    out = Path(out)
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        _fail(f"--out {out}: is a directory; name a file to write (inside it or elsewhere)")
    if not parent.exists():
        _fail(f"--out {out}: folder {parent} does not exist; create it first (mkdir -p {parent})")
    if not parent.is_dir():
        _fail(f"--out {out}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        _fail(f"--out {out}: not writable (permission denied); choose another path")


def _write_out(out, data: str | bytes) -> None:
    """Write --out, or exit 2 with one line naming the path (a disk full, a race with _check_out)."""
    from pathlib import Path

    try:
        if isinstance(data, str):
            Path(out).write_text(data, encoding="utf-8")
        else:
            Path(out).write_bytes(data)
    except OSError as e:
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
