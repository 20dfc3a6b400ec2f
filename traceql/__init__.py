"""traceql: an offline analyzer for distributed PyTorch training runs.

In a notebook: `run = traceql.load(path)` gives the run's tables as polars DataFrames, `traceql.check(path)` its
findings (see traceql.api). Both are imported on first use, so `import traceql` (and `traceql --version`) stay fast
and do not import polars.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING at run time; importing typing would cost `traceql --version` 12%

__version__ = "0.1.0"

__all__ = ["Findings", "QueryError", "RuleOutcome", "Run", "__version__", "check", "load"]

if TYPE_CHECKING:
    from traceql.api import Findings, QueryError, RuleOutcome, Run, check, load

_API = {"Findings", "QueryError", "Run", "RuleOutcome", "check", "load"}


def __getattr__(name: str):
    if name in _API:
        from traceql import api

        return getattr(api, name)
    raise AttributeError(f"module 'traceql' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API)
