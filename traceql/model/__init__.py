"""The records and tables every stage shares. Names load on first use (PEP 562), so that a module needing only
Source or Finding (discovery, archives, the CLI) does not import polars with the table specs."""

from __future__ import annotations

import importlib

_FROM = {
    "SEVERITIES": "finding", "SEVERITY_ORDER": "finding", "Finding": "finding",
    "Run": "run",
    "KINDS": "source", "Source": "source",
    "SCHEMAS": "tables", "concat": "tables", "conform": "tables", "empty": "tables",
}

__all__ = ["SCHEMAS", "SEVERITIES", "SEVERITY_ORDER", "KINDS", "Finding", "Run", "Source", "concat", "conform", "empty"]


def __getattr__(name: str):
    sub = _FROM.get(name)
    if sub is None:
        raise AttributeError(f"module 'traceql.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"traceql.model.{sub}"), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
