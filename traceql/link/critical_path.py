"""Per step, across ranks: the chain of GPU activity that bounds the step, and where its time went.

Algorithm (times on the aligned clock, link.clock):
1. The step ends with its latest-ending kernel over all ranks; that kernel's rank bounds the step.
2. Walk back from it. At each kernel K the predecessors are the graph's: the previous activity on its device (the
   latest-ending kernel that ended before K started: the stream edge, or a cross-stream dependency), its launch
   call (launch edge), and, for a collective kernel, the collective's last-arriving rank (peer edge). The walk
   takes the latest-finishing predecessor:
   - K is a collective kernel and another rank arrived after K started: K's time before that arrival was spent
     waiting; the path jumps to the last arriver's collective kernel (wait is charged to that rank's path, not
     here), and K's time after the arrival is exposed communication.
   - otherwise K's time is compute (compute, memcpy, memset kernels) or exposed communication (comm kernels: on
     the path, so nothing else ran beside it that bounds the step).
   - the gap between K's start and the end of the previous activity on the device is host launch time when K's
     launch call ended after that activity did (the GPU waited for the host to launch K), else idle.
3. The walk stops at the start of the step on the rank it is on (its ProfilerStep start, aligned); the gap from
   there to the first kernel on the path is host launch time when that kernel's launch ended after the step
   started, else idle.
So step_ms = compute_ms + exposed_comm_ms + host_launch_ms + idle_ms, measured from the start of the step on the
rank where the walk ended to the end of the step's last kernel.

Ranks without GPU activity (gloo on CPU) have no kernels: their steps have no critical path here (run.notes says
so); their waits are in collective_instances.

Also here: exposed_comm (per rank and step, from link.metrics' step_metrics) and launch_bound (per rank and
step: gaps in GPU activity where the next kernel had not been launched yet, the measure TQL203 reads).
"""

from __future__ import annotations

import polars as pl

from traceql.link._keys import first_match
from traceql.model import Run

CP_SCHEMA = {"step": pl.Int64, "rank": pl.Int32, "ranks_on_path": pl.List(pl.Int32), "step_ms": pl.Float64,
             "compute_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "host_launch_ms": pl.Float64, "idle_ms": pl.Float64,
             "exposed_comm_pct": pl.Float64, "host_launch_pct": pl.Float64, "path_kernels": pl.Int64, "rank_jumps": pl.Int64,
             "last_kernel": pl.Utf8, "typical_exposed_comm_pct": pl.Float64}


def _note(run: Run, text: str) -> None:
    if text not in run.notes:
        run.notes.append(text)


def _kernels_aligned(run: Run) -> pl.DataFrame:
    from traceql.link import clock, ensure

    # the columns the walk reads: filtering and joining the wide kernel table would copy every column
    k = run.table("kernels").select("rank", "source", "device", "name", "kind", "ts", "end", "correlation", "step")
    k = k.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null())
    if k.height == 0:
        return k
    k = k.with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32))
    rt = run.table("runtime").select("rank", "source", "correlation", "pid", "ts", "end").filter(pl.col("correlation").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "correlation", "pid",
        pl.col("ts").alias("launch_ts"), pl.col("end").alias("launch_end"))
    k = first_match(k, rt.drop("pid"), ["rank", "source", "correlation"])
    if run.has("collectives"):
        offsets = ensure(run, "clock_offsets")
        k = clock.align(k, offsets, ["ts", "end", "launch_ts", "launch_end"])
    return k


def _collective_waits(run: Run, k: pl.DataFrame) -> dict[int, tuple[int, int]]:
    """kernel row -> (arrival of the last arriver, row of the last arriver's collective kernel), where another rank
    arrived after this collective kernel started."""
    from traceql.link import ensure

    if not run.has("collectives"):
        return {}
    m = ensure(run, "collective_matches").filter(pl.col("kernel_ts").is_not_null())
    ci = ensure(run, "collective_instances").select("rank", "match_id", "arrival", "last_arriver", "n_ranks")
    if m.height == 0:
        return {}
    ki = k.with_row_index("_row").select("_row", "rank", "source", "kind", pl.col("ts").alias("_ats"))
    # collective kernel start on the raw clock (collectives.kernel_ts) -> aligned kernel row
    raw = run.table("kernels").select("rank", "source", "kind", "ts", "end").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null()) \
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32)).with_row_index("_row") \
        .filter(pl.col("kind") == "comm").select("_row", "rank", "source", pl.col("ts").alias("kernel_ts"))
    mk = m.select("rank", "source", "match_id", "kernel_ts").join(raw, on=["rank", "source", "kernel_ts"], how="inner") \
        .unique(["rank", "match_id"], keep="first").join(ci, on=["rank", "match_id"], how="inner").filter(pl.col("n_ranks") >= 2)
    last = mk.filter(pl.col("rank") == pl.col("last_arriver")).select("match_id", pl.col("_row").alias("_lrow"),
                                                                       pl.col("arrival").alias("_larr"))
    j = mk.join(last, on="match_id", how="inner").join(ki.select("_row", "_ats"), on="_row", how="inner").filter(
        (pl.col("rank") != pl.col("last_arriver")) & (pl.col("_larr") > pl.col("_ats")))
    return {r: (a, lr) for r, a, lr in j.select("_row", "_larr", "_lrow").iter_rows()}


_NO_TIME = -(1 << 63)


def _int_view(s: pl.Series) -> memoryview:
    """A Series of integers or booleans without nulls as a memoryview of Python ints (zero-copy for int64)."""
    if s.null_count():
        raise ValueError(f"column {s.name!r} has nulls: fill them before viewing it")
    arr = s.cast(pl.Int64).rechunk().to_arrow()
    if arr.null_count:  # pragma: no cover - checked above
        raise ValueError(s.name)
    buf = arr.buffers()[1]
    return memoryview(buf).cast("q")[arr.offset: arr.offset + len(arr)]


def _prev_on_device(k: pl.DataFrame) -> pl.Series:
    """For each kernel row: the row of the latest-ending activity on its device (rank, source, device) that ended
    at or before the kernel started (ties in end: the later row), never the kernel itself; None where there is none.

    One binary search per device of all its rows' starts into its rows sorted by end (the graph's stream and
    cross-stream predecessor), instead of a Python sort and a bisect per visited kernel."""
    n = k.height
    out = pl.repeat(None, n, dtype=pl.Int64, eager=True).alias("_prev")
    keyed = k.select("rank", "source", pl.col("device").fill_null(-1), "ts", "end").with_row_index("_row")
    parts = []
    for _, g in keyed.partition_by(["rank", "source", "device"], as_dict=True, maintain_order=True).items():
        by_end = g.select("_row", "end").sort(["end", "_row"])
        j = by_end["end"].search_sorted(g["ts"], side="right").cast(pl.Int64) - 1
        rows_by_end = by_end["_row"].cast(pl.Int64)
        me = g["_row"].cast(pl.Int64)
        # the kernel itself can only be the candidate when it has no duration: then take the one before it
        j = j - (rows_by_end.gather(j.clip(lower_bound=0)) == me).cast(pl.Int64)
        p_row = rows_by_end.gather(j.clip(lower_bound=0))
        cand = pl.DataFrame({"_row": me, "_j": j, "_p": p_row}).with_columns(
            pl.when(pl.col("_j") >= 0).then(pl.col("_p")).alias("_p"))
        parts.append(cand.select("_row", "_p"))
    if not parts:
        return out
    allp = pl.concat(parts)
    return out.scatter(allp["_row"], allp["_p"])


def critical_path(run: Run) -> pl.DataFrame:
    k = _kernels_aligned(run)
    if k.height == 0:
        if run.has("steps"):
            _note(run, "critical_path: no GPU activity in the run (host-only backends such as gloo on CPU); not computed")
        return pl.DataFrame(schema=CP_SCHEMA)
    from traceql.link import clock, ensure

    steps = run.table("steps").filter(pl.col("ts").is_not_null())
    if run.has("collectives") and steps.height:
        steps = clock.align(steps.with_columns(pl.col("rank").cast(pl.Int32)), ensure(run, "clock_offsets"), ["ts", "end"])
    step_start = {(r, s): t for r, s, t in steps.group_by("rank", "step").agg(pl.col("ts").min()).iter_rows()}
    waits = _collective_waits(run, k)

    # The walk reads a few rows of millions at random: index the columns' own memory (no Python list per column).
    # Missing values become sentinels the comparisons below treat as missing: no predecessor is -1, no launch
    # end is the smallest int64 (never later than anything).
    prev = _int_view(_prev_on_device(k).fill_null(-1))
    rank = _int_view(k["rank"])
    ts = _int_view(k["ts"])
    end = _int_view(k["end"])
    is_comm = _int_view((k["kind"] == "comm").fill_null(False))
    lend = _int_view(k["launch_end"].fill_null(_NO_TIME))
    name = k["name"]

    # the last kernel of each step over all ranks (the first such row where several end together)
    last = (
        k.select("step", "end").with_row_index("_row").filter(pl.col("step").is_not_null())
        .group_by("step").agg(pl.col("_row").get(pl.col("end").arg_max()))
    )
    rows = []
    for s, i in last.sort("step").iter_rows():
        comp = comm = launch = idle = 0
        t = end[i]
        t_end = end[i]
        on_path = {rank[i]}
        n_path = jumps = 0
        cur = i
        start_rank = rank[i]
        guard = 0
        while cur is not None and guard < 10_000_000:
            guard += 1
            n_path += 1
            w = waits.get(cur)
            if w is not None and w[0] < t:
                # a collective kernel that waited for a later rank: the time after that rank's arrival is
                # exposed communication; the path goes on from the last arriver's collective kernel
                arr, lrow = w
                comm += t - max(arr, ts[cur])
                jumps += 1
                on_path.add(rank[lrow])
                cur = lrow
                t = ts[cur]
            else:
                dur = max(0, min(t, end[cur]) - ts[cur])
                if is_comm[cur]:
                    comm += dur
                else:
                    comp += dur
            seg_start = ts[cur]
            w0 = step_start.get((rank[cur], s))
            p = prev[cur]
            if p < 0:
                p = None
            p_end = end[p] if p is not None else None
            if w0 is not None and (p_end is None or p_end <= w0):
                # reached the start of the step on this rank
                gap = max(0, seg_start - w0)
                if lend[cur] > w0:
                    launch += gap
                else:
                    idle += gap
                t = w0
                break
            if p is None:
                t = seg_start
                break
            gap = max(0, seg_start - p_end)
            if lend[cur] > p_end:
                launch += gap
            else:
                idle += gap
            t = p_end
            cur = p
        total = t_end - t
        rows.append({
            "step": s, "rank": start_rank, "ranks_on_path": sorted(on_path), "step_ms": total / 1e6,
            "compute_ms": comp / 1e6, "exposed_comm_ms": comm / 1e6, "host_launch_ms": launch / 1e6, "idle_ms": idle / 1e6,
            "exposed_comm_pct": 100.0 * comm / total if total > 0 else None,
            "host_launch_pct": 100.0 * launch / total if total > 0 else None,
            "path_kernels": n_path, "rank_jumps": jumps, "last_kernel": name[i],
        })
    if not rows:
        return pl.DataFrame(schema=CP_SCHEMA)
    # the median step's share: whether exposed communication bounds the run's steps, or one outlier step
    typical = pl.Series([r["exposed_comm_pct"] for r in rows], dtype=pl.Float64).median()
    for r in rows:
        r["typical_exposed_comm_pct"] = typical
    return pl.DataFrame(rows, schema=CP_SCHEMA)


def exposed_comm(run: Run) -> pl.DataFrame:
    """Per rank and step: communication time, the part hidden under compute, the exposed rest, and the exposed share
    of the step (from link.metrics' step_metrics: NCCL kernels, or host-side collectives where there are none)."""
    from traceql.link import ensure

    b = ensure(run, "step_metrics").filter(pl.col("side").is_not_null())
    if b.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "comm_ms": pl.Float64,
                                    "overlap_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "exposed_pct_of_step": pl.Float64,
                                    "side": pl.Utf8})
    return b.select(
        "rank", "step", "step_ms", "comm_ms", "overlap_ms", "exposed_comm_ms",
        (pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("exposed_comm_ms") / pl.col("step_ms"))).alias("exposed_pct_of_step"),
        "side",
    )


def launch_bound(run: Run) -> pl.DataFrame:
    """Per rank and step: how much of the step the GPU sat idle because the next kernel had not been launched yet.

    On each device, in start order, a kernel's gap is the time from the end of all earlier activity on the device to
    its start. The gap is launch-bound when the kernel's launch call began after the device went idle: the launch
    queue was empty, so the GPU was waiting on the host. Kernels and their launches are on one rank's clock.
    """
    schema = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "kernels": pl.Int64, "median_kernel_us": pl.Float64,
              "busy_ms": pl.Float64, "gap_ms": pl.Float64, "launch_gap_ms": pl.Float64, "launch_gap_pct": pl.Float64,
              "launch_gaps": pl.Int64, "busy_pct": pl.Float64, "typical_launch_gap_pct": pl.Float64}
    k = run.table("kernels").select("rank", "source", "device", "ts", "end", "dur", "step", "correlation")
    k = k.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("step").is_not_null())
    if k.height == 0:
        return pl.DataFrame(schema=schema)
    rt = run.table("runtime").select("rank", "source", "correlation", "ts").filter(pl.col("correlation").is_not_null()).select(
        "rank", "source", "correlation", pl.col("ts").alias("_lts"))
    k = first_match(k, rt, ["rank", "source", "correlation"])
    # rows of a device are contiguous once sorted: number them by run, so the window hashes one integer key
    # (a stable sort of nearly sorted rows is also much faster than an unstable one)
    k = k.sort(["rank", "source", "device", "ts"], maintain_order=True)
    k = k.with_columns(pl.struct("rank", "source", pl.col("device").fill_null(-1)).rle_id().alias("_dev"))
    k = k.with_columns(pl.col("end").cum_max().shift(1).over("_dev").alias("_busy_until"))
    k = k.with_columns((pl.col("ts") - pl.col("_busy_until")).clip(lower_bound=0).alias("_gap"))
    k = k.with_columns(((pl.col("_gap") > 0) & pl.col("_lts").is_not_null() & (pl.col("_lts") >= pl.col("_busy_until"))).fill_null(False).alias("_lb"))
    # A GPU that waits while the host fetches its next batch waits for data, not for launches (TQL210's case): the
    # part of a gap the host spent in a DataLoader fetch is not launch time.
    from traceql.link.input_pipeline import input_wait_ns

    k = k.with_columns(input_wait_ns(run, k, "_busy_until", "ts").alias("_in"))
    k = k.with_columns(pl.when(pl.col("_lb")).then((pl.col("_gap") - pl.col("_in")).clip(lower_bound=0)).otherwise(0).alias("_lgap"))
    per = ["rank", "step"]
    out = k.group_by(per).agg(
        pl.len().cast(pl.Int64).alias("kernels"),
        (pl.col("dur").median() / 1e3).alias("median_kernel_us"),
        (pl.col("_gap").sum() / 1e6).alias("gap_ms"),
        (pl.col("_lgap").sum() / 1e6).alias("launch_gap_ms"),
        (pl.col("_lgap") > 0).sum().cast(pl.Int64).alias("launch_gaps"),
    )
    from traceql import intervals as measures

    busy = measures.union(k.select("rank", "step", "ts", "end", "dur"), per).select(*per, pl.col("union_ms").alias("busy_ms"))
    from traceql.link import ensure

    # the step time every report uses: the longer of the host range and the GPU span (link.steps.step_times)
    st = ensure(run, "step_times").select("rank", "step", "step_ms")
    out = out.join(busy, on=per, how="left").join(
        st.with_columns(pl.col("rank").cast(out.schema["rank"]), pl.col("step").cast(out.schema["step"])), on=per, how="left")
    out = out.with_columns(
        pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("launch_gap_ms") / pl.col("step_ms")).alias("launch_gap_pct"),
        pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("busy_ms") / pl.col("step_ms")).alias("busy_pct"),
    )
    # the rank's median step: one step (the first, loading CUDA modules between launches) is not the run's habit
    out = out.with_columns(pl.col("launch_gap_pct").median().over("rank").alias("typical_launch_gap_pct"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(per)


DERIVED = {"critical_path": critical_path, "exposed_comm": exposed_comm, "launch_bound": launch_bound}
