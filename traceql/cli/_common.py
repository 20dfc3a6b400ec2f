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


# Set by a command that has written all its output and holds nothing that needs the interpreter's own teardown (the
# check, once its report is out): the process may then end at once (exit_now), without freeing every module and
# table one by one, which costs about 0.04 CPU s after a small check (polars' import alone leaves 0.035 of it).
_DONE = False


def done(code: int) -> None:
    """The command's exit status, all its output written: the process may end without the interpreter's teardown."""
    global _DONE
    _DONE = True
    sys.exit(code)


def exit_now(code) -> None:
    """End the process with `code` now, where done() was called: stdout and stderr flushed, the atexit handlers run
    (the ingest pool's close, temporary folders' finalizers), then os._exit, which skips freeing the modules and
    objects one by one. Returns (the interpreter exits as usual) where done() was not called, the code is not an
    int, another thread is alive (the interpreter joins it), or a stream cannot be flushed (a closed pipe: Python's
    own exit reports it)."""
    import atexit
    import os
    import threading

    if not _DONE or not (code is None or isinstance(code, int)) or threading.active_count() > 1:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code or 0)




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
