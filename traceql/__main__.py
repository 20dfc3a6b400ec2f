"""The `traceql` command (its console script calls run) and `python -m traceql ...`, the same command."""

from __future__ import annotations

import os
import sys


def run() -> int | None:
    """`traceql --version` on its own is answered here, in click.version_option's words: importing click is about
    half the instructions of the whole command (100 of 196 M), and a version check in a script or a CI step should
    cost no more than the interpreter's start. Everything else, `--version` beside other arguments included, goes to
    the click group (traceql.cli)."""
    if sys.argv[1:] == ["--version"]:
        from traceql import __version__

        try:
            print(f"traceql, version {__version__}", flush=True)
        except BrokenPipeError:  # `traceql --version | true`: no traceback, and none at exit's flush either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    from traceql.cli import main

    return main(prog_name="traceql")


if __name__ == "__main__":
    sys.exit(run())
