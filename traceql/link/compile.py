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
from traceql.model.ranks import format_ranks


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
    if known.len() <= 1 and ce["rank"].null_count():
        # a single-process run: logs that name no rank (TORCH_LOGS without [rankN]:, debug folders) are that rank's,
        # and rank 0 where no log names one (a single process, as compile_trace assumes too)
        ce = ce.with_columns(pl.col("rank").fill_null(known[0] if known.len() else 0))
    ce = ce.with_columns(
        pl.col("source").replace_strict(kinds, default="unknown", return_dtype=pl.Utf8).alias("_sk"),
    ).with_columns(pl.col("_sk").replace_strict(_PRIORITY, default=9, return_dtype=pl.Int32).alias("_prio"))
    # torch < 2.4 TORCH_TRACE logs imply recompiles and graph breaks without their reasons (traceql infers them
    # from frame ids and resume frames): a source of the same rank that has the reasons (TORCH_LOGS) wins then
    reasonless = ((pl.col("kind").is_in(["recompile", "graph_break"])
                   & pl.col("reason").is_null().all().over("rank", "kind", "source"))
                  # torch 2.5's restart_reasons give a graph break's reason but not its user line
                  | ((pl.col("kind") == "graph_break") & pl.col("user_frame").is_null().all().over("rank", "kind", "source")))
    ce = ce.with_columns(pl.when(reasonless).then(pl.col("_prio") + 10).otherwise(pl.col("_prio")).alias("_prio"))
    best = ce.group_by("rank", "kind").agg(pl.col("_prio").min().alias("_best"))
    ce = ce.join(best, on=["rank", "kind"], how="left", nulls_equal=True)
    ce = ce.filter(pl.col("_prio") == pl.col("_best")).drop("_sk", "_prio", "_best")
    return _adopt_ids(ce)


def _adopt_ids(ce: pl.DataFrame) -> pl.DataFrame:
    """Rows from logs that name no compile id (TORCH_LOGS of torch < 2.4: recompiles with stand-in frame ids,
    WON'T CONVERT reports) take the frame id of the same rank's compiled function where a compile record names it
    (one frame per function name), and rows with a compile id but no function take the function of its compile."""
    comp = ce.filter((pl.col("kind") == "compile") & pl.col("compile_id").is_not_null() & pl.col("function").is_not_null())
    if comp.height == 0:
        return ce
    fn = (comp.group_by("rank", "function").agg(pl.col("frame_id").n_unique().alias("_nf"), pl.col("frame_id").first().alias("_fid"),
                                                pl.col("compile_id").sort_by("attempt").last().alias("_last"))
          .filter(pl.col("_nf") == 1).drop("_nf"))
    by_cid = comp.unique(subset=["rank", "compile_id"], keep="first").select(
        "rank", "compile_id", pl.col("function").alias("_fn"), pl.col("filename").alias("_file"), pl.col("line").alias("_line"))
    stand_in = pl.col("frame_id").is_null() | (pl.col("frame_id") < 0)
    ce = ce.join(fn, on=["rank", "function"], how="left", nulls_equal=False).join(
        by_cid, on=["rank", "compile_id"], how="left", nulls_equal=False)
    ce = ce.with_columns(
        pl.when(stand_in & pl.col("_fid").is_not_null() & (pl.col("kind") == "recompile") & pl.col("attempt").is_not_null())
        .then(pl.format("{}/{}", pl.col("_fid"), pl.col("attempt")))
        .when(pl.col("compile_id").is_null() & (pl.col("kind") == "compile_failure")).then(pl.col("_last"))
        .otherwise(pl.col("compile_id")).alias("compile_id"),
    ).with_columns(
        pl.when(stand_in & pl.col("_fid").is_not_null()).then(pl.col("_fid")).otherwise(pl.col("frame_id")).alias("frame_id"),
        pl.coalesce("function", "_fn").alias("function"), pl.coalesce("filename", "_file").alias("filename"),
        pl.coalesce("line", "_line").alias("line"),
    )
    return ce.drop("_fid", "_last", "_fn", "_file", "_line")


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
    # torch < 2.4 TORCH_TRACE shows a graph break only as its resume frame: the reason is in TORCH_LOGS alone
    gb = gb.with_columns(pl.col("reason").fill_null("reason not in this log (torch < 2.4 TORCH_TRACE; "
                                                    "TORCH_LOGS=graph_breaks prints it)"))
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
        # a log that names no frame (TORCH_LOGS of torch <= 2.3 without TORCH_TRACE): the user line stands in
        pl.when(pl.col("filename").is_null() & pl.col("user_frame").is_not_null()).then(pl.col("user_frame"))
        .otherwise(pl.format("{}:{}", pl.col("filename").fill_null("unknown file"), pl.col("line").fill_null(0))).alias("location"),
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
    # by compile id F/C, not by restart attempt: a rank that restarted F/C at a graph break (F/C_1) still has F/C
    seen = (ev.filter(pl.col("rank").is_in(ranks) & pl.col("compile_id").is_not_null()
                      & pl.col("kind").is_in(["compile", "cache_hit", "cache_miss", "cache_bypass"]))
            .group_by(pl.col("compile_id").alias("_cid")).agg(pl.col("rank").unique().sort().alias("_present")))
    counts = c.group_by("_cid", "rank").agg(pl.len().cast(pl.Int64).alias("_n"))
    counts_f = c.group_by(pl.col("compile_id").alias("_cid"), "rank").agg(pl.len().cast(pl.Int64).alias("_n"))
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
    # every compile id counts here, not only those that produced an FX graph: a frame some ranks traced and others
    # never reached is the divergence, whether or not it reached inductor
    for r in seen.sort("_cid").iter_rows(named=True):
        present = [x for x in r["_present"] if x in ranks]
        absent = [x for x in ranks if x not in present]
        if not absent or not present:
            continue
        recompile = bool(re.search(r"/[1-9]\d*(?:_\d+)?$|_\d+$", r["_cid"]))
        extra = len(present) < len(absent) or (len(present) == len(absent) and recompile)
        n_graphs = {k: v for k, v in counts_f.filter(pl.col("_cid") == r["_cid"]).select("rank", "_n").iter_rows()}
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
        for n in sorted(set(mine) | set(theirs), key=_natural):  # example_inputs[2] before [10]
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



def compile_divergence_groups(run: Run) -> pl.DataFrame:
    """compile_cache_divergence with the odd ranks grouped as people read them ("ranks 3-4 vs 0-2"): one row per
    kind of divergence and group of ranks that diverge alike, over every compile id where they do (listed in full
    in compile_ids, summarised in `note`). Key divergences group by the differing component names; missing and
    extra compile ids by the ranks that have them."""
    schema = {"ranks": pl.List(pl.Int32), "ranks_text": pl.Utf8, "divergence": pl.Utf8, "compile_id": pl.Utf8,
              "compile_ids": pl.Utf8, "n_compile_ids": pl.UInt32, "graphs": pl.Utf8, "n_graphs": pl.Int64,
              "cache_key": pl.Utf8, "majority_key": pl.Utf8, "majority_ranks": pl.Utf8, "n_ranks": pl.UInt32,
              "n_differing": pl.Int64, "differing": pl.Utf8, "differing_values": pl.Utf8, "graphs_here": pl.Int64,
              "graphs_majority": pl.Int64, "present_on": pl.Utf8, "missing_on": pl.Utf8, "truncated": pl.Boolean,
              "note": pl.Utf8}
    div = _ensure(run, "compile_cache_divergence")
    if div.height == 0:
        return pl.DataFrame(schema=schema)
    partial = {s.rank for s in run.sources if s.kind == "torch_trace" and s.status == "partial" and s.rank is not None}
    groups: dict[tuple, list[dict]] = {}
    for r in div.sort("compile_id", "rank").iter_rows(named=True):
        d = r["divergence"]
        if d in ("missing", "extra"):
            key = (d, r["present_on"], r["missing_on"])
        elif d == "key":
            key = (d, r["differing"], r["majority_ranks"], r["compile_id"] if r["differing"] is None else None)
        else:
            key = (d, r["compile_id"], r["graphs_here"], r["graphs_majority"])
        groups.setdefault(key, []).append(r)
    rows = []
    for key, items in groups.items():
        # the ranks of a group: those odd on every compile id of it (a rank odd on fewer forms its own group)
        by_rank: dict[int, list[str]] = {}
        for it in items:
            by_rank.setdefault(it["rank"], []).append(it["compile_id"])
        by_cids: dict[tuple, list[int]] = {}
        for rank, cids in by_rank.items():
            by_cids.setdefault(tuple(sorted(set(cids), key=_cid_order)), []).append(rank)
        for cids, ranks in by_cids.items():
            first = next(it for it in items if it["rank"] == ranks[0] and it["compile_id"] == cids[0])
            rows.append(_group_row(first, sorted(ranks), list(cids), any(x in partial for x in ranks)))
    return pl.DataFrame(rows, schema=schema).sort("compile_id", "ranks_text")


def _group_row(r: dict, ranks: list[int], cids: list[str], truncated: bool) -> dict:
    d = r["divergence"]
    who, one = _ranks_word(ranks), len(ranks) == 1
    what = (f"compile {cids[0]}" if len(cids) == 1 else f"compile ids {summarise(cids)}")
    present, missing = (r["present_on"] or "").split(","), (r["missing_on"] or "").split(",")
    if d == "missing":
        others = _ranks_word([int(x) for x in present if x])
        logs = f"{who}'s compile log has" if one else f"the compile logs of {who} have"
        note = (f"{what} {'is' if len(cids) == 1 else 'are'} missing: {others} compiled "
                f"{'it' if len(cids) == 1 else 'them'} ({r['graphs_majority']} FX graph(s)"
                f"{'' if len(cids) == 1 else ' for the first'}), {logs} no record of {'it' if len(cids) == 1 else 'them'}"
                + (" (its log is truncated: it may have compiled it after the log ends)" if truncated else
                   ": the ranks compiled different code, so graphs do not line up across ranks"))
    elif d == "extra":
        others = _ranks_word([int(x) for x in missing if x])
        note = (f"{what} {'is' if len(cids) == 1 else 'are'} extra: {who} compiled {'it' if len(cids) == 1 else 'them'} "
                f"({r['graphs_here']} FX graph(s){'' if len(cids) == 1 else ' for the first'}), {others} "
                f"{'has' if len(missing) == 1 else 'have'} no record of {'it' if len(cids) == 1 else 'them'}: the ranks "
                "compiled different code (a rank-specific recompile or graph break)")
    elif d == "key":
        values = (r["differing_values"] or "").split("; ")
        shown = "; ".join(values[:3]) + (f"; and {len(values) - 3} more components (all in the evidence)" if len(values) > 3 else "")
        count = (f"; and {r['graphs_here']} FX graph(s) here vs {r['graphs_majority']} on {_ranks_word(_parse(r['majority_ranks']))}"
                 if r["graphs_here"] is not None else "")
        note = (f"{what} {'has' if len(cids) == 1 else 'have'} {r['n_graphs']} FX graph(s)"
                f"{'' if len(cids) == 1 else ' (in the first)'} whose cache key differs from "
                f"{_ranks_word(_parse(r['majority_ranks']))} (first: {r['cache_key']} vs {r['majority_key']}); "
                f"differing components: {shown}{count}")
    else:
        note = (f"{what} logged a different number of FX graphs: {r['graphs_here']} FX graph(s) on {who} vs "
                f"{r['graphs_majority']} on {_ranks_word(_parse(r['majority_ranks']))}; the graphs that pair have the same cache keys")
    return {**{k: r[k] for k in ("divergence", "graphs", "n_graphs", "cache_key", "majority_key", "majority_ranks",
                                 "n_ranks", "n_differing", "differing", "differing_values", "graphs_here",
                                 "graphs_majority", "present_on", "missing_on")},
            "ranks": ranks, "ranks_text": format_ranks(ranks), "compile_id": cids[0], "compile_ids": ",".join(cids),
            "n_compile_ids": len(cids), "truncated": truncated, "note": f"{who}: {note}"}


def _parse(ranks_csv: str | None) -> list[int]:
    return [int(x) for x in (ranks_csv or "").split(",") if x.strip().lstrip("-").isdigit()]

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
              "skew_s": pl.Float64, "n_ranks": pl.UInt32, "steps_note": pl.Utf8}
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
    ).with_columns(
        pl.when(pl.col("share_pct").is_not_null()).then(pl.format(
            "{}% of compile plus recorded step time ({} s over {} steps)", pl.col("share_pct").round(0).cast(pl.Int64),
            pl.col("steps_s").round(2), pl.col("n_steps")))
        .otherwise(pl.lit("no step times recorded (no profiler trace of this rank)")).alias("steps_note"),
    )
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank")


# --- shared: grouping ranks and summarising lists --------------------------------------------------------------


def summarise(items, k: int = 3) -> str:
    """At most k items, then "and N more": messages stay readable, the full list goes to the evidence."""
    items = [str(x) for x in items]
    if len(items) <= k + 1:
        return ", ".join(items)
    return ", ".join(items[:k]) + f" and {len(items) - k} more"


def _odd_groups(values: dict[int, object]) -> tuple[list[int], object, list[tuple[list[int], object]]]:
    """Ranks grouped by value: (majority ranks, majority value, [(odd ranks, their value), ...]). The majority is
    the value most ranks have; a tie goes to the value of the lowest rank."""
    by: dict[object, list[int]] = {}
    for r in sorted(values):
        by.setdefault(values[r], []).append(r)
    order = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    (maj_v, maj_r), rest = order[0], order[1:]
    return maj_r, maj_v, [(rs, v) for v, rs in rest]


def _ranks_word(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)


# --- TQL406 -------------------------------------------------------------------------------------------------


def compile_failures(run: Run) -> pl.DataFrame:
    """Frames whose compile failed (compilation_metrics.fail_type, or a WON'T CONVERT report in TORCH_LOGS): one row
    per function, failure type and reason, with the ranks it happened on and their compile ids. The recompile limit
    (TQL401) and frames dynamo skips on purpose are not failures."""
    schema = {"ranks": pl.List(pl.Int32), "ranks_text": pl.Utf8, "n_ranks": pl.UInt32, "compile_ids": pl.Utf8,
              "first_compile_id": pl.Utf8, "function": pl.Utf8, "location": pl.Utf8, "fail_type": pl.Utf8,
              "reason": pl.Utf8, "backend": pl.Utf8, "category": pl.Utf8, "outcome": pl.Utf8, "user_frame": pl.Utf8,
              "note": pl.Utf8}
    ev = _ensure(run, "compile_evidence")
    f = ev.filter(pl.col("kind") == "compile_failure")
    if f.height == 0:
        return pl.DataFrame(schema=schema)
    # whether suppress_errors was on: torch >= 2.6 metrics say so; before, a WON'T CONVERT report in TORCH_LOGS does
    said = (run.table("compile_events").filter((pl.col("kind") == "compile_failure")
                                                & (_detail_field("suppress_errors") == "true"))
            .select(pl.col("rank").alias("_srank"), "function").unique().with_columns(pl.lit(True).alias("_said")))
    # a log that names no rank (single-process stderr) speaks for the rank its failure is on
    pairs = (f.select("rank", "function").unique().join(said, on="function")
             .filter(pl.col("_srank").is_null() | (pl.col("_srank") == pl.col("rank")))
             .select("rank", "function", "_said").unique())
    f = f.join(pairs, on=["rank", "function"], how="left", nulls_equal=True)
    f = f.with_columns(
        _detail_field("backend").alias("backend"), _detail_field("category").alias("category"),
        pl.coalesce(pl.when(_detail_field("suppress_errors").is_not_null()).then(_detail_field("suppress_errors") == "true"),
                    pl.col("_said")).alias("_sup"),
        pl.format("{}:{}", pl.col("filename").fill_null("?"), pl.col("line").fill_null(0)).alias("location"),
        pl.col("op").fill_null("unknown").alias("fail_type"))
    all_ranks = ev["rank"].drop_nulls().unique().len()
    rows = []
    keys = ["function", "location", "fail_type", "reason"]
    for g in f.partition_by(keys, maintain_order=True):
        r0 = g.row(0, named=True)
        ranks = sorted(g["rank"].drop_nulls().unique().to_list())
        cids = sorted(g["compile_id"].drop_nulls().unique().to_list(), key=_cid_order)
        sup = g["_sup"].drop_nulls().to_list()
        outcome = ("suppress_errors=True: the frame runs in eager mode, without its compiled speed-up" if sup and all(sup)
                   else "the error reached the program (it stopped, or caught it)" if sup and not any(sup)
                   else "the frame was not compiled")
        where = _ranks_word(ranks) + (f" of {all_ranks}" if 1 < len(ranks) < all_ranks else "")
        backend = f" (backend {r0['backend']})" if r0["backend"] else ""
        cid_text = f"compile {summarise(cids)}" if cids else "a compile"
        note = (f"{cid_text} of {r0['function'] or '?'} ({r0['location']}) failed on {where}: {r0['fail_type']}"
                f"{backend}: {r0['reason'] or 'no reason logged'}; {outcome}")
        rows.append({"ranks": ranks, "ranks_text": format_ranks(ranks), "n_ranks": len(ranks), "compile_ids": ",".join(cids),
                     "first_compile_id": cids[0] if cids else None, "function": r0["function"],
                     "location": r0["location"], "fail_type": r0["fail_type"], "reason": r0["reason"],
                     "backend": r0["backend"], "category": r0["category"], "outcome": outcome,
                     "user_frame": r0["user_frame"], "note": note})
    return pl.DataFrame(rows, schema=schema)


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _cid_order(cid: str):
    nums = [int(x) for x in re.findall(r"\d+", cid or "")]
    return (cid.startswith("!"), nums, cid)


# --- TQL403 (grouped), TQL407, TQL408, TQL409: ranks that compiled differently -------------------------------


_DIV_SCHEMA = {"aspect": pl.Utf8, "ranks": pl.List(pl.Int32), "ranks_text": pl.Utf8, "majority_ranks": pl.Utf8,
               "n_ranks": pl.UInt32, "compile_id": pl.Utf8, "compile_ids": pl.Utf8, "n_compile_ids": pl.UInt32,
               "here": pl.Utf8, "majority": pl.Utf8, "note": pl.Utf8}


def _trace_ranks(run: Run, ev: pl.DataFrame) -> pl.DataFrame:
    """compile_evidence rows from TORCH_TRACE logs only: the one source that names every compile id of a rank."""
    tt = {s.id for s in run.sources if s.kind == "torch_trace"}
    return ev.filter(pl.col("source").is_in(list(tt)) & pl.col("rank").is_not_null() & pl.col("compile_id").is_not_null())


def _per_cid_values(df: pl.DataFrame, value: str) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for cid, rank, v in df.select("_cid", "rank", value).iter_rows():
        out.setdefault(cid, {})[rank] = v
    return out


def compile_rank_divergence(run: Run) -> pl.DataFrame:
    """What ranks compiled differently, beyond cache keys (TQL403), in one row per aspect and group of odd ranks:
    - collective_schedule: the collectives inside a compiled graph, in graph order (post-grad graph where logged),
      differ from the majority's for the same compile id (TQL407: ranks issuing collectives in different orders
      deadlock or reduce the wrong tensors);
    - cache_pattern: the FX graph cache hit/miss sequence differs (TQL408), grouped over compile ids;
    - tensor_meta: the dynamo graph's inputs (shapes, dtypes) differ (TQL409), grouped over compile ids.
    Only ranks whose TORCH_TRACE logs hold the fact for a compile id take part in comparing it. `ranks` is the odd
    group, `majority_ranks` the ranks it is compared with; `note` is the sentence the rule's message prints."""
    ev = _ensure(run, "compile_evidence")
    if ev.height == 0:
        return pl.DataFrame(schema=_DIV_SCHEMA)
    ev = _trace_ranks(run, ev)
    if ev.height == 0 or ev["rank"].n_unique() < 2:
        return pl.DataFrame(schema=_DIV_SCHEMA)
    # compared by compile id F/C: a restart attempt (F/C_1, after a graph break) is the same frame's compile
    ev = ev.with_columns(pl.col("compile_id").alias("_cid"))
    rows = _schedule_rows(ev) + _cache_pattern_rows(ev) + _tensor_meta_rows(ev)
    return pl.DataFrame(rows, schema=_DIV_SCHEMA) if rows else pl.DataFrame(schema=_DIV_SCHEMA)


def _schedule_rows(ev: pl.DataFrame) -> list[dict]:
    g = ev.filter(pl.col("kind") == "graph_op")
    if g.height == 0:
        return []
    g = g.with_columns(_detail_field("graph").alias("_graph"), _detail_field("graph_no", pl.Int64).alias("_gno"))
    rank_of = {"post_grad": 0, "aot": 1, "dynamo": 2}
    g = g.with_columns(pl.col("_graph").replace_strict(rank_of, default=3, return_dtype=pl.Int32).alias("_gr"))
    g = g.filter(pl.col("_gr") == pl.col("_gr").min().over("rank", "_cid"))
    # the last copy of each graph (inductor may log a graph more than once): the graph as run
    g = g.filter(pl.col("_gno") == pl.col("_gno").max().over("rank", "_cid", "_graph"))
    if not g.filter(pl.col("op").str.contains(_COLLECTIVE.pattern)).height:
        return []
    sched = (g.sort("op_index").group_by("rank", "_cid", maintain_order=True)
             .agg(pl.col("op").filter(pl.col("op").str.contains(_COLLECTIVE.pattern)
                                      & ~pl.col("op").str.contains(_WAIT.pattern)).alias("_ops")))
    short = (pl.element().str.replace(r"^(?:torch\.ops\.)?_?c10d_functional\.", "").str.replace(r"\.default$", "")
             .str.strip_chars_end("_"))
    per_cid = _per_cid_values(sched.with_columns(pl.col("_ops").list.eval(short).list.join(" -> ").alias("_s")), "_s")
    # a rank's whole schedule, its graphs in compile order: where every rank's agrees, the collectives still pair up
    # at run time even if they sit in other graphs (a rank-specific graph break moves them into the resume frame)
    whole: dict[int, list[str]] = {}
    for cid in sorted(per_cid, key=_cid_order):
        for rank, v in per_cid[cid].items():
            whole.setdefault(rank, []).extend(x for x in (v or "").split(" -> ") if x)
    if len({tuple(v) for v in whole.values()}) < 2:
        return []
    rows = []
    for cid, vals in sorted(per_cid.items(), key=lambda kv: _cid_order(kv[0])):
        if len(vals) < 2 or len(set(vals.values())) < 2:
            continue
        maj_r, maj_v, odd = _odd_groups(vals)
        for rs, v in odd:
            here, there = v or "no collectives", maj_v or "no collectives"
            rows.append({"aspect": "collective_schedule", "ranks": rs, "ranks_text": format_ranks(rs), "majority_ranks": format_ranks(maj_r),
                         "n_ranks": len(vals), "compile_id": cid, "compile_ids": cid, "n_compile_ids": 1,
                         "here": here, "majority": there,
                         "note": (f"compile {cid}: the compiled graph on {_ranks_word(rs)} issues {_clip(here)}, on "
                                  f"{_ranks_word(maj_r)} {_clip(there)}: the ranks' collectives no longer pair up "
                                  "in order, unless the others issue the difference in eager code")})
    return rows


def _clip(seq: str, k: int = 4) -> str:
    parts = seq.split(" -> ")
    return seq if len(parts) <= k + 1 else " -> ".join(parts[:k]) + f" -> ... ({len(parts)} collectives)"


def _grouped(aspect: str, per_cid: list[tuple[str, list[int], list[int], str, str, int]], sentence) -> list[dict]:
    """Odd groups found per compile id, merged over compile ids that share the same odd ranks and the same kind of
    difference (`kind`): one row each, its compile ids summarised in the note and listed in full in compile_ids."""
    merged: dict[tuple, list] = {}
    for cid, rs, maj, here, there, n in per_cid:
        merged.setdefault((tuple(rs), here, there), []).append((cid, maj, n))
    rows = []
    for (rs, here, there), items in merged.items():
        cids = sorted({c for c, _, _ in items}, key=_cid_order)
        maj = sorted({r for _, m, _ in items for r in m})
        rows.append({"aspect": aspect, "ranks": list(rs), "ranks_text": format_ranks(rs), "majority_ranks": format_ranks(maj),
                     "n_ranks": max(n for _, _, n in items), "compile_id": cids[0], "compile_ids": ",".join(cids),
                     "n_compile_ids": len(cids), "here": here, "majority": there,
                     "note": sentence(list(rs), maj, cids, here, there)})
    return sorted(rows, key=lambda r: (_cid_order(r["compile_id"]), r["ranks"]))


def _cids_text(cids) -> str:
    return ("compile " if len(cids) == 1 else f"{len(cids)} compile ids (") + summarise(cids) + ("" if len(cids) == 1 else ")")


def _cache_pattern_rows(ev: pl.DataFrame) -> list[dict]:
    c = ev.filter(pl.col("kind").is_in(["cache_hit", "cache_miss", "cache_bypass"])
                  & (_detail_field("cache") == "fx_graph").fill_null(False))
    if c.height == 0:
        return []
    c = c.with_columns(pl.col("kind").str.replace("cache_", "").alias("_hm"))
    pat = c.group_by("rank", "_cid", maintain_order=True).agg(pl.col("_hm"))
    per_cid = []
    for cid, vals in _per_cid_values(pat.with_columns(pl.col("_hm").list.join(",").alias("_p")), "_p").items():
        if len(vals) < 2 or len(set(vals.values())) < 2:
            continue
        maj_r, maj_v, odd = _odd_groups(vals)
        for rs, v in odd:
            per_cid.append((cid, rs, maj_r, _pattern_word(v), _pattern_word(maj_v), len(vals)))

    def sentence(rs, maj, cids, here, there):
        return (f"{_ranks_word(rs)} {here} the FX graph cache where {_ranks_word(maj)} {there}, on {_cids_text(cids)}: "
                f"{'a cache miss recompiles the graph from scratch, so that rank starts later and the others wait for it at the first collective' if 'miss' in here else 'those ranks compiled from scratch while this one reused cached graphs'}")
    return _grouped("cache_pattern", per_cid, sentence)


def _pattern_word(p: str) -> str:
    kinds = set(p.split(","))
    if kinds == {"hit"}:
        return "hit"
    if kinds == {"miss"}:
        return "missed"
    if kinds == {"bypass"}:
        return "bypassed"
    return f"had {p.replace(',', ', ')}"


def _tensor_meta_rows(ev: pl.DataFrame) -> list[dict]:
    t = ev.filter(pl.col("kind") == "graph_inputs")
    if t.height == 0:
        return []
    sig = t.group_by("rank", "_cid", maintain_order=True).agg(pl.col("reason").first().alias("_sig"))
    per_cid = []
    for cid, vals in _per_cid_values(sig, "_sig").items():
        if len(vals) < 2 or len(set(vals.values())) < 2:
            continue
        maj_r, maj_v, odd = _odd_groups(vals)
        for rs, v in odd:
            here, there = _input_diff(v or "", maj_v or "")
            per_cid.append((cid, rs, maj_r, here, there, len(vals)))

    def sentence(rs, maj, cids, here, there):
        return (f"on {_cids_text(cids)} the compiled graph's inputs differ: {here} on {_ranks_word(rs)} vs {there} "
                f"on {_ranks_word(maj)}: the ranks compiled different graphs for different shapes")
    return _grouped("tensor_meta", per_cid, sentence)


def _input_diff(a: str, b: str, k: int = 2) -> tuple[str, str]:
    """The inputs that differ between two `name: f32[4, 16]; ...` signatures, at most k of them named."""
    da = dict(x.split(": ", 1) if ": " in x else (x, "?") for x in a.split("; ") if x)
    db = dict(x.split(": ", 1) if ": " in x else (x, "?") for x in b.split("; ") if x)
    names = [n for n in dict.fromkeys([*da, *db]) if da.get(n) != db.get(n)]
    more = f" (and {len(names) - k} more inputs)" if len(names) > k else ""
    here = ", ".join(f"{n} {da.get(n, 'absent')}" for n in names[:k]) + more
    there = ", ".join(f"{n} {db.get(n, 'absent')}" for n in names[:k]) + more
    return here or "the same inputs in another order", there or "theirs"


DERIVED = {
    "compile_evidence": compile_evidence,
    "compile_frames": compile_frames,
    "compiled_regions": compiled_regions,
    "graph_break_cost": graph_break_cost,
    "compile_cache_divergence": compile_cache_divergence,
    "graph_collectives": graph_collectives,
    "compile_time": compile_time,
    "compile_failures": compile_failures,
    "compile_divergence_groups": compile_divergence_groups,
    "compile_rank_divergence": compile_rank_divergence,
}
