"""The exit status contract CI relies on (DESIGN.md): 0 clean, 1 findings at or above --fail-on, 2 usage or
configuration error (nothing analysable included), 3 a rule or internal error (the report is incomplete).
A module of its own, importing nothing, so that `traceql --help` does not load polars to know them."""

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
