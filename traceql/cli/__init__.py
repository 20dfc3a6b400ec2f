"""Command-line entry points. Only argument handling and output here: the work happens in the packages.

One module per command family, each registered below; none imports polars or the analysis packages at import time,
so `traceql --help` and `--version` answer at once."""

from __future__ import annotations

import click

from traceql import __version__
from traceql.cli._common import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE  # noqa: F401  (the contract)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceql")
def main():
    """traceql: find why a distributed PyTorch run is slow, hangs, or got slower after torch.compile."""


# registration: each module adds its commands to `main` (check, summary, rules, cache) or exports one command
from traceql.cli import cache, check, rules  # noqa: E402,F401
from traceql.cli.capture import capture_group  # noqa: E402
from traceql.cli.graph import graph_command  # noqa: E402
from traceql.cli.report import annotate, diff, query  # noqa: E402
from traceql.cli.serve import serve  # noqa: E402

for _cmd in (annotate, diff, query, graph_command, capture_group, serve):
    main.add_command(_cmd)
