"""Per step, across ranks: the chain of work, GPU and host, that bounds the step, and where its time went.

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
   - the gap between K's start and the end of the previous activity on the device is idle when K had been
     launched before the device went idle, else the host's: the GPU waited for the host to launch K. The host's
     gap is split by what the host did (host_launch_ms, and its parts): fetching a batch (a DataLoader __next__
     range: input_wait_ms), inside a host-side collective (gloo: host_comm_ms), blocked in a sync call
     (host_sync_ms), inside another recorded op or runtime call (launching: dispatch, launch calls), else outside
     anything recorded (host_other_ms: Python between ops, a sleep). Where the host was blocked in a host-side
     collective (gloo) waiting for a later rank, the path jumps to that rank at its arrival (host_jumps): its
     late launch, data wait or sync is on the path of every rank that waited for it, and the walk goes on from
     that rank's last kernel before it.
3. The walk stops at the start of the step on the rank it is on (its ProfilerStep start, aligned); the gap from
   there to the first kernel on the path is split as in 2.
So step_ms = compute_ms + exposed_comm_ms + host_launch_ms + idle_ms (host_launch_ms holds host_sync_ms,
input_wait_ms, host_comm_ms and host_other_ms), measured from the start of the step on the rank where the walk ended
to the end of the step's last kernel; rank_jumps counts every jump to another rank, host_jumps those through
host-side collectives.

The walk's inputs are per rank and on the rank's own clock (path_kernels: the kernels with their launch calls;
host_cover: what the host did, as unions of intervals), so a rank task builds them where the rank was read; the
clock offsets, a shift per rank, are applied where the path is walked. The walk goes on on another rank only at a
collective kernel that waited for a later rank and at a host-side collective wait, so it is split there: a rank's
part (_Part) walks the segments between those points from its own rows, and the cross-rank stage (stitch) chains
the segments across ranks from per-step and per-collective rows (jumps_frame, from collective_instances and the
parts' collective kernels). On Dask (traceql.executor) each rank group's part runs where its rows were read and no
kernel or host row leaves it; the local path walks the whole run as one part.

Ranks without GPU activity (gloo on CPU) have no kernels: their steps have no critical path here (run.notes says
so); their waits are in collective_instances.

Also here: exposed_comm (per rank and step, from link.metrics' step_metrics) and launch_bound (per rank and
step: gaps in GPU activity where the next kernel had not been launched yet, the measure TQL203 reads). Whether
exposed communication bounds the run's typical step (TQL104's median) is the rule's own SQL.
"""

from __future__ import annotations

from array import array

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.link._keys import first_match
from traceql.model import Run

CP_SCHEMA = {"step": pl.Int64, "rank": pl.Int32, "ranks_on_path": pl.List(pl.Int32), "step_ms": pl.Float64,
             "compute_ms": pl.Float64, "exposed_comm_ms": pl.Float64, "host_launch_ms": pl.Float64, "idle_ms": pl.Float64,
             "host_sync_ms": pl.Float64, "input_wait_ms": pl.Float64, "host_comm_ms": pl.Float64,
             "host_other_ms": pl.Float64,
             "exposed_comm_pct": pl.Float64, "host_launch_pct": pl.Float64, "path_kernels": pl.Int64, "rank_jumps": pl.Int64,
             "host_jumps": pl.Int64, "last_kernel": pl.Utf8}


def _note(run: Run, text: str) -> None:
    if text not in run.notes:
        run.notes.append(text)


PATH_KERNELS_SCHEMA = {"rank": pl.Int32, "source": pl.Int32, "device": pl.Int32, "name": pl.Utf8, "kind": pl.Utf8,
                       "ts": pl.Int64, "end": pl.Int64, "step": pl.Int64, "launch_ts": pl.Int64, "launch_end": pl.Int64}
HOST_COVER_SCHEMA = {"rank": pl.Int32, "cover": pl.Utf8, "seg_ts": pl.Int64, "seg_end": pl.Int64}


def path_kernels(run: Run) -> pl.DataFrame:
    """The walk's per-rank input, on the rank's own clock: every timed kernel with the columns the walk reads and its
    launch call's start and end. A rank's rows need only its own kernels and runtime calls, so a rank task builds
    them where the rank was read (traceql.executor) and the kernels and runtime tables never travel; the clock
    offsets are a shift per rank, applied where the path is walked."""
    # the columns the walk reads: filtering and joining the wide kernel table would copy every column
    k = run.table("kernels").select("rank", "source", "device", "name", "kind", "ts", "end", "correlation", "step")
    k = k.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null())
    if k.height == 0:
        return pl.DataFrame(schema=PATH_KERNELS_SCHEMA)
    k = k.with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32))
    rt = run.table("runtime").select("rank", "source", "correlation", "ts", "end").filter(pl.col("correlation").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "correlation",
        pl.col("ts").alias("launch_ts"), pl.col("end").alias("launch_end"))
    k = first_match(k, rt, ["rank", "source", "correlation"])
    return k.select([pl.col(c).cast(t) for c, t in PATH_KERNELS_SCHEMA.items()])


def host_covers(run: Run) -> dict[str, pl.DataFrame]:
    """The intervals (rank, ts, end) each of host_cover's unions is made of, by cover name, in host_cover's order."""
    from traceql.link.input_pipeline import loader_rows

    rt = run.table("runtime")
    return {
        "loader": loader_rows(run.table("host_ops")).select("rank", "ts", "end"),
        "sync": rt.filter((pl.col("kind") == "sync") & ~pl.col("name").str.contains("Query")).select("rank", "ts", "end"),
        # the host's own work: any op or range, and runtime calls (launches); outside all of them the host ran
        # code the profiler did not record (Python between ops, a sleep, another library)
        # (not the ranges that hold a whole step: ProfilerStep#N, the profiler's own range, a "train" NVTX range)
        "ops": pl.concat([_below_steps(run).select("rank", "ts", "end"), rt.select("rank", "ts", "end")]),
        # host-side collectives: calls with no GPU kernel (gloo), as collective_matches defines host_only
        "host_comm": run.table("collectives").filter(pl.col("kernel_ts").is_null() & pl.col("kernel_end").is_null())
        .select("rank", "ts", "end"),
    }


def host_cover(run: Run) -> pl.DataFrame:
    """What each rank's host did, as disjoint segments on the rank's own clock (the walk's host gaps read them):
    DataLoader fetches (loader), blocking sync calls (sync), any recorded op below the step ranges or runtime call
    (ops), and host-side collectives with no GPU kernel (host_comm, gloo). A union of intervals shifted by a rank's
    clock offset is the shifted union, so a rank task builds these from its own host ops and runtime calls."""
    from traceql import intervals

    covers = host_covers(run)
    # the four unions in one pass: segments per (union, rank), in host_covers' order, then rank and start
    df = pl.concat([d.lazy().select(pl.lit(i, dtype=pl.Int8).alias("_c"), pl.col("rank").cast(pl.Int32), "ts", "end")
                    for i, d in enumerate(covers.values())]).filter(
        pl.col("rank").is_not_null() & pl.col("ts").is_not_null() & pl.col("end").is_not_null()).collect(engine=POLARS_ENGINE)
    if df.height == 0:
        return pl.DataFrame(schema=HOST_COVER_SCHEMA)
    names = dict(enumerate(covers))
    return intervals.segments(df, ["_c", "rank"]).select(
        "rank", pl.col("_c").replace_strict(names, return_dtype=pl.Utf8).alias("cover"), "seg_ts", "seg_end") \
        .select([pl.col(c).cast(t) for c, t in HOST_COVER_SCHEMA.items()])


_NO_TIME = -(1 << 63)


# From this many rows a column is viewed in place through pyarrow (zero-copy); below it, copied into an array of
# int64: pyarrow's import costs more than the copy of a small trace's columns, and most checks never need it.
_VIEW_IN_PLACE = 1 << 18


def _int_view(s: pl.Series) -> memoryview:
    """A Series of integers or booleans without nulls as a memoryview of Python ints (zero-copy for long columns)."""
    if s.null_count():
        raise ValueError(f"column {s.name!r} has nulls: fill them before viewing it")
    if s.len() < _VIEW_IN_PLACE:
        return memoryview(array("q", s.cast(pl.Int64).to_list()))
    arr = s.cast(pl.Int64).rechunk().to_arrow()
    if arr.null_count:  # pragma: no cover - checked above
        raise ValueError(s.name)
    buf = arr.buffers()[1]
    return memoryview(buf).cast("q")[arr.offset: arr.offset + len(arr)]


def _prev_on_device(k: pl.DataFrame) -> pl.Series:
    return _prev_and_order(k)[0]


def _prev_and_order(k: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """For each kernel row: the row of the latest-ending activity on its device (rank, source, device) that ended
    at or before the kernel started (ties in end: the later row), never the kernel itself; None where there is none.

    One binary search per device of all its rows' starts into its rows sorted by end (the graph's stream and
    cross-stream predecessor), instead of a Python sort and a bisect per visited kernel. Also the rows in that order,
    device by device (_run_sums' order)."""
    n = k.height
    if n < _PREV_IN_PYTHON:
        return _prev_and_order_few(k)
    packed = _prev_and_order_packed(k) if _PACK_DEVICES else None
    if packed is not None:
        return packed
    out = pl.repeat(None, n, dtype=pl.Int64, eager=True).alias("_prev")
    keyed = k.select("rank", "source", pl.col("device").fill_null(-1), "ts", "end").with_row_index("_row")
    parts, orders = [], []
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
        orders.append(rows_by_end)
    if not parts:
        return out, pl.Series("_row", [], dtype=pl.Int64)
    allp = pl.concat(parts)
    return out.scatter(allp["_row"], allp["_p"]), pl.concat(orders)


# below this many kernels _prev_and_order searches in Python: its polars queries cost ~0.5 ms per device
_PREV_IN_PYTHON = 8_192
_PACK_DEVICES = True  # tests turn it off to compare the packed search with the loop per device


def _prev_and_order_packed(k: pl.DataFrame) -> tuple[pl.Series, pl.Series] | None:
    """_prev_and_order's rows for every device at once: one stable sort and one binary search over a single Int64 key
    (the device's dense number above the end's offset from the earliest time), instead of a sort, a search and a
    frame per device (16 ranks x 36 MB: 0.09 -> 0.05 s in-process; 128 ranks have 128 devices or more). The same rows
    and order as the loop; None where the key does not fit 62 bits (the loop runs then)."""
    n = k.height
    dev = k.select(pl.struct("rank", "source", pl.col("device").fill_null(-1)).rank("dense").cast(pl.Int64) - 1).to_series()
    # renumbered in order of first appearance, as the loop takes the devices
    first = dev.filter(dev.is_first_distinct())
    dev = pl.repeat(0, first.len(), dtype=pl.Int64, eager=True).scatter(first, pl.int_range(first.len(), dtype=pl.Int64, eager=True)).gather(dev)
    lo = min(k["ts"].min(), k["end"].min())
    hi = max(k["ts"].max(), k["end"].max())
    width = int(hi - lo).bit_length()
    if int(dev.max()).bit_length() + width > 62:
        return None
    # ends sorted per device with ties by row (a stable sort of rows in row order)
    s = pl.DataFrame({"_k": dev * (1 << width) + (k["end"] - lo),
                      "_row": pl.int_range(n, dtype=pl.Int64, eager=True)}).sort("_k", maintain_order=True)
    key, rows = s["_k"], s["_row"]
    # the last end at or before the start on the same device; never the kernel itself (no duration): the one before
    pos = key.search_sorted(dev * (1 << width) + (k["ts"] - lo), side="right").cast(pl.Int64) - 1
    pos = pos - (rows.gather(pos.clip(lower_bound=0)) == pl.int_range(n, dtype=pl.Int64, eager=True)).cast(pl.Int64)
    at = rows.gather(pos.clip(lower_bound=0))
    prev = pl.select(pl.when((pos >= 0) & (dev.gather(at) == dev)).then(at)).to_series()
    return prev.alias("_prev"), rows.alias("_row")


def _prev_and_order_few(k: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """_prev_and_order by a sort and a bisection per device in Python (the same rows: ends sorted with ties by row,
    the last end at or before the start, never the kernel itself; devices in order of first appearance)."""
    from bisect import bisect_right

    dev: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(k["rank"].to_list(), k["source"].to_list(), k["device"].fill_null(-1).to_list())):
        v = dev.get(key)
        if v is None:
            v = dev[key] = []
        v.append(i)
    ts, end = k["ts"].to_list(), k["end"].to_list()
    prev: list[int | None] = [None] * k.height
    order: list[int] = []
    for rows in dev.values():
        by_end = sorted(rows, key=lambda i: (end[i], i))
        ends = [end[i] for i in by_end]
        for i in rows:
            j = bisect_right(ends, ts[i]) - 1
            if j >= 0 and by_end[j] == i:  # the kernel itself (no duration): the one before it
                j -= 1
            if j >= 0:
                prev[i] = by_end[j]
        order.extend(by_end)
    return pl.Series("_prev", prev, dtype=pl.Int64), pl.Series("_row", order, dtype=pl.Int64)


def _below_steps(run: Run) -> pl.DataFrame:
    """Host ops that do not span a whole step of their rank and source (those hold everything the host did)."""
    h = run.table("host_ops").select("rank", "source", "id", "ts", "end").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    st = run.table("steps").select("rank", "source", pl.col("ts").alias("_sts"), pl.col("end").alias("_send"))
    if h.height == 0 or st.height == 0:
        return h
    shortest = st.group_by("rank", "source").agg((pl.col("_send") - pl.col("_sts")).min().alias("_min"))
    # only ops as long as a step can hold one: a few per rank, so the joins with the steps stay small (no op shorter
    # than every rank's shortest step passes its own rank's test: filtered before the join)
    long = h.filter(pl.col("end") - pl.col("ts") >= shortest["_min"].min())
    long = long.join(shortest, on=["rank", "source"], how="inner").filter(pl.col("end") - pl.col("ts") >= pl.col("_min"))
    spans = long.join(st, on=["rank", "source"], how="inner").filter(
        (pl.col("ts") <= pl.col("_sts")) & (pl.col("end") >= pl.col("_send"))).select("rank", "source", "id").unique()
    if spans.height == 0:
        return h
    # the anti-join on (rank, source, id) as a mask in h's row order: the exact key test only for the rows whose id
    # is a spanning op's (a few), not a hash of every host op's key
    cand = h.select("rank", "source", "id").with_row_index("_r").filter(pl.col("id").is_in(spans["id"].implode()))
    drop = cand.join(spans, on=["rank", "source", "id"], how="semi")["_r"]
    return h.filter(pl.repeat(True, h.height, dtype=pl.Boolean, eager=True).scatter(drop, False))


def host_waits(ci: pl.DataFrame) -> pl.DataFrame:
    """collective_instances' rows where a rank waited in a host-side collective (gloo) for a later rank."""
    return ci.filter(
        pl.col("host_only").fill_null(False) & (pl.col("n_ranks") >= 2) & (pl.col("rank") != pl.col("last_arriver"))
        & pl.col("wait_end").is_not_null() & (pl.col("wait_end") > pl.col("arrival")))


class _HostView:
    """What each rank's host did, on the aligned clock, for the walk's host gaps: DataLoader fetches, blocking sync
    calls, and its waits in host-side collectives (gloo: the call blocks the host) for a later rank;
    and each rank's kernels by end time, to go on from a rank the path jumps to."""

    def __init__(self, cov: pl.DataFrame, ci: pl.DataFrame | None, k: pl.DataFrame):
        """cov: the ranks' host_cover on the aligned clock; ci: their rows of collective_instances (None: the run has
        no collectives); k: their kernels, aligned."""
        self._cov = cov
        self.cover_rows = cov.height
        self._covers: dict[str, pl.DataFrame] | None = None
        self.waits: dict[int, tuple[list[int], list[tuple[int, int]]]] = {}
        if ci is not None:
            ci = host_waits(ci)
            for (r,), g in ci.sort("wait_end").partition_by("rank", as_dict=True, maintain_order=True).items():
                self.waits[int(r)] = (g["wait_end"].to_list(), list(zip(g["arrival"].to_list(), g["last_arriver"].to_list())))
        self._k = k.select("rank", "end")
        self._by_end: dict | None = None
        self._lists: dict | None = None  # charge_few's unions as lists, built on its first call

    @property
    def by_end(self) -> dict[int, tuple[list[int], list[int]]]:
        """Per rank, its kernels' ends in order and their rows: built on the first host-side jump (gloo) only, as
        most runs never jump there."""
        if self._by_end is None:
            kk = self._k.with_row_index("_row").sort("end")
            self._by_end = {int(r): (g["end"].to_list(), g["_row"].to_list())
                            for (r,), g in kk.partition_by("rank", as_dict=True, maintain_order=True).items()}
        return self._by_end

    @property
    def cover(self) -> dict[str, pl.DataFrame]:
        """host_cover's unions per rank for charge's joins: built on its first call (a small run's walk charges its
        gaps in Python, charge_few)."""
        if self._covers is None:
            self._covers = {c: self._cover(self._cov, c) for c in ("loader", "sync", "ops", "host_comm")}
        return self._covers

    @staticmethod
    def _cover(cov: pl.DataFrame, name: str) -> pl.DataFrame:
        """One of host_cover's unions per rank: segments sorted by start, with the covered time before each."""
        return (cov.filter(pl.col("cover") == name).select(pl.col("rank").cast(pl.Int64), "seg_ts", "seg_end")
                .sort("rank", "seg_ts")
                .with_columns(((pl.col("seg_end") - pl.col("seg_ts")).cum_sum().over("rank")
                               - (pl.col("seg_end") - pl.col("seg_ts"))).alias("cum")))

    def _upto(self, name: str, pts: pl.DataFrame, t: str) -> pl.Series:
        """Per point: rank's covered time of this union before pts[t] (0 where the rank has none); pts sorted by t,
        the result in pts' row order (_i: 0..n-1 in some order)."""
        seg = self.cover[name]
        j = pts.join_asof(seg, left_on=t, right_on="seg_ts", by="rank", strategy="backward", check_sortedness=False)
        v = j.select((pl.col("cum") + pl.min_horizontal(pl.col(t), pl.col("seg_end")) - pl.col("seg_ts")).fill_null(0)
                     .alias(name)).to_series()
        # back in the points' order: one scatter, not a sort per union
        return pl.repeat(0, pts.height, dtype=v.dtype, eager=True).alias(name).scatter(j["_i"], v)

    def classify(self, gaps: list[tuple[int, int, int, int]]) -> dict[int, dict[str, int]]:
        """Charge the host gaps (step, rank r, a, b) = [a, b) of rank r, summed per step: the part the host spent in
        a DataLoader fetch to input, in a host-side collective (gloo: after any wait for a later rank, which the walk
        crosses) to comm, the part it was still blocked in a sync call to sync (a sync returns when the GPU work it
        waits for ends; blocked past that, it waits for something else: an event of another stream, a host-side
        copy), the rest to launching where the host was inside a recorded op or runtime call (dispatch, launch
        calls), else to other (code the profiler did not record: Python between ops, a sleep). All gaps at once:
        the walk only records them (one query per union here, not four bisections per gap in Python)."""
        if not gaps:
            return {}
        g = pl.DataFrame(gaps, schema={"step": pl.Int64, "rank": pl.Int64, "a": pl.Int64, "b": pl.Int64},
                         orient="row")
        g = self.charge(g)
        per = g.group_by("step").agg(pl.col("launch", "sync", "input", "comm", "other").sum())
        return {row["step"]: row for row in per.iter_rows(named=True)}

    def charge(self, g: pl.DataFrame) -> pl.DataFrame:
        """Per gap [a, b) of rank (Int64 columns rank, a, b): its launch, sync, input, comm and other parts (classify's
        split, row by row)."""
        g = g.with_row_index("_i")
        # the points sorted once per end, for every union's as-of join
        at = {t: g.select("_i", "rank", t).sort(t) for t in ("a", "b")}
        w = {name: self._upto(name, at["b"], "b") - self._upto(name, at["a"], "a") for name in self.cover}
        g = g.with_columns(*(v.clip(lower_bound=0).alias(f"_{n}") for n, v in w.items()))
        span = pl.col("b") - pl.col("a")
        g = g.with_columns(pl.col("_loader").alias("input"))
        g = g.with_columns(pl.min_horizontal(span - pl.col("input"), pl.col("_host_comm")).alias("comm"))
        g = g.with_columns(pl.min_horizontal(span - pl.col("input") - pl.col("comm"), pl.col("_sync")).alias("sync"))
        g = g.with_columns((span - pl.col("input") - pl.col("comm") - pl.col("sync")).alias("_rest"))
        g = g.with_columns(pl.min_horizontal(pl.col("_rest"), pl.col("_ops")).alias("launch"))
        return g.with_columns((pl.col("_rest") - pl.col("launch")).alias("other"))

    def charge_few(self, gaps: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int, int]]:
        """charge's split, (launch, sync, input, comm, other) per gap (rank, a, b), by bisection over the unions as
        Python lists: for the few gaps of a small run's walk, where charge's eight as-of joins cost more than the
        gaps (identical integers: the same sums and minima)."""
        from bisect import bisect_right

        if self._lists is None:
            # per union and rank: segment starts, ends and the covered time before each, in start order (_cover's)
            self._lists = {c: {} for c in ("loader", "sync", "ops", "host_comm")}
            cov = self._cov.sort("cover", "rank", "seg_ts")
            for c, r, a, b in zip(*(cov[col].to_list() for col in ("cover", "rank", "seg_ts", "seg_end"))):
                per = self._lists.get(c)
                if per is None:
                    continue
                v = per.get(r)
                if v is None:
                    v = per[r] = ([], [], [], [0])
                v[0].append(a)
                v[1].append(b)
                v[2].append(v[3][0])
                v[3][0] += b - a

        def upto(per, r, t):  # _upto for one point
            v = per.get(r)
            if v is None:
                return 0
            i = bisect_right(v[0], t) - 1
            return v[2][i] + min(t, v[1][i]) - v[0][i] if i >= 0 else 0

        loader, host_comm, sync_, ops = (self._lists[c] for c in ("loader", "host_comm", "sync", "ops"))
        out = []
        for r, a, b in gaps:
            span = b - a
            inp = max(0, upto(loader, r, b) - upto(loader, r, a))
            comm = min(span - inp, max(0, upto(host_comm, r, b) - upto(host_comm, r, a)))
            sync = min(span - inp - comm, max(0, upto(sync_, r, b) - upto(sync_, r, a)))
            rest = span - inp - comm - sync
            launch = min(rest, max(0, upto(ops, r, b) - upto(ops, r, a)))
            out.append((launch, sync, inp, comm, rest - launch))
        return out

    def wait(self, r: int, a: int, b: int) -> tuple[int, int] | None:
        """(end of the wait, late rank) of rank r's latest host-side collective wait for another rank that ends
        inside (a, b]."""
        from bisect import bisect_right

        v = self.waits.get(r)
        if v is None:
            return None
        ends, info = v
        i = bisect_right(ends, b) - 1
        if i >= 0 and ends[i] > a and info[i][1] is not None and info[i][1] != r:
            return ends[i], int(info[i][1])
        return None

    def last_kernel_before(self, r: int, t: int) -> int | None:
        from bisect import bisect_right

        v = self.by_end.get(r)
        if v is None:
            return None
        i = bisect_right(v[0], t) - 1
        return v[1][i] if i >= 0 else None


_GUARD = 10_000_000
# below this many host gaps in a round of segments, they are charged in Python (_HostView.charge_few): a small run's
# walk has tens of gaps per round, and charge's joins cost ~1 ms each whatever their size (and while host_cover is
# short enough that taking it as lists once costs less than a few rounds of joins)
_CHARGE_FEW = 500
_CHARGE_FEW_COVER = 1 << 16
# below this many kernels the walk's own code is quicker than building the runs (a fixed ~0.05 s of polars queries)
_RUNS_FROM = 20_000
_NEVER = 1 << 62
_SUMS = ("_comp", "_comm", "_idle", "_n", "launch", "sync", "input", "comm", "other")


def _interior_runs(k: pl.DataFrame, prev: pl.Series, waits: dict, host: _HostView,
                   step_start: dict, order: pl.Series) -> dict[str, memoryview]:
    """The walk's plain visits, all at once. A visit of kernel K (the walk reaches it at its end) whose previous
    activity P exists, that waits for no later rank (no collective wait, no host-side collective wait in its gap)
    and that the step's start does not cut (every step s whose start on K's rank is at or after P's end: s >= T[K])
    adds K's duration, then the idle or host gap from P's end to K's start, and goes on to P, whatever the step.
    Kernels whose successive plain visits have one T form runs; per kernel: the sums to the end of its run and the
    kernel the run hands on to, by pointer doubling (log2 of the run's length rounds of gathers). The walk then
    crosses a run in one step; every other visit (ff is 0) takes the walk's own code."""
    n = k.height
    d = k.select(pl.col("rank").cast(pl.Int64), "ts", "end", (pl.col("kind") == "comm").fill_null(False).alias("_isc"),
                 pl.col("launch_end").fill_null(_NO_TIME).alias("_lend")).with_columns(
        prev.alias("_p"), pl.int_range(n, dtype=pl.Int64).alias("_i"))
    d = d.with_columns(pl.col("end").gather(pl.col("_p")).alias("_e"))
    d = d.with_columns((pl.col("_lend") > pl.col("_e")).fill_null(False).alias("_hg"))
    # T: the first step whose start on the rank is at or after P's end (a suffix minimum over the rank's starts)
    st = pl.DataFrame([(r, s, t) for (r, s), t in step_start.items() if r is not None and s is not None and t is not None],
                      schema={"rank": pl.Int64, "_s": pl.Int64, "_w0": pl.Int64}, orient="row")
    st = st.group_by("rank", "_w0").agg(pl.col("_s").min()).sort("rank", "_w0", descending=[False, True]).with_columns(
        pl.col("_s").cum_min().over("rank").alias("_T")).sort("_w0")
    known = d.filter(pl.col("_e").is_not_null()).select("_i", "rank", "_e").sort("_e")
    tt = known.join_asof(st.select("rank", "_w0", "_T"), left_on="_e", right_on="_w0", by="rank", strategy="forward",
                         check_sortedness=False).select("_i", "_T")
    # back in row order by a scatter (_i is the row number), not a join and a sort
    d = d.with_columns(pl.repeat(_NEVER, n, dtype=pl.Int64, eager=True).scatter(tt["_i"], tt["_T"].fill_null(_NEVER))
                       .alias("_T"))
    special = pl.col("_p").is_null() | pl.col("_i").is_in(pl.Series(list(waits), dtype=pl.Int64).implode())
    if host.waits:
        hw = pl.DataFrame([(r, e) for r, (ends, _) in host.waits.items() for e in ends],
                          schema={"rank": pl.Int64, "_we": pl.Int64}, orient="row").sort("_we")
        hj = d.filter(pl.col("_hg")).select("_i", "rank", "_e", "ts").sort("ts").join_asof(
            hw, left_on="ts", right_on="_we", by="rank", strategy="backward", check_sortedness=False)
        waited = hj.filter(pl.col("_we") > pl.col("_e"))["_i"]
        special = special | pl.col("_i").is_in(waited.implode())
    d = d.with_columns(special.alias("_sp"))
    dur = (pl.col("end") - pl.col("ts")).clip(lower_bound=0)
    gap = pl.col("_hg") & (pl.col("ts") > pl.col("_e"))
    d = d.with_columns(
        pl.when(~pl.col("_isc")).then(dur).otherwise(0).alias("_comp"),
        pl.when(pl.col("_isc")).then(dur).otherwise(0).alias("_comm"),
        pl.when(~pl.col("_hg")).then((pl.col("ts") - pl.col("_e")).clip(lower_bound=0)).otherwise(0).fill_null(0).alias("_idle"),
        pl.lit(1, dtype=pl.Int64).alias("_n"), gap.fill_null(False).alias("_gap"))
    zeros = [pl.lit(0, dtype=pl.Int64).alias(c) for c in ("launch", "sync", "input", "comm", "other")]
    gaps = d.filter(pl.col("_gap") & ~pl.col("_sp")).select(pl.col("_i").alias("_k"), "rank", pl.col("_e").alias("a"), pl.col("ts").alias("b"))
    if gaps.height:
        parts = host.charge(gaps)
        d = d.with_columns(pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(parts["_k"], parts[c].cast(pl.Int64).fill_null(0))
                           .alias(c) for c in ("launch", "sync", "input", "comm", "other"))
    else:
        d = d.with_columns(zeros)
    # the next kernel in the run: P, where K and P are plain and share T
    nxt = pl.when(~pl.col("_sp") & ~pl.col("_sp").gather(pl.col("_p")).fill_null(True)
                  & (pl.col("_T").gather(pl.col("_p")) == pl.col("_T"))).then(pl.col("_p"))
    # only what _run_sums reads stays alive: the frame's other columns (a dozen of n rows) are freed before its own
    # temporaries are made, which lowers the walk's peak and the fresh pages it faults in
    sp, p, tq = d["_sp"], d["_p"], d["_T"]
    own = [d.select(*(pl.when(pl.col("_sp")).then(0).otherwise(pl.col(c)).alias(c) for c in _SUMS), nxt.alias("_ptr"))]
    del d, gaps
    out = _run_sums(k, own, sp, p, order)
    out["T"] = _int_view(tq)
    return out


def _run_sums(k: pl.DataFrame, own: list[pl.DataFrame], sp: pl.Series, prev: pl.Series,
              order: pl.Series) -> dict[str, memoryview]:
    """_interior_runs' per-kernel sums to the end of its run, from each kernel's own sums (_SUMS) and its next
    kernel in the run (_ptr, None where the run ends). Most links go to the kernel just before on the device by end
    time (one stream, one kernel after another), so in that order a run is mostly consecutive rows: per stretch of
    such links a cumulative sum, and pointer doubling only over the stretches (one per overlap or step boundary),
    instead of log2(run length) gathers of every row. Integer sums: exact in any order (order: the rows device by
    device by end, as _prev_and_order sorted them; any order gives the same sums, this one the fewest stretches)."""
    n = k.height
    pos_of = pl.repeat(0, n, dtype=pl.Int64, eager=True).scatter(order, pl.int_range(n, dtype=pl.Int64, eager=True))
    s = own.pop().select(pl.all().gather(order))  # own: [frame], emptied so that the frame is freed here
    # a stretch: rows whose link goes to the row just before; its head (first row) links elsewhere or nowhere
    s = s.with_columns(pl.int_range(n, dtype=pl.Int64).alias("_pos"),
                       pos_of.gather(s["_ptr"]).alias("_to"))
    head = s.select((pl.col("_to") != pl.col("_pos") - 1).fill_null(True).alias("_h"))["_h"]
    # within a stretch, the sums from a row back to the head: a cumulative sum less the one before the head
    cs = s.select(pl.col(*_SUMS).cum_sum(), "_pos", "_to", (head.cum_sum().cast(pl.Int64) - 1).alias("_seg"))
    heads = cs.filter(head).select("_pos", "_to", *(pl.col(c) - s[c].filter(head) for c in _SUMS))
    seg_of = cs["_seg"]
    s = cs.select(*((pl.col(c) - heads[c].gather(seg_of)).alias(c) for c in _SUMS))
    del cs
    # per stretch: where its head hands on to (a row of another stretch, or none), doubled over the stretches
    to = heads["_to"]
    g = pl.DataFrame([*(s[c].gather(to).fill_null(0) for c in _SUMS), seg_of.gather(to).alias("_ptr"),
                      pl.int_range(heads.height, dtype=pl.Int64, eager=True).alias("_last")])
    for _ in range(64):
        if g["_ptr"].null_count() == g.height:
            break
        h = g.select(pl.all().gather(g["_ptr"]))
        g = g.with_columns(*((pl.col(c) + h[c].fill_null(0)).alias(c) for c in _SUMS),
                           pl.coalesce(h["_last"], pl.col("_last")).alias("_last"), h["_ptr"].alias("_ptr"))
    # what the row's stretch head's chain adds, then back in the kernels' row order
    at = g.select(pl.all().gather(seg_of))
    tot = s.select(*((pl.col(c) + at[c]).gather(pos_of) for c in _SUMS), at["_last"].gather(pos_of), at["_ptr"].gather(pos_of))
    del s, at
    last = order.gather(heads["_pos"].gather(tot["_last"]))
    # a run that never ends (zero-length kernels that are each other's previous activity) takes the walk's own code
    ff = ~sp & tot["_ptr"].is_null()
    out = {c: _int_view(tot[c]) for c in _SUMS}
    out["ff"] = _int_view(ff)
    out["exit"] = _int_view(prev.gather(last).fill_null(-1))
    return out


# The walk split where it goes on on another rank. A rank's part of the walk (_Part.segments) reads only its own rows,
# its waits in host-side collectives and the rows of jumps_frame for its collective kernels; the cross-rank stage
# (stitch) reads only per-step and per-collective rows (_Part.meta) and the segments: so a rank task walks its
# segments where its kernels were read, and no kernel row ever leaves it (traceql.executor).
#
# A segment starts at an entry and walks the rank's kernels, exactly as the walk above does, up to the point where the
# walk goes on on another rank, or to its end:
# - entries: ("last", row, s): the step's last kernel, visited; ("after", row, s): a collective kernel the walk
#   arrived at from a rank that waited for it (the walk goes on with the gap before it); ("host", (rank, t), s): the
#   path arrives on the rank at time t, the end of another rank's wait for it in a host-side collective.
# - exits: ("d1", row, ts, end, jump): a collective kernel that waited for a later rank (jump: its jumps_frame row:
#   the last arriver's arrival, its collective kernel (part, row), its rank); ("hj", rank, t): the host waited in a
#   host-side collective for a later rank (the rank's own rows of collective_instances: host_waits); ("stop", t):
#   the step's start, where the walk ends.
# Sums of a segment: _SEG_SUMS (nanoseconds and visit counts, integers: adding them in any order is exact).
_SEG_SUMS = ("comp", "comm", "idle", "n", "launch", "sync", "input", "hcomm", "other")


class _Part:
    """Some ranks' walk inputs on the aligned clock (one rank task's, or a whole run's) and their segments.

    pk, cov: path_kernels and host_cover rows (the rank's own clock); steps: the ranks' steps; offsets: clock_offsets;
    matches: the ranks' rows of collective_matches; ci: the ranks' rows of collective_instances (only host_waits
    are read); coll: whether the run has collectives (without them nothing is aligned and nothing waits)."""

    def __init__(self, pk: pl.DataFrame, cov: pl.DataFrame, steps: pl.DataFrame, offsets: pl.DataFrame | None,
                 matches: pl.DataFrame | None, ci: pl.DataFrame | None, coll: bool):
        from traceql.link import clock

        self._args = (pk, cov, steps, offsets, matches, ci, coll)
        k = pk
        if k.height and coll:
            k = clock.align(k, offsets, ["ts", "end", "launch_ts", "launch_end"])
        st = steps.filter(pl.col("ts").is_not_null())
        if coll and st.height:
            st = clock.align(st.with_columns(pl.col("rank").cast(pl.Int32)), offsets, ["ts", "end"])
        self.step_start = {(r, s): t for r, s, t in st.group_by("rank", "step").agg(pl.col("ts").min()).iter_rows()}
        if coll and cov.height:
            cov = clock.align(cov, offsets, ["seg_ts", "seg_end"])
        self.host = _HostView(cov, ci if coll else None, k)
        self.ranks = sorted({int(r) for r in k["rank"].unique().to_list()} | set(self.host.waits)
                            | {int(r) for r, _ in self.step_start if r is not None})
        # the collective kernels (as _collective_waits finds them): where the walk may jump to the last arriver
        self.mk = pl.DataFrame(schema={"rank": pl.Int32, "match_id": pl.Int64, "_row": pl.Int64, "_ats": pl.Int64,
                                       "step": pl.Int64})
        if coll and matches is not None and matches.height and k.height:
            m = matches.filter(pl.col("kernel_ts").is_not_null())
            raw = pk.select("rank", "source", "kind", "ts").with_row_index("_row") \
                .filter(pl.col("kind") == "comm").select("_row", "rank", "source", pl.col("ts").alias("kernel_ts"))
            mk = m.select("rank", "source", "match_id", "kernel_ts").join(raw, on=["rank", "source", "kernel_ts"], how="inner") \
                .unique(["rank", "match_id"], keep="first")
            ats = k.select(pl.col("ts").alias("_ats"), "step").with_row_index("_row")
            self.mk = mk.join(ats, on="_row", how="inner").select(
                pl.col("rank").cast(pl.Int32), pl.col("match_id").cast(pl.Int64), pl.col("_row").cast(pl.Int64), "_ats",
                pl.col("step").cast(pl.Int64))
        self.exits = set(self.mk["_row"].to_list())
        self.jumps: dict[int, tuple] = {}  # set_jumps: the collective kernels here that waited for a later rank
        self._jumps: pl.DataFrame | None = None
        self.n_kernels = k.height
        pv, order = _prev_and_order(k)
        self.prev = _int_view(pv.fill_null(-1))
        self.rank = _int_view(k["rank"])
        self.ts = _int_view(k["ts"])
        self.end = _int_view(k["end"])
        self.is_comm = _int_view((k["kind"] == "comm").fill_null(False))
        self.lend = _int_view(k["launch_end"].fill_null(_NO_TIME))
        self.runs = _interior_runs(k, pv, self.exits, self.host, self.step_start, order) \
            if k.height >= _RUNS_FROM else None
        # per step, the part's last kernel (the first such row where several end together), as critical_path picks it
        at = pl.col("end").arg_max()
        self.lasts = k.select("step", "end", "rank", "name").with_row_index("_row").filter(pl.col("step").is_not_null()) \
            .group_by("step").agg(pl.col("_row").get(at).cast(pl.Int64), pl.col("end").get(at), pl.col("rank").get(at),
                                  pl.col("name").get(at))

    def __reduce__(self):  # memoryviews do not pickle: a part moved between Dask workers is rebuilt from its tables
        return (_rebuilt, (self._args, self._jumps))

    def with_jumps(self, j: pl.DataFrame) -> _Part:
        """This part with its rows of jumps_frame set (a new object: a Dask task never changes its input)."""
        new = object.__new__(_Part)
        new.__dict__.update(self.__dict__)
        new.set_jumps(j)
        return new

    def meta(self) -> tuple[pl.DataFrame, pl.DataFrame, list[int]]:
        """What the cross-rank stage reads of this part: per step its last kernel, per collective its kernel row."""
        return self.lasts, self.mk, self.ranks

    def set_jumps(self, j: pl.DataFrame) -> None:
        """This part's rows of jumps_frame: where the walk leaves a collective kernel for its last arriver's."""
        self._jumps = j
        self.jumps = {r: (a, (lp, lr), x) for r, a, lp, lr, x in
                      j.select("_row", "_larr", "_lpart", "_lrow", "last_arriver").iter_rows()}

    def segments(self, entries) -> dict[tuple, tuple]:
        """entry -> (sums as _SEG_SUMS, exit), for every entry asked; the host gaps of all of them charged at once."""
        out, gaps = {}, []
        for e in entries:
            if e in out:
                continue
            sums, ex, g = self._segment(*e)
            gaps.extend((len(out), r, a, b) for r, a, b in g)
            out[e] = (sums, ex)
        if gaps and len(gaps) < _CHARGE_FEW and self.host.cover_rows < _CHARGE_FEW_COVER:
            keys = list(out)
            for (kk, _, _, _), hp in zip(gaps, self.host.charge_few([g[1:] for g in gaps])):
                sums, ex = out[keys[kk]]
                out[keys[kk]] = (sums[:4] + tuple(a + b for a, b in zip(sums[4:], hp)), ex)
        elif gaps:
            g = pl.DataFrame(gaps, schema={"_k": pl.Int64, "rank": pl.Int64, "a": pl.Int64, "b": pl.Int64}, orient="row")
            per = self.host.charge(g).group_by("_k").agg(pl.col("launch", "sync", "input", "comm", "other").sum())
            keys = list(out)
            for kk, *hp in per.select("_k", "launch", "sync", "input", "comm", "other").iter_rows():
                sums, ex = out[keys[kk]]
                out[keys[kk]] = (sums[:4] + tuple(a + b for a, b in zip(sums[4:], hp)), ex)
        return out

    def _segment(self, kind: str, key, s: int) -> tuple[tuple, tuple, list]:
        end, ts, rank, prev, lend, host = self.end, self.ts, self.rank, self.prev, self.lend, self.host
        step_start, exits, runs = self.step_start, self.exits, self.runs
        ff, tq = (runs["ff"], runs["T"]) if runs is not None else (None, None)
        comp = comm = idle = n = 0
        hsum = [0, 0, 0, 0, 0]
        gaps: list[tuple[int, int, int]] = []

        def done(ex):
            return (comp, comm, idle, n, *hsum), ex, gaps

        mode = {"last": "visit", "after": "pred", "host": "host"}[kind]
        cur = key if kind != "host" else None
        while True:
            if mode == "visit":
                if ff is not None and ff[cur] and tq[cur] > s:
                    # a run of plain visits (_interior_runs): its sums, then the kernel it hands on to
                    n += runs["_n"][cur]
                    comp += runs["_comp"][cur]
                    comm += runs["_comm"][cur]
                    idle += runs["_idle"][cur]
                    for j, name_ in enumerate(("launch", "sync", "input", "comm", "other")):
                        hsum[j] += runs[name_][cur]
                    cur = runs["exit"][cur]
                    continue
                w0 = step_start.get((rank[cur], s))
                # a kernel that began before the step on its rank counts from the step's start: the path ends there
                dur = max(0, end[cur] - max(ts[cur], w0 if w0 is not None else ts[cur]))
                if cur in exits:
                    j = self.jumps.get(cur)
                    if j is not None and j[0] < end[cur]:  # it waited for a later rank: the walk goes on there
                        return done(("d1", cur, ts[cur], end[cur], j))
                n += 1
                if is_comm := self.is_comm[cur]:
                    comm += dur
                if not is_comm:
                    comp += dur
                mode = "pred"
            if mode == "pred":
                seg_start = ts[cur]
                r = rank[cur]
                w0 = step_start.get((r, s))
                p = prev[cur]
                if p < 0:
                    p = None
                p_end = end[p] if p is not None else None
                at_start = w0 is not None and (p_end is None or p_end <= w0)
                if not at_start and p is None:
                    return done(("stop", seg_start))
                a = w0 if at_start else p_end
                if lend[cur] <= a:  # the kernel was queued before the device went idle: not the host's doing
                    idle += max(0, seg_start - a)
                    if at_start:
                        return done(("stop", a))
                    cur = p
                    mode = "visit"
                    continue
            else:  # the path arrives on rank x at the end of another rank's wait for it
                r, seg_start = key
                w0 = step_start.get((r, s))
                p = host.last_kernel_before(r, seg_start)
                at_start = w0 is not None and (p is None or end[p] <= w0)
                if not at_start and p is None:
                    return done(("stop", seg_start))
                a = w0 if at_start else end[p]
            # the GPU waited for the host to launch the kernel. Where the host was then waiting for a later rank
            # in a host-side collective (gloo), the path goes on from that rank at its arrival
            hw = host.wait(r, a, seg_start)
            if hw is not None:
                w_end, x = hw
                if seg_start > max(a, w_end):
                    gaps.append((r, max(a, w_end), seg_start))
                return done(("hj", x, w_end))
            if seg_start > a:
                gaps.append((r, a, seg_start))
            if at_start:
                return done(("stop", a))
            cur = p
            mode = "visit"


def _rebuilt(args: tuple, jumps: pl.DataFrame | None) -> _Part:
    part = _Part(*args)
    if jumps is not None:
        part.set_jumps(jumps)
    return part


def jumps_frame(metas: list[tuple], ci: pl.DataFrame | None) -> pl.DataFrame:
    """Per collective kernel row (_part, _row) where another rank arrived after it started (_collective_waits, over
    the parts' metas): the arrival of the last arriver (_larr), its collective kernel (_lpart, _lrow) and rank
    (last_arriver), and the step of the kernel that waited (step: the walk most likely to jump there)."""
    schema = {"_part": pl.Int64, "_row": pl.Int64, "_larr": pl.Int64, "_lpart": pl.Int64, "_lrow": pl.Int64,
              "last_arriver": pl.Int64, "step": pl.Int64}
    mks = [mk.with_columns(pl.lit(i, dtype=pl.Int64).alias("_part")) for i, (_, mk, _) in enumerate(metas) if mk.height]
    if ci is None or not mks:
        return pl.DataFrame(schema=schema)
    ci = ci.select(pl.col("rank").cast(pl.Int32), pl.col("match_id").cast(pl.Int64), "arrival", "last_arriver", "n_ranks")
    mk = pl.concat(mks).join(ci, on=["rank", "match_id"], how="inner").filter(pl.col("n_ranks") >= 2)
    last = mk.filter(pl.col("rank") == pl.col("last_arriver")).select(
        "match_id", pl.col("_part").alias("_lpart"), pl.col("_row").alias("_lrow"), pl.col("arrival").alias("_larr"))
    j = mk.join(last, on="match_id", how="inner").filter(
        (pl.col("rank") != pl.col("last_arriver")) & (pl.col("_larr") > pl.col("_ats")))
    # one kernel row of two collectives that both waited: the last of them, as a dict built from these rows keeps
    return j.select([pl.col(c).cast(t) for c, t in schema.items()]).unique(["_part", "_row"], keep="last",
                                                                            maintain_order=True)


def last_kernels(metas: list[tuple]) -> dict[int, tuple]:
    """step -> (part, row, end, rank, name) of the step's last kernel over all ranks: the latest end, the first row
    (parts in the run's row order) where several end together."""
    best: dict[int, tuple] = {}
    for i, (lasts, _, _) in enumerate(metas):
        for s, row, e, r, name in lasts.select("step", "_row", "end", "rank", "name").iter_rows():
            if s not in best or e > best[s][2]:
                best[s] = (i, row, e, r, name)
    return best


def stitch(metas: list[tuple], fetch, cache: dict | None = None) -> pl.DataFrame:
    """critical_path from the parts' metas (_Part.meta, in the run's row order; their jumps set): every step's walk
    goes from segment to segment, across ranks at the collectives' last arrivers and the host-side waits.
    fetch({part: [entry, ...]}) -> {part: {entry: segment}} walks the segments the walks still lack, in rounds (on
    Dask, one task per part and round); cache: {(part, entry): segment} walked already."""
    cache = {} if cache is None else cache
    part_of = {r: i for i, (_, _, ranks) in enumerate(metas) for r in ranks}
    best = last_kernels(metas)
    walks = []
    for s in sorted(best):
        i, row, e, r, name = best[s]
        walks.append({"s": s, "rank": r, "t_end": e, "name": name, "on": {r}, "sums": [0] * len(_SEG_SUMS),
                      "jumps": 0, "host_jumps": 0, "at": (i, ("last", row, s)), "t": None, "guard": 0})
    todo = walks
    while todo:
        need: dict[int, list] = {}
        for w in todo:
            while w["t"] is None:
                seg = cache.get(w["at"])
                if seg is None:
                    need.setdefault(w["at"][0], []).append(w["at"][1])
                    break
                _advance(w, seg, part_of)
        todo = [w for w in todo if w["t"] is None]
        if need:
            for i, segs in fetch(need).items():
                cache.update({(i, e): v for e, v in segs.items()})
    rows = []
    for w in walks:
        comp, comm, idle, n, launch, sync, inp, hcomm, other = w["sums"]
        total = w["t_end"] - w["t"]
        host_launch = launch + sync + inp + hcomm + other
        rows.append({
            "step": w["s"], "rank": w["rank"], "ranks_on_path": sorted(w["on"]), "step_ms": total / 1e6,
            "compute_ms": comp / 1e6, "exposed_comm_ms": comm / 1e6, "host_launch_ms": host_launch / 1e6,
            "idle_ms": idle / 1e6, "host_sync_ms": sync / 1e6, "input_wait_ms": inp / 1e6, "host_comm_ms": hcomm / 1e6,
            "host_other_ms": other / 1e6, "exposed_comm_pct": 100.0 * comm / total if total > 0 else None,
            "host_launch_pct": 100.0 * host_launch / total if total > 0 else None, "path_kernels": n,
            "rank_jumps": w["jumps"], "host_jumps": w["host_jumps"], "last_kernel": w["name"]})
    if not rows:
        return pl.DataFrame(schema=CP_SCHEMA)
    return pl.DataFrame(rows, schema=CP_SCHEMA)


def _advance(w: dict, seg: tuple, part_of: dict) -> None:
    """One segment added to a step's walk, and where the walk goes on (or its start, w["t"])."""
    sums, ex = seg
    w["sums"] = [a + b for a, b in zip(w["sums"], sums)]
    w["guard"] += sums[3] + 1
    if ex[0] == "stop":
        w["t"] = ex[1]
        return
    if w["guard"] >= _GUARD:  # a walk that never ends (the walk's own guard): it stops where it is
        w["t"] = ex[3] if ex[0] == "d1" else ex[2]
        return
    w["jumps"] += 1
    part, s = w["at"][0], w["s"]
    if ex[0] == "hj":
        _, x, w_end = ex
        w["host_jumps"] += 1
        w["on"].add(x)
        w["at"] = (part_of.get(x, part), ("host", (x, w_end), s))
        return
    # a collective kernel that waited for a later rank: the time after that rank's arrival is exposed
    # communication; the path goes on from the last arriver's collective kernel
    _, _, ts, end, (arr, (lp, lr), x) = ex
    w["sums"][3] += 1
    w["sums"][1] += end - max(arr, ts)
    w["on"].add(x)
    w["at"] = (lp, ("after", lr, s))


def part_of_run(run: Run) -> _Part:
    """The whole run as one part (the local path: every rank's rows are here)."""
    from traceql.link import ensure

    coll = run.has("collectives")
    return _Part(ensure(run, "path_kernels"), ensure(run, "host_cover"), run.table("steps"),
                 ensure(run, "clock_offsets") if coll else None, ensure(run, "collective_matches") if coll else None,
                 ensure(run, "collective_instances") if coll else None, coll)


def critical_path(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    if ensure(run, "path_kernels").height == 0:
        if run.has("steps"):
            _note(run, NO_GPU_NOTE)
        return pl.DataFrame(schema=CP_SCHEMA)
    part = part_of_run(run)
    metas = [part.meta()]
    part.set_jumps(jumps_frame(metas, ensure(run, "collective_instances") if run.has("collectives") else None))
    return stitch(metas, lambda need: {0: part.segments(need[0])})


NO_GPU_NOTE = "critical_path: no GPU activity in the run (host-only backends such as gloo on CPU); not computed"


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
    # (one lazy plan to the gaps, one from them: each eager step is a fixed cost on a small run)
    k = k.lazy().sort(["rank", "source", "device", "ts"], maintain_order=True)
    k = k.with_columns(pl.struct("rank", "source", pl.col("device").fill_null(-1)).rle_id().alias("_dev"))
    k = k.with_columns(pl.col("end").cum_max().shift(1).over("_dev").alias("_busy_until"))
    k = k.with_columns((pl.col("ts") - pl.col("_busy_until")).clip(lower_bound=0).alias("_gap"))
    k = k.with_columns(((pl.col("_gap") > 0) & pl.col("_lts").is_not_null() & (pl.col("_lts") >= pl.col("_busy_until"))).fill_null(False).alias("_lb"))
    k = k.collect(engine=POLARS_ENGINE)
    # A GPU that waits while the host fetches its next batch waits for data, not for launches (TQL210's case): the
    # part of a gap the host spent in a DataLoader fetch is not launch time.
    from traceql.link.input_pipeline import input_wait_ns

    k = k.with_columns(input_wait_ns(run, k, "_busy_until", "ts").alias("_in"))
    k = k.with_columns(pl.when(pl.col("_lb")).then((pl.col("_gap") - pl.col("_in")).clip(lower_bound=0)).otherwise(0).alias("_lgap"))
    per = ["rank", "step"]
    out = k.lazy().group_by(per).agg(
        pl.len().cast(pl.Int64).alias("kernels"),
        (pl.col("dur").median() / 1e3).alias("median_kernel_us"),
        (pl.col("_gap").sum() / 1e6).alias("gap_ms"),
        (pl.col("_lgap").sum() / 1e6).alias("launch_gap_ms"),
        (pl.col("_lgap") > 0).sum().cast(pl.Int64).alias("launch_gaps"),
    )
    from traceql import intervals as measures

    busy = measures.union(k.select("rank", "step", "ts", "end", "dur"), per).lazy().select(*per, pl.col("union_ms").alias("busy_ms"))
    from traceql.link import ensure

    # the step time every report uses: the longer of the host range and the GPU span (link.steps.step_times)
    st = ensure(run, "step_times").lazy().select("rank", "step", "step_ms")
    out = out.join(busy, on=per, how="left").join(
        st.with_columns(pl.col("rank").cast(k.schema["rank"]), pl.col("step").cast(k.schema["step"])), on=per, how="left")
    out = out.with_columns(
        pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("launch_gap_ms") / pl.col("step_ms")).alias("launch_gap_pct"),
        pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("busy_ms") / pl.col("step_ms")).alias("busy_pct"),
    )
    # the rank's median step: one step (the first, loading CUDA modules between launches) is not the run's habit
    out = out.with_columns(pl.col("launch_gap_pct").median().over("rank").alias("typical_launch_gap_pct"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(per).collect(engine=POLARS_ENGINE)


DERIVED = {"path_kernels": path_kernels, "host_cover": host_cover, "critical_path": critical_path, "exposed_comm": exposed_comm, "launch_bound": launch_bound}
