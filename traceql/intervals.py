"""Interval algebra over tables (coverage, union, gaps, segments) and the built-in measures of the rule vocabulary.

Interval work is done here, once, by sort-and-sweep. link/ (derived tables), rules/ (measures) and report/ (summary)
all use it, so it sits beside the flow's packages rather than inside one of them.

Every function takes frames already filtered by the rule's selection and returns one frame of output columns
(documented in rules/README.md). Times stay int64 ns inside; output durations are float milliseconds (`*_ms`).
"""

from __future__ import annotations

import polars as pl

NS_PER_MS = 1e6


def _keys(per: list[str]) -> list[str]:
    return list(per) if per else ["rank"]


def _clean(df, per: list[str]):
    """Drop rows without an interval or without a value in a grouping key (a kernel outside every step). A frame or
    a lazy frame, as given."""
    cond = pl.col("ts").is_not_null() & pl.col("end").is_not_null() & (pl.col("end") >= pl.col("ts"))
    for k in per:
        cond = cond & pl.col(k).is_not_null()
    return df.filter(cond)


def coverage(sel: pl.DataFrame, against: pl.DataFrame | None, per: list[str]) -> pl.DataFrame:
    """Union of `sel`, union of `against` and the length of their intersection, per group.

    |A ∩ B| = |A| + |B| - |A ∪ B|, each union from one stable sort of the intervals by group and start (see
    _union_plan): integer nanoseconds throughout, so the result is exactly the boundary sweep's (+1 at a start, -1
    at an end, spans where both counters are positive), from fewer and better-sorted rows. One lazy query (the three
    unions, their joins and the ratios) on the in-memory engine: on the small frames most rules read, a query's fixed
    cost is most of the work, and twenty eager steps cost twice what one plan does.
    """
    per = _keys(per)
    # only the columns the sweep reads: filtering wide frames (kernel names) costs more than the sweep
    s = _clean(sel.lazy().select(*per, "ts", "end"), per)
    a = _union_plan(s, per).rename({"_u": "_a"})
    if against is None:
        out = a.with_columns(pl.lit(0, pl.Int64).alias("_b"), pl.lit(0, pl.Int64).alias("_i"))
    else:
        # cast keys to the selection's dtypes so the two sides concatenate
        o = _clean(against.lazy().select(*per, "ts", "end").with_columns([pl.col(k).cast(sel.schema[k]) for k in per]),
                   per)
        b = _union_plan(o, per).select(*per, pl.col("_u").alias("_b"))
        both = _union_plan(pl.concat([s, o], how="vertical"), per).select(*per, pl.col("_u").alias("_ab"))
        out = a.join(b, on=per, how="left", nulls_equal=True).join(both, on=per, how="left", nulls_equal=True)
        out = out.with_columns(pl.col("_b").fill_null(0)).with_columns((pl.col("_a") + pl.col("_b") - pl.col("_ab")).alias("_i"))
    out = out.select(
        *per, pl.col("_n").alias("n"), (pl.col("_a") / NS_PER_MS).alias("sel_ms"), (pl.col("_b") / NS_PER_MS).alias("against_ms"),
        (pl.col("_i") / NS_PER_MS).alias("overlap_ms"),
    )
    return out.with_columns(
        (pl.col("sel_ms") - pl.col("overlap_ms")).clip(lower_bound=0.0).alias("exposed_ms"),
        pl.when(pl.col("sel_ms") > 0).then(pl.col("overlap_ms") / pl.col("sel_ms") * 100.0).otherwise(None).alias("overlap_pct"),
    ).sort(per).collect(engine="in-memory")


def union_ns(df: pl.DataFrame, per: list[str]) -> pl.DataFrame:
    """per, _u (busy ns of the union of the group's intervals), _n (how many) for clean intervals (_union_plan)."""
    # one lazy query, on the in-memory engine (polars' default picks streaming, far dearer on tables this size)
    return _union_plan(df.lazy().select(*per, "ts", "end"), per).collect(engine="in-memory")


def _union_plan(lf: pl.LazyFrame, per: list[str]) -> pl.LazyFrame:
    """union_ns as a plan over clean intervals (per, ts, end).

    One stable sort by group and start; each interval adds what reaches past the furthest end before it (the
    running maximum of the group's earlier ends). Rows of a group are contiguous once sorted, so they are numbered
    by run and the running maximum is a window over one integer key."""
    lf = lf.sort([*per, "ts"], maintain_order=True)
    lf = lf.with_columns(pl.struct(per).rle_id().alias("_g"))
    lf = lf.with_columns(pl.col("end").cum_max().shift(1).over("_g").alias("_pm"))
    adds = (pl.col("end") - pl.max_horizontal("ts", "_pm")).clip(lower_bound=0)
    return lf.group_by("_g").agg(*[pl.col(k).first() for k in per], adds.sum().alias("_u"), pl.len().alias("_n")).drop("_g")


def union(sel: pl.DataFrame, per: list[str]) -> pl.DataFrame:
    """Busy time of the union of the intervals per group, and how many there are."""
    per = _keys(per)
    out = _union_plan(_clean(sel.lazy().select(*per, "ts", "end"), per), per)
    return out.select(*per, (pl.col("_u") / NS_PER_MS).alias("union_ms"), pl.col("_n").alias("n")).sort(per) \
        .collect(engine="in-memory")


def segments(df: pl.DataFrame, per: list[str]) -> pl.DataFrame:
    """Merge intervals into disjoint busy segments per group: seg_ts, seg_end, first_name, last_name, n."""
    per = _keys(per)
    has_name = "name" in df.columns
    df = _clean(df.select(*per, "ts", "end", *(["name"] if has_name else [])), per).sort([*per, "ts"], maintain_order=True)
    # one integer per group (rows of a group are contiguous once sorted), so windows hash one key, not several
    df = df.with_columns(pl.struct(per).rle_id().alias("_g"))
    df = df.with_columns(pl.col("end").cum_max().shift(1).over("_g").alias("_prev_max"))
    df = df.with_columns((pl.col("_prev_max").is_null() | (pl.col("ts") > pl.col("_prev_max"))).alias("_new"))
    # Segments are runs of contiguous rows, each starting at a _new row (a new group always starts one). Within a
    # segment every row ends after all earlier segments of its group, so "end >= _prev_max" marks the rows that
    # reach the running maximum of their segment; the last of them ends the segment (the latest row among equal
    # ends, as a stable sort by end would pick). Forward fills of row numbers replace a group_by over
    # millions of one-row segments.
    df = df.with_row_index("_i").with_columns(
        pl.when(pl.col("_new")).then(pl.col("_i")).forward_fill().alias("_fi"),
        pl.when(pl.col("_prev_max").is_null() | (pl.col("end") >= pl.col("_prev_max"))).then(pl.col("_i")).forward_fill().alias("_li"),
    )
    last = df.filter(pl.col("_new").shift(-1).fill_null(True))
    fi, li = last["_fi"], last["_li"]
    out = last.select(
        *per,
        df["ts"].gather(fi).alias("seg_ts"),
        df["end"].gather(li).alias("seg_end"),
        (pl.col("_i") - pl.col("_fi") + 1).cast(pl.UInt32).alias("n"),
    )
    if has_name:
        out = out.with_columns(df["name"].gather(fi).alias("first_name"), df["name"].gather(li).alias("last_name"))
    return out  # already in (group, seg_ts) order


def short_names(df: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """short_name over columns of a frame, worked out once per distinct name (names repeat a lot)."""
    out = []
    for c in cols:
        if c not in df.columns:
            continue
        u = df.select(pl.col(c).unique().drop_nulls())
        if u.height == 0:
            out.append(pl.col(c))
            continue
        m = u.with_columns(short_name(c).alias("_short"))
        out.append(pl.col(c).replace_strict(m[c], m["_short"], default=None, return_dtype=pl.Utf8).alias(c))
    return df.with_columns(out) if out else df


def short_name(col: str) -> pl.Expr:
    """A kernel or op name without return type, template arguments and parameter list, for messages."""
    e = pl.col(col).str.replace(r"^void ", "").str.replace_all(r"\(anonymous namespace\)::", "", literal=False)
    for _ in range(4):  # templates nest; peel the innermost <...> a few times
        e = e.str.replace_all(r"<[^<>]*>", "")
    return e.str.replace(r"(\S)\(.*$", "${1}").str.strip_chars().str.slice(0, 80)


def gaps(df: pl.DataFrame, per: list[str], shorten: bool = True) -> pl.DataFrame:
    """Idle gaps between consecutive busy segments of the selection, per group.

    shorten=False leaves prev_name/next_name as recorded (the engine shortens them after its condition)."""
    per = _keys(per)
    seg = segments(df, per)
    if seg.height == 0:
        return pl.DataFrame(schema={**{k: df.schema.get(k, pl.Int64) for k in per}, "gap_ts": pl.Int64, "gap_end": pl.Int64, "gap_ms": pl.Float64, "prev_name": pl.Utf8, "next_name": pl.Utf8})
    has_name = "first_name" in seg.columns
    # seg is sorted by group: the next row is the next segment of the same group unless the group changes
    same = pl.col("_g") == pl.col("_g").shift(-1)
    seg = seg.with_columns(pl.struct(per).rle_id().alias("_g")).with_columns(
        pl.when(same).then(pl.col("seg_ts").shift(-1)).alias("gap_end"),
        (pl.when(same).then(pl.col("first_name").shift(-1)) if has_name else pl.lit(None, pl.Utf8)).alias("next_name"),
    )
    out = seg.filter(pl.col("gap_end").is_not_null()).select(
        *per,
        pl.col("seg_end").alias("gap_ts"),
        "gap_end",
        ((pl.col("gap_end") - pl.col("seg_end")) / NS_PER_MS).alias("gap_ms"),
        (pl.col("last_name") if has_name else pl.lit(None, pl.Utf8)).alias("prev_name"),
        "next_name",
    )
    out = out.filter(pl.col("gap_ms") > 0)
    return short_names(out, ["prev_name", "next_name"]) if shorten else out


def count(df: pl.DataFrame, per: list[str]) -> pl.DataFrame:
    per = _keys(per)
    return df.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in per])).group_by(per).agg(pl.len().alias("n")).sort(per)


def total(df: pl.DataFrame, per: list[str], column: str = "dur") -> pl.DataFrame:
    per = _keys(per)
    name = f"{column}_ms" if column == "dur" else f"{column}_sum"
    expr = pl.col(column).sum() / NS_PER_MS if column == "dur" else pl.col(column).sum()
    return df.group_by(per).agg(expr.alias(name), pl.len().alias("n")).sort(per)


_AGG = {"median": lambda c: pl.col(c).median(), "mean": lambda c: pl.col(c).mean(), "sum": lambda c: pl.col(c).sum(), "max": lambda c: pl.col(c).max(), "min": lambda c: pl.col(c).min()}


def spread(df: pl.DataFrame, column: str, agg: str = "median", scale: float = 1.0) -> pl.DataFrame:
    """A per-rank value compared with the median across ranks."""
    if agg not in _AGG:
        raise ValueError(f"agg {agg!r} unknown; valid: {sorted(_AGG)}")
    per_rank = df.filter(pl.col("rank").is_not_null()).group_by("rank").agg((_AGG[agg](column) * scale).alias("value"), pl.len().alias("n"))
    if per_rank.height == 0:
        return per_rank.with_columns(pl.lit(None, pl.Float64).alias("across_median"), pl.lit(None, pl.Float64).alias("ratio"), pl.lit(0).alias("n_ranks"))
    med = per_rank["value"].median()
    return per_rank.with_columns(
        pl.lit(med, pl.Float64).alias("across_median"),
        (pl.col("value") / med if med else pl.lit(None, pl.Float64)).alias("ratio"),
        pl.lit(per_rank.height).alias("n_ranks"),
        pl.lit(per_rank["value"].min(), pl.Float64).alias("across_min"),
    ).sort("rank")


def distinct(df: pl.DataFrame, key: list[str], value: str) -> pl.DataFrame:
    """Across ranks: for each key, the value most ranks have, and one row per rank that has another."""
    d = df.filter(pl.col("rank").is_not_null()).select(*key, "rank", pl.col(value).cast(pl.Utf8).alias("value")).unique()
    votes = d.group_by([*key, "value"]).agg(pl.col("rank").sort().alias("vranks"), pl.len().alias("votes"))
    # majority: most ranks, ties broken by the lowest rank holding the value (stable, explainable)
    votes = votes.with_columns(pl.col("vranks").list.first().alias("_first"))
    maj = votes.sort(["votes", "_first"], descending=[True, False]).group_by(key, maintain_order=True).first()
    maj = maj.select(*key, pl.col("value").alias("majority"), pl.col("vranks").alias("majority_ranks"))
    n = d.group_by(key).agg(pl.col("rank").n_unique().alias("n_ranks"), pl.col("value").n_unique().alias("n_values"))
    odd = d.join(maj, on=key).join(n, on=key).filter(pl.col("value") != pl.col("majority"))
    odd_ranks = odd.group_by(key).agg(pl.col("rank").sort().alias("odd_ranks"))
    return odd.join(odd_ranks, on=key).sort([*key, "rank"])
