"""The HTML report's timeline data: every rank's lanes (top-level host ops of its busiest threads, one lane per GPU
stream), every step's window, the collectives matched across ranks and where each finding's evidence sits.

The page's script draws it on a canvas with zoom and pan; this module only chooses and bounds what goes in, so a run
with millions of events or of distinct kernel names still gives a page of a few megabytes: the longest events are
kept up to MAX_EVENTS, names up to MAX_NAMES (by time), each name cut at MAX_NAME_CHARS, and `cut` says what was
left out. Times are microseconds from the earliest event drawn, on the aligned clock where ranks are aligned
(report._align), else each rank from its own first event.
"""

from __future__ import annotations

import polars as pl

from traceql import link
from traceql.model.result import CheckResult
from traceql.report._align import aligner
from traceql.report.html_assets import cut

MAX_EVENTS = 60_000  # rects over all lanes; the longest are kept
MAX_NAMES = 3_000  # distinct names kept (by total time); the others show as "name not kept"
MAX_NAME_CHARS = 160
MAX_LINKS = 3_000  # matched collectives drawn (largest skew first)
MAX_STEPS = 5_000
MAX_RANKS = 64  # ranks with lanes: those the findings name first, then the lowest
HOST_THREADS_PER_RANK = 2  # host lanes per rank: the threads with the most top-level time
KINDS = ["compute", "comm", "memcpy", "memset", "host", "other"]
# Evidence that is an interval of a derived table: the evidence keys it needs, the table, the columns that must equal
# the evidence's, a filter, start and end columns, whether they are on the aligned clock already, and what picks one
# row (the largest value of that column; None: the longest interval). A GPU gap names its neighbours by short name,
# so it is found in gpu_idle_gaps, not in kernels; a straggler's evidence is the collective it arrived last at with
# the largest skew; exposed communication, the step's longest collective on the rank.
_INTERVALS = [
    {"keys": ("gap_ms", "prev_name", "next_name"), "table": "gpu_idle_gaps", "match": ("prev_name", "next_name"), "where": None,
     "ts": "gap_ts", "end": "gap_end", "aligned": False, "pick": None},
    {"keys": ("wait_caused_ms",), "table": "collective_instances", "match": (), "where": pl.col("is_last"),
     "ts": "arrival", "end": "end", "aligned": True, "pick": "skew_ms"},
    {"keys": ("excess_ms",), "table": "collective_instances", "match": (), "where": pl.col("is_last"),
     "ts": "arrival", "end": "end", "aligned": True, "pick": "skew_ms"},
    {"keys": ("exposed_ms",), "table": "collective_instances", "match": (), "where": None,
     "ts": "arrival", "end": "end", "aligned": True, "pick": None},
]
# evidence fields that name a kernel, host op or runtime call the finding is about, most specific first
_NAME_KEYS = ("kernel", "name", "fp32_example", "low_example", "prev_name", "next_name", "call", "host_op", "function")


def _us(col: str, base: pl.Expr | int) -> pl.Expr:
    return ((pl.col(col) - base) / 1000.0).round(3)


def timeline_data(result: CheckResult) -> dict:
    """The JSON the page's timeline script reads (see module docstring)."""
    run = result.run
    al = aligner(run)
    cut: list[str] = []
    k = run.table("kernels").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null())
    k = al(k, ["ts", "end"]).select("rank", "device", "stream", "ts", "end", "kind", "name", "step")
    h = _host_ops(run)
    h = al(h, ["ts", "end"])
    if h.height:
        # a rank's busiest threads only: a dataloader's or a watchdog's threads would bury the main one
        busy = (h.group_by("rank", "tid").agg((pl.col("end") - pl.col("ts")).sum().alias("_b"))
                .sort(["rank", "_b"], descending=[False, True]).group_by("rank", maintain_order=True).head(HOST_THREADS_PER_RANK))
        dropped = h.select("rank", "tid").unique().height - busy.height
        if dropped > 0:
            cut.append(f"host ops of {dropped} less busy host thread(s) not drawn")
        h = h.join(busy.select("rank", "tid"), on=["rank", "tid"], how="semi")
    steps = al(run.table("steps").filter(pl.col("rank").is_not_null() & pl.col("ts").is_not_null()), ["ts", "end"])
    if k.height == 0 and h.height == 0:
        return {"lanes": [], "steps": [], "links": [], "marks": [], "names": [], "kinds": KINDS, "cut": cut,
                "aligned": al.aligned, "note": al.note, "ranks": []}

    # one origin for all ranks on the aligned clock; without alignment each rank starts at its own first event
    parts = [df.select("rank", "ts") for df in (k, h, steps) if df.height]
    firsts = pl.concat(parts).group_by("rank").agg(pl.col("ts").min().alias("_o"))
    if al.aligned:
        firsts = firsts.with_columns(pl.col("_o").min().alias("_o"))
    origin = dict(firsts.iter_rows())

    def shift(df: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
        df = df.join(firsts, on="rank", how="left")
        return df.with_columns(*[_us(c, pl.col("_o")).alias(c) for c in cols if c in df.columns]).drop("_o")

    all_ranks = sorted(set(k["rank"].unique().to_list()) | set(h["rank"].unique().to_list()))
    if len(all_ranks) > MAX_RANKS:
        named = sorted({r for f in result.findings for r in f.ranks} & set(all_ranks))[:MAX_RANKS]
        keep = set(named) | set([r for r in all_ranks if r not in named][: MAX_RANKS - len(named)])
        cut.append(f"{len(all_ranks) - len(keep):,} of {len(all_ranks):,} ranks not drawn (the ranks findings name come first, "
                   "then the lowest)")
        k, h = k.filter(pl.col("rank").is_in(keep)), h.filter(pl.col("rank").is_in(keep))
    total = k.height + h.height
    events = pl.concat([
        k.with_columns(pl.format("gpu{} s{}", pl.col("device").fill_null(-1), pl.col("stream").fill_null(-1)).alias("lane"),
                       pl.lit("gpu").alias("side"), pl.col("device").fill_null(-1).cast(pl.Int64).alias("_o1"),
                       pl.col("stream").fill_null(-1).cast(pl.Int64).alias("_o2"))
         .select("rank", "lane", "side", "_o1", "_o2", "ts", "end", "kind", "name", "step"),
        h.with_columns(pl.format("host t{}", pl.col("tid").fill_null(-1)).alias("lane"), pl.lit("host").alias("side"),
                       pl.lit(-2, pl.Int64).alias("_o1"), pl.col("tid").fill_null(-1).cast(pl.Int64).alias("_o2"),
                       pl.lit("host").alias("kind"))
         .select("rank", "lane", "side", "_o1", "_o2", "ts", "end", "kind", "name", "step"),
    ], how="vertical_relaxed").with_columns((pl.col("end") - pl.col("ts")).alias("_d"))
    if events.height > MAX_EVENTS:
        events = events.sort("_d", descending=True).head(MAX_EVENTS)
        cut.append(f"{total - MAX_EVENTS:,} of {total:,} events not drawn (the shortest); the tables above count every one")
    # names: the ones with the most time among what is drawn; the rest keep their rect but not their name
    n_names = events["name"].n_unique()
    kept = (events.group_by("name").agg(pl.col("_d").sum().alias("_t")).sort("_t", descending=True)
            .head(MAX_NAMES)["name"].to_list())
    if n_names > MAX_NAMES:
        cut.append(f"{n_names - MAX_NAMES:,} of {n_names:,} distinct names not kept (the least time); their events show without a name")
    names = [_cut(n) for n in kept]
    name_idx = pl.DataFrame({"name": kept, "_n": list(range(len(kept)))}, schema={"name": pl.String, "_n": pl.Int64})
    events = shift(events, ["ts", "end"]).join(name_idx, on="name", how="left").with_columns(
        pl.col("_n").fill_null(-1),
        pl.col("kind").fill_null("other").replace_strict({x: i for i, x in enumerate(KINDS)}, default=len(KINDS) - 1,
                                                         return_dtype=pl.Int64).alias("_k"),
        (pl.col("end") - pl.col("ts")).round(3).alias("_dur"))

    lanes = []
    lane_of: dict[tuple, int] = {}
    for (rank, o1, o2, label, side), g in sorted(events.group_by("rank", "_o1", "_o2", "lane", "side"), key=lambda t: t[0][:3]):
        g = g.sort("ts")
        flat = []
        for row in g.select("ts", "_dur", "_k", "_n", "step").iter_rows():
            flat.extend(row[:4])
            flat.append(-1 if row[4] is None else row[4])
        lane_of[(rank, label)] = len(lanes)
        comm = int((g["_k"] == KINDS.index("comm")).sum())
        lanes.append({"rank": int(rank), "label": label, "side": side, "e": flat, "maxd": float(g["_dur"].max() or 0), "comm": comm})
    ranks = sorted({ln["rank"] for ln in lanes})

    return {
        "ranks": ranks, "lanes": lanes, "names": names, "kinds": KINDS, "cut": cut, "aligned": al.aligned,
        "note": al.note, "n_events": total,
        "steps": _steps(shift, steps, events, cut),
        "links": _links(run, shift, lanes, cut),
        "marks": _marks(result, shift, steps, events, kept),
        "origin_ns": {str(r): int(v) for r, v in origin.items()},
    }


def _cut(v) -> str:
    return cut(v, MAX_NAME_CHARS)


def _host_ops(run) -> pl.DataFrame:
    """Top-level host ops (not the profiler's own span), with a ProfilerStep#N op replaced by its children: the step is drawn as step boundaries,
    and one grey bar the length of the step would hide what the host did in it."""
    # Kineto's "PyTorch Profiler (N)" (cat Trace) spans the whole capture: it says nothing a lane could show
    h = run.table("host_ops").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null()
                                     & (pl.col("cat").fill_null("") != "Trace"))
    if h.height == 0:
        return h
    is_step = pl.col("name").str.starts_with("ProfilerStep#")
    steps = h.filter((pl.col("depth") == 0) & is_step).select("rank", "source", pl.col("id").alias("parent"))
    under = h.join(steps, on=["rank", "source", "parent"], how="semi")
    return pl.concat([h.filter((pl.col("depth") == 0) & ~is_step), under])


def _steps(shift, steps: pl.DataFrame, events: pl.DataFrame, cut: list[str]) -> list[dict]:
    """Per step, each rank's window: its step markers, widened by the step's GPU work that ran past them."""
    win = shift(steps, ["ts", "end"]).group_by("step", "rank").agg(pl.col("ts").min(), pl.col("end").max())
    ev = events.filter(pl.col("step").is_not_null()).group_by("step", "rank").agg(pl.col("ts").min(), pl.col("end").max())
    win = pl.concat([win, ev], how="vertical_relaxed").group_by("step", "rank").agg(pl.col("ts").min(), pl.col("end").max())
    out: dict[int, dict] = {}
    for s, r, a, b in win.sort("step", "rank").iter_rows():
        out.setdefault(int(s), {})[str(r)] = [a, b]
    items = [{"step": s, "w": w} for s, w in sorted(out.items())]
    if len(items) > MAX_STEPS:
        cut.append(f"{len(items) - MAX_STEPS:,} of {len(items):,} steps not in the step selector (the last ones)")
        items = items[:MAX_STEPS]
    return items


def _comm_lane(lanes: list[dict], rank: int, host_only: bool) -> int | None:
    """The lane a rank's collectives are drawn on: its stream with the most communication kernels (gloo and other
    host-side collectives: its busiest host thread's lane)."""
    mine = [(i, ln) for i, ln in enumerate(lanes) if ln["rank"] == rank]
    if not mine:
        return None
    if not host_only:
        gpu = [(ln["comm"], -i, i) for i, ln in mine if ln["side"] == "gpu" and ln["comm"]]
        if gpu:
            return max(gpu)[2]
    host = [i for i, ln in mine if ln["side"] == "host"]
    return host[0] if host else mine[0][0]


def _links(run, shift, lanes: list[dict], cut: list[str]) -> list[dict]:
    if "collective_instances" not in link.derived_tables() and "collective_instances" not in run.tables:
        return []
    try:
        ci = link.ensure(run, "collective_instances")
    except Exception:  # a linking failure loses the links, not the report (the waits section says why)
        return []
    ci = ci.filter(pl.col("arrival").is_not_null() & pl.col("rank").is_not_null() & (pl.col("n_ranks") >= 2))
    if ci.height == 0:
        return []
    ci = shift(ci.with_columns(pl.coalesce("end", "arrival").alias("end")), ["arrival", "wait_end", "end"])
    order = ci.group_by("match_id").agg(pl.col("skew_ms").max().alias("_s"))
    if order.height > MAX_LINKS:
        cut.append(f"{order.height - MAX_LINKS:,} of {order.height:,} matched collectives not linked on the timeline (the smallest skew)")
        ci = ci.join(order.sort("_s", descending=True, nulls_last=True).head(MAX_LINKS), on="match_id", how="semi")
    out = []
    for (mid,), g in ci.sort("rank").group_by("match_id"):
        r0 = g.row(0, named=True)
        pts = []
        for r in g.iter_rows(named=True):
            lane = _comm_lane(lanes, int(r["rank"]), bool(r["host_only"]))
            if lane is None:
                continue
            pts.append([lane, r["arrival"], r["wait_end"] if r["wait_end"] is not None else r["arrival"], r["end"],
                        round(float(r["wait_ms"] or 0.0), 3), int(bool(r["is_last"])), int(r["rank"])])
        if len(pts) >= 2:
            out.append({"op": _cut(r0["op"]), "pg": _cut(r0["pg_name"] or r0["group"]), "seq": r0["seq"],
                        "step": r0["step"], "skew": round(float(r0["skew_ms"] or 0.0), 3), "p": pts})
    return sorted(out, key=lambda x: min(p[1] for p in x["p"]))


# ---------------------------------------------------------------------------------------------------- evidence


def _marks(result: CheckResult, shift, steps: pl.DataFrame, events: pl.DataFrame, kept: list) -> list[dict]:
    """Where each finding's evidence is on the timeline: the collective, kernel, host op or call its evidence names
    on its rank and step, else its step's window on that rank, else the rank's whole span."""
    run = result.run
    st = shift(steps, ["ts", "end"]).group_by("rank", "step").agg(pl.col("ts").min(), pl.col("end").max())
    spans = events.group_by("rank").agg(pl.col("ts").min(), pl.col("end").max())
    ci = None
    out = []
    for f in result.findings:
        ev = f.evidence or {}
        rank = f.ranks[0] if f.ranks else None
        step = f.step
        if step is None and isinstance(ev.get("steps"), list) and ev["steps"]:
            step = ev["steps"][0]
        where, t0, t1 = None, None, None
        if rank is not None and ev.get("seq") is not None:
            if ci is None:
                ci = _ci(run, shift)
            hit = ci.filter((pl.col("rank") == rank) & (pl.col("seq") == ev["seq"]))
            if ev.get("pg_name") is not None:
                hit = hit.filter(pl.col("pg_name") == str(ev["pg_name"]))
            if hit.height:
                r = hit.row(0, named=True)
                where, t0, t1 = f"{r['op']} #{r['seq']}", r["arrival"], r["end"]
                step = r["step"] if step is None else step
        if where is None and rank is not None:
            where, t0, t1, step = _by_interval(ev, rank, step, run, shift)
        if where is None and rank is not None:
            where, t0, t1, step = _by_name(ev, rank, step, events, kept, run, shift)
        if where is None and rank is not None and step is not None:
            w = st.filter((pl.col("rank") == rank) & (pl.col("step") == step))
            if w.height:
                where, t0, t1 = f"step {step}", w["ts"][0], w["end"][0]
        if where is None:
            w = spans.filter(pl.col("rank") == rank) if rank is not None else spans
            if w.height:
                where, t0, t1 = "whole trace", w["ts"].min(), w["end"].max()
        if where is None:
            continue
        out.append({"fp": f.fingerprint, "sev": f.severity, "rule": f.rule, "msg": _cut(f.message), "rank": rank,
                    "ranks": list(f.ranks)[:64], "step": step, "t0": t0, "t1": t1, "where": _cut(where)})
    return out


def _ci(run, shift) -> pl.DataFrame:
    try:
        ci = link.ensure(run, "collective_instances")
    except Exception:
        return pl.DataFrame(schema={"rank": pl.Int32, "seq": pl.Int64, "pg_name": pl.String, "op": pl.String,
                                    "arrival": pl.Float64, "end": pl.Float64, "step": pl.Int64})
    ci = ci.filter(pl.col("arrival").is_not_null()).with_columns(pl.coalesce("end", "arrival").alias("end"))
    return shift(ci, ["arrival", "end"])


def _by_interval(ev: dict, rank: int, step, run, shift):
    """The interval of a derived table that the evidence describes, on the rank, in the step where known."""
    for spec in _INTERVALS:
        if not all(ev.get(x) is not None for x in spec["keys"]) or spec["table"] not in link.derived_tables():
            continue
        try:
            t = link.ensure(run, spec["table"])
        except Exception:  # the table failing loses this placement, not the report
            continue
        a, b = spec["ts"], spec["end"]
        sel = t.filter((pl.col("rank") == rank) & pl.col(a).is_not_null() & pl.col(b).is_not_null())
        if spec["where"] is not None:
            sel = sel.filter(spec["where"])
        for c in spec["match"]:
            sel = sel.filter(pl.col(c) == ev[c])
        if step is not None and sel.filter(pl.col("step") == step).height:
            sel = sel.filter(pl.col("step") == step)
        if sel.height == 0:
            continue
        label = (pl.format("{} #{}", pl.col("op"), pl.col("seq")) if spec["table"] == "collective_instances"
                 else pl.lit(spec["table"].replace("_", " ")))
        sel = sel.select("rank", "step", label.alias("_w"), pl.col(a).alias("ts"), pl.col(b).alias("end"),
                         (pl.col(spec["pick"]) if spec["pick"] else pl.col(b) - pl.col(a)).cast(pl.Float64).alias("_x"))
        if not spec["aligned"]:
            sel = aligner(run)(sel, ["ts", "end"])
        r = shift(sel, ["ts", "end"]).sort("_x", descending=True, nulls_last=True).row(0, named=True)
        return f"{r['_w']} ({r['end'] - r['ts']:.1f} us)", r["ts"], r["end"], step if step is not None else r["step"]
    return None, None, None, step


def _by_name(ev: dict, rank: int, step, events: pl.DataFrame, kept: list, run, shift):
    """The longest drawn event (or runtime call) on the rank, in the step where known, with a name the evidence gives."""
    for key in _NAME_KEYS:
        v = ev.get(key)
        if not isinstance(v, str) or not v:
            continue
        sel = events.filter((pl.col("rank") == rank) & (pl.col("name") == v))
        if step is not None and sel.filter(pl.col("step") == step).height:
            sel = sel.filter(pl.col("step") == step)
        if sel.height == 0:  # a runtime call (a sync, a copy) is not drawn: zoom to it all the same
            rt = run.table("runtime")
            if rt.height:
                rt = rt.filter((pl.col("rank") == rank) & (pl.col("name") == v) & pl.col("ts").is_not_null()
                               & pl.col("end").is_not_null())
                if rt.height:
                    if step is not None and rt.filter(pl.col("step") == step).height:
                        rt = rt.filter(pl.col("step") == step)
                    sel = shift(aligner(run)(rt, ["ts", "end"]).select("rank", "ts", "end", "step", "name"), ["ts", "end"])
        if sel.height:
            r = sel.with_columns((pl.col("end") - pl.col("ts")).alias("_x")).sort("_x", descending=True).row(0, named=True)
            return f"{key} {_cut(v)}", r["ts"], r["end"], step if step is not None else r["step"]
    return None, None, None, step
