"""`traceql query RUN_DIR "SQL"`: polars SQL over the canonical tables and, built only when named, the derived ones."""

from __future__ import annotations

import re

import orjson
import polars as pl

from traceql import link
from traceql.model import SCHEMAS, Run
from traceql.rules import sql_guard
from traceql.model.text_safety import visible


class QueryError(ValueError):
    """A query that cannot run; the message names the valid tables (and the columns of those it used)."""


def _views() -> dict:
    """The rule pack's named views (rules/views/): queries read them like tables."""
    from traceql.rules.loader import default_rules_dir, views_of

    return views_of([default_rules_dir()])


def table_names(run: Run) -> list[str]:
    return sorted(set(SCHEMAS) | set(run.tables) | set(link.derived_tables()) | set(_views()))


def named_tables(sql: str, names: list[str]) -> list[str]:
    """Tables the query mentions: a name as a whole SQL identifier, quoted or not, outside string literals."""
    text = re.sub(r"'(?:[^']|'')*'", "''", sql)
    words = {w.lower() for w in re.findall(r'"([^"]+)"|([A-Za-z_][A-Za-z0-9_]*)', text) for w in w if w}
    return [n for n in names if n.lower() in words]


def query(run: Run, sql: str) -> pl.DataFrame:
    if not sql.strip():
        raise QueryError("empty query; e.g. SELECT rank, count(*) FROM kernels GROUP BY rank")
    names = table_names(run)
    try:  # only the run's tables: polars' table functions (read_csv, read_parquet, ...) would read any file
        sql_guard.check(sql, names)
    except sql_guard.SqlRefused as e:
        raise QueryError(f"refused: {e}") from None
    used = named_tables(sql, names)
    ctx = pl.SQLContext()
    for n in SCHEMAS:
        ctx.register(n, run.table(n).lazy())
    views = _views()
    for n in used:
        if n not in SCHEMAS:
            try:
                if n in views and n not in link.derived_tables():
                    from traceql.rules.views import frame

                    ctx.register(n, frame(run, n, views).lazy())
                    continue
                ctx.register(n, link.ensure(run, n).lazy())
            except Exception as e:  # a derived table that cannot be built names itself, not a polars trace
                raise QueryError(f"cannot build derived table {n!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        return ctx.execute(sql, eager=True)
    except (pl.exceptions.PolarsError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        low = first.lower()
        if "relation" in low and "not found" in low or not used:
            hint = f"valid tables: {', '.join(names)}"
        elif "valid columns" in low:
            hint = ""  # polars named them already
        else:
            hint = "columns: " + "; ".join(f"{n}({', '.join(_columns(run, n))})" for n in used)
        raise QueryError(f"{first}; {hint}" if hint else first) from None


def _columns(run: Run, name: str) -> list[str]:
    return run.table(name).columns if name in run.tables or name in SCHEMAS else link.ensure(run, name).columns


def _plain(df: pl.DataFrame) -> pl.DataFrame:
    """Nested columns (lists, structs) as JSON text, for CSV and tables."""
    conv = []
    for c, t in df.schema.items():
        if isinstance(t, (pl.List, pl.Struct, pl.Array)):
            conv.append(pl.col(c).map_elements(lambda v: orjson.dumps(v.to_list() if isinstance(v, pl.Series) else v).decode(), return_dtype=pl.Utf8).alias(c))
    return df.with_columns(conv) if conv else df


def render(df: pl.DataFrame, fmt: str, max_rows: int = 200) -> str:
    if fmt == "json":
        return orjson.dumps(df.to_dicts(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
    if fmt == "csv":
        return _plain(df).write_csv()
    # text cells come from the inputs: control characters shown as escapes, so a kernel name cannot drive the terminal
    shown = _plain(df.head(max_rows))
    shown = shown.with_columns(pl.col(c).map_elements(visible, return_dtype=pl.Utf8)
                               for c, t in shown.schema.items() if t == pl.Utf8)
    with pl.Config(tbl_rows=shown.height, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=240, tbl_hide_dataframe_shape=True):
        text = str(shown)
    more = f"\n({df.height} rows; first {max_rows} shown; --format csv for all)" if df.height > max_rows else f"\n({df.height} rows)"
    return text + more + "\n"
