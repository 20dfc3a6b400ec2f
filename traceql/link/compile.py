"""torch.compile derived tables: the facts TQL401-405 select, built from compile_events (and host_ops, steps).

compile_events can hold the same fact from several sources of one rank (TORCH_TRACE, TORCH_LOGS text,
TORCH_COMPILE_DEBUG). `compile_evidence` keeps, per rank and event kind, only the best source that has that kind:
TORCH_TRACE first (it has compile ids, keys, times), then TORCH_LOGS, then TORCH_COMPILE_DEBUG (inferred ids).
Every other table here reads compile_evidence.
"""

from __future__ import annotations

import re
import warnings

import orjson
import polars as pl

from traceql.model import Run


def _ensure(run: Run, name: str) -> pl.DataFrame:
    # built once per run and kept in run.tables (several tables here read the same evidence)
    from traceql.link import ensure

    return ensure(run, name)

_PRIORITY = {"torch_trace": 0, "torch_logs": 1, "compile_debug": 2}
_COLLECTIVE = re.compile(r"(?:^|\.)_?c10d_functional\.\w+")
_WAIT = re.compile(r"(?:^|\.)_?c10d_functional\.wait_tensor")
# Ops that move no data through compute units worth overlapping: views, aliases, indexing, copies.
_TRIVIAL = re.compile(
    r"(?:^|\.)(?:view|_unsafe_view|reshape|permute|t|transpose|expand|squeeze|unsqueeze|alias|detach|clone|copy_?|"
    r"getitem|slice|select|as_strided|contiguous|flatten|unflatten|split|chunk|_to_copy|to)(?:\.\w+)?$"
)
_REGION = re.compile(r"^Torch-Compiled Region: (\S+?)\s*$")
_FXCALL = re.compile(r"^## Call CompiledFxGraph (\w+) ##$")


def compile_evidence(run: Run) -> pl.DataFrame:
    ce = run.table("compile_events")
    if ce.height == 0:
        return ce
    kinds = {s.id: s.kind for s in run.sources}
    known = ce["rank"].drop_nulls().unique()
    if known.len() == 1 and ce["rank"].null_count():
        # a single-process run: logs that name no rank (TORCH_LOGS without [rankN]:, debug folders) are that rank's
        ce = ce.with_columns(pl.col("rank").fill_null(known[0]))
    ce = ce.with_columns(
        pl.col("source").replace_strict(kinds, default="unknown", return_dtype=pl.Utf8).alias("_sk"),
    ).with_columns(pl.col("_sk").replace_strict(_PRIORITY, default=9, return_dtype=pl.Int32).alias("_prio"))
    best = ce.group_by("rank", "kind").agg(pl.col("_prio").min().alias("_best"))
    ce = ce.join(best, on=["rank", "kind"], how="left", nulls_equal=True)
    return ce.filter(pl.col("_prio") == pl.col("_best")).drop("_sk", "_prio", "_best")


def _known_rank(run: Run):
    """The one rank the compile logs name, where they name exactly one (a single-process run)."""
    ce = run.table("compile_events")
    known = ce["rank"].drop_nulls().unique() if ce.height else pl.Series([], dtype=pl.Int32)
    return known[0] if known.len() == 1 else None


def _steps(run: Run) -> pl.DataFrame:
    """steps, with a null rank filled in for single-process runs (a profile without distributedInfo)."""
    st = run.table("steps")
    r = _known_rank(run)
    if st.height and r is not None and st["rank"].null_count():
        st = st.with_columns(pl.col("rank").fill_null(r))
    return st


def _detail_field(name: str, dtype=pl.Utf8) -> pl.Expr:
    return pl.col("detail").str.json_path_match(f"$.{name}").cast(dtype, strict=False)


# --- TQL401 -------------------------------------------------------------------------------------------------


def compile_frames(run: Run) -> pl.DataFrame:
    """Per rank and frame: compiles, recompiles, whether the recompile limit was hit, the guard that keeps failing."""
    ev = _ensure(run, "compile_evidence")
    schema = {"rank": pl.Int32, "frame_id": pl.Int64, "function": pl.Utf8, "filename": pl.Utf8, "line": pl.Int64,
              "compiles": pl.UInt32, "recompiles": pl.UInt32, "limit_hit": pl.Boolean, "limit": pl.Int64,
              "top_guard": pl.Utf8, "top_guard_count": pl.UInt32, "last_guard": pl.Utf8, "compile_s": pl.Float64,
              "location": pl.Utf8, "limit_note": pl.Utf8}
    ev = ev.filter(pl.col("kind").is_in(["compile", "recompile", "cache_limit"]) & pl.col("frame_id").is_not_null())
    if ev.height == 0:
        return pl.DataFrame(schema=schema)
    fwd = pl.col("kind") == "compile"
    fwd_only = fwd & (pl.col("detail").is_null() | (_detail_field("phase") != "backward").fill_null(True))
    base = ev.group_by("rank", "frame_id").agg(
        pl.col("function").drop_nulls().first(),
        pl.col("filename").drop_nulls().first(),
        pl.col("line").drop_nulls().first(),
        pl.col("compile_id").filter(fwd_only).n_unique().alias("compiles"),
        (pl.col("kind") == "recompile").sum().alias("recompiles"),
        (pl.col("kind") == "cache_limit").any().alias("limit_hit"),
        _detail_field("limit", pl.Int64).filter(pl.col("kind") == "cache_limit").drop_nulls().first().alias("limit"),
        (pl.col("dur").filter(fwd).sum() / 1e9).alias("compile_s"),
    )
    rec = ev.filter((pl.col("kind") == "recompile") & pl.col("guard").is_not_null())
    # the guard that fails most often: strip the per-call numbers so that "expected 3, actual 4" and
    # "expected 4, actual 5" count as one guard
    rec = rec.with_columns(pl.col("guard").str.replace_all(r"expected \S+, actual \S+", "expected (varies), actual (varies)").alias("_g"))
    # ties (every guard failing once, say) go to the guard that failed first, not to whichever the hash order gives
    top = (rec.with_row_index("_first").group_by("rank", "frame_id", "_g")
           .agg(pl.len().alias("top_guard_count"), pl.col("guard").last().alias("_ex"), pl.col("_first").min())
           .sort(["top_guard_count", "_first"], descending=[True, False]).group_by("rank", "frame_id", maintain_order=True).agg(
               pl.col("_g").first().alias("top_guard"), pl.col("top_guard_count").first()))
    last = rec.sort("attempt").group_by("rank", "frame_id").agg(pl.col("guard").last().alias("last_guard"))
    out = base.join(top, on=["rank", "frame_id"], how="left", nulls_equal=True).join(
        last, on=["rank", "frame_id"], how="left", nulls_equal=True)
    out = out.with_columns(
        pl.format("{}:{}", pl.col("filename").fill_null("unknown file"), pl.col("line").fill_null(0)).alias("location"),
        pl.col("top_guard_count").fill_null(0),
        pl.when(pl.col("limit_hit")).then(pl.format(
            " and hit the recompile limit ({}): the frame now runs in eager mode", pl.col("limit").cast(pl.Utf8).fill_null("size unknown")))
        .otherwise(pl.lit("")).alias("limit_note"),
    )
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "frame_id")


# --- compiled regions (Kineto) and TQL402 -------------------------------------------------------------------


def compiled_regions(run: Run) -> pl.DataFrame:
    """Runtime per compiled region: `Torch-Compiled Region: F/C` and `## Call CompiledFxGraph <key> ##` host ops,
    per rank and step, tied to compile ids (the key through the FX graph cache events of the same rank)."""
    schema = {"rank": pl.Int32, "step": pl.Int64, "compile_id": pl.Utf8, "cache_key": pl.Utf8, "what": pl.Utf8,
              "calls": pl.UInt32, "total_ms": pl.Float64}
    ho = run.table("host_ops")
    if ho.height == 0:
        return pl.DataFrame(schema=schema)
    ho = ho.filter(pl.col("name").str.starts_with("Torch-Compiled Region: ") | pl.col("name").str.starts_with("## Call CompiledFxGraph "))
    if ho.height == 0:
        return pl.DataFrame(schema=schema)
    ho = ho.with_columns(
        pl.col("name").str.extract(_REGION.pattern, 1).alias("_cid"),
        pl.col("name").str.extract(_FXCALL.pattern, 1).alias("cache_key"),
    ).with_columns(pl.when(pl.col("_cid").is_not_null()).then(pl.lit("region")).otherwise(pl.lit("fx_graph")).alias("what"))
    ev = _ensure(run, "compile_evidence")
    r = _known_rank(run)
    if r is not None and ho["rank"].null_count():  # a single-process profile without distributedInfo
        ho = ho.with_columns(pl.col("rank").fill_null(r))
    if ho["step"].null_count():  # rows the step linker left without a step: the step window of their source
        st = run.table("steps").filter(pl.col("ts").is_not_null()).select(
            "source", pl.col("ts").alias("_sts"), pl.col("end").alias("_send"), pl.col("step").alias("_sstep")).sort("_sts")
        if st.height:
            with warnings.catch_warnings():  # sorted by ts within each source; polars cannot verify that with `by`
                warnings.simplefilter("ignore")
                ho = ho.sort("ts").join_asof(st, left_on="ts", right_on="_sts", by="source", strategy="backward")
            ho = ho.with_columns(pl.coalesce("step", pl.when(pl.col("ts") < pl.col("_send")).then(pl.col("_sstep"))).alias("step"))
    keys = (ev.filter(pl.col("cache_key").is_not_null() & pl.col("kind").is_in(["cache_hit", "cache_miss"]))
            .select("rank", "cache_key", pl.col("compile_id").alias("_kcid")).unique(subset=["rank", "cache_key"], keep="first"))
    ho = ho.join(keys, on=["rank", "cache_key"], how="left", nulls_equal=True)
    ho = ho.with_columns(pl.coalesce("_cid", "_kcid").alias("compile_id"))
    out = ho.group_by("rank", "step", "compile_id", "cache_key", "what").agg(
        pl.len().alias("calls"), (pl.col("dur").sum() / 1e6).alias("total_ms"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "step", "what", "compile_id", nulls_last=True)


def graph_break_cost(run: Run) -> pl.DataFrame:
    """One row per graph break (rank, compile id, reason, user frame), with how often the broken frame's compiled
    region ran per step and its time per step where a profiler trace has it (null where none does)."""
    schema = {"rank": pl.Int32, "compile_id": pl.Utf8, "function": pl.Utf8, "location": pl.Utf8, "reason": pl.Utf8,
              "user_frame": pl.Utf8, "n_steps": pl.UInt32, "steps_with_calls": pl.UInt32, "calls_per_step": pl.Float64,
              "ms_per_step": pl.Float64, "traced": pl.Boolean, "cost_note": pl.Utf8}
    ev = _ensure(run, "compile_evidence")
    gb = ev.filter(pl.col("kind") == "graph_break")
    if gb.height == 0:
        return pl.DataFrame(schema=schema)
    gb = gb.unique(subset=["rank", "compile_id", "reason", "user_frame"], keep="first", maintain_order=True)
    regions = _ensure(run, "compiled_regions")
    reg = regions.filter(pl.col("what") == "region")
    steps = _steps(run)
    n_steps = steps.group_by("rank").agg(pl.col("step").n_unique().alias("n_steps"))
    traced_ranks = reg.select("rank").unique().with_columns(pl.lit(True).alias("traced"))
    per = reg.filter(pl.col("step").is_not_null()).group_by("rank", "compile_id").agg(
        pl.col("step").n_unique().alias("steps_with_calls"),
        pl.col("calls").sum().alias("_calls"),
        pl.col("total_ms").sum().alias("_ms"),
    )
    out = (gb.join(per, on=["rank", "compile_id"], how="left", nulls_equal=True)
           .join(n_steps, on="rank", how="left", nulls_equal=True)
           .join(traced_ranks, on="rank", how="left", nulls_equal=True))
    out = out.with_columns(
        pl.col("traced").fill_null(False),
        pl.format("{}:{}", pl.col("filename").fill_null("unknown file"), pl.col("line").fill_null(0)).alias("location"),
    ).with_columns(
        pl.when(pl.col("traced")).then(pl.col("steps_with_calls").fill_null(0)).alias("steps_with_calls"),
        pl.when(pl.col("traced") & (pl.col("n_steps") > 0)).then(pl.col("_calls").fill_null(0) / pl.col("n_steps")).alias("calls_per_step"),
        pl.when(pl.col("traced") & (pl.col("n_steps") > 0)).then(pl.col("_ms").fill_null(0) / pl.col("n_steps")).alias("ms_per_step"),
    )
    out = out.with_columns(
        pl.when(pl.col("traced")).then(pl.format(
            "its compiled region ran in {} of {} profiled steps, {} calls and {} ms per step",
            pl.col("steps_with_calls"), pl.col("n_steps"), pl.col("calls_per_step").round(1), pl.col("ms_per_step").round(3)))
        .otherwise(pl.lit("no profiler trace of this rank: how often it runs is unknown")).alias("cost_note"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "compile_id")


# --- TQL403 -------------------------------------------------------------------------------------------------

_TM = re.compile(r"TensorMetadata\(dtype=([^,]+), shape=torch\.Size\(\[([^\]]*)\]\).*?device=device\(([^)]*)\)")


def _short(name: str, value: str | None) -> str:
    if value is None:
        return "(not recorded)"
    m = _TM.search(value)
    if m:
        return f"{m.group(1).replace('torch.', '')}[{m.group(2)}] on {m.group(3).replace('type=', '')}"
    if name == "gm":
        return "graph (see hash)"
    return value if len(value) <= 80 else value[:77] + "..."


def compile_cache_divergence(run: Run) -> pl.DataFrame:
    """FX graph cache keys compared across ranks, graph by graph, paired by identity: the compile id, its restart
    attempt (tlparse's [F/C_R], shown as "F/C_R" where R > 0) and the graph's position within that attempt. Never by
    order across compile ids, so a compile id one rank lacks cannot shift the pairing of the graphs after it.

    One row per rank and compile id that diverge, `divergence` saying how:
    - key: the same graphs have different cache keys here than on the majority; names the differing key
      components and their values on this rank and on the majority (and a different graph count, if any);
    - graphs: the same keys, but this rank logged a different number of FX graphs for the compile id;
    - missing: most ranks compiled this compile id, this one has no record of it;
    - extra: this rank compiled a compile id most ranks have no record of.
    Only ranks whose logs carry FX graph cache keys take part (a rank without them is unknown, not missing), and only
    compile ids that produced an FX graph on some rank. `note` is the sentence the rule's message prints."""
    schema = {"rank": pl.Int32, "compile_id": pl.Utf8, "divergence": pl.Utf8, "graphs": pl.Utf8, "n_graphs": pl.Int64,
              "cache_key": pl.Utf8, "majority_key": pl.Utf8, "majority_ranks": pl.Utf8, "n_ranks": pl.UInt32,
              "n_differing": pl.Int64, "differing": pl.Utf8, "differing_values": pl.Utf8, "graphs_here": pl.Int64,
              "graphs_majority": pl.Int64, "present_on": pl.Utf8, "missing_on": pl.Utf8, "note": pl.Utf8}
    ev = _ensure(run, "compile_evidence")
    if ev.height == 0:
        return pl.DataFrame(schema=schema)
    # tlparse's [F/C_R]: the restart attempt R of compile id F/C, where there was one
    ev = ev.with_columns(pl.when(_detail_field("restart", pl.Int64).fill_null(0) > 0)
                         .then(pl.format("{}_{}", pl.col("compile_id"), _detail_field("restart", pl.Int64)))
                         .otherwise(pl.col("compile_id")).alias("_cid"))
    c = ev.filter(pl.col("kind").is_in(["cache_hit", "cache_miss"]) & pl.col("cache_key").is_not_null()
                  & (_detail_field("cache") == "fx_graph").fill_null(False) & pl.col("rank").is_not_null()
                  & pl.col("compile_id").is_not_null())
    if c.height == 0 or c["rank"].n_unique() < 2:
        return pl.DataFrame(schema=schema)
    # the graph's position within its compile id and restart attempt, in log order (seq counts per file and compile
    # id); a second log of the same rank repeats positions and only its first copy is kept
    c = (c.with_columns(_detail_field("seq", pl.Int64).alias("_seq"))
         .with_columns((pl.col("_seq").rank("dense").over("rank", "source", "_cid") - 1).cast(pl.Int64).alias("graph_seq"))
         .unique(subset=["rank", "_cid", "graph_seq"], keep="first", maintain_order=True))
    ranks = sorted(c["rank"].unique().to_list())
    n_all = len(ranks)
    # which of those ranks have any record of a compile id (its compile metrics or any cache event)
    seen = (ev.filter(pl.col("rank").is_in(ranks) & pl.col("_cid").is_not_null()
                      & pl.col("kind").is_in(["compile", "cache_hit", "cache_miss", "cache_bypass"]))
            .group_by("_cid").agg(pl.col("rank").unique().sort().alias("_present")))
    counts = c.group_by("_cid", "rank").agg(pl.len().cast(pl.Int64).alias("_n"))
    logs = set(c["source"].unique().to_list())
    partial = {s.rank for s in run.sources if s.id in logs and s.status == "partial" and s.rank is not None}

    per: dict[tuple, dict] = {}  # (rank, compile id) -> the row being built

    def row(rank: int, cid: str, divergence: str) -> dict:
        return per.setdefault((rank, cid), {
            "rank": rank, "compile_id": cid, "divergence": divergence, "graphs": None, "n_graphs": None,
            "cache_key": None, "majority_key": None, "majority_ranks": None, "n_ranks": n_all, "n_differing": None,
            "differing": None, "differing_values": None, "graphs_here": None, "graphs_majority": None,
            "present_on": None, "missing_on": None, "names": {}, "unknown": False, "keyed": []})

    # (b) compile ids some ranks compiled and others have no record of: the minority is the odd one out; on a tie a
    # recompile (C > 0, or a restart) is the extra, a first compile is the missing one
    for r in seen.join(c.select("_cid").unique(), on="_cid").sort("_cid").iter_rows(named=True):
        present = [x for x in r["_present"] if x in ranks]
        absent = [x for x in ranks if x not in present]
        if not absent or not present:
            continue
        recompile = bool(re.search(r"/[1-9]\d*(?:_\d+)?$|_\d+$", r["_cid"]))
        extra = len(present) < len(absent) or (len(present) == len(absent) and recompile)
        n_graphs = {k: v for k, v in counts.filter(pl.col("_cid") == r["_cid"]).select("rank", "_n").iter_rows()}
        for odd in (present if extra else absent):
            acc = row(odd, r["_cid"], "extra" if extra else "missing")
            acc["present_on"], acc["missing_on"] = _ranks(present), _ranks(absent)
            acc["majority_ranks"] = _ranks(absent if extra else present)
            acc["graphs_here"] = n_graphs.get(odd, 0)
            acc["graphs_majority"] = max((n_graphs.get(x, 0) for x in (absent if extra else present)), default=0)

    # (a) the same compile id and graph position with different keys on different ranks
    keyed = c.group_by("_cid", "graph_seq", "cache_key").agg(
        pl.col("rank").sort().alias("ranks"), pl.len().alias("n"), pl.col("rank").min().alias("_lo"))
    # the reference key: the one most ranks have; a tie goes to the key of the lowest rank
    groups = keyed.group_by("_cid", "graph_seq").agg(
        pl.col("cache_key").n_unique().alias("n_keys"),
        pl.col("cache_key").sort_by(["n", "_lo"], descending=[True, False]).first().alias("majority_key"),
        pl.col("ranks").sort_by(["n", "_lo"], descending=[True, False]).first().alias("_maj_ranks"),
    ).filter(pl.col("n_keys") > 1)
    odd = c.join(groups, on=["_cid", "graph_seq"]).filter(pl.col("cache_key") != pl.col("majority_key"))
    comps = {(r["rank"], r["_cid"], r["graph_seq"]): r["components"] for r in
             c.select("rank", "_cid", "graph_seq", "components").iter_rows(named=True)}
    for r in odd.sort("graph_seq").iter_rows(named=True):
        maj_rank = r["_maj_ranks"][0]
        mine = _load(comps.get((r["rank"], r["_cid"], r["graph_seq"])))
        theirs = _load(comps.get((maj_rank, r["_cid"], r["graph_seq"])))
        if mine is not None and theirs is not None and _device_index_only(mine, theirs):
            continue  # each rank compiled for its own GPU (cuda:1 vs cuda:0), as every multi-GPU job does
        acc = row(r["rank"], r["_cid"], "key")
        if not acc["keyed"]:
            acc.update(cache_key=r["cache_key"], majority_key=r["majority_key"],
                       majority_ranks=_ranks(r["_maj_ranks"]))
        acc["keyed"].append(str(r["graph_seq"]))
        if mine is None or theirs is None:
            acc["unknown"] = True
            continue
        for n in sorted(set(mine) | set(theirs)):
            a, b = (mine.get(n) or {}).get("value"), (theirs.get(n) or {}).get("value")
            if _only_device_differs(a, b):
                continue  # this input differs only by its rank's own GPU index: not the difference to name
            if (mine.get(n) or {}).get("hash") != (theirs.get(n) or {}).get("hash") and n not in acc["names"]:
                acc["names"][n] = (f"{n}: {_short(n, (mine.get(n) or {}).get('value'))} (rank {r['rank']}) vs "
                                   f"{_short(n, (theirs.get(n) or {}).get('value'))} (rank {maj_rank})")

    # ranks that compiled a compile id like the majority but logged a different number of FX graphs for it: the
    # positions past the shorter list pair with nothing (a rank with none keyed is unknown, not different)
    both = counts.join(counts.group_by("_cid").agg(pl.col("_n").mode().max().alias("_maj_n")), on="_cid")
    for r in both.filter(pl.col("_n") != pl.col("_maj_n")).sort("_cid", "rank").iter_rows(named=True):
        acc = per.get((r["rank"], r["_cid"]))
        if acc is not None and acc["divergence"] in ("missing", "extra"):
            continue
        maj = both.filter((pl.col("_cid") == r["_cid"]) & (pl.col("_n") == r["_maj_n"]))["rank"].sort().to_list()
        acc = row(r["rank"], r["_cid"], "graphs")
        acc["graphs_here"], acc["graphs_majority"] = r["_n"], r["_maj_n"]
        if acc["majority_ranks"] is None:
            acc["majority_ranks"] = _ranks(maj)

    rows = [_divergence_row(acc, rank in partial) for (rank, _), acc in per.items()]
    return pl.DataFrame(rows, schema=schema).sort("compile_id", "rank")


_DEVICE_INDEX = re.compile(r"index=\d+|cuda:\d+")


def _device_index_only(mine: dict, theirs: dict) -> bool:
    """Whether two graphs' key components differ only in the device index they name (device(type='cuda', index=1)
    vs index=0), with the graph's own hash allowed to differ alongside (the device is baked into it). Such keys
    differ on every multi-GPU job, each rank compiling for its own GPU: not a divergence."""
    moved = False
    for n in set(mine) | set(theirs):
        a, b = mine.get(n) or {}, theirs.get(n) or {}
        if a.get("hash") == b.get("hash"):
            continue
        va, vb = a.get("value"), b.get("value")
        if va is None or vb is None or (va != vb and not _only_device_differs(va, vb)):
            return False
        moved = moved or va != vb
    return moved


def _only_device_differs(a: str | None, b: str | None) -> bool:
    """Two component values that differ, and only in the device index they name."""
    return a is not None and b is not None and a != b and _DEVICE_INDEX.sub("#", a) == _DEVICE_INDEX.sub("#", b)


def _ranks(rs) -> str:
    return ",".join(str(x) for x in sorted(rs))


def _divergence_row(acc: dict, truncated: bool) -> dict:
    """Fills the key-difference columns and `note`, the sentence the rule's message prints after the compile id."""
    names, unknown, keyed = acc.pop("names"), acc.pop("unknown"), acc.pop("keyed")
    d, rank = acc["divergence"], acc["rank"]
    if d == "missing":
        acc["note"] = (f"is missing: rank(s) {acc['present_on']} compiled it ({acc['graphs_majority']} FX graph(s)), rank "
                       f"{rank}'s compile log has no record of it"
                       + (" (its log is truncated: it may have compiled it after the log ends)" if truncated else
                          ": the ranks compiled different code, so graphs do not line up across ranks"))
        return acc
    if d == "extra":
        acc["note"] = (f"is extra: rank {rank} compiled it ({acc['graphs_here']} FX graph(s)), rank(s) "
                       f"{acc['missing_on']} have no record of it: the ranks compiled different code "
                       f"(a rank-specific recompile or graph break)")
        return acc
    count = (f"{acc['graphs_here']} FX graph(s) on rank {rank} vs {acc['graphs_majority']} on rank(s) {acc['majority_ranks']}"
             if acc["graphs_here"] is not None else None)
    if not keyed:  # d == "graphs": the graphs that pair have the same keys
        acc["note"] = f"logged a different number of FX graphs: {count}; the graphs that pair have the same cache keys"
        return acc
    acc["graphs"], acc["n_graphs"] = ",".join(keyed), len(keyed)
    if unknown and not names:
        acc["differing"] = acc["differing_values"] = "unknown (no key components logged)"
    else:
        acc["differing"], acc["differing_values"] = ", ".join(names), "; ".join(names.values())
        acc["n_differing"] = len(names)
    acc["note"] = (f"has {len(keyed)} FX graph(s) whose cache key differs from rank(s) {acc['majority_ranks']} (first: "
                   f"{acc['cache_key']} vs {acc['majority_key']}); differing components: {acc['differing_values']}"
                   + (f"; and {count}" if count else ""))
    return acc


def _load(s: str | None) -> dict | None:
    if not s:
        return None
    try:
        v = orjson.loads(s)
        return v if isinstance(v, dict) else None
    except orjson.JSONDecodeError:
        return None


# --- TQL404 -------------------------------------------------------------------------------------------------


def graph_collectives(run: Run) -> pl.DataFrame:
    """Each collective inside a compiled graph with the wait_tensor that consumes it and the compute ops between
    them, in graph op order. A collective whose wait comes with no compute in between is serialized: it cannot
    overlap with anything. Uses the post-grad graph (what inductor runs) where logged, else the dynamo graph."""
    schema = {"rank": pl.Int32, "compile_id": pl.Utf8, "graph": pl.Utf8, "graph_no": pl.Int64, "op": pl.Utf8,
              "op_index": pl.Int64, "wait_index": pl.Int64, "ops_between": pl.Int64, "compute_between": pl.Int64,
              "serialized": pl.Boolean, "function": pl.Utf8}
    ev = _ensure(run, "compile_evidence")
    g = ev.filter(pl.col("kind") == "graph_op")
    if g.height == 0:
        return pl.DataFrame(schema=schema)
    g = g.with_columns(_detail_field("graph").alias("graph"), _detail_field("graph_no", pl.Int64).alias("graph_no"))
    # prefer the post-grad graph of a compile id where there is one
    rank_of = {"post_grad": 0, "aot": 1, "dynamo": 2}
    g = g.with_columns(pl.col("graph").replace_strict(rank_of, default=3, return_dtype=pl.Int32).alias("_gr"))
    g = g.filter(pl.col("_gr") == pl.col("_gr").min().over("rank", "compile_id"))
    coll = g.filter(pl.col("op").str.contains(_COLLECTIVE.pattern) & ~pl.col("op").str.contains(_WAIT.pattern))
    if coll.height == 0:
        return pl.DataFrame(schema=schema)
    rows = []
    ops_by_graph: dict[tuple, list[dict]] = {}
    for r in g.select("rank", "compile_id", "graph", "graph_no", "op", "op_index", "detail").iter_rows(named=True):
        ops_by_graph.setdefault((r["rank"], r["compile_id"], r["graph"], r["graph_no"]), []).append(r)
    fn = {(r["rank"], r["compile_id"]): r["function"] for r in
          ev.filter(pl.col("function").is_not_null()).select("rank", "compile_id", "function").unique(
              subset=["rank", "compile_id"], keep="first").iter_rows(named=True)}
    for key, ops in ops_by_graph.items():
        ops.sort(key=lambda o: o["op_index"])
        parsed = [(o, _load(o["detail"]) or {}) for o in ops]
        for i, (o, d) in enumerate(parsed):
            if not re.search(_COLLECTIVE.pattern, o["op"]) or re.search(_WAIT.pattern, o["op"]):
                continue
            out = d.get("out")
            wait_i = None
            for j in range(i + 1, len(parsed)):
                oj, dj = parsed[j]
                if re.search(_WAIT.pattern, oj["op"]) and out in (dj.get("in") or []):
                    wait_i = j
                    break
            between = parsed[i + 1:wait_i] if wait_i is not None else []
            compute = [b for b, _ in between if not _TRIVIAL.search(b["op"]) and not re.search(_WAIT.pattern, b["op"])
                       and not re.search(_COLLECTIVE.pattern, b["op"])]
            rows.append({"rank": key[0], "compile_id": key[1], "graph": key[2], "graph_no": key[3], "op": o["op"],
                         "op_index": o["op_index"], "wait_index": parsed[wait_i][0]["op_index"] if wait_i is not None else None,
                         "ops_between": len(between) if wait_i is not None else None,
                         "compute_between": len(compute) if wait_i is not None else None,
                         "serialized": (len(compute) == 0) if wait_i is not None else None,
                         "function": fn.get((key[0], key[1]))})
    return pl.DataFrame(rows, schema=schema).sort("rank", "compile_id", "graph_no", "op_index")


# --- TQL405 -------------------------------------------------------------------------------------------------


def compile_time(run: Run) -> pl.DataFrame:
    """Per rank: total compile time (dynamo + backward inductor compiles), the recorded steps' time, the compile
    share of both, and how the rank's compile time compares with the median across ranks."""
    schema = {"rank": pl.Int32, "compile_s": pl.Float64, "compiles": pl.UInt32, "steps_s": pl.Float64,
              "n_steps": pl.UInt32, "share_pct": pl.Float64, "across_median_s": pl.Float64, "ratio": pl.Float64,
              "skew_s": pl.Float64, "n_ranks": pl.UInt32}
    ev = _ensure(run, "compile_evidence")
    c = ev.filter((pl.col("kind") == "compile") & pl.col("dur").is_not_null() & pl.col("rank").is_not_null())
    if c.height == 0:
        return pl.DataFrame(schema=schema)
    per = c.group_by("rank").agg((pl.col("dur").sum() / 1e9).alias("compile_s"), pl.col("compile_id").n_unique().alias("compiles"))
    steps = _steps(run)
    st = steps.group_by("rank").agg((pl.col("dur").sum() / 1e9).alias("steps_s"), pl.col("step").n_unique().alias("n_steps"))
    out = per.join(st, on="rank", how="left").with_columns(
        pl.when(pl.col("steps_s") > 0).then(100 * pl.col("compile_s") / (pl.col("compile_s") + pl.col("steps_s"))).alias("share_pct"),
        pl.col("compile_s").median().alias("across_median_s"),
        pl.len().alias("n_ranks"),
    ).with_columns(
        (pl.col("compile_s") / pl.col("across_median_s")).alias("ratio"),
        (pl.col("compile_s") - pl.col("across_median_s")).alias("skew_s"),
    )
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank")


DERIVED = {
    "compile_evidence": compile_evidence,
    "compile_frames": compile_frames,
    "compiled_regions": compiled_regions,
    "graph_break_cost": graph_break_cost,
    "compile_cache_divergence": compile_cache_divergence,
    "graph_collectives": graph_collectives,
    "compile_time": compile_time,
}
NEEDS = {
    "compile_evidence": ["compile_events"],
    "compile_frames": ["compile_events"],
    "compiled_regions": ["host_ops", "compile_events"],
    "graph_break_cost": ["compile_events"],
    "compile_cache_divergence": ["compile_events"],
    "graph_collectives": ["compile_events"],
    "compile_time": ["compile_events"],
}
