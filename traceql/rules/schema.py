"""Load-time checks of a rule against the declared schemas (model/tables.py, model/derived.py, rules/views/).

A rule's names are checked before any run is read: the tables it selects or its SQL reads, the columns of its
where/per/column/key/value/against/span, and everything it reads from its output (condition, message fields,
evidence, location, collapse, ranks_column, step_column). The output columns are not guessed: the rule's own
selection runs, through the engine, on a run whose every table is an empty frame of its declared schema (SQL through
polars' SQLContext on those frames), and the columns of the result are what the rule can use. A typo therefore fails
at load, naming the file, the field and the valid choices, instead of printing "unknown" or dropping evidence.
The bundled pack's manifest (rules.manifest) records each file's outputs, so an unchanged file is not run again;
its names are still checked against them (check_reads).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from traceql.model import Run
from traceql.model.derived import DERIVED, SCHEMAS, empty
from traceql.rules import compose, engine, sql_guard
from traceql.rules.condition import ConditionError, compile_condition
from traceql.rules.views import ViewError, _first
from traceql.rules.yamlfile import RuleError

if TYPE_CHECKING:
    from traceql.rules.loader import Rule

# what the engine adds to a finding's row besides the selection's columns
_COLLAPSE_EXTRA = ("steps", "n_rows")


def _err(rule: Rule, fld: str, msg: str) -> RuleError:
    return RuleError(f"{rule.path}: field '{fld}': {msg}")


def _choices(name: str, valid) -> str:
    valid = sorted(set(valid))
    import difflib  # only for an error's suggestion

    close = difflib.get_close_matches(name, valid, n=1)
    return (f"did you mean {close[0]!r}? " if close else "") + f"valid: {', '.join(valid)}"


def table_schema(name: str, views: dict) -> dict[str, pl.DataType] | None:
    if name in SCHEMAS or name in DERIVED:
        from traceql.model.derived import schema

        return schema(name)
    if name in views:
        return _view_schema(views[name])
    return None


def _view_schema(v) -> dict[str, pl.DataType]:
    try:  # inferred on first use where the manifest vouched for the views: a view error is still a rule pack error
        return v.schema
    except ViewError as e:
        raise RuleError(str(e)) from None


def _known_tables(views: dict) -> set[str]:
    return set(SCHEMAS) | set(DERIVED) | set(views)


_EMPTY: dict[str, pl.DataFrame] = {}
_EMPTY_VIEWS: dict[int, tuple[dict, dict[str, pl.DataFrame]]] = {}


def schema_run(views: dict) -> Run:
    """A run whose every canonical and derived table is an empty frame of its declared schema."""
    if not _EMPTY:  # frames are immutable: one set serves every rule
        _EMPTY.update({n: empty(n) for n in [*SCHEMAS, *DERIVED]})
    tables = dict(_EMPTY)
    held = _EMPTY_VIEWS.get(id(views))
    if held is None or held[0] is not views:  # one set per views dict (the loader shares one across the pack)
        held = (views, {n: pl.DataFrame(schema=_view_schema(v)) for n, v in views.items()})
        _EMPTY_VIEWS.clear()
        _EMPTY_VIEWS[id(views)] = held
    tables.update(held[1])
    return Run(path=Path("<declared schemas>"), tables=tables)


def _check_cols(rule: Rule, fld: str, cols, schema: dict, where: str) -> None:
    for c in cols:
        if c not in schema:
            raise _err(rule, fld, f"{where} has no column {c!r}; {_choices(str(c), schema)}")


def _check_select_names(rule: Rule, fld: str, s: dict, views: dict) -> None:
    """Tables and input columns of a selection, with the field that names them."""
    if s["measure"] == "join":
        _check_select_names(rule, f"{fld}.left", s["left"], views)
        _check_select_names(rule, f"{fld}.right", s["right"], views)
        return
    t = s["table"]
    sch = table_schema(t, views)
    if sch is None:
        raise _err(rule, f"{fld}.table", f"unknown table {t!r}; {_choices(t, _known_tables(views))}")
    span = s.get("span")
    _check_cols(rule, f"{fld}.span", span or [], sch, f"table {t}")
    if span:  # the span columns stand in for ts and end
        sch = {**{c: d for c, d in sch.items() if c not in ("ts", "end")}, "ts": pl.Int64, "end": pl.Int64}
    _check_cols(rule, f"{fld}.where", (s.get("where") or {}).keys(), sch, f"table {t}")
    per = s.get("per") or ["rank"]
    if s["measure"] in ("count", "sum", "union", "overlap", "exposed", "gaps"):  # the measures that group by per
        _check_cols(rule, f"{fld}.per", per, sch, f"table {t}")
    if s["measure"] in ("sum", "spread") and s.get("column") is not None:
        _check_cols(rule, f"{fld}.column", [s["column"]], sch, f"table {t}")
    if s["measure"] == "distinct":
        _check_cols(rule, f"{fld}.key", s.get("key") or [], sch, f"table {t}")
        _check_cols(rule, f"{fld}.value", [s["value"]], sch, f"table {t}")
    if s["measure"] in ("union", "overlap", "exposed", "gaps"):
        _check_cols(rule, f"{fld}.table", ["ts", "end"], sch, f"table {t} (an interval measure reads ts and end; "
                    "name others with span: [start, end])")
    ag = s.get("against")
    if s["measure"] in ("overlap", "exposed") and ag:
        at = ag["table"]
        asch = table_schema(at, views)
        if asch is None:
            raise _err(rule, f"{fld}.against.table", f"unknown table {at!r}; {_choices(at, _known_tables(views))}")
        _check_cols(rule, f"{fld}.against.span", ag.get("span") or [], asch, f"table {at}")
        if ag.get("span"):
            asch = {**asch, "ts": pl.Int64, "end": pl.Int64}
        _check_cols(rule, f"{fld}.against.where", (ag.get("where") or {}).keys(), asch, f"table {at}")
        _check_cols(rule, f"{fld}.against", [c for c in per if c != "source"], asch, f"table {at} (per)")


def output(rule: Rule) -> pl.DataFrame:
    """The rule's selection (or SQL) run on empty frames of the declared schemas: an empty frame of its output."""
    views = rule.views or {}
    run = schema_run(views)
    params = rule.defaults()
    if rule.select is not None:
        _check_select_names(rule, "select", rule.select, views)
        try:
            return engine.run_select(run, rule.select, params, views)
        except (engine.RuleRunError, compose.StageError, ConditionError) as e:
            raise _err(rule, "select", _first(e)) from None
        except pl.exceptions.PolarsError as e:
            raise _err(rule, "select", f"cannot run on the declared schemas: {_first(e)}") from None
    known = _known_tables(views)
    try:
        sql_guard.check(rule.sql, known)
    except sql_guard.SqlRefused as e:
        raise _err(rule, "sql", str(e)) from None
    for v in rule.uses_views:
        if v not in views:
            raise _err(rule, "views", f"no view {v!r} in the rule pack; {_choices(str(v), views)}")
    from traceql.rules.views import named

    frames = {n: run.tables[n] for n in named(rule.sql, sorted(known))}
    try:
        out = engine.execute_sql(pl.SQLContext(frames=frames), rule.sql)  # CTEs one by one, as at run time
    except (pl.exceptions.PolarsError, ValueError, TypeError) as e:
        raise _err(rule, "sql", f"cannot run on the declared schemas: {_first(e)}") from None
    if not rule.cross_rank and "rank" not in out.columns:
        out = out.with_columns(pl.lit(None, pl.Int32).alias("rank"))  # the engine adds the partition's rank
    return out


def message_fields(template: str) -> list[str]:
    out = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None:
            out.append(name)
    return out


def check_needs(rule: Rule) -> None:
    known = _known_tables(rule.views or {})
    for need in rule.needs:
        for t in need if isinstance(need, list) else [need]:
            if t not in known:
                raise _err(rule, "needs", f"unknown table {t!r}; {_choices(str(t), known)}")


def outputs(rule: Rule) -> tuple[list[str], list[str] | None]:
    """What the rule's later fields can read, inferred by running it on empty frames (output): the columns of its
    selection's output (the condition reads them) and, after collapse, those of a finding's row (message, evidence,
    location, ranks_column, step_column read these); None where a collapse column is missing (check_reads says so).
    These are what the bundled pack's manifest records per rule file."""
    out = output(rule)
    cols = list(out.columns)
    if not rule.collapse:
        return cols, cols
    if not all(c in out.schema for c in rule.collapse):
        return cols, None
    return cols, list(engine._collapse(out, rule.collapse, rule).columns)


def check_reads(rule: Rule, cols: list[str], collapsed: list[str] | None, step_column_given: bool = True) -> None:
    """Raise RuleError at the first name the rule reads that its output columns (outputs) cannot give."""
    params = rule.defaults()
    if rule.condition:
        try:
            compile_condition(rule.condition, params, cols)
        except ConditionError as e:
            raise _err(rule, "condition", str(e)) from None
    if rule.collapse:
        _check_cols(rule, "collapse", rule.collapse, cols, "the selection's output")
    have = set(cols if collapsed is None else collapsed)
    for name in message_fields(rule.message):
        if name == "":
            raise _err(rule, "message", "positional {} fields are not allowed; name a column or a param, e.g. {rank}")
        if "." in name or "[" in name:
            raise _err(rule, "message", f"field {{{name}}}: attribute and index access are not allowed in messages")
        if name not in have and name not in params:
            raise _err(rule, "message", f"{{{name}}} is neither a column of the selection's output nor a param; "
                                        f"{_choices(name, have | set(params))}")
    for fld, names in (("evidence", rule.evidence), ("location", rule.location)):
        for n in names:
            if n not in have and n not in _COLLAPSE_EXTRA:
                raise _err(rule, fld, f"{n!r} is not a column of the selection's output; {_choices(str(n), have)}")
    if rule.ranks_column not in have:
        raise _err(rule, "ranks_column", f"{rule.ranks_column!r} is not a column of the selection's output; "
                                         f"{_choices(rule.ranks_column, have)}")
    if step_column_given and rule.step_column not in have:
        raise _err(rule, "step_column", f"{rule.step_column!r} is not a column of the selection's output; "
                                        f"{_choices(rule.step_column, have)}")


def validate(rule: Rule, step_column_given: bool = True) -> list[str]:
    """Raise RuleError at the first name the rule reads that its output cannot give; the output columns else."""
    check_needs(rule)
    cols, collapsed = outputs(rule)
    check_reads(rule, cols, collapsed, step_column_given)
    return cols if collapsed is None else collapsed
