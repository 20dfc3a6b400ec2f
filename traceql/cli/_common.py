"""What every command shares: exit codes and the one-line error."""

from __future__ import annotations

import sys

import click

# (nothing analysable included), 3 a rule or internal error (the report is incomplete).
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _say(msg: str) -> None:
    """One line to stderr; the message may quote input (a file name, a detail): its control characters are escaped."""
    from traceql.model.text_safety import visible

    click.echo(f"traceql: {visible(msg)}", err=True)


def _fail(msg: str, code: int = EXIT_USAGE) -> None:
    _say(msg)
    sys.exit(code)




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
