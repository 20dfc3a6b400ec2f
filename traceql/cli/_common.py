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


