"""Evaluate rules over a Run: selection -> measure -> condition -> findings."""

from __future__ import annotations

import functools
import math
import re
import string
import weakref
from typing import TYPE_CHECKING

import polars as pl

from traceql import link
from traceql.link.context import host_context
from traceql.link.ranks import collided_ranks
from traceql.model import Finding, Run
from traceql.model.result import RuleResult
from traceql.model.ranks import format_ranks
from traceql import intervals as measures
from traceql.rules import compose, sql_guard, views as viewsmod
from traceql.rules.condition import ConditionError, compile_condition

if TYPE_CHECKING:
    from traceql.rules.loader import Rule


class RuleRunError(RuntimeError):
    pass


# ---------------------------------------------------------------- selection


def _filter_expr(col: str, cond, schema) -> pl.Expr:
    if col not in schema:
        raise RuleRunError(f"unable to find column {col!r}; valid columns: {list(schema)}")
    c = pl.col(col)
    if isinstance(cond, dict):
        out = pl.lit(True)
        for op, v in cond.items():
            e = {
                "eq": lambda: c == v,
                "ne": lambda: c != v,
                "lt": lambda: c < v,
                "le": lambda: c <= v,
                "gt": lambda: c > v,
                "ge": lambda: c >= v,
                "in": lambda: c.is_in(list(v)),
                "not_in": lambda: ~c.is_in(list(v)),
                "regex": lambda: c.str.contains(str(v)),
                "not_regex": lambda: ~c.str.contains(str(v)).fill_null(False),
                "is_null": lambda: c.is_null() if v else c.is_not_null(),
                "not_null": lambda: c.is_not_null() if v else c.is_null(),
            }[op]()
            out = out & e
        return out
    if isinstance(cond, list):
        return c.is_in(cond)
    if cond is None:
        return c.is_null()
    return c == cond


def table(run: Run, name: str, views: dict | None = None) -> pl.DataFrame:
    """A canonical or derived table, or a named view (rules/views/) of the rule pack."""
    if views and name in views and name not in link.derived_tables():
        return viewsmod.frame(run, name, views)
    return link.ensure(run, name)


def select(run: Run, table_name: str, where: dict | None, keep: list[str] | None = None, views: dict | None = None,
           span: list[str] | None = None) -> pl.DataFrame:
    """Rows of `table_name` matching `where`; with `keep`, only those columns (and the filtered ones) when all of
    `keep` that a measure must have exist, so that filtering does not copy wide columns the measure never reads.
    span: [start, end] columns that interval measures read instead of ts and end (they become ts and end)."""
    df = table(run, table_name, views)
    if span and list(span) != ["ts", "end"]:
        a, b = span
        if a not in df.columns or b not in df.columns:
            raise RuleRunError(f"field 'select.span': no column {a if a not in df.columns else b!r} in {table_name}; "
                               f"valid columns: {list(df.columns)}")
        if {a, b} & {"ts", "end"}:
            df = df.drop([c for c in ("ts", "end") if c in df.columns]).rename({a: "ts", b: "end"})
        else:
            df = pick(df, [c for c in df.columns if c not in ("ts", "end")], {a: "ts", b: "end"})
    if keep is not None and set(keep) | set(where or {}) <= set(df.columns):  # else errors name every column
        wanted = set(keep) | set(where or {}) | {"source", "name"}
        df = pick(df, [c for c in df.columns if c in wanted])
    if where:
        expr = pl.lit(True)
        for col, cond in where.items():
            expr = expr & _filter_expr(col, cond, df.schema)
        if df.height:  # no rows: nothing to filter (the expression is still checked against the columns above)
            df = df.filter(expr.fill_null(False))
    return df


def pick(df: pl.DataFrame, cols: list[str], names: dict[str, str] | None = None) -> pl.DataFrame:
    """The frame's columns `cols` in that order, renamed by `names`: the same columns, no polars query (a select or
    rename of a small frame is a query whose fixed cost is most of a rule's)."""
    names = names or {}
    return pl.DataFrame([df.get_column(c).alias(names.get(c, c)) for c in cols], height=df.height)


def _with_step_time(run: Run, out: pl.DataFrame) -> pl.DataFrame:
    """Per-step outputs get the step's duration (step_ms), so rules can weigh a measure against the step."""
    if not {"rank", "step"} <= set(out.columns) or "step_ms" in out.columns:
        return out
    # the longer of the step's host range and its GPU work's span (link.steps.step_times): the GPU runs behind
    st = pick(link.ensure(run, "step_times"), ["rank", "step", "step_ms"])
    casts = [pl.col(k).cast(out.schema[k]) for k in ("rank", "step") if st.schema[k] != out.schema[k]]
    if casts:
        st = st.with_columns(casts)
    return out.join(st, on=["rank", "step"], how="left")


def _measure(run: Run, rule: Rule, raw_gaps: bool = False, params: dict | None = None) -> pl.DataFrame:
    return run_select(run, rule.select, params if params is not None else rule.defaults(), rule.views, raw_gaps)


def run_select(run: Run, s: dict, params: dict, views: dict | None = None, raw_gaps: bool = False) -> pl.DataFrame:
    """A selection: its measure (or the join of two selections), step times for per-step outputs, then its stages
    (compute, filter, steps, across_ranks, then: [...]; traceql.rules.compose)."""
    if s["measure"] == "join":
        left = run_select(run, s["left"], params, views)
        right = run_select(run, s["right"], params, views)
        out = compose.join(left, right, list(s.get("on") or ["rank", "step"]), s.get("how", "left"), s.get("prefix"))
        out = _with_step_time(run, out)
    else:
        out = _measure_raw(run, s, raw_gaps, views)
        out = _with_step_time(run, out) if s["measure"] != "rows" else out
    for kind, spec in stages(s):
        if kind == "compute":
            out = compose.compute(out, spec, params)
        elif kind == "filter":
            out = compose.keep(out, spec, params)
        elif kind == "steps":
            warm = link.ensure(run, "warmup_steps") if spec.get("skip_warmup") else None
            out = compose.steps(out, spec, warm)
        elif kind == "across_ranks":
            out = compose.across_ranks(out, spec)
    return out


def stages(s: dict) -> list[tuple[str, object]]:
    """The selection's stages in the order they run: the fixed keys first, then the `then` list."""
    out = [(k, s[k]) for k in compose.STAGES if s.get(k) is not None]
    for st in s.get("then") or []:
        out.extend((k, st[k]) for k in compose.STAGES if k in st)
    return out


# Columns the gaps measure adds row by row after the sweep (readable names, what the host was doing). When a
# rule's condition reads none of them, they are added after the condition has kept the few gaps that matter:
# the same rows get the same values, at a fraction of the cost (one as-of join per kept gap, not per gap).
_GAP_LATE = ("prev_name", "next_name", "host_op")


def _finish_gaps(run: Run, out: pl.DataFrame) -> pl.DataFrame:
    cols = out.columns
    out = host_context(run, measures.short_names(out, ["prev_name", "next_name"]))
    if "step_ms" in cols:  # keep the column order of the finished-then-timed frame
        out = out.select([c for c in out.columns if c != "step_ms"] + ["step_ms"])
    return out


def _condition_reads_late_gap_columns(rule: Rule, values: dict, columns: list[str]) -> bool:
    try:
        expr = compile_condition(rule.condition, values, [*columns, *_GAP_LATE, "host_op"])
        return bool(set(expr.meta.root_names()) & set(_GAP_LATE))
    except (ConditionError, pl.exceptions.PolarsError):
        return True  # let the ordinary path report it


def _measure_raw(run: Run, s: dict, raw_gaps: bool = False, views: dict | None = None) -> pl.DataFrame:
    m = s["measure"]
    per = list(s.get("per") or ["rank"])
    interval = m in ("union", "overlap", "exposed", "gaps")
    span = s.get("span")
    df = select(run, s["table"], s.get("where"), keep=[*per, *(span or ["ts", "end"])] if interval else None,
                views=views, span=span)
    if interval and "source" in df.columns and "source" not in per:
        per.append("source")  # intervals from two sources of one rank are on different clocks: never mix them
    if m == "rows":
        return df
    if m == "count":
        return measures.count(df, per)
    if m == "sum":
        return measures.total(df, per, s.get("column", "dur"))
    if m == "union":
        return measures.union(df, per)
    if m in ("overlap", "exposed"):
        ag = s["against"]
        other = select(run, ag["table"], ag.get("where"), keep=[*per, *(ag.get("span") or ["ts", "end"])], views=views,
                       span=ag.get("span"))
        return measures.coverage(df, other, per)
    if m == "gaps":
        out = measures.gaps(df, per, shorten=False)
        return out if raw_gaps else _finish_gaps(run, out)
    if m == "spread":
        return measures.spread(df, s["column"], s.get("agg", "median"), float(s.get("scale", 1.0)))
    if m == "distinct":
        return measures.distinct(df, list(s["key"]), s["value"])
    raise RuleRunError(f"measure {m!r} unknown")


def _rank_slices(df: pl.DataFrame) -> dict[int, tuple[int, int]] | None:
    """rank -> (offset, length) when every rank's rows are one contiguous block, else None."""
    runs = df.select(pl.col("rank").rle()).unnest("rank")
    out: dict[int, tuple[int, int]] = {}
    off = 0
    for ln, v in runs.select("len", "value").iter_rows():
        if v is not None:
            if v in out:
                return None
            out[v] = (off, ln)
        off += ln
    return out


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GAP = re.compile(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", re.DOTALL)


# where _close must look: quotes, parentheses and comment openers (everything between them is skipped at once)
_CLOSE_TOKEN = re.compile(r"['\"()]|--|/\*")


def _close(sql: str, i: int) -> int | None:
    """The index of the ")" that closes the "(" at i, stepping over strings, quoted names and comments."""
    depth = 0
    while (m := _CLOSE_TOKEN.search(sql, i)) is not None:
        i, c = m.start(), m.group()
        if c in "'\"":
            j = sql.find(c, i + 1)
            while j >= 0 and sql[j + 1:j + 2] == c:  # '' inside a string, "" inside a name
                j = sql.find(c, j + 2)
            if j < 0:
                return None
            i = j + 1
        elif c in ("--", "/*"):
            end = _GAP.match(sql, i).end()
            if end == i:  # an unterminated /* comment: nothing closes after it
                return None
            i = end
        elif c == "(":
            depth += 1
            i += 1
        else:
            depth -= 1
            if depth == 0:
                return i
            i += 1
    return None


def split_ctes(sql: str) -> tuple[list[tuple[str, str]], str] | None:
    """`WITH a AS (...), b AS (...) SELECT ...` as its CTEs [(name, body)] and the final statement; None where the
    statement has no leading WITH of that plain form (RECURSIVE, column lists: polars runs those whole)."""
    parts = _split_ctes(sql)
    return None if parts is None else (list(parts[0]), parts[1])


@functools.lru_cache(maxsize=1024)
def _split_ctes(sql: str) -> tuple[tuple[tuple[str, str], ...], str] | None:
    # kept per statement text: a per-rank rule splits the same SQL once per rank, and rule load splits it too
    i = _GAP.match(sql).end()
    if sql[i:i + 4].lower() != "with" or not sql[i + 4:i + 5].isspace():
        return None
    i += 4
    ctes = []
    while True:
        m = _IDENT.match(sql, _GAP.match(sql, i).end())
        if not m:
            return None
        i = _GAP.match(sql, m.end()).end()
        if sql[i:i + 2].lower() != "as" or not sql[i + 2:i + 3].isspace() and sql[i + 2:i + 3] != "(":
            return None
        i = _GAP.match(sql, i + 2).end()
        j = _close(sql, i) if sql[i:i + 1] == "(" else None
        if j is None:
            return None
        ctes.append((m.group(0), sql[i + 1:j]))
        i = _GAP.match(sql, j + 1).end()
        if sql[i:i + 1] != ",":
            return tuple(ctes), sql[i:]
        i += 1


def execute_sql(ctx: pl.SQLContext, query: str) -> pl.DataFrame:
    """The query's rows. Its CTEs run level by level (cte_steps), each result registered as a table for the next: polars
    plans a statement whose CTEs read each other more than once as a tree, whose size doubles with each such level (20
    CTEs of that kind took seconds on 60 rows), where running them in turn costs their sum."""
    return execute_sql_all([ctx], query)[0]


def execute_sql_all(ctxs: list[pl.SQLContext], query: str) -> list[pl.DataFrame]:
    """execute_sql in each context (a per-rank rule's rank partitions): each step of every context in one collect_all,
    so the partitions run side by side on polars' threads instead of one small query after another."""
    steps = cte_steps(query)
    for step in steps[:-1]:
        dfs = pl.collect_all([c.execute(body, eager=False) for _, body in step for c in ctxs], engine=link.POLARS_ENGINE)
        _register(step, ctxs, dfs)
    return pl.collect_all([c.execute(final, eager=False) for _, final in steps[-1] for c in ctxs],
                          engine=link.POLARS_ENGINE)


def _register(step, ctxs: list[pl.SQLContext], dfs: list[pl.DataFrame]) -> None:
    """A step's CTE results, each registered under its name in the context it ran in (plans are ordered CTE by CTE,
    then context by context)."""
    it = iter(dfs)
    for name, _ in step:
        for c in ctxs:
            c.register(name, next(it))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=1024)
def cte_steps(query: str) -> tuple[tuple[tuple[str | None, str], ...], ...]:
    """The statement as steps that run one after another: its CTEs grouped by dependency level, those of one level
    reading none of the others' names (so they run side by side, in one collect_all), then the final SELECT (name
    None). Each CTE sees exactly the tables it saw run one by one in text order: of two CTEs where either names the
    other (or both have one name, or the earlier names a table the later one shadows), the later runs a step after.
    Names are matched as words anywhere in the text, strings and comments included: a word too many only orders two
    CTEs that could have run together. A statement without a plain leading WITH (split_ctes) is one step."""
    parts = split_ctes(query)
    if parts is None:
        return (((None, query),),)
    ctes, final = parts
    names = [n.lower() for n, _ in ctes]
    words = [{w.lower() for w in _WORD.findall(body)} for _, body in ctes]
    level: list[int] = []
    for j in range(len(ctes)):
        lv = 0
        for i in range(j):
            if names[i] in words[j] or names[j] in words[i] or names[i] == names[j]:
                lv = max(lv, level[i] + 1)
        level.append(lv)
    steps = [tuple(c for c, lv in zip(ctes, level) if lv == k) for k in range(max(level) + 1)]
    return (*steps, ((None, final),))


# ranks of a per-rank rule run together (execute_sql_all): enough to fill the threads, few enough that their CTEs'
# intermediate rows stay small beside the tables
RANK_BATCH = 16
_PARTS: dict[int, tuple] = {}  # id(frame) -> (weakref to it, its ranks, its rank slices): see _partitions


def _partitions(df: pl.DataFrame) -> tuple[list[int], dict[int, tuple[int, int]] | None]:
    """The frame's ranks and rank slices (_rank_slices), worked out once per frame: every per-rank rule over a table
    asks again, and tables do not change once built. Kept while the frame lives (a weak reference)."""
    hit = _PARTS.get(id(df))
    if hit is not None and hit[0]() is df:
        return hit[1], hit[2]
    key = id(df)
    ref = weakref.ref(df, lambda _, k=key: _PARTS.pop(k, None))
    ranks = df["rank"].drop_nulls().unique().to_list()
    _PARTS[key] = (ref, ranks, _rank_slices(df))
    return ranks, _PARTS[key][2]


class _SqlRun:
    """One SQL rule's statement over the run, step by step (cte_steps): plans() gives the current step's plans (each
    CTE of the step in each context: the run's tables for a cross-rank rule, else one per rank of the current batch of
    RANK_BATCH ranks), take() their results, until `result` holds the rule's rows. Run alone (_sql), or side by side
    with the other SQL rules of a run (run_rules), whose plans of one step go to polars in one collect_all."""

    def __init__(self, run: Run, rule: Rule):
        query = rule.sql
        known = set(run.tables) | set(link.derived_tables()) | set(rule.views or {})
        read: set[str] = set()
        try:  # again here, with the run's table names: only those reach polars, and no table function does
            sql_guard.check(query, known, read)
        except sql_guard.SqlRefused as e:
            raise RuleRunError(f"field 'sql': {e}") from None
        names = [n for n in sorted(known) if n.lower() in read]  # views.named, from the check's own reading
        self.frames = {n: table(run, n, rule.views) for n in names}
        self.steps = cte_steps(query)
        self.result: pl.DataFrame | None = None
        self.failed = False  # its plans or results failed beside other rules' (_run_side_by_side)
        self._outs: list[pl.DataFrame] = []
        if rule.cross_rank:
            self._batches: list[list[int] | None] = [None]
        else:
            self._parts = {n: _partitions(df) for n, df in self.frames.items() if "rank" in df.columns}
            ranks = sorted({r for rs, _ in self._parts.values() for r in rs})
            self._batches = [ranks[i:i + RANK_BATCH] for i in range(0, len(ranks), RANK_BATCH)]
        self._b = -1
        self._next_batch()

    def rows(self) -> int:
        """The rows of the tables it reads: what decides whether it runs beside other rules (their steps' results are
        held together)."""
        return sum(df.height for df in self.frames.values())

    def _next_batch(self) -> None:
        self._b += 1
        self._s = 0
        if self._b == len(self._batches):
            if self._batches == [None]:  # cross-rank: the statement's rows as they are, even none
                self.result = self._outs[0]
            else:
                self.result = pl.concat(self._outs, how="diagonal_relaxed") if self._outs else pl.DataFrame()
            return
        batch = self._batches[self._b]
        self._ctxs = [pl.SQLContext(frames=self.frames)] if batch is None else [pl.SQLContext(frames=self._part(r))
                                                                                for r in batch]

    def _part(self, r: int) -> dict[str, pl.LazyFrame]:
        # lazy partitions: the query's own filters and projections reach the scan; where a table holds each rank in one
        # block of rows (the usual case), the partition is that block (a zero-copy slice), else a filter
        part = {}
        for n, df in self.frames.items():
            if "rank" not in df.columns:
                part[n] = df.lazy()
            elif self._parts[n][1] is not None:
                off, ln = self._parts[n][1].get(r, (0, 0))
                part[n] = df.slice(off, ln).lazy()
            else:
                part[n] = df.lazy().filter(pl.col("rank") == r)
        return part

    def plans(self) -> list[pl.LazyFrame]:
        return [c.execute(body, eager=False) for _, body in self.steps[self._s] for c in self._ctxs]

    def take(self, dfs: list[pl.DataFrame]) -> None:
        step = self.steps[self._s]
        if step[0][0] is not None:
            _register(step, self._ctxs, dfs)
            self._s += 1
            return
        batch = self._batches[self._b]
        if batch is None:
            self._outs.append(dfs[0])
        else:
            for r, res in zip(batch, dfs):
                if res.height:
                    if "rank" not in res.columns:
                        res = res.with_columns(pl.lit(r, pl.Int32).alias("rank"))
                    self._outs.append(res)
        self._next_batch()


def _sql(run: Run, rule: Rule, job: _SqlRun | None = None) -> pl.DataFrame:
    """The rule's SQL rows: the job's (prepared, or run side by side already), else a job of its own."""
    job = job or _SqlRun(run, rule)
    while job.result is None:
        job.take(pl.collect_all(job.plans(), engine=link.POLARS_ENGINE))
    return job.result


# SQL rules run side by side (run_rules) where the tables they read hold at most this many rows in all: there the fixed
# cost of a polars query (a fraction of a millisecond) is most of a rule's cost, and a step's intermediate rows of
# every rule held at once stay small. Larger inputs run one rule at a time, as each rule's work then dominates.
BATCH_ROWS = 250_000


def _run_side_by_side(jobs: list[_SqlRun]) -> None:
    """Every job's steps, the current step of each in one collect_all, until each has its result. A job whose plans
    or results fail is dropped (result None): its rule runs again alone, where its own error is reported as it would
    be without the others; the others go on."""
    active = list(jobs)
    while active:
        plans: list[pl.LazyFrame] = []
        mine: list[tuple[_SqlRun, int]] = []
        for job in active:
            try:
                ps = job.plans()
            except Exception:
                job.failed = True
                continue
            mine.append((job, len(ps)))
            plans.extend(ps)
        try:
            dfs = pl.collect_all(plans, engine=link.POLARS_ENGINE)
        except Exception:  # one of them fails: each on its own, to find which
            for job, _ in mine:
                try:
                    job.take(pl.collect_all(job.plans(), engine=link.POLARS_ENGINE))
                except Exception:
                    job.failed = True
        else:
            i = 0
            for job, n in mine:
                try:
                    job.take(dfs[i:i + n])
                except Exception:
                    job.failed = True
                i += n
        active = [j for j in active if j.result is None and not j.failed]


# ---------------------------------------------------------------- findings


# A message stays readable: a list longer than this is cut ("and 40 more"), the whole list going to the evidence
MAX_LIST_ITEMS = 5
# a text value longer than this (a list built by a link table, a long reason) is cut, the whole text to the evidence
MAX_VALUE_CHARS = 400
# Stands in for a missing value while a message is formatted; the clause holding it is dropped afterwards
_MISSING = "\ue000"
_RANK_TEXT = re.compile(r"\[?\s*\d+(\s*,\s*\d+)*\s*\]?")


class _SafeFormatter(string.Formatter):
    """str.format without attribute or index access, tolerant of missing or null values, and keeping messages short.

    A missing or null value never shows as a placeholder: the clause that holds it is left out (see _drop_missing).
    Lists show their first MAX_LIST_ITEMS items and how many more there are (rank and step lists as ranges, "0-3, 7");
    long "; "-separated texts show their first items and how many more. `shortened` collects the fields that were
    cut, so that the finding's evidence can carry them whole."""

    def __init__(self):
        super().__init__()
        self.shortened: set[str] = set()

    def get_field(self, field_name, args, kwargs):
        if "." in field_name or "[" in field_name:
            raise ValueError(f"field {field_name!r}: attribute and index access are not allowed in messages")
        return (field_name, kwargs.get(field_name)), field_name

    def convert_field(self, value, conversion):
        name, v = value  # get_field hands on (name, value): the name decides how a list reads
        return name, (v if v is None else super().convert_field(v, conversion))

    def format_field(self, value, format_spec):
        name, value = value
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return _MISSING
        if isinstance(value, (list, tuple)):
            return self._list(name, list(value))
        if isinstance(value, str) and name.endswith("ranks") and _RANK_TEXT.fullmatch(value):
            # ranks a link table joined into text ("0,1,2,...,1023"): as ranges, like a list of ranks
            return self._list(name, [int(x) for x in re.findall(r"\d+", value)])
        try:
            out = format(value, format_spec)
        except (ValueError, TypeError):
            out = str(value)
        out = out.replace(_MISSING, "")  # a value from a trace cannot pose as a missing one
        return self._text(name, out) if isinstance(value, str) else out

    def _list(self, name: str, items: list) -> str:
        items = [x for x in items if x is not None]
        if not items:
            return "none"
        if name.endswith(("ranks", "steps", "rank", "step")) and all(isinstance(x, int) for x in items):
            runs = format_ranks(items).split(", ")
            if len(runs) <= MAX_LIST_ITEMS:
                return ", ".join(runs)
            self.shortened.add(name)
            shown = runs[:MAX_LIST_ITEMS]
            rest = len(set(items)) - sum(_run_len(r) for r in shown)
            return f"{', '.join(shown)} and {rest} more"
        if len(items) <= MAX_LIST_ITEMS:
            return ", ".join(str(x) for x in items)
        self.shortened.add(name)
        return f"{', '.join(str(x) for x in items[:MAX_LIST_ITEMS])} and {len(items) - MAX_LIST_ITEMS} more"

    def _text(self, name: str, text: str) -> str:
        parts = text.split("; ")
        keep = min(len(parts), MAX_LIST_ITEMS)
        # whole items, as many as fit (at least one): a cut inside an item reads as a wrong value
        while keep > 1 and len("; ".join(parts[:keep])) > MAX_VALUE_CHARS:
            keep -= 1
        if keep < len(parts):
            self.shortened.add(name)
            text = "; ".join(parts[:keep]) + f"; and {len(parts) - keep} more"
        if len(text) > MAX_VALUE_CHARS + 40:
            self.shortened.add(name)
            text = text[:MAX_VALUE_CHARS].rstrip() + "... (the whole text is in the evidence)"
        return text


def _run_len(run: str) -> int:
    a, _, b = run.partition("-")
    return int(b) - int(a) + 1 if b else 1


def _clause_start(msg: str, i: int) -> tuple[int, str]:
    """The delimiter that opens the clause holding position i: the nearest ", " or "; " or unclosed "(" before it,
    skipping parentheses that close before i ("rank(s)")."""
    depth = 0
    for j in range(i - 1, -1, -1):
        ch = msg[j]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                return j, "("
            depth -= 1
        elif depth == 0 and msg[j:j + 2] in (", ", "; "):
            return j, msg[j:j + 2]
    return -1, ""


def _clause_end(msg: str, i: int) -> tuple[int, str]:
    """The delimiter that ends the clause holding position i: the next "," or ";" or ")" at its depth, or " (" that
    opens a parenthesis after it."""
    depth = 0
    for j in range(i + 1, len(msg)):
        ch = msg[j]
        if ch == "(":
            if depth == 0 and msg[j - 1] == " ":
                return j - 1, " ("
            depth += 1
        elif ch == ")":
            if depth == 0:
                return j, ")"
            depth -= 1
        elif depth == 0 and ch in ",;":
            return j, ch
    return len(msg), ""


def _drop_missing(msg: str) -> str:
    """The message without the clauses that hold a missing value.

    A clause runs from the delimiter before the value (", ", "; " or an opening parenthesis) to the next one
    (",", ";", ")" or " ("): "(4% overlapped, ? ms step; median ...)" becomes "(4% overlapped; median ...)", and a
    parenthesis holding nothing else goes entirely. A value with no clause around it (the subject of the sentence)
    reads "unknown"."""
    while _MISSING in msg:
        i = msg.index(_MISSING)
        p, d = _clause_start(msg, i)
        q, x = _clause_end(msg, i)
        if p < 0 or (d == "(" and x in (" (", "")):
            msg = msg[:i] + "unknown" + msg[i + 1:]
        elif d == "(" and x == ")":
            start = p - 1 if p > 0 and msg[p - 1] == " " else p
            msg = msg[:start] + msg[q + 1:]
        elif d == "(":  # the first clause inside a parenthesis: drop it and the delimiter after it
            end = q + 1
            while end < len(msg) and msg[end] == " ":
                end += 1
            msg = msg[:p + 1] + msg[end:]
        else:
            msg = msg[:p] + msg[q:]
    return msg


def format_message(template: str, values: dict) -> tuple[str, set[str]]:
    """The rule's message for one row, and the fields shortened in it (their whole values belong in the evidence)."""
    fmt = _SafeFormatter()
    msg = fmt.format(template, **values)
    return _drop_missing(msg), fmt.shortened


def _jsonable(v):
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 4)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def _collapse(df: pl.DataFrame, keys: list[str], rule: Rule) -> pl.DataFrame:
    aggs = [pl.len().alias("n_rows")]
    for c in df.columns:
        if c in keys:
            continue
        dt = df.schema[c]
        if c == rule.step_column:
            aggs.append(pl.col(c).drop_nulls().unique().sort().alias("steps"))
            aggs.append(pl.col(c).min().alias(c))
        elif dt.is_numeric():
            aggs.append(pl.col(c).median().alias(c))
            aggs.append(pl.col(c).max().alias(f"{c}_max"))
            aggs.append(pl.col(c).sum().alias(f"{c}_total"))
        elif dt == pl.Utf8:
            # the most frequent value, ties by first appearance: "the host was in X" for most of the gaps
            aggs.append(pl.col(c).drop_nulls().mode().sort().first().alias(c))
        else:
            aggs.append(pl.col(c).first().alias(c))
    return df.group_by(keys, maintain_order=True).agg(aggs)


def _present(run: Run, table: str) -> bool:
    """Whether the run has rows of `table`: here, or on the rank tasks' workers (Run.held, traceql.executor)."""
    if run.held.get(table, 0) > 0:
        return True
    return (run.rows(table) if table in run.tables else link.ensure(run, table).height) > 0  # rows: read nothing


def rows(run: Run, rule: Rule, params: dict | None = None) -> pl.DataFrame | None:
    """The numbers a rule's YAML computes, every row before its condition (None where the rule cannot run here): what
    reports show beside the findings, so that a table and a finding never disagree."""
    values = {**rule.defaults(), **(params or {})}
    if not any(all(_present(run, t) for t in need) for need in rule.need_sets()):
        return None
    try:
        out = _measure(run, rule, params=values) if rule.select is not None else _sql(run, rule)
    except (ConditionError, RuleRunError, compose.StageError, pl.exceptions.PolarsError):
        return None
    return out


def _precheck(run: Run, rule: Rule) -> RuleResult | None:
    """The rule's result where it cannot run on this run (skipped, with the reason), else None."""
    # needs: any one of the need sets must be fully present
    missing_sets = []
    for need in rule.need_sets():
        missing = [t for t in need if not _present(run, t)]
        if not missing:
            missing_sets = []
            break
        missing_sets.append(missing)
    if missing_sets:
        miss = " or ".join("+".join(m) for m in missing_sets)
        return RuleResult(rule, "skipped", f"needs {miss}: no source in this run provides it")
    clash = collided_ranks(run) if rule.cross_rank or (rule.select or {}).get("measure") in ("spread", "distinct") else []
    if clash:
        # the colliding sources' ranks cannot be matched with the other ranks' run: comparing them would report
        # another run's rank as a straggler or a desync (link.ranks)
        return RuleResult(rule, "skipped", f"compares ranks, and rank(s) {format_ranks(clash)} are claimed by several "
                                           "sources (TQL001 rank-collision); check each run on its own")
    return None


_RULE_ERRORS = (ConditionError, RuleRunError, compose.StageError, pl.exceptions.PolarsError)


def evaluate(run: Run, rule: Rule, params: dict | None = None) -> RuleResult:
    pre = _precheck(run, rule)
    return pre if pre is not None else _evaluate(run, rule, {**rule.defaults(), **(params or {})})


def _evaluate(run: Run, rule: Rule, values: dict, job: _SqlRun | None = None) -> RuleResult:
    """A rule that can run here (_precheck): its rows (job: its SQL prepared, or run already), its condition and
    collapse, and a finding per row left."""
    try:
        # gaps' late columns (what the host was doing) are added after the condition, where no stage comes between
        gaps_late = rule.select is not None and rule.select["measure"] == "gaps" and not stages(rule.select)
        if rule.select is not None:
            out = _measure(run, rule, raw_gaps=gaps_late, params=values)
        else:
            out = _sql(run, rule, job)
        if gaps_late and (not rule.condition or _condition_reads_late_gap_columns(rule, values, out.columns)):
            out = _finish_gaps(run, out)
            gaps_late = False
        if out.height and rule.condition:
            out = out.filter(compile_condition(rule.condition, values, out.columns).fill_null(False))
        if gaps_late:
            out = _finish_gaps(run, out)
        if out.height and rule.collapse:
            out = _collapse(out, rule.collapse, rule)
    except _RULE_ERRORS as e:
        return _error(rule, e)
    findings = []
    for row in out.iter_rows(named=True):
        ctx = {**values, **row}
        try:
            msg, shortened = format_message(rule.message, ctx)
        except (ValueError, KeyError) as e:
            return RuleResult(rule, "error", f"{rule.path.name}: field 'message': {e}")
        ranks = row.get(rule.ranks_column)
        if ranks is None:
            ranks = []
        elif not isinstance(ranks, list):
            ranks = [ranks]
        ranks = sorted({int(r) for r in ranks if r is not None})
        step = row.get(rule.step_column)
        evidence = {k: _jsonable(row.get(k)) for k in rule.evidence if k in row}
        for k in ("steps", "n_rows"):
            if k in row:
                evidence[k] = _jsonable(row[k])
        for k in sorted(shortened):  # what the message cut short, whole
            if k not in evidence and k in ctx:
                evidence[k] = _jsonable(ctx[k])
        loc = {k: _jsonable(row.get(k)) for k in rule.location if k in row}
        findings.append(
            Finding(
                rule=rule.id,
                name=rule.name,
                severity=rule.severity,
                message=msg,
                ranks=ranks,
                step=int(step) if isinstance(step, (int, float)) and not (isinstance(step, float) and math.isnan(step)) else None,
                evidence=evidence,
                sources=run.source_paths(ranks or None),
                location=loc,
            )
        )
    return RuleResult(rule, "ran", findings=findings)


def _error(rule: Rule, e: Exception) -> RuleResult:
    return RuleResult(rule, "error", f"{rule.path.name}: {type(e).__name__}: {str(e).splitlines()[0]}")


def _internal(rule: Rule, e: Exception) -> RuleResult:
    first = (str(e).splitlines() or [""])[0]
    return RuleResult(rule, "error", f"{rule.path.name}: internal error ({type(e).__name__}: {first}); please report it "
                                     "with the run")


def run_rules(run: Run, rules: list[Rule], overrides: dict[str, dict] | None = None) -> list[RuleResult]:
    """Every rule's result, in the rules' order. Rules are taken in that order (the tables they read are built in it,
    so that notes keep their order); a SQL rule over small tables (BATCH_ROWS) is held back once its tables are
    there, and the held ones run side by side (_run_side_by_side) before their conditions and findings. A rule (or
    the derived table it reads) that breaks never hides the others' findings."""
    overrides = overrides or {}
    out: list[RuleResult | None] = [None] * len(rules)
    held: list[tuple[int, _SqlRun]] = []
    for i, r in enumerate(rules):
        try:
            values = {**r.defaults(), **(overrides.get(r.id) or {})}
            pre = _precheck(run, r)
            if pre is not None or r.sql is None:
                out[i] = pre if pre is not None else _evaluate(run, r, values)
                continue
            try:
                job = _SqlRun(run, r)  # builds the tables it reads, here, in the rules' order
            except _RULE_ERRORS as e:
                out[i] = _error(r, e)
                continue
            if job.rows() <= BATCH_ROWS:
                held.append((i, job))
            else:
                out[i] = _evaluate(run, r, values, job)
        except Exception as e:  # a rule (or the derived table it reads) that breaks must not hide the others' findings
            out[i] = _internal(r, e)
    _run_side_by_side([job for _, job in held])
    for i, job in held:
        r = rules[i]
        try:  # a job that failed beside the others has no result: its rule runs again alone, for its own error
            out[i] = _evaluate(run, r, {**r.defaults(), **(overrides.get(r.id) or {})}, None if job.failed else job)
        except Exception as e:
            out[i] = _internal(r, e)
    return out
