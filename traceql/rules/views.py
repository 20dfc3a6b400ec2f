"""Named SQL views: shared pieces of rule SQL, kept once under rules/views/ instead of copied into each rule.

A view is a file in a `views/` folder beside the rule files: `NAME.sql` (a leading `--` comment block is its doc) or
`NAME.yaml` with `sql`, `doc` and optionally `columns: {name: doc}`. Rule SQL, vocabulary selections (`table:`) and
`traceql query` read a view like a table. A view is checked like rule SQL (one SELECT, traceql's tables, views and
its own CTEs only; no table function) and its columns are known at load: the query runs on empty frames of the
declared schemas (model/tables.py, model/derived.py) and its result schema is the view's.

A view runs once per run, over every rank, and its rows are kept in run.tables; so a view that rules partition by
rank must carry a rank column, and its joins must keep rank in their keys (one nsys file can hold several ranks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceql.rules import sql_guard
from traceql.rules.yamlfile import MAX_RULE_BYTES, RuleError, load_yaml

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class ViewError(ValueError):
    """A view file is invalid; the message names the file and the field."""


@dataclass
class View:
    name: str
    sql: str
    doc: str
    path: Path
    columns: dict[str, str] = field(default_factory=dict)  # name -> doc, where the file documents them
    reads: list[str] = field(default_factory=list)  # tables and views the query names
    # the result schema, from a run on empty frames: at load, or on first use where the bundled pack's manifest
    # vouches for the views (only rule validation reads it, and a pack that matches its manifest validates none)
    _schema: dict[str, pl.DataType] | None = field(default=None, repr=False, compare=False)
    _pack: dict | None = field(default=None, repr=False, compare=False)  # the views it was loaded with

    @property
    def schema(self) -> dict[str, pl.DataType]:
        if self._schema is None:
            _schema(self, self._pack if self._pack is not None else {self.name: self}, [])
        return self._schema


def _sql_doc(text: str) -> str:
    lines = []
    for ln in text.splitlines():
        s = ln.strip()
        if not s.startswith("--"):
            break
        lines.append(s[2:].strip())
    return " ".join(x for x in lines if x)


def _read(path: Path, data=None) -> View:
    """One view file; data, where given, is the YAML file's data as the bundled pack's manifest recorded it for these
    very bytes (rules.manifest), sparing the parse."""
    name = path.stem
    if not NAME_RE.match(name):
        raise ViewError(f"{path}: field 'name': view name {name!r} must be lower_snake_case (it is used as a table name)")
    if path.suffix == ".sql":
        try:
            size = path.stat().st_size
            if size > MAX_RULE_BYTES:  # a view is a page of SQL, like a rule file
                raise ViewError(f"{path}: {size} bytes is too large for a view file (limit "
                                f"{MAX_RULE_BYTES >> 10} KB)")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ViewError(f"{path}: cannot read view: {e}") from None
        return View(name, text, _sql_doc(text), path)
    try:
        data = load_yaml(path, "view file") if data is None else data
    except RuleError as e:
        raise ViewError(str(e)) from None
    if not isinstance(data, dict):
        raise ViewError(f"{path}: a view file holds one mapping: sql, doc, columns")
    unknown = set(data) - {"sql", "doc", "columns"}
    if unknown:
        raise ViewError(f"{path}: field {sorted(unknown)[0]!r}: unknown field; valid fields: columns, doc, sql")
    if not isinstance(data.get("sql"), str):
        raise ViewError(f"{path}: field 'sql': is required (a string holding one SELECT)")
    if not isinstance(data.get("doc"), str) or not data["doc"].strip():
        raise ViewError(f"{path}: field 'doc': is required (what a row of the view is)")
    cols = data.get("columns") or {}
    if not isinstance(cols, dict):
        raise ViewError(f"{path}: field 'columns': must be a mapping of column -> doc")
    return View(name, data["sql"], " ".join(data["doc"].split()), path, {str(k): str(v) for k, v in cols.items()})


def load_views(dirs: list[Path], infer: bool = True, data: dict[Path, dict] | None = None) -> dict[str, View]:
    """Every view under `views/` of the rule folders, checked and with its schema. Later folders cannot redefine a
    view or shadow a table. Where the bundled pack's manifest vouches for the views, infer=False leaves each schema
    to its first use and data gives the YAML files' data by path."""
    from traceql.model.derived import DERIVED, SCHEMAS

    views: dict[str, View] = {}
    for d in dirs:
        folder = Path(d) / "views"
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if p.suffix not in (".sql", ".yaml", ".yml"):
                continue
            v = _read(p, (data or {}).get(p))
            if v.name in SCHEMAS or v.name in DERIVED:
                raise ViewError(f"{p}: field 'name': {v.name!r} is already a table; name the view otherwise")
            if v.name in views:
                raise ViewError(f"{p}: field 'name': view {v.name!r} is already defined by {views[v.name].path}")
            views[v.name] = v
    known = set(SCHEMAS) | set(DERIVED) | set(views)
    for v in views.values():
        try:
            sql_guard.check(v.sql, known)
        except sql_guard.SqlRefused as e:
            raise ViewError(f"{v.path}: field 'sql': {e}") from None
        v.reads = named(v.sql, sorted(known - {v.name}))
        v._pack = views
    if infer:
        for v in views.values():
            _schema(v, views, [])
    return views


def named(sql: str, names: list[str]) -> list[str]:
    """Those of `names` the statement reads as tables (FROM, JOIN; its own CTEs left out)."""
    read = sql_guard.read_tables(sql)
    return [n for n in names if n.lower() in read]


def _schema(v: View, views: dict[str, View], stack: list[str]) -> dict[str, pl.DataType]:
    """The view's result schema: its query run on empty frames of what it reads (views first, in order)."""
    from traceql.model.derived import empty

    if v._schema is not None:
        return v._schema
    if v.name in stack:
        raise ViewError(f"{v.path}: field 'sql': views read each other in a cycle: {' -> '.join([*stack, v.name])}")
    frames = {}
    for n in v.reads:
        frames[n] = pl.DataFrame(schema=_schema(views[n], views, [*stack, v.name])) if n in views else empty(n)
    try:
        from traceql.link import POLARS_ENGINE

        out = pl.SQLContext(frames=frames).execute(v.sql, eager=False).collect(engine=POLARS_ENGINE)
    except (pl.exceptions.PolarsError, ValueError, TypeError) as e:
        raise ViewError(f"{v.path}: field 'sql': {_first(e)}") from None
    got = dict(out.schema)
    extra = set(v.columns) - set(got)
    if extra:
        raise ViewError(f"{v.path}: field 'columns': {sorted(extra)[0]!r} is documented but the query gives no such "
                        f"column; its columns: {', '.join(got)}")
    v._schema = got
    return got


def _first(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def frame(run, name: str, views: dict[str, View]) -> pl.DataFrame:
    """The view's rows for this run, built once (over every rank) and kept in run.tables; where the run has a
    derived-table cache (a cached check), kept there too, so that a warm re-check reads the rows instead of running
    the query again (a join of runtime and kernels over 8 x 216k events: 0.10 CPU s to build, 0.02 to read)."""
    from traceql import link

    if name in run.tables:
        return run.tables[name]
    v = views[name]
    sql_guard.check(v.sql, v.reads)  # checked at load; again here, where it runs (memoised by its text)
    entry = cache_name(v, views) if run.derived_cache is not None else None
    if entry is not None:
        from traceql import cache

        hit = cache.load_derived(run.derived_cache, entry)
        if hit is not None:
            run.tables[name] = hit[0]
            return hit[0]
    frames = {n: frame(run, n, views) if n in views else link.ensure(run, n) for n in v.reads}
    out = pl.SQLContext(frames=frames).execute(v.sql, eager=False).collect(engine=link.POLARS_ENGINE)
    run.tables[name] = out
    if entry is not None:
        from traceql import cache

        cache.store_derived(run.derived_cache, entry, out, [])
    return out


def cache_name(v: View, views: dict[str, View]) -> str | None:
    """The view's entry in a run's derived-table cache: its name and a digest of what its rows depend on beyond the
    run's sources and the linking code, which the cache folder's key covers (traceql.cache.run_dir): its SQL, the
    views it reads (theirs, in turn) and polars, which runs the SQL. None where it reads, at any depth, a table of the
    sources' statuses, which that key does not cover (link.ensure caches none of those either)."""
    import hashlib

    from traceql import link

    h = hashlib.blake2b(f"{pl.__version__}\0{v.sql}".encode(), digest_size=12)
    for n in v.reads:
        if n in link.UNCACHED:
            return None
        if n in views:
            sub = cache_name(views[n], views)
            if sub is None:
                return None
            h.update(f"\0{sub}".encode())
    return f"view-{v.name}-{h.hexdigest()}"
