"""`python -m traceql ...`: the same as the `traceql` command."""

from traceql.cli import main

main(prog_name="traceql")
