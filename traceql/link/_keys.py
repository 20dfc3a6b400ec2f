"""One integer join key in place of several, where the values allow it.

Polars joins and deduplicates on several key columns by encoding rows, which at millions of rows costs several
times more than on one integer column (benchmarks/rules.py: a kernels x runtime join on rank, source and
correlation, 2.6M rows each, 2.8 s vs 1.0 s of CPU). Non-negative integer keys whose bit widths fit 62 bits
together pack into one Int64 without collisions; a null in any key column gives a null key, which (like the
several-column key) matches nothing in a join.
"""

from __future__ import annotations

import polars as pl


def packed_key(frames: list[pl.DataFrame], cols: list[str], from_min: bool = False) -> pl.Expr | None:
    """An expression giving the same collision-free Int64 for equal key tuples in every frame, or None when the
    values (negative, non-integer, too wide) do not allow one: then join on the columns themselves.
    from_min: each column is taken from its minimum over the frames, so that negative values pack too (Kineto's
    thread ids can be -2); the key is then non-negative as well."""
    widths, lows = [], []
    for c in cols:
        lo, hi = None, None
        for df in frames:
            if c not in df.columns or not df.schema[c].is_integer():
                return None
            col = df.get_column(c)  # Series min and max: no polars plan per column and frame, as a select is
            s = (col.min(), col.max())
            if s[0] is None:
                continue
            lo = s[0] if lo is None else min(lo, s[0])
            hi = s[1] if hi is None else max(hi, s[1])
        base = int(lo or 0) if from_min else 0
        if lo is not None and lo < base:
            return None
        lows.append(base)
        widths.append(max(1, (int(hi or 0) - base).bit_length()))
    if sum(widths) > 62:
        return None
    expr = None
    shift = 0
    for c, lo, w in reversed(list(zip(cols, lows, widths))):
        col = pl.col(c).cast(pl.Int64)
        part = (col - lo if lo else col) * (1 << shift)
        expr = part if expr is None else expr + part
        shift += w
    return expr.alias("_key")


def first_match(left: pl.DataFrame, right: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """left with right's other columns from right's first row of each key (a left join, left's row order kept).

    With a packed key: a stable sort of right by the key puts each key's first row first, and one binary search
    per left row finds it (cheaper than hashing millions of keys to deduplicate and again to join)."""
    key = packed_key([left, right], on)
    other = [c for c in right.columns if c not in on]
    if key is None or set(other) & set(left.columns):
        return left.join(right.unique(on, keep="first"), on=on, how="left", maintain_order="left")
    r = right.with_columns(key).filter(pl.col("_key").is_not_null()).sort("_key", maintain_order=True)
    if r.height == 0 or left.height == 0:
        return left.with_columns(pl.lit(None, dtype=right.schema[c]).alias(c) for c in other)
    probe = left.select(key)["_key"].fill_null(-1)  # keys are >= 0: -1 finds nothing
    idx = r["_key"].search_sorted(probe, side="left").clip(upper_bound=r.height - 1)
    hit = r["_key"].gather(idx) == probe
    found = r.select(other)[idx].with_columns(hit.alias("_hit"))
    found = found.select(pl.when(pl.col("_hit")).then(pl.col(c)).alias(c) for c in other)
    return left.hstack(found.get_columns())


def join(left: pl.DataFrame, right: pl.DataFrame, on: list[str], how: str = "inner", **kw) -> pl.DataFrame:
    """left.join(right, on=on, how=how), on one packed integer key where the values allow it (same rows; the
    key columns come from left, as in a plain join)."""
    key = packed_key([left, right], on)
    if key is None:
        return left.join(right, on=on, how=how, **kw)
    r = right.with_columns(key)
    if how in ("semi", "anti"):  # a filter: no join machinery, left's order kept
        inside = key.is_in(r["_key"].drop_nulls().implode())
        return left.filter(inside if how == "semi" else ~inside.fill_null(False))
    return left.with_columns(key).join(r.drop(on), on="_key", how=how, **kw).drop("_key")


def in_order(df: pl.DataFrame, by: list[str]) -> bool:
    """Whether df's rows are already in ascending order of `by` (ties allowed), by one comparison of each row with
    the one before: a few vectorised passes, where a sort of several columns encodes every row (352k gaps of 16
    ranks: 160 ms to sort four integer columns that were in order). False where a key column has nulls (a sort
    places them first: not checked here)."""
    if df.height < 2:
        return True
    if any(df[c].null_count() for c in by):
        return False
    later = None  # the row is after the previous one in the order of by[i:], built from the last key up
    for c in reversed(by):
        here, before = pl.col(c), pl.col(c).shift(1)
        later = (here >= before) if later is None else (here > before) | ((here == before) & later)
    return bool(df.select(later.fill_null(True).all()).item())


def sorted_by(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """df sorted by `by`: as it is where it already is (in_order), else df.sort(by)."""
    return df if in_order(df, by) else df.sort(by)
