"""Run: every source of a run directory, the canonical tables over all ranks, and what link/ derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceql.model.source import Source
from traceql.model.tables import SCHEMAS, empty


@dataclass
class Run:
    path: Path
    sources: list[Source] = field(default_factory=list)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)  # canonical and derived tables
    graph: object | None = None  # networkx.DiGraph, built on demand by link.graph
    notes: list[str] = field(default_factory=list)  # run-level facts link/ wants reported (residuals, gaps)
    derived_cache: Path | None = None  # where link.ensure keeps derived tables of this exact input (see cache)
    # "run": every rank's rows; "rank": one rank task's ranks only (traceql.executor), where a table declared scope
    # "run" (model/derived.py) cannot be built, since building it would compare ranks it does not hold
    scope: str = "run"
    # rows per canonical table that stayed on the rank tasks' workers (traceql.executor): what rules' `needs` see
    # on the driver, which holds no kernels, host ops or runtime calls
    held: dict[str, int] = field(default_factory=dict)

    def table(self, name: str) -> pl.DataFrame:
        if name in self.tables:
            return self.tables[name]
        if name in SCHEMAS:
            return empty(name)
        raise KeyError(f"no table {name!r}; valid tables: {sorted(set(self.tables) | set(SCHEMAS))}")

    def has(self, name: str) -> bool:
        return name in self.tables and self.tables[name].height > 0

    @property
    def ranks(self) -> list[int]:
        ranks: set[int] = set()
        for s in self.sources:
            if s.status in ("ok", "partial"):
                ranks.update(s.ranks or ([s.rank] if s.rank is not None else []))
        return sorted(ranks)

    def source_paths(self, ranks: list[int] | None = None) -> list[str]:
        out = []
        for s in self.sources:
            if s.status not in ("ok", "partial"):
                continue
            held = s.ranks or ([s.rank] if s.rank is not None else [])
            if ranks is None or not held or set(held) & set(ranks):
                out.append(str(s.path))
        return out
