"""Run: every source of a run directory, the canonical tables over all ranks, and what link/ derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceql.model.source import Source
from traceql.model.tables import SCHEMAS, empty


class Pending:
    """A table not read yet: its row count is known (the cache recorded it), its rows are read on first use. A warm
    re-check reads few of the canonical tables (the derived ones it needs come from the cache): 8 ranks x 216k
    events read 61% of their Parquet bytes for host ops and kernels that only their row counts were asked of."""

    __slots__ = ("rows", "_read", "_df")

    def __init__(self, rows: int, read):
        self.rows = rows
        self._read = read
        self._df: pl.DataFrame | None = None

    def read(self) -> pl.DataFrame:
        if self._df is None:  # once, also where two Tables share the entry (Tables.copy)
            self._df = self._read()
            self._read = None
        return self._df


class Tables(dict):
    """name -> DataFrame where an entry may be Pending: every way of reading a value (t[name], get, items, values,
    pop, dict(t), {**t}) reads it first, so a caller sees DataFrames only; `rows` and `amend` leave it unread."""

    def __getitem__(self, name: str) -> pl.DataFrame:
        v = dict.__getitem__(self, name)
        if isinstance(v, Pending):
            v = v.read()
            dict.__setitem__(self, name, v)
        return v

    def __iter__(self):  # overridden, so that dict(t), {**t} and d.update(t) take their values through __getitem__
        return dict.__iter__(self)

    def get(self, name, default=None):
        return self[name] if name in self else default

    def items(self):
        return [(k, self[k]) for k in list(dict.keys(self))]

    def values(self):
        return [self[k] for k in list(dict.keys(self))]

    def pop(self, name, *default):
        if name in self:
            v = self[name]
            dict.__delitem__(self, name)
            return v
        if default:
            return default[0]
        raise KeyError(name)

    def setdefault(self, name, default=None):
        if name not in self:
            dict.__setitem__(self, name, default)
        return self[name]

    def copy(self) -> Tables:
        t = Tables()
        for k in dict.keys(self):
            dict.__setitem__(t, k, dict.__getitem__(self, k))
        return t

    def __reduce__(self):  # pickled (to a Dask worker, a deep copy) as a plain dict of read tables
        return (dict, (dict(self.items()),))

    def rows(self, name: str) -> int:
        v = dict.__getitem__(self, name)
        return v.rows if isinstance(v, Pending) else v.height

    def amend(self, name: str, fn) -> None:
        """tables[name] = fn(tables[name]), where fn keeps the rows: applied when the table is read, if it is not yet."""
        v = dict.__getitem__(self, name)
        if isinstance(v, Pending):
            dict.__setitem__(self, name, Pending(v.rows, lambda: fn(v.read())))
        else:
            dict.__setitem__(self, name, fn(v))


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
        return name in self.tables and self.rows(name) > 0

    def rows(self, name: str) -> int:
        """The height of table `name` (0 where absent), without reading a table the cache has not read yet."""
        if name not in self.tables:
            return self.table(name).height
        return self.tables.rows(name) if isinstance(self.tables, Tables) else self.tables[name].height

    def heights(self) -> dict[str, int]:
        """Every table's height, reading none the cache has not read yet (nor looking any up by name)."""
        t = self.tables
        if isinstance(t, Tables):
            return {k: t.rows(k) for k in dict.keys(t)}
        return {k: df.height for k, df in t.items()}

    def amend(self, name: str, fn) -> None:
        """Replace table `name` by fn(table), fn keeping its rows (a column added): lazily where it is not read yet."""
        if isinstance(self.tables, Tables) and name in self.tables:
            self.tables.amend(name, fn)
        else:
            self.tables[name] = fn(self.table(name))

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
