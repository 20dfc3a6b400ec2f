"""`traceql annotate`: every rank's trace merged into one Chrome/Perfetto JSON, with the findings on it.

Built from the canonical tables, not by re-reading the files: one process per rank ("rank N"), one thread per GPU
stream and per host thread, kernels, host ops and runtime calls as complete events, each finding as an instant
event at its step's start on its rank(s), and flow arrows from the last rank to arrive at a collective to every
rank that waited for it (where collective_instances exists). Ranks are put on one clock with the derived
clock_offsets where they exist; otherwise each keeps its own and the trace metadata says so.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from traceql import __version__, link
from traceql.report._align import aligner
from traceql.model.result import CheckResult

STREAM_TID_BASE = 1_000_000  # stream threads sort after host threads in viewers and never collide with them
FINDING_CAT = "traceql.finding"


def annotate(result: CheckResult, host: bool = True) -> dict:
    run = result.run
    al = aligner(run)
    kernels = al(run.table("kernels").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null()), ["ts", "end"])
    host_ops = al(run.table("host_ops").filter(pl.col("ts").is_not_null()), ["ts", "end"]) if host else run.table("host_ops").clear()
    runtime = al(run.table("runtime").filter(pl.col("ts").is_not_null()), ["ts", "end"]) if host else run.table("runtime").clear()
    steps = al(run.table("steps").filter(pl.col("ts").is_not_null()), ["ts", "end"])
    starts = [df["ts"].min() for df in (kernels, host_ops, runtime, steps) if df.height]
    base = min(starts) if starts else 0
    notes = [al.note]
    events: list[dict] = []

    def us(ns) -> float:
        return (ns - base) / 1000.0

    ranks = sorted(set(run.ranks) | set(kernels["rank"].drop_nulls().unique().to_list()))
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})

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

    # host threads: their own tid (small numbers in Kineto, large in nsys; both stay below STREAM_TID_BASE or are
    # renumbered)
    host_tid: dict[tuple, int] = {}
    threads = pl.concat([host_ops.select("rank", "tid"), runtime.select("rank", "tid")]).unique().sort(["rank", "tid"], nulls_last=True)
    for r, tid in threads.iter_rows():
        n = len([k for k in host_tid if k[0] == r])
        t = tid if tid is not None and 0 <= tid < STREAM_TID_BASE else n + 1
        host_tid[(r, tid)] = t
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": f"host thread {tid}"}})
    for table, cat_col in ((host_ops, "cat"), (runtime, "kind")):
        cols = ["rank", "tid", "name", cat_col, "ts", "end", "external_id", "correlation" if "correlation" in table.columns else "external_id", "step"]
        for row in table.select(list(dict.fromkeys(cols))).iter_rows(named=True):
            end = row["end"] if row["end"] is not None else row["ts"]
            args = {k: row[k] for k in ("external_id", "correlation", "step") if k in row and row[k] is not None}
            events.append({"ph": "X", "cat": row[cat_col] or ("runtime" if table is runtime else "host"), "name": row["name"] or "?",
                           "pid": row["rank"], "tid": host_tid[(row["rank"], row["tid"])], "ts": us(row["ts"]),
                           "dur": (end - row["ts"]) / 1000.0, "args": args})

    # findings: an instant event at the start of the finding's step on each of its ranks
    step_start = {(r, s): ts for r, s, ts in steps.group_by("rank", "step").agg(pl.col("ts").min()).iter_rows()}
    rank_start: dict[int, int] = {}
    for df in (kernels, host_ops, runtime):
        for r, ts in df.group_by("rank").agg(pl.col("ts").min()).iter_rows():
            rank_start[r] = min(ts, rank_start.get(r, ts))
    n_findings = 0
    for f in result.findings:
        for r in f.ranks or ranks:
            ts = step_start.get((r, f.step)) if f.step is not None else None
            if ts is None:
                ts = rank_start.get(r, base)
            events.append({
                "ph": "i", "s": "p", "cat": FINDING_CAT, "name": f"{f.rule} {f.name}", "pid": r, "tid": 0, "ts": us(ts),
                "args": {"severity": f.severity, "message": f.message, "ranks": f.ranks, "step": f.step,
                         "evidence": f.evidence, "fingerprint": f.fingerprint,
                         "cost_ms_per_step": f.cost_ms_per_step, "cost_pct": f.cost_pct, "caused_by": f.caused_by},
            })
            n_findings += 1

    n_flows, flow_note = _flows(run, events, stream_tid, kernels, us)
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
        "flows": n_flows,
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"traceql": meta}}


def _flows(run, events: list, stream_tid: dict, kernels: pl.DataFrame, us) -> tuple[int, str]:
    """Arrows from the last arriver's collective to each rank that waited for it, bound to the waiting kernel."""
    if "collective_instances" not in link.derived_tables() and "collective_instances" not in run.tables:
        return 0, "no cross-rank wait arrows: this version of traceql has no collective_instances table"
    try:
        ci = link.ensure(run, "collective_instances")
    except Exception as e:  # the arrows are an extra; the merged trace stands without them
        return 0, f"no cross-rank wait arrows: matching collectives failed ({type(e).__name__}: {e})"
    need = {"rank", "match_id", "arrival", "start", "end", "wait_ms", "last_arriver"}
    if ci.height == 0 or not need <= set(ci.columns):
        return 0, "no cross-rank wait arrows: no collective matched across ranks"
    ci = ci.filter(pl.col("wait_ms").is_not_null() & pl.col("arrival").is_not_null() & pl.col("start").is_not_null())
    # the stream each rank's collective ran on: the comm kernel that starts at the collective's start
    comm = kernels.filter(pl.col("kind") == "comm").select("rank", "device", "stream", pl.col("ts").alias("start"))
    ci = ci.join(comm, on=["rank", "start"], how="left").unique(["match_id", "rank"], keep="first")
    last = ci.filter(pl.col("rank") == pl.col("last_arriver")).select("match_id", pl.col("rank").alias("_lr"),
                                                                     pl.col("arrival").alias("_la"), pl.col("device").alias("_ld"),
                                                                     pl.col("stream").alias("_ls"))
    waits = ci.filter(pl.col("rank") != pl.col("last_arriver")).join(last, on="match_id", how="inner")
    n = 0
    for row in waits.iter_rows(named=True):
        if row["device"] is None or row["_ld"] is None:
            continue  # host-only collectives (gloo) have no kernel to bind an arrow to
        fid = int(row["match_id"]) * 100_000 + int(row["rank"])
        name = f"wait {row['wait_ms']:.3f} ms for rank {row['_lr']}"
        # bind inside the waiter's kernel: at the last arrival, clamped into the kernel
        dst = min(max(row["_la"], row["start"]), row["end"] - 1 if row["end"] > row["start"] else row["start"])
        events.append({"ph": "s", "id": fid, "cat": "traceql.wait", "name": name, "pid": row["_lr"],
                       "tid": stream_tid[(row["_lr"], row["_ld"], row["_ls"])], "ts": us(row["_la"])})
        events.append({"ph": "f", "bp": "e", "id": fid, "cat": "traceql.wait", "name": name, "pid": row["rank"],
                       "tid": stream_tid[(row["rank"], row["device"], row["stream"])], "ts": us(dst)})
        n += 1
    return n, "" if n else "no cross-rank wait arrows: no matched collective had kernels on two ranks"


def write(result: CheckResult, out: Path, host: bool = True) -> dict:
    doc = annotate(result, host=host)
    data = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    if str(out).endswith(".gz"):
        import gzip

        data = gzip.compress(data, compresslevel=6)
    Path(out).write_bytes(data)
    return doc["otherData"]["traceql"]
