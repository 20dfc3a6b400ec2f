"""Stages that compose after any measure of the rule vocabulary: compute, filter, windows over steps, across ranks,
and the per-key join of two measures. Plain functions from a frame (and the stage's spec) to a frame.

The engine runs a selection as: measure (or join) -> compute -> filter -> steps -> across_ranks -> then (a list of
further stages, in order), and the rule's condition after all of them. rules/README.md documents each with examples.
"""

from __future__ import annotations

import polars as pl

from traceql import intervals
from traceql.rules.condition import ConditionError, compile_condition

STEP_AGGS = ("median", "mean", "sum", "worst")
STAGES = ("compute", "filter", "steps", "across_ranks")
STEPS_FIELDS = {"skip_first", "skip_warmup", "agg", "of", "per"}
ACROSS_FIELDS = {"key", "value"}
JOIN_HOW = ("left", "inner")


class StageError(ValueError):
    """A stage cannot run on the frame it is given (a column it names is not there)."""


def compute(df: pl.DataFrame, exprs: dict[str, str], params: dict) -> pl.DataFrame:
    """New columns from expressions over the frame's columns and the params, in order: a later one may use an
    earlier one. The grammar is the condition's (rules/condition.py). Expressions that read none of the columns made
    (or replaced) since the last query go to polars in one with_columns: the same columns, fewer queries."""
    cols = list(df.columns)
    group: dict[str, pl.Expr] = {}
    for name, text in exprs.items():
        try:
            expr = compile_condition(str(text), params, cols)
        except ConditionError as e:
            raise StageError(f"compute.{name}: {e}") from None
        name = str(name)
        if name in group or set(expr.meta.root_names()) & set(group):
            df = df.with_columns([e.alias(n) for n, e in group.items()])
            group = {}
        group[name] = expr
        if name not in cols:
            cols.append(name)
    return df.with_columns([e.alias(n) for n, e in group.items()]) if group else df


def keep(df: pl.DataFrame, text: str, params: dict) -> pl.DataFrame:
    """Rows where the expression holds (null counts as false)."""
    try:
        expr = compile_condition(str(text), params, df.columns)
    except ConditionError as e:
        raise StageError(f"filter: {e}") from None
    return df.filter(expr.fill_null(False)) if df.height else df


def steps(df: pl.DataFrame, spec: dict, warmup: pl.DataFrame | None) -> pl.DataFrame:
    """Per-step rows to one row per `per` group (default: rank, and source where the rows have one), over the steps
    that count.

    skip_first N drops each group's first N steps; skip_warmup drops the steps link.steps.warmup_steps names (CUDA
    modules loaded lazily), unless that would leave the group no step. agg: median, mean or sum of every numeric
    column; worst keeps the row with the largest `of`, its step included. Rows without a step (a rank without steps
    has one row for its whole trace) are never skipped. Adds n_steps (the steps judged) and, with `of`, `<of>_worst`.
    """
    # two sources of one rank are two clocks and two sets of steps (link.steps): never aggregated together
    per = list(spec.get("per") or (["rank", "source"] if "source" in df.columns else ["rank"]))
    agg = spec.get("agg", "median")
    of = spec.get("of")
    missing = [c for c in [*per, "step", *([of] if of else [])] if c not in df.columns]
    if missing:
        raise StageError(f"steps: no column {missing[0]!r}; columns: {', '.join(df.columns)}")
    n_skip = int(spec.get("skip_first") or 0)
    if n_skip > 0:
        first = (pl.col("step").rank("dense").over(per) <= n_skip) & pl.col("step").is_not_null()
        df = df.filter(~first.fill_null(False))
    if spec.get("skip_warmup") and warmup is not None and warmup.height and "rank" in df.columns:
        w = warmup.select(pl.col("rank").cast(df.schema["rank"]), pl.col("step").cast(df.schema["step"])).unique()
        w = w.with_columns(pl.lit(True).alias("_warm"))
        df = df.join(w, on=["rank", "step"], how="left", nulls_equal=False)
        # a group whose every step is warm-up keeps them: judging nothing would hide what there is
        all_warm = pl.col("_warm").fill_null(False).all().over(per)
        df = df.filter(~pl.col("_warm").fill_null(False) | all_warm).drop("_warm")
    n = pl.col("step").n_unique().alias("n_steps")
    if agg == "worst":
        if not of:
            raise StageError("steps: agg worst needs of: the column whose largest value is the worst step")
        worst = df.sort([*per, of, "step"], descending=[*([False] * len(per)), True, False], nulls_last=True)
        out = worst.group_by(per, maintain_order=True).first()
        counts = df.group_by(per).agg(n, pl.col(of).max().alias(f"{of}_worst"))
        return out.join(counts, on=per, how="left", nulls_equal=True).sort(per, nulls_last=True)
    if agg not in STEP_AGGS:
        raise StageError(f"steps: agg {agg!r} unknown; valid: {', '.join(STEP_AGGS)}")
    aggs = [n]
    for c, t in df.schema.items():
        if c in per or c == "step":
            continue
        if t.is_numeric():
            aggs.append(getattr(pl.col(c), agg)().alias(c))
        elif t == pl.Utf8:
            aggs.append(pl.col(c).drop_nulls().mode().sort().first().alias(c))
        else:
            aggs.append(pl.col(c).first().alias(c))
    if of:
        aggs.append(pl.col(of).max().alias(f"{of}_worst"))
    return df.group_by(per, maintain_order=True).agg(aggs).sort(per, nulls_last=True)


def across_ranks(df: pl.DataFrame, spec: dict) -> pl.DataFrame:
    """Group one key on every rank: one row per key and minority rank, naming the majority's value, the ranks on
    each side and what differs (`differs`: the value columns where the rank leaves the majority). The rank's own
    row (its other columns) is kept beside them. `value` is one column or a list of columns."""
    key = list(spec.get("key") or [])
    vals = spec.get("value")
    vals = [vals] if isinstance(vals, str) else list(vals or [])
    missing = [c for c in [*key, *vals, "rank"] if c not in df.columns]
    if missing:
        raise StageError(f"across_ranks: no column {missing[0]!r}; columns: {', '.join(df.columns)}")
    sep = "\x1f"  # joins several value columns into one comparable value; never in a trace's text
    one = pl.concat_str([pl.col(v).cast(pl.Utf8).fill_null("\x00") for v in vals], separator=sep).alias("_v")
    d = df.with_columns(one)
    out = intervals.distinct(d, key, "_v")
    if len(vals) == 1:
        out = out.with_columns(pl.col("value").replace("\x00", None), pl.col("majority").replace("\x00", None),
                               pl.lit(vals[0]).alias("differs"))
    else:
        parts = [(pl.col("value").str.split(sep).list.get(i) != pl.col("majority").str.split(sep).list.get(i)) for i in range(len(vals))]
        names = [pl.when(p).then(pl.lit(v)) for p, v in zip(parts, vals)]
        out = out.with_columns(pl.concat_list(names).list.drop_nulls().list.join(", ").alias("differs"),
                               pl.col("value").str.replace_all(sep, ", ").str.replace_all("\x00", "null"),
                               pl.col("majority").str.replace_all(sep, ", ").str.replace_all("\x00", "null"))
    rest = [c for c in df.columns if c not in key and c != "rank" and c not in out.columns]
    if rest:
        first = df.group_by([*key, "rank"], maintain_order=True).agg([pl.col(c).first() for c in rest])
        first = first.with_columns([pl.col(k).cast(out.schema[k]) for k in [*key, "rank"]])
        out = out.join(first, on=[*key, "rank"], how="left", nulls_equal=True)
    return out.sort([*key, "rank"], nulls_last=True)


def join(left: pl.DataFrame, right: pl.DataFrame, on: list[str], how: str, prefix: dict | str | None) -> pl.DataFrame:
    """left joined with right on `on` (a per-step join: [rank, step]). Other columns keep their names; with
    prefix ({left: "a_", right: "b_"}, or a string for the right side) they are renamed; a name both sides still
    share gets the suffix _right on the right, except step_ms (the same step time on both sides: kept once)."""
    if how not in JOIN_HOW:
        raise StageError(f"join: how {how!r} unknown; valid: {', '.join(JOIN_HOW)}")
    for side, df in (("left", left), ("right", right)):
        missing = [c for c in on if c not in df.columns]
        if missing:
            raise StageError(f"join: {side} has no column {missing[0]!r}; its columns: {', '.join(df.columns)}")
    if "step_ms" in left.columns and "step_ms" in right.columns:
        right = right.drop("step_ms")
    pre = {"right": prefix} if isinstance(prefix, str) else dict(prefix or {})
    if pre.get("left"):
        left = _renamed(left, {c: f"{pre['left']}{c}" for c in left.columns if c not in on})
    if pre.get("right"):
        right = _renamed(right, {c: f"{pre['right']}{c}" for c in right.columns if c not in on})
    casts = [pl.col(k).cast(left.schema[k]) for k in on if right.schema[k] != left.schema[k]]
    if casts:
        right = right.with_columns(casts)
    return left.join(right, on=on, how=how, nulls_equal=True, suffix="_right")


def _renamed(df: pl.DataFrame, names: dict[str, str]) -> pl.DataFrame:
    """df.rename(names) without a polars query: the same columns under their new names."""
    if len(set(names.values()) | (set(df.columns) - set(names))) < df.width:  # a clash: polars names the problem
        return df.rename(names)
    return pl.DataFrame([s.alias(names.get(s.name, s.name)) for s in df.get_columns()], height=df.height)
