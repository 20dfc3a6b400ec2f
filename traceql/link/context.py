"""What the host was doing at a moment: the runtime call or innermost host op spanning it, per rank.

Per (rank, thread): an as-of join finds the op that started last before the moment; if it ended before it, only
its ancestors (parent ids) can span the moment on that thread, so the parent chain is walked. Deepest wins.
"""

from __future__ import annotations

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.link._keys import packed_key
from traceql.model import Run


def enclosing_op(run: Run, points: pl.DataFrame, tids: bool = False, tables: tuple[str, ...] = ("runtime", "host_ops"),
                 exclude: pl.DataFrame | None = None) -> pl.DataFrame:
    """points: _gid, rank, _mid (and tid when tids=True, to stay on the point's own thread) -> _gid, host_op.
    exclude: (rank, source, id) of host ops never to name (the NVTX ranges that are the steps themselves)."""
    picks = []
    src = ["source"] if "source" in points.columns else []
    points = points.with_columns(pl.col(c).cast(pl.Int32) for c in src)
    # one lazy plan per step below (a table's ops, the as-of join, each parent level): a dozen small eager queries
    # per level cost more than the joins themselves
    pts = points.lazy()
    for table, depth in (("runtime", 1000), ("host_ops", None)):
        if table not in tables:
            continue
        full = run.table(table)
        # only the ranks (sources) the points are on, and only the columns read here; not the names: an op's name
        # is fetched by its row (_row) for the ops picked, not copied for every op of the table (at 128 ranks,
        # millions of strings for a few thousand points)
        cols = [c for c in ("rank", "source", "tid", "ts", "end", "id", "parent", "depth") if c in full.columns]
        on = ["rank", *src]
        lt = full.lazy().with_row_index("_row").filter(
            ~pl.col("name").str.starts_with("ProfilerStep#") & (pl.col("tid").is_null() | (pl.col("tid") >= 0)))
        lt = lt.select(*cols, "_row").with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32))
        # on the points' own threads only (tids): ops, parents included (an op's parent is on its thread), of the
        # other threads are never read, and sorting and indexing them was most of the cost for a few calls
        own = [*on, "tid"] if tids else on
        want = pts.select(*on, *([pl.col("tid").cast(full.schema["tid"])] if tids else [])).unique().collect(engine=POLARS_ENGINE)
        inside = _member(full, want, own)
        lt = lt.join(want.lazy(), on=own, how="semi", nulls_equal=True) if inside is None else lt.filter(inside)
        if exclude is not None and table == "host_ops" and exclude.height:
            ex = exclude.select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), pl.col("id").cast(full.schema["id"]))
            out = _member(full, ex, ["rank", "source", "id"])
            lt = lt.join(ex.lazy(), on=["rank", "source", "id"], how="anti") if out is None else lt.filter(~out.fill_null(False))
        t = lt.collect(engine=POLARS_ENGINE)
        if t.height == 0:
            continue
        key = ["rank", *src]
        t = t.with_row_index("_r")
        j = _started_last(pts, t, key, tids) if t.height >= _SEARCH_OPS_FROM else None
        if j is None:  # few ops, or keys that do not pack (or have nulls): polars' as-of join by thread
            if tids:
                gt = pts.select("_gid", "rank", *src, "tid", "_mid").sort("_mid")
            else:
                gt = pts.select("_gid", "rank", *src, "_mid").join(_threads(t, ["rank", *src, "tid"]).lazy(), on=["rank", *src]).sort("_mid")
            right = t.lazy().select(*key, "tid", "ts", "id", "_r")
            j = gt.join_asof(right.sort("ts"), left_on="_mid", right_on="ts", by=[*key, "tid"], strategy="backward",
                             check_sortedness=False).collect(engine=POLARS_ENGINE)
        j = j.filter(pl.col("id").is_not_null()).select("_gid", *key, "tid", "_mid", "id", "_r")
        levels = 32 if depth is None else 1
        if j.height < _WALK_IN_PYTHON and t.height < _WALK_OPS_IN_PYTHON and _walk_listed(picks, full, t, j, key, depth, levels):
            continue
        look = _by_id(t, key)
        if look is None:  # ids repeat within a rank and source, or the key does not fit one integer: join per level
            _walk_joined(picks, full, t, j, key, depth, levels)
        else:
            _walk_searched(picks, full, t, j, key, depth, levels, *look)
    if not picks:
        return pl.DataFrame(schema={"_gid": pl.UInt32, "host_op": pl.Utf8})
    allp = pl.concat(picks)
    # deepest wins; ops of equal depth spanning the moment (on two threads) by the latest start, then thread and
    # name, so the choice does not depend on the order joins return rows in
    allp = allp.sort(["_gid", "depth", "ts", "tid", "name"], descending=[False, True, True, False, False], nulls_last=True)
    return allp.group_by("_gid", maintain_order=True).first().select("_gid", pl.col("name").alias("host_op")).collect(engine=POLARS_ENGINE)


PACKED = True  # tests turn it off to compare _member and _threads with the joins and the unique they replace


def _member(full: pl.DataFrame, want: pl.DataFrame, cols: list[str]) -> pl.Expr | None:
    """Whether a row's (cols) is one of want's rows, as a test of one packed integer (link/_keys.py) against want's
    few keys: what a semi-join on cols keeps, without hashing every op's several columns (16 ranks x 36 MB: 25-30 ms
    a table). None where a key column has nulls in either frame (the join matches nulls to nulls there) or the
    values do not pack."""
    if not PACKED or full.height == 0 or want.height == 0 or any(full[c].null_count() or want[c].null_count() for c in cols):
        return None
    key = packed_key([full, want], cols, from_min=True)
    if key is None:
        return None
    return key.is_in(want.select(key)["_key"].implode())


def _threads(t: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """t's distinct (rank, source, tid): on one packed integer where the values allow it (a hash of one column,
    not of three), else a unique over the columns (the row order is not read)."""
    key = None if not PACKED or t.height == 0 or any(t[c].null_count() for c in cols) else packed_key([t], cols, from_min=True)
    if key is None:
        return t.select(cols).unique()
    return t.select(cols).filter(t.select(key.is_first_distinct()).to_series())


def _started_last(pts: pl.LazyFrame, t: pl.DataFrame, key: list[str], tids: bool) -> pl.DataFrame | None:
    """The as-of join of the points to t's ops by thread (each point on its own thread with tids, else on every thread
    of its rank and source): _gid, key, tid, _mid and the id and row (_r) of the op that started last at or before
    _mid, on one packed integer (thread, start) searched per point. polars' as-of join sorts every op by start and
    hashes its thread, which at 32 ranks x 36 MB cost 0.85 s for 128 gaps; here the ops are ordered by one stable
    sort of that integer (the ops of a thread that start together stay in table order, and the last is taken). None
    where the keys have nulls or do not fit one integer: the join then."""
    by = [*key, "tid"]
    p = pts.select("_gid", *key, *(["tid"] if tids else []), "_mid").collect(engine=POLARS_ENGINE)
    if not PACKED or t.height == 0 or p.height == 0 or any(t[c].null_count() for c in (*by, "ts")) or \
            any(p[c].null_count() for c in p.columns):
        return None
    thread = packed_key([t, p] if tids else [t], by, from_min=True)
    if thread is None:
        return None
    lo, hi = t["ts"].min(), t["ts"].max()
    width = max(1, (hi - lo).bit_length())
    th = t.select(thread)["_key"]
    if width + max(1, th.max().bit_length()) > 62:
        return None
    # t's rows are its _r: the sort's order is the rows of the ops in (thread, start) order
    packed = th * (1 << width) + (t["ts"] - lo)
    order = pl.DataFrame([packed]).select(pl.arg_sort_by("_key", maintain_order=True))["_key"]
    at = packed.gather(order)
    if tids:
        p = p.with_columns(thread)
    else:  # every thread of the point's rank and source
        first = (at // (1 << width)).diff().fill_null(1) != 0
        threads = t.select(*by).gather(order.filter(first)).with_columns(_key=at.filter(first) // (1 << width))
        p = p.join(threads, on=key, how="inner")
    p = p.filter(pl.col("_mid") >= lo)
    probe = pl.col("_key") * (1 << width) + (pl.min_horizontal("_mid", pl.lit(hi)) - lo)
    pos = at.search_sorted(p.select(probe).to_series(), side="right").cast(pl.Int64) - 1
    # the op found is on the point's thread where its packed thread is the point's (else the thread has none before)
    rows = order.gather(pos.clip(0))
    found = (pos >= 0) & (at.gather(pos.clip(0)) // (1 << width) == p["_key"])
    p = p.with_columns(_r=rows).filter(found)
    return p.select("_gid", *key, "tid", "_mid", t["id"].gather(p["_r"]).alias("id"), "_r")


# below this many ops the as-of join stays polars' (in enclosing_op's lazy plan): collecting the points and packing
# the key cost more than the search saves (the demo's whole check, callgrind: 1.675 -> 1.692 G instructions with
# the search on every table)
_SEARCH_OPS_FROM = 1 << 16


# below this many points the parent walk runs in Python over the ops as lists (_walk_listed): a level of the
# vectorised walks costs ~1 ms of polars queries however few points climb it (while the ops, taken as lists once,
# are few too: a large trace's few points walk faster by searching its ops than by listing them). 2,048, not 1,000:
# trace_filter's 1,746 points over 4,765 ops 24.7 -> 16.3 ms (host_context, min of 5 in one process), the other
# corpus traces and fixtures the same within their noise (benchmarks/README.md, eleventh round)
_WALK_IN_PYTHON = 2_048
_WALK_OPS_IN_PYTHON = 16_384


def _walk_listed(picks, full, t, j, key, depth, levels) -> bool:
    """The parent walk point by point over t's columns as lists, a dict from (key, id) to row for the parents: the
    same hits as _walk_searched. False (nothing done) where a key column or id has nulls or ids repeat within a key:
    there _walk_joined's semantics hold."""
    cols = [*key, "id"]
    if any(t[c].null_count() for c in cols):
        return False
    row_of = {k: r for r, k in enumerate(zip(*(t[c].to_list() for c in cols)))}
    if len(row_of) != t.height:
        return False
    ts, end, row = t["ts"].to_list(), t["end"].to_list(), t["_row"].to_list()
    parent = t["parent"].to_list() if "parent" in t.columns else [None] * t.height
    dep = t["depth"].to_list() if depth is None else [depth] * t.height
    hits: dict[str, list] = {"_gid": [], "_row": [], "depth": [], "ts": [], "tid": []}
    for gid, *kv, tid, mid, r in j.select("_gid", *key, "tid", "_mid", "_r").iter_rows():
        for _ in range(levels):
            if ts[r] is None or end[r] is None:  # an op without an interval neither spans the point nor climbs
                break
            if ts[r] <= mid <= end[r]:
                for c, v in zip(hits, (gid, row[r], dep[r], ts[r], tid)):
                    hits[c].append(v)
                break
            r = row_of.get((*kv, parent[r]))  # None where the parent is no op here (no parent: no key has None)
            if r is None:
                break
    h = pl.DataFrame(hits, schema={"_gid": j.schema["_gid"], "_row": pl.Int64, "depth": pl.Int32,
                                   "ts": t.schema["ts"], "tid": pl.Int64})
    picks.append(h.select("_gid", name=full["name"].gather(h["_row"]), depth="depth", ts="ts", tid="tid").lazy())
    return True


def _walk_joined(picks, full, t, j, key, depth, levels):
    """The parent walk by a join of each level's ids against the ops (where _by_id cannot index them)."""
    j = j.drop("_r")
    info = t.lazy().select(*key, "id", "ts", "end", "_row", "parent" if "parent" in t.columns else pl.lit(None, pl.Int64).alias("parent"), "depth" if depth is None else pl.lit(depth, pl.Int32).alias("depth"))
    for _ in range(levels):
        # the rows of the ops looked up at this level only (a few), deduplicated as the whole table would be
        level = info.join(j.lazy().select(*key, "id").unique(), on=[*key, "id"], how="semi").unique([*key, "id"])
        jj = j.lazy().join(level, on=[*key, "id"], how="inner").collect(engine=POLARS_ENGINE)
        span = (pl.col("ts") <= pl.col("_mid")) & (pl.col("end") >= pl.col("_mid"))
        hit = jj.filter(span)
        picks.append(hit.select("_gid", name=full["name"].gather(hit["_row"]), depth=pl.col("depth").cast(pl.Int32),
                                ts="ts", tid=pl.col("tid").cast(pl.Int64)).lazy())
        j = jj.filter(~span & pl.col("parent").is_not_null()).select("_gid", *key, "tid", "_mid", pl.col("parent").alias("id"))
        if j.height == 0:
            break


def _by_id(t: pl.DataFrame, key: list[str]):
    """(rank, source, id) -> row of t by a binary search over one packed Int64 key (link/_keys.py): each parent
    level then costs a search per point still walking, not a pass over every op of the table (up to 32 levels x
    940k ops at 128 ranks). None where the key cannot be packed, a key column has nulls, or ids repeat.
    The source in the key's high bits, then the rank: a table holds its sources one after another, each in id order,
    so the index is sorted as it comes (ranks in the high bits are out of order where rank 10 is read before rank 2:
    a sort of every op, 16 ranks x 36 MB 0.031 s against 0.014 sorted)."""
    cols = [*key[::-1], "id"]
    packed = packed_key([t], cols)
    if packed is None or any(t[c].null_count() for c in cols):
        return None
    index = t.select(packed, r="_r")
    if not index["_key"].is_sorted():
        index = index.sort("_key")
    if index.height > 1 and index["_key"].diff().min() == 0:  # sorted: a repeated key sits next to itself
        return None
    return index, packed, (t["id"].min(), t["id"].max())


def _walk_searched(picks, full, t, j, key, depth, levels, index, packed, id_range):
    """The parent walk by row: the op each point stands at is gathered by its row; a point whose op does not span
    it moves to the parent's row, found by binary search (_by_id). The same hits as _walk_joined."""
    info = t.select("ts", "end", "_row", pl.col("parent") if "parent" in t.columns else pl.lit(None, pl.Int64).alias("parent"),
                    pl.col("depth") if depth is None else pl.lit(depth, pl.Int32).alias("depth"))
    cur = j.select("_gid", *key, "tid", "_mid", "_r")
    for _ in range(levels):
        jj = pl.concat([cur, info.select(pl.all().gather(cur["_r"]))], how="horizontal")
        span = (pl.col("ts") <= pl.col("_mid")) & (pl.col("end") >= pl.col("_mid"))
        hit = jj.filter(span)
        picks.append(hit.select("_gid", name=full["name"].gather(hit["_row"]), depth=pl.col("depth").cast(pl.Int32),
                                ts="ts", tid=pl.col("tid").cast(pl.Int64)).lazy())
        # a parent outside the ids' range is no op here (the join found none) and would not pack into the key's
        # widths; inside it, the searched row holds the parent only where its key is the parent's
        up = jj.filter(~span & pl.col("parent").is_between(*id_range))
        if up.height == 0:
            break
        k = up.select(*key, id="parent").select(packed)["_key"]
        pos = index["_key"].search_sorted(k, side="left").clip(0, index.height - 1)
        up = up.with_columns(_r=index["r"].gather(pos), _found=index["_key"].gather(pos) == k)
        cur = up.filter("_found").select("_gid", *key, "tid", "_mid", "_r")
        if cur.height == 0:
            break


def host_context(run: Run, gaps: pl.DataFrame) -> pl.DataFrame:
    """Gaps (gap_ts, gap_end per rank) get host_op: what the host was doing at the gap's midpoint."""
    if gaps.height == 0 or "rank" not in gaps.columns:
        return gaps.with_columns(pl.lit(None, pl.Utf8).alias("host_op"))
    g = gaps.with_row_index("_gid").with_columns(((pl.col("gap_ts") + pl.col("gap_end")) // 2).alias("_mid"), pl.col("rank").cast(pl.Int32))
    best = enclosing_op(run, g)
    return g.join(best.with_columns(pl.col("_gid").cast(pl.UInt32)), on="_gid", how="left").drop("_gid", "_mid")
