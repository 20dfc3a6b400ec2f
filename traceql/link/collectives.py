"""Collective matching across the ranks of each process group, and what the matches show.

Matching is by (group, sequence number), never by timestamps: ranks' clocks differ, and a straggler's collective
can start long after its peers'. The sequence number is the trace's own (`seq`) where every call of the group
carries one; otherwise it is the call order per rank and group, counted within each training step where every
call has a step (ranks whose profiler windows start at different calls still line up step by step), else over
the whole trace.

The group of a call: its pg_name where names agree across ranks (recent torch: "0", "1", ...); where one group's
ranks report different names (older torch named groups per process) the group is its description plus its rank
list; calls with neither (older traces) fall into one default group over the whole world.

Tables (DERIVED):
- collective_matches: per call and rank, on the rank's own clock: its group, match key and match id.
- collective_instances: per matched call and rank, on the aligned clock (link.clock): arrival, start, end,
  the wait the others caused it, the skew, the last arriver.
- collective_gaps: ranks of a group with no trace in the run dir, and ranks that stop early.
- collective_waits: per rank and each rank it waited for, the union of those waits (TQL302 weighs them).
"""

from __future__ import annotations

import polars as pl

from traceql import intervals
from traceql.model import Run
from traceql.model.ranks import format_ranks

# Preference when one rank has collectives from several sources (Kineto and a Flight Recorder dump, say):
# the source with timestamps on the profiler clock wins; the others are not matched (they are another clock).
_SOURCE_PREF = {"kineto": 0, "nsys": 1, "flight_recorder": 2}

_MATCH_SCHEMA = {
    "rank": pl.Int32, "source": pl.Int32, "id": pl.Int64, "group": pl.Utf8, "pg": pl.Utf8, "pg_name": pl.Utf8,
    "members": pl.Utf8, "group_size": pl.Int32, "seq": pl.Int64, "seq_origin": pl.Utf8, "match_step": pl.Int64,
    "call": pl.Int64, "match_id": pl.Int64, "op": pl.Utf8, "backend": pl.Utf8, "dtype": pl.Utf8,
    "in_nelems": pl.Int64, "out_nelems": pl.Int64, "bytes": pl.Int64, "step": pl.Int64, "ts": pl.Int64,
    "end": pl.Int64, "kernel_ts": pl.Int64, "kernel_end": pl.Int64, "host_only": pl.Boolean, "grouping": pl.Utf8,
}


def _note(run: Run, text: str) -> None:
    if text not in run.notes:
        run.notes.append(text)


def _source_kinds(run: Run) -> dict[int, str]:
    return {s.id: s.kind for s in run.sources}


def world_size(run: Run) -> int | None:
    sizes = [s.meta.get("world_size") for s in run.sources if isinstance(s.meta.get("world_size"), int)]
    return max(sizes) if sizes else None


def _pg_config(run: Run) -> pl.DataFrame:
    """(rank, pg_name) -> members/desc from Kineto distributedInfo.pg_config of each rank's trace."""
    rows = []
    for s in run.sources:
        pgc = s.meta.get("pg_config")
        if not isinstance(pgc, list) or s.rank is None:
            continue
        for pg in pgc:
            if not isinstance(pg, dict) or pg.get("pg_name") is None:
                continue
            ranks = pg.get("ranks")
            members = None
            if isinstance(ranks, list) and ranks and all(isinstance(r, int) for r in ranks):
                members = ",".join(str(r) for r in sorted(ranks))
            rows.append({"rank": s.rank, "pg_name": str(pg["pg_name"]), "_cfg_members": members,
                         "_cfg_desc": None if pg.get("pg_desc") is None else str(pg["pg_desc"])})
    schema = {"rank": pl.Int32, "pg_name": pl.Utf8, "_cfg_members": pl.Utf8, "_cfg_desc": pl.Utf8}
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, schema=schema).unique(["rank", "pg_name"], keep="first")


def _one_source_per_rank(run: Run, c: pl.DataFrame) -> pl.DataFrame:
    """One source's collectives per rank (two sources are two clocks): a source that timed the collectives' kernels
    first (arrival and waiting are read from kernel times; a torch.profiler trace recorded under nsys has host events
    only), then by kind (Kineto carries sequence numbers and group names), then the most timed calls."""
    kinds = _source_kinds(run)
    per = (
        c.group_by("rank", "source")
        .agg(pl.col("ts").is_not_null().sum().alias("_n_ts"), pl.len().alias("_n"),
             (pl.col("kernel_ts").is_not_null().sum() > 0).alias("_kernels"))
        .with_columns(pl.col("source").replace_strict(kinds, default="?").replace_strict(_SOURCE_PREF, default=9).alias("_pref"))
        .sort(["rank", "_kernels", "_pref", "_n_ts", "source"], descending=[False, True, False, True, False])
    )
    keep = per.unique("rank", keep="first", maintain_order=True)
    dropped = per.join(keep.select("rank", "source"), on=["rank", "source"], how="anti")
    for r, s in dropped.select("rank", "source").iter_rows():
        _note(run, f"collectives: rank {r} has collectives in several sources; matched those of source "
                   f"{keep.filter(pl.col('rank') == r)['source'][0]}, not source {s} (another clock)")
    return c.join(keep.select("rank", "source"), on=["rank", "source"], how="semi")


def collective_matches(run: Run) -> pl.DataFrame:
    c = run.table("collectives").filter(pl.col("rank").is_not_null() & pl.col("op").is_not_null())
    if c.height == 0:
        return pl.DataFrame(schema=_MATCH_SCHEMA)
    c = _one_source_per_rank(run, c)
    sizes = sorted({s.meta["world_size"] for s in run.sources if isinstance(s.meta.get("world_size"), int)})
    if len(sizes) > 1:
        _note(run, f"collectives: the traces disagree on the world size ({', '.join(map(str, sizes))}): they may not come "
                   "from one run; matches across them are not meaningful")
    c = c.with_columns(pl.col("rank").cast(pl.Int32))
    # Members: the trace's rank list (any spelling: "[0, 1]", "0,1", a JSON list), else pg_config's.
    c = c.with_columns(
        pl.col("pg_ranks").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.sort()
        .list.eval(pl.element().cast(pl.Utf8)).list.join(",").alias("_members")
    ).with_columns(pl.when(pl.col("_members") == "").then(None).otherwise(pl.col("_members")).alias("_members"))
    cfg = _pg_config(run)
    c = c.join(cfg, on=["rank", "pg_name"], how="left").with_columns(
        pl.col("_members").fill_null(pl.col("_cfg_members")).alias("_members"),
        pl.col("pg_desc").fill_null(pl.col("_cfg_desc")).alias("_desc"),
    )
    c = _assign_groups(run, c)
    c = _assign_seq(run, c)
    c = c.with_columns(pl.struct("group", "match_step", "seq").rank("dense").cast(pl.Int64).alias("match_id"))
    ws = world_size(run)
    c = c.with_columns(
        pl.coalesce(
            pl.col("_members").str.split(",").list.len().cast(pl.Int32),
            pl.when(pl.col("_members").is_null() & (pl.col("group") == "default")).then(pl.lit(ws, pl.Int32)),
            pl.col("group_size"),
        ).alias("group_size"),
        (pl.col("kernel_ts").is_null() & pl.col("kernel_end").is_null()).alias("host_only"),
        pl.col("_members").alias("members"),
        # how sure the group is: the call names it, or the run's traces say there is one group, or every call was put
        # in one group because nothing says which it belongs to (older traces of multi-group jobs)
        pl.when(pl.col("group") != "default").then(pl.lit("trace"))
        .otherwise(pl.lit("single group" if _single_group(run) else "assumed")).alias("grouping"),
    )
    return c.select([pl.col(k).cast(t) for k, t in _MATCH_SCHEMA.items()]).sort(["group", "rank", "call"])


def _assign_groups(run: Run, c: pl.DataFrame) -> pl.DataFrame:
    fallback = pl.concat_str([pl.col("_desc").fill_null("pg"), pl.lit("["), pl.col("_members"), pl.lit("]")])
    c = c.with_columns(
        pl.when(pl.col("pg_name").is_not_null()).then(pl.lit("pg ") + pl.col("pg_name"))
        .when(pl.col("_members").is_not_null()).then(fallback)
        .otherwise(pl.lit("default")).alias("group"),
        pl.coalesce(pl.col("pg_name"), fallback, pl.lit("default")).alias("pg"),
    )
    named = c.filter(pl.col("pg_name").is_not_null() & pl.col("_members").is_not_null())
    if named.height:
        # Names disagree across ranks when one (desc, members) group carries more names over all ranks than on
        # any one rank: then the group is the (desc, members) pair (with the rank's own order of names).
        per = named.group_by("_desc", "_members").agg(pl.col("pg_name").n_unique().alias("_n_names"))
        per_rank = named.group_by("_desc", "_members", "rank").agg(pl.col("pg_name").n_unique().alias("_k"))
        per = per.join(per_rank.group_by("_desc", "_members").agg(pl.col("_k").max().alias("_n_max")),
                                      on=["_desc", "_members"], how="left", nulls_equal=True)
        bad = per.filter(pl.col("_n_names") > pl.col("_n_max"))
        if bad.height:
            order = (
                named.join(bad.select("_desc", "_members"), on=["_desc", "_members"], how="semi", nulls_equal=True)
                .group_by("rank", "_desc", "_members", "pg_name").agg(pl.col("ts").min().alias("_first"))
                .with_columns(pl.col("_first").rank("ordinal").over("rank", "_desc", "_members").cast(pl.Int64).alias("_ord"))
                .select("rank", "_desc", "_members", "pg_name", "_ord")
            )
            c = c.join(order, on=["rank", "_desc", "_members", "pg_name"], how="left", nulls_equal=True).with_columns(
                pl.when(pl.col("_ord").is_not_null())
                .then(fallback + pl.when(pl.col("_ord") > 1).then(pl.lit("#") + pl.col("_ord").cast(pl.Utf8)).otherwise(pl.lit("")))
                .otherwise(pl.col("group")).alias("group")
            ).with_columns(pl.when(pl.col("_ord").is_not_null()).then(pl.col("group")).otherwise(pl.col("pg")).alias("pg")).drop("_ord")
            for d, m in bad.select("_desc", "_members").iter_rows():
                _note(run, f"collectives: group {d or 'pg'}[{m}] has different pg_name values on different ranks; "
                           "matched by its description and rank list instead")
    return c


def _assign_seq(run: Run, c: pl.DataFrame) -> pl.DataFrame:
    """seq: the trace's where the whole group has one; else call order (per step where every call has a step)."""
    g = c.group_by("group").agg(
        pl.col("seq").is_null().any().alias("_no_seq"), pl.col("step").is_null().any().alias("_no_step")
    )
    c = c.join(g, on="group", how="left").sort(["rank", "group", pl.col("ts").fill_null(0), "id"])
    call = pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "group")
    call_in_step = pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "group", "step")
    c = c.with_columns(call.alias("call"), call_in_step.alias("_call_in_step"))
    c = c.with_columns(
        pl.when(~pl.col("_no_seq")).then(pl.lit("trace"))
        .when(~pl.col("_no_step")).then(pl.lit("call order per step"))
        .otherwise(pl.lit("call order")).alias("seq_origin"),
    ).with_columns(
        pl.when(pl.col("seq_origin") == "trace").then(pl.col("seq"))
        .when(pl.col("seq_origin") == "call order per step").then(pl.col("_call_in_step"))
        .otherwise(pl.col("call")).alias("seq"),
        pl.when(pl.col("seq_origin") == "call order per step").then(pl.col("step")).otherwise(pl.lit(-1, pl.Int64)).alias("match_step"),
    )
    return c


# ---------------------------------------------------------------------------------------------------- instances


def collective_instances(run: Run) -> pl.DataFrame:
    from traceql.link import clock, ensure

    m = ensure(run, "collective_matches")
    offsets = ensure(run, "clock_offsets")
    m = clock.align(m, offsets, ["ts", "end", "kernel_ts", "kernel_end"])
    m = m.with_columns(
        pl.coalesce("kernel_ts", "ts").alias("arrival"),
        pl.coalesce("kernel_ts", "ts").alias("start"),
        pl.coalesce("kernel_end", "end").alias("end"),
    )
    by = pl.col("match_id")
    m = m.with_columns(
        pl.len().over(by).cast(pl.Int32).alias("n_ranks"),
        pl.col("arrival").max().over(by).alias("_last"),
        pl.col("arrival").min().over(by).alias("_first"),
        pl.col("rank").sort_by("arrival", descending=True, nulls_last=True).first().over(by).alias("last_arriver"),
    )
    multi = pl.col("n_ranks") >= 2
    m = m.with_columns(
        pl.when(multi).then((pl.col("_last") - pl.col("arrival")) / 1e6).alias("wait_ms"),
        # the wait as an interval [arrival, wait_end) on the aligned clock: a rank's waits in collectives that are
        # in flight together (DDP buckets, async gloo work) overlap, and time waited is their union, not their sum
        pl.when(multi).then(pl.col("_last")).alias("wait_end"),
        pl.when(multi).then((pl.col("_last") - pl.col("_first")) / 1e6).alias("skew_ms"),
        pl.when(multi).then(pl.col("last_arriver")).alias("last_arriver"),
        pl.when(multi).then(pl.col("rank") == pl.col("last_arriver")).alias("is_last"),
        ((pl.col("end") - pl.col("start")) / 1e6).alias("dur_ms"),
        (pl.col("group_size") - pl.len().over(by)).clip(lower_bound=0).cast(pl.Int32).alias("missing_ranks"),
    )
    return m.select(
        "rank", "pg", "pg_name", "group", "seq", "seq_origin", "match_id", "step", "op", "backend", "dtype", "bytes",
        "in_nelems", "out_nelems", "host_only", "arrival", "start", "end", "dur_ms", "wait_ms", "wait_end", "skew_ms",
        "last_arriver", "is_last", "n_ranks", "group_size", "missing_ranks",
    ).sort(["group", "match_id", "rank"])


# ---------------------------------------------------------------------------------------------------- gaps


def _members_of(m: pl.DataFrame, ws: int | None) -> dict[str, list[int] | None]:
    out: dict[str, list[int] | None] = {}
    for group, members in m.group_by("group").agg(pl.col("members").drop_nulls().first()).iter_rows():
        if members:
            out[group] = [int(x) for x in members.split(",")]
        elif group == "default" and ws:
            out[group] = list(range(ws))
        else:
            out[group] = None
    return out


def collective_gaps(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    schema = {"pg": pl.Utf8, "group": pl.Utf8, "rank": pl.Int32, "status": pl.Utf8, "n_collectives": pl.Int64,
              "n_expected": pl.Int64, "last_seq": pl.Int64, "last_step": pl.Int64, "detail": pl.Utf8}
    m = ensure(run, "collective_matches")
    if m.height == 0:
        return pl.DataFrame(schema=schema)
    members = _members_of(m, world_size(run))
    rows = []
    # the ordinal of a match within its group: match ids are dense over (group, match_step, seq)
    m = m.with_columns(pl.col("match_id").rank("dense").over("group").cast(pl.Int64).alias("_pos"))
    per_rank = m.group_by("group", "pg", "rank").agg(
        pl.len().alias("n"), pl.col("_pos").max().alias("last_pos"), pl.col("seq").sort_by("_pos").last().alias("last_seq"),
        pl.col("match_step").sort_by("_pos").last().alias("last_step"),
    )
    for group in sorted(members):
        pr = per_rank.filter(pl.col("group") == group)
        pg = pr["pg"][0]
        present = set(pr["rank"].to_list())
        mem = members[group]
        if mem is not None:
            missing = sorted(set(mem) - present)
            for r in missing:
                rows.append({"pg": pg, "group": group, "rank": r, "status": "missing", "n_collectives": 0,
                             "n_expected": None, "last_seq": None, "last_step": None,
                             "detail": "member of the group with no trace in the run dir"})
            if missing:
                _note(run, f"collectives: group {pg}: {len(missing)} of {len(mem)} member ranks have no trace in the run "
                           f"dir (ranks {format_ranks(missing, limit=12)}); waits and skew are over the {len(present)} present")
        total = int(m.filter(pl.col("group") == group)["_pos"].max())
        for r, n, last_pos, last_seq, last_step in pr.select("rank", "n", "last_pos", "last_seq", "last_step").iter_rows():
            if len(present) >= 2 and last_pos < total:
                step_txt = f" (step {last_step})" if last_step is not None and last_step >= 0 else ""
                rows.append({"pg": pg, "group": group, "rank": r, "status": "stopped_early", "n_collectives": n,
                             "n_expected": total, "last_seq": last_seq, "last_step": None if last_step == -1 else last_step,
                             "detail": f"last collective at seq {last_seq}{step_txt}; others went on to {total} calls"})
                _note(run, f"collectives: group {pg}: rank {r} stops early: {n} of {total} calls, last at seq {last_seq}{step_txt}")
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame(rows, schema=schema)


def _single_group(run: Run) -> bool:
    """Every trace that describes its process groups describes exactly one (distributedInfo pg_count / pg_config)."""
    said = []
    for src in run.sources:
        if src.status not in ("ok", "partial"):
            continue
        cfg, count = src.meta.get("pg_config"), src.meta.get("pg_count")
        if isinstance(cfg, list):
            said.append(len(cfg))
        elif isinstance(count, int):
            said.append(count)
    return bool(said) and all(n == 1 for n in said)


# ---------------------------------------------------------------------------------------------------- waits


def wait_union(ci: pl.DataFrame, per: list[str]) -> pl.DataFrame:
    """per, _u: nanoseconds in the union of the wait intervals [arrival, wait_end) of collective_instances rows, per
    group. Waits of collectives in flight together overlap; counted once. One sort, a running maximum of ends."""
    w = ci.filter(pl.col("wait_end").is_not_null() & pl.col("arrival").is_not_null() & (pl.col("wait_end") > pl.col("arrival")))
    w = w.select(*per, pl.col("arrival").alias("ts"), pl.col("wait_end").alias("end"))
    if w.height == 0:
        return w.select(*per).with_columns(pl.lit(0, pl.Int64).alias("_u")).head(0)
    return intervals.union_ns(w, per).drop("_n")


def collective_waits(run: Run) -> pl.DataFrame:
    """Who waited for whom: per rank and each rank it waited for (waited_for, the last arriver of the calls), over
    the collectives matched on two or more ranks, the time it spent waiting (wait_ms: the union of its wait
    intervals at those calls, so collectives in flight together count once) and at how many calls (calls).
    Only waits of positive length appear."""
    from traceql.link import ensure

    schema = {"rank": pl.Int32, "waited_for": pl.Int32, "wait_ms": pl.Float64, "calls": pl.Int64}
    ci = ensure(run, "collective_instances").filter((pl.col("n_ranks") >= 2) & pl.col("wait_ms").is_not_null()
                                                    & ~pl.col("is_last").fill_null(False))
    ci = ci.filter(pl.col("wait_end") > pl.col("arrival"))
    if ci.height == 0:
        return pl.DataFrame(schema=schema)
    u = wait_union(ci, ["rank", "last_arriver"])
    n = ci.group_by("rank", "last_arriver").agg(pl.len().alias("calls"))
    out = u.join(n, on=["rank", "last_arriver"], how="left").select(
        "rank", pl.col("last_arriver").alias("waited_for"), (pl.col("_u") / 1e6).alias("wait_ms"), "calls")
    return out.select([pl.col(k).cast(t) for k, t in schema.items()]).sort("rank", "waited_for")


DERIVED = {
    "collective_matches": collective_matches,
    "collective_instances": collective_instances,
    "collective_gaps": collective_gaps,
    "collective_waits": collective_waits,
}
