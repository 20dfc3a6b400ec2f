"""`traceql annotate`: every rank's trace merged into one Chrome/Perfetto JSON, with the findings on it.

Built from the canonical tables, not by re-reading the files: one process per rank ("rank N"), one thread per GPU
stream and per host thread, kernels, host ops and runtime calls as complete events.

One clock. A rank recorded by two tools (Kineto for the host, nsys for the GPU: under nsys, nsys owns CUPTI) has two
clocks that can be weeks apart (Kineto's is the host's monotonic clock, nsys' starts at its session). Per rank, the
source whose collectives the cross-rank alignment used is the reference; every other source of the rank is moved
onto it by the median difference of events both saw (the same kernels, runtime calls, steps or host ops, in order),
or left out with a note when nothing matches closely. Then ranks are put on one clock with clock_offsets.

Findings sit at their evidence: each is a slice on the rank's "traceql findings" track spanning the event it is
about (the kernel, the sync call, the gap between two kernels, the collective, the compiled region, the step) and an
instant on that event's own thread; args say what it was placed at. Cross-rank waits are flow arrows from the last
rank to arrive at a collective to every rank that waited, bound to the comm kernels (NCCL) or the host ops (gloo).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from traceql import __version__, link
from traceql.model.result import CheckResult
from traceql.report._align import aligner

STREAM_TID_BASE = 1_000_000  # stream threads sort after host threads in viewers and never collide with them
FINDINGS_TID = 999_999  # the per-rank findings track, between host threads and streams
FINDING_CAT = "traceql.finding"
# two sources of one rank are on one clock when the differences of their matched events agree this closely
MAX_SPREAD_NS = 1_000_000
_TIMED = ("kernels", "host_ops", "runtime", "steps", "collectives")
_DRAWN = ("kernels", "host_ops", "runtime", "steps")  # the tables whose rows become events of the trace


# ---------------------------------------------------------------------------------------------------------------
# one clock per rank: every source of a rank onto its reference source


def _keyed(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Rows with their occurrence number among rows of the same keys, in time order (the k-th 'aten::mm')."""
    return (df.filter(pl.all_horizontal(pl.col(k).is_not_null() for k in keys)).sort("ts")
            .with_columns(pl.int_range(pl.len()).over(keys).alias("_k")).select(*keys, "_k", "ts"))


def _pairs(ref: pl.DataFrame, other: pl.DataFrame, keys: list[str], same_counts: bool) -> pl.Series:
    """ref ts - other ts for the events both sources hold under the same keys and occurrence number. Without a
    step in the keys, only names that occur equally often in both (a window cut differently would shift the k)."""
    a, b = _keyed(ref, keys), _keyed(other, keys)
    if same_counts:
        ca, cb = a.group_by(keys).len(), b.group_by(keys).len()
        ok = ca.join(cb, on=keys).filter(pl.col("len") == pl.col("len_right")).select(keys)
        a, b = a.join(ok, on=keys, how="semi"), b.join(ok, on=keys, how="semi")
    j = a.join(b, on=[*keys, "_k"], how="inner")
    return (j["ts"] - j["ts_right"]) if j.height else pl.Series([], dtype=pl.Int64)


# what two sources of one rank are matched on, most precise first: (table, keys, names must occur equally often)
_ANCHORS = [("kernels", ["step", "name"], False), ("kernels", ["name"], True), ("runtime", ["step", "name"], False),
            ("runtime", ["name"], True), ("steps", ["step"], False), ("host_ops", ["step", "name"], False),
            ("host_ops", ["name"], True)]


def _shift_between(t: dict[str, pl.DataFrame], rank: int, ref: int, src: int) -> tuple[int, str] | None:
    """The shift (ns) that puts source `src` of `rank` on the clock of source `ref`, and what it was measured on;
    None where no kind of event matches with differences that agree within MAX_SPREAD_NS."""
    for table, keys, same in _ANCHORS:
        df = t[table]
        a = df.filter((pl.col("rank") == rank) & (pl.col("source") == ref))
        b = df.filter((pl.col("rank") == rank) & (pl.col("source") == src))
        if a.height == 0 or b.height == 0 or not set(keys) <= set(df.columns):
            continue
        d = _pairs(a, b, keys, same)
        if d.len() == 0:
            continue
        med = int(d.median())
        spread = float((d - med).abs().median())
        if spread <= MAX_SPREAD_NS:
            return med, f"{d.len()} matched {table} ({'+'.join(keys)}), median deviation {spread / 1e3:.1f} us"
    return None


def _reference_sources(run, t: dict[str, pl.DataFrame]) -> dict[int, int]:
    """Per rank, the source the cross-rank clock offsets were measured on (its matched collectives), else the one
    with the most GPU kernels, else the one with the most events."""
    refs: dict[int, int] = {}
    try:
        m = link.ensure(run, "collective_matches")
        if m.height and "source" in m.columns:
            refs = {int(r): int(s) for r, s in m.group_by("rank").agg(pl.col("source").first()).iter_rows()}
    except Exception:  # noqa: BLE001,S110 (matching is an improvement; a rank without it falls back to its counts)
        pass
    counts: dict[tuple[int, int], tuple[int, int]] = {}
    for name in _DRAWN:
        for r, s, n in t[name].group_by("rank", "source").len().iter_rows():
            if r is not None:
                k, e = counts.get((r, s), (0, 0))
                counts[(r, s)] = (k + n if name == "kernels" else k, e + n)
    # a matched source that draws nothing (collectives from a log or a dump) cannot anchor the rank's events
    refs = {r: s for r, s in refs.items() if (r, s) in counts}
    for (r, s), _ in sorted(counts.items(), key=lambda kv: kv[1], reverse=True):
        refs.setdefault(r, s)
    return refs


def one_clock_per_rank(run, t: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], list[str], list[str]]:
    """The tables with every source of a rank moved onto its reference source's clock, and sources that cannot be
    placed dropped. Returns (tables, notes, warnings); warnings (what was left out) are for stderr too."""
    refs = _reference_sources(run, t)
    names = {s.id: s.path.name for s in run.sources}
    # the sources the trace shows (collectives only place markers: a Flight Recorder dump's, on the wall clock, is
    # dropped below without a word, it was never drawn)
    pairs: set[tuple[int, int]] = set()
    for name in _DRAWN:
        pairs |= {(r, s) for r, s in t[name].select("rank", "source").unique().iter_rows() if r is not None}
    shifts: dict[tuple[int, int], int] = {}
    notes: list[str] = []
    warns: list[str] = []
    dropped: list[tuple[int, int]] = []
    for r, s in sorted(pairs):
        ref = refs.get(r)
        if ref is None or s == ref:
            continue
        got = _shift_between(t, r, ref, s)
        if got is None:
            dropped.append((r, s))
            warns.append(f"rank {r}: {names.get(s, s)} left out of the merged trace: it shares no kernels, runtime "
                         f"calls, steps or host ops with {names.get(ref, ref)} to put it on that clock")
        else:
            shifts[(r, s)] = got[0]
            notes.append(f"rank {r}: {names.get(s, s)} moved onto the clock of {names.get(ref, ref)} by "
                         f"{got[0] / 1e9:+.6f} s, from {got[1]}")
    # collectives of sources that draw nothing (Flight Recorder, logs) are on other clocks: not used for placing
    placed = pl.DataFrame([(r, refs[r]) for r in refs] + list(shifts), schema={"_r": pl.Int32, "_s": pl.Int32}, orient="row")
    if not shifts and not dropped and t["collectives"].height == 0:
        return t, notes, warns
    sh = pl.DataFrame([(r, s, d) for (r, s), d in shifts.items()] or None,
                      schema={"_r": pl.Int32, "_s": pl.Int32, "_sh": pl.Int64}, orient="row")
    gone = pl.DataFrame(dropped or None, schema={"_r": pl.Int32, "_s": pl.Int32}, orient="row")
    out = {}
    for name, df in t.items():
        if df.height == 0:
            out[name] = df
            continue
        df = df.with_columns(pl.col("rank").cast(pl.Int32).alias("_r"), pl.col("source").cast(pl.Int32).alias("_s"))
        df = df.join(gone, on=["_r", "_s"], how="anti")
        if name == "collectives":
            df = df.join(placed, on=["_r", "_s"], how="semi")
        df = df.join(sh, on=["_r", "_s"], how="left", maintain_order="left").with_columns(pl.col("_sh").fill_null(0))
        cols = [c for c in ("ts", "end", "kernel_ts", "kernel_end") if c in df.columns]
        out[name] = df.with_columns([(pl.col(c) + pl.col("_sh")).alias(c) for c in cols]).drop("_r", "_s", "_sh")
    return out, notes, warns


# ---------------------------------------------------------------------------------------------------------------
# where a finding's evidence is


def _in(df: pl.DataFrame, rank: int, window: tuple[int, int] | None) -> pl.DataFrame:
    df = df.filter((pl.col("rank") == rank) & pl.col("end").is_not_null())
    if window is not None:
        df = df.filter((pl.col("ts") < window[1]) & (pl.col("end") > window[0]))
    return df


def _longest(df: pl.DataFrame) -> dict | None:
    if df.height == 0:
        return None
    return df.with_columns((pl.col("end") - pl.col("ts")).alias("_d")).sort(["_d", "ts"], descending=[True, False]).row(0, named=True)


def _locate(f, rank: int, t: dict[str, pl.DataFrame], window: tuple[int, int] | None, ci: pl.DataFrame | None):
    """(ts, end, kind, row, how): the event finding `f` is about on `rank`, from its evidence and location fields,
    within its step where it has one; kind says which track the row lives on (kernel, host, runtime, collective,
    step). None where the finding names no event and has no step."""
    ev = {**f.evidence, **f.location}
    k, h, rt = t["kernels"], t["host_ops"], t["runtime"]
    # the gap between two named kernels (TQL202): the largest such gap on the rank's GPU
    if isinstance(ev.get("prev_name"), str) and isinstance(ev.get("next_name"), str):
        kk = _in(k, rank, window).sort("ts").with_columns(
            pl.col("name").shift(1).over("device").alias("_pn"), pl.col("end").shift(1).over("device").alias("_pe"))
        # the rule may shorten names ('at::native::vectorized_elementwise_kernel' for the templated one)
        g = kk.filter(_named(pl.col("_pn"), ev["prev_name"]) & _named(pl.col("name"), ev["next_name"]) & (pl.col("ts") > pl.col("_pe")))
        if g.height:
            g = g.with_columns((pl.col("ts") - pl.col("_pe")).alias("_g"))
            # the gap the finding measured (gap_ms), else the longest
            want = ev.get("gap_ms")
            order = (pl.col("_g") - int(want * 1e6)).abs() if isinstance(want, (int, float)) else -pl.col("_g")
            row = g.sort(order).row(0, named=True)
            return row["_pe"], row["ts"], "gap", row, f"the GPU gap before kernel {row['name']!r}"
    # a compiled region (TQL402, TQL404, ...)
    if isinstance(ev.get("compile_id"), str):
        got = _longest(_in(h, rank, window).filter(pl.col("name").str.starts_with(f"Torch-Compiled Region: {ev['compile_id']}")))
        if got:
            return got["ts"], got["end"], "host", got, f"compiled region {ev['compile_id']}"
    # a named runtime call (syncs, copies: TQL201, TQL204-207, TQL211)
    if isinstance(ev.get("call"), str):
        got = _longest(_in(rt, rank, window).filter(_named(pl.col("name"), ev["call"])))
        if got:
            return got["ts"], got["end"], "runtime", got, f"the longest {ev['call']} call"
    # a named kernel (TQL209's fp32 GEMM)
    if isinstance(ev.get("fp32_example"), str):
        got = _longest(_in(k, rank, window).filter(_named(pl.col("name"), ev["fp32_example"])))
        if got:
            return got["ts"], got["end"], "kernel", got, f"kernel {ev['fp32_example']!r}"
    # a collective by sequence number (TQL303, TQL5xx, TQL6xx)
    if isinstance(ev.get("seq"), int):
        c = t["collectives"].filter((pl.col("rank") == rank) & (pl.col("seq") == ev["seq"]) & pl.col("ts").is_not_null())
        for cond in ([pl.col("pg_name") == str(ev["pg_name"])] if ev.get("pg_name") is not None else []) + \
                ([pl.col("step") == f.step] if f.step is not None else []):
            if c.filter(cond).height:
                c = c.filter(cond)
        if c.height:
            row = c.sort("ts").row(0, named=True)
            return row["ts"], row["end"] if row["end"] is not None else row["ts"], "collective", row, f"collective seq {ev['seq']}"
        # the traces carry no sequence numbers (gloo on Kineto): the one the matching gave the call
        if ci is not None and ci.height:
            c = ci.filter((pl.col("rank") == rank) & (pl.col("seq") == ev["seq"]) & pl.col("arrival").is_not_null())
            narrow = [pl.col(k) == str(ev[k]) for k in ("pg_name", "pg") if ev.get(k) is not None]
            if f.step is not None:  # sequence numbers may count calls per step ("call order per step")
                narrow.append(pl.col("step") == f.step)
            for cond in narrow:
                if c.filter(cond).height:
                    c = c.filter(cond)
            if c.height:
                row = c.sort("arrival").row(0, named=True)
                return row["arrival"], max(row["end"], row["arrival"]), "collective", row, f"collective seq {ev['seq']}"
    # waits across ranks (TQL301, TQL302): the collective it made others wait at, or waited at, the longest
    if ci is not None and ci.height and ("wait_ms" in ev or "wait_caused_ms" in ev):
        c = ci.filter(pl.col("arrival").is_not_null() & pl.col("end").is_not_null())
        if window is not None:
            c = c.filter((pl.col("arrival") < window[1]) & (pl.col("end") > window[0]))
        own = c.filter(pl.col("rank") == rank)
        if "wait_caused_ms" in ev:
            worst = (c.filter((pl.col("last_arriver") == rank) & (pl.col("rank") != rank)).group_by("match_id")
                     .agg(pl.col("wait_ms").max()).join(own, on="match_id").sort("wait_ms", descending=True))
            how = "the collective it reached last, {:.3f} ms after the first rank"
        else:
            worst = own.filter(pl.col("wait_ms") > 0).sort("wait_ms", descending=True)
            how = "its longest wait for a later rank ({:.3f} ms)"
        if worst.height:
            row = worst.row(0, named=True)
            return row["arrival"], max(row["end"], row["arrival"]), "collective", row, how.format(row["wait_ms"])
    # exposed communication (TQL101): the longest comm kernel (or host collective) of the step
    if "exposed_ms" in ev:
        got = _longest(_in(k, rank, window).filter(pl.col("kind") == "comm"))
        if got:
            return got["ts"], got["end"], "kernel", got, "the longest communication kernel of the step"
        got = _longest(_in(t["collectives"], rank, window))
        if got:
            return got["ts"], got["end"], "collective", got, "the longest collective of the step"
    if window is not None:
        return window[0], window[1], "step", None, f"step {f.step} (the finding is about the step as a whole)"
    st = t["steps"].filter((pl.col("rank") == rank) & pl.col("end").is_not_null())
    if f.step is None and st.height:
        return st["ts"].min(), st["end"].max(), "step", None, "the rank's profiled steps (the finding is about all of them)"
    return None


def _named(col: pl.Expr, name: str) -> pl.Expr:
    """The event is the one named: the same name, or one the rule shortened (a kernel's template arguments cut)."""
    return (col == name) | col.str.contains(name, literal=True)


# ---------------------------------------------------------------------------------------------------------------


def annotate(result: CheckResult, host: bool = True) -> dict:
    """The merged Chrome/Perfetto trace of `result`'s run as a dict (traceEvents, otherData.traceql: notes...)."""
    return _annotate(result, host)[0]


def _annotate(result: CheckResult, host: bool = True) -> tuple[dict, list[str]]:
    run = result.run
    al = aligner(run)
    raw = {name: run.table(name).filter(pl.col("ts").is_not_null()) for name in _TIMED}
    raw["kernels"] = raw["kernels"].filter(pl.col("end").is_not_null())
    if not host:
        raw["host_ops"], raw["runtime"] = raw["host_ops"].clear(), raw["runtime"].clear()
    t, clock_notes, warns = one_clock_per_rank(run, raw)
    t = {name: al(df, ["ts", "end", "kernel_ts", "kernel_end"]) for name, df in t.items()}
    kernels, host_ops, runtime, steps = t["kernels"], t["host_ops"], t["runtime"], t["steps"]
    starts = [df["ts"].min() for df in (kernels, host_ops, runtime, steps) if df.height]
    base = min(starts) if starts else 0
    notes = [al.note, *clock_notes, *warns]
    events: list[dict] = []

    def us(ns) -> float:
        return (ns - base) / 1000.0

    ranks = sorted(set(run.ranks) | set(kernels["rank"].drop_nulls().unique().to_list()))
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": FINDINGS_TID, "args": {"name": "traceql findings"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": FINDINGS_TID, "args": {"sort_index": -1}})

    # GPU streams: one thread each, numbered in (device, stream) order
    stream_tid: dict[tuple, int] = {}
    for r, dev, stream in kernels.select("rank", "device", "stream").unique().sort(["rank", "device", "stream"], nulls_last=True).iter_rows():
        tid = STREAM_TID_BASE + len([k for k in stream_tid if k[0] == r])
        stream_tid[(r, dev, stream)] = tid
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": f"GPU {dev} stream {stream}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid, "args": {"sort_index": tid}})
    for row in kernels.select("rank", "device", "stream", "name", "kind", "ts", "dur", "end", "correlation", "collective", "step", "bytes").iter_rows(named=True):
        args = {k: row[k] for k in ("kind", "correlation", "collective", "step", "bytes") if row[k] is not None}
        events.append({"ph": "X", "cat": f"kernel.{row['kind']}", "name": row["name"] or "?", "pid": row["rank"],
                       "tid": stream_tid[(row["rank"], row["device"], row["stream"])], "ts": us(row["ts"]),
                       "dur": (row["end"] - row["ts"]) / 1000.0, "args": args})

    # host threads: their own tid where it is small (Kineto), else renumbered; never the findings track's
    host_tid: dict[tuple, int] = {}
    threads = pl.concat([host_ops.select("rank", "tid"), runtime.select("rank", "tid")]).unique().sort(["rank", "tid"], nulls_last=True)
    for r, tid in threads.iter_rows():
        n = len([k for k in host_tid if k[0] == r])
        t_ = tid if tid is not None and 0 <= tid < FINDINGS_TID else n + 1
        host_tid[(r, tid)] = t_
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": t_, "args": {"name": f"host thread {tid}"}})
    for table, cat_col in ((host_ops, "cat"), (runtime, "kind")):
        cols = ["rank", "tid", "name", cat_col, "ts", "end", "external_id", "correlation" if "correlation" in table.columns else "external_id", "step"]
        for row in table.select(list(dict.fromkeys(cols))).iter_rows(named=True):
            end = row["end"] if row["end"] is not None else row["ts"]
            args = {k: row[k] for k in ("external_id", "correlation", "step") if k in row and row[k] is not None}
            events.append({"ph": "X", "cat": row[cat_col] or ("runtime" if table is runtime else "host"), "name": row["name"] or "?",
                           "pid": row["rank"], "tid": host_tid[(row["rank"], row["tid"])], "ts": us(row["ts"]),
                           "dur": (end - row["ts"]) / 1000.0, "args": args})

    ci = _instances(run)
    n_findings, n_located = _markers(result, t, ci, ranks, base, us, events, stream_tid, host_tid)
    n_flows, flow_note = _flows(ci, events, stream_tid, host_tid, t, us)
    if flow_note:
        notes.append(flow_note)
    meta = {
        "tool": f"traceql {__version__}",
        "run": str(run.path),
        "ranks": ranks,
        "aligned": al.aligned,
        "base_ns": int(base),
        "notes": notes + list(run.notes),
        "findings": n_findings,
        "findings_at_evidence": n_located,
        "flows": n_flows,
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"traceql": meta}}, warns


def _instances(run) -> pl.DataFrame | str:
    """collective_instances on the trace's clock, or why there is none (a note)."""
    if "collective_instances" not in link.derived_tables() and "collective_instances" not in run.tables:
        return "no cross-rank wait arrows: this version of traceql has no collective_instances table"
    try:
        ci = link.ensure(run, "collective_instances")
    except Exception as e:  # noqa: BLE001 (the arrows are an extra; the merged trace stands without them)
        return f"no cross-rank wait arrows: matching collectives failed ({type(e).__name__}: {e})"
    need = {"rank", "match_id", "arrival", "start", "end", "wait_ms", "last_arriver"}
    if ci.height == 0 or not need <= set(ci.columns):
        return "no cross-rank wait arrows: no collective matched across ranks"
    return ci  # already on the aligned clock (link.collectives aligns it with clock_offsets)


def _markers(result, t, ci, ranks, base, us, events, stream_tid, host_tid) -> tuple[int, int]:
    """Per finding and rank: a slice on the findings track spanning its evidence, and an instant on the evidence's
    own thread. A finding that names no event spans its step; one with no step sits at the rank's first event.
    Returns (markers, markers placed at an event rather than a whole step or the start)."""
    windows = {(r, s): (a, b) for r, s, a, b in
               t["steps"].group_by("rank", "step").agg(pl.col("ts").min(), pl.col("end").max()).iter_rows()}
    rank_start: dict[int, int] = {}
    for name in ("kernels", "host_ops", "runtime"):
        for r, ts in t[name].group_by("rank").agg(pl.col("ts").min()).iter_rows():
            rank_start[r] = min(ts, rank_start.get(r, ts))
    ci = ci if isinstance(ci, pl.DataFrame) else None
    n = located = 0
    for f in result.findings:
        name = f"{f.rule} {f.name}"
        for r in f.ranks or ranks:
            window = windows.get((r, f.step)) if f.step is not None else None
            got = _locate(f, r, t, window, ci)
            if got is None:
                ts = rank_start.get(r, base)
                end, kind, row = ts, None, None
                how = "start of the rank's trace: the finding names no event or step of the trace (a run-wide fact)"
            else:
                ts, end, kind, row, how = got
                located += kind != "step"
            events.append({"ph": "X", "cat": FINDING_CAT, "name": name, "pid": r, "tid": FINDINGS_TID, "ts": us(ts),
                           "dur": max(end - ts, 0) / 1000.0,
                           "args": {"severity": f.severity, "message": f.message, "placed_at": how, "rule": f.rule,
                                    "ranks": f.ranks, "step": f.step, "fingerprint": f.fingerprint,
                                    "cost_ms_per_step": f.cost_ms_per_step, "cost_pct": f.cost_pct,
                                    "caused_by": f.caused_by, "evidence": f.evidence}})
            tid, at = None, ts
            if kind in ("kernel", "gap"):
                tid = stream_tid.get((r, row["device"], row["stream"]))
                at = end if kind == "gap" else ts  # a gap is marked on the kernel that waited through it
            elif kind in ("host", "runtime"):
                tid = host_tid.get((r, row["tid"]))
            elif kind == "collective" and row.get("host_op_id") is not None:  # the host op that made the call
                h = t["host_ops"].filter((pl.col("rank") == r) & (pl.col("source") == row["source"]) & (pl.col("id") == row["host_op_id"]))
                tid = host_tid.get((r, h["tid"][0])) if h.height else None
                at = h["ts"][0] if h.height else ts
            if tid is not None:
                events.append({"ph": "i", "s": "t", "cat": FINDING_CAT, "name": name, "pid": r, "tid": tid, "ts": us(at),
                               "args": {"severity": f.severity, "message": f.message, "fingerprint": f.fingerprint}})
            n += 1
    return n, located


def _flows(ci, events: list, stream_tid: dict, host_tid: dict, t: dict, us) -> tuple[int, str]:
    """Arrows from the last arriver's collective to each rank that waited for it: between the comm kernels where
    both ranks have one (NCCL), else between the host ops that carried it (gloo and other host-side backends)."""
    if not isinstance(ci, pl.DataFrame):
        return 0, ci
    ci = ci.filter(pl.col("wait_ms").is_not_null() & pl.col("arrival").is_not_null() & pl.col("start").is_not_null())
    # the stream each rank's collective ran on: the comm kernel that starts at the collective's start
    comm = t["kernels"].filter(pl.col("kind") == "comm").select("rank", "device", "stream", pl.col("ts").alias("start"))
    ci = ci.join(comm, on=["rank", "start"], how="left").unique(["match_id", "rank"], keep="first")
    # the host thread of a collective: the innermost host op that holds its arrival
    hosts = t["host_ops"].filter(pl.col("end").is_not_null()).select("rank", "tid", pl.col("ts").alias("_hts"), pl.col("end").alias("_hend"))
    ci = ci.with_columns(pl.int_range(pl.len()).alias("_row"))
    on_host = (ci.select("_row", "rank", "arrival").join(hosts, on="rank", how="inner")
               .filter((pl.col("_hts") <= pl.col("arrival")) & (pl.col("_hend") >= pl.col("arrival")))
               .sort(pl.col("_hend") - pl.col("_hts")).unique("_row", keep="first").select("_row", pl.col("tid").alias("_htid")))
    ci = ci.join(on_host, on="_row", how="left")
    last = ci.filter(pl.col("rank") == pl.col("last_arriver")).select(
        "match_id", pl.col("rank").alias("_lr"), pl.col("arrival").alias("_la"), pl.col("device").alias("_ld"),
        pl.col("stream").alias("_ls"), pl.col("_htid").alias("_lhtid"))
    waits = ci.filter(pl.col("rank") != pl.col("last_arriver")).join(last, on="match_id", how="inner")
    n = 0
    for row in waits.iter_rows(named=True):
        if row["device"] is not None and row["_ld"] is not None:
            src, dst_tid = stream_tid[(row["_lr"], row["_ld"], row["_ls"])], stream_tid[(row["rank"], row["device"], row["stream"])]
        else:
            src, dst_tid = host_tid.get((row["_lr"], row["_lhtid"])), host_tid.get((row["rank"], row["_htid"]))
            if row["_lhtid"] is None or row["_htid"] is None or src is None or dst_tid is None:
                continue
        fid = int(row["match_id"]) * 100_000 + int(row["rank"])
        name = f"wait {row['wait_ms']:.3f} ms for rank {row['_lr']}"
        # bind inside the waiter's collective: at the last arrival, clamped into it
        dst = min(max(row["_la"], row["start"]), row["end"] - 1 if row["end"] > row["start"] else row["start"])
        events.append({"ph": "s", "id": fid, "cat": "traceql.wait", "name": name, "pid": row["_lr"], "tid": src, "ts": us(row["_la"])})
        events.append({"ph": "f", "bp": "e", "id": fid, "cat": "traceql.wait", "name": name, "pid": row["rank"],
                       "tid": dst_tid, "ts": us(dst)})
        n += 1
    return n, "" if n else "no cross-rank wait arrows: no matched collective had a kernel or a host op on two ranks"


def write(result: CheckResult, out: Path, host: bool = True) -> dict:
    """Write the merged trace (gzip where `out` ends in .gz); returns its metadata plus 'warnings' (sources left out)."""
    doc, warns = _annotate(result, host=host)
    data = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    if str(out).endswith(".gz"):
        import gzip

        data = gzip.compress(data, compresslevel=6)
    Path(out).write_bytes(data)
    return {**doc["otherData"]["traceql"], "warnings": warns}
