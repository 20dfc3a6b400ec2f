"""Give every row of the per-rank tables the training step it belongs to.

Host-side rows (host ops, runtime calls, collectives) belong to the step whose window holds their start, on the
same rank and source (two sources of one rank have different clocks). GPU rows (kernels, syncs) belong to the
step of the runtime call that launched them (by correlation), because GPU work runs after its host step may have
ended; rows without a launch fall back to their own start time.
"""

from __future__ import annotations

import polars as pl

from traceql.link._keys import first_match
from traceql.model import Run

_BY = ["rank", "source"]


def _by_time(df: pl.DataFrame, steps: pl.DataFrame) -> pl.Series:
    """The step whose [ts, end) window holds each row's ts, on the row's own rank and source.

    Steps are few per (rank, source), so each group is one binary search of its rows' starts into the sorted
    step starts: O(n log s), no join machinery.
    """
    n = df.height
    if n == 0 or steps.height == 0:
        return pl.Series("step", [None] * n, dtype=pl.Int64)
    keyed = df.select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "ts").with_row_index("_i")
    groups = steps.sort("ts").partition_by(_BY, as_dict=True)
    rows_at, steps_of = [], []
    for key, rows in _runs(keyed):
        st = groups.get(key)
        if st is None:
            continue
        # Series operations only: each eager DataFrame filter or with_columns is a polars plan of its own, and
        # this loop runs once per (rank, source)
        # (fill_null and gather dispatch to expressions, a plan each; indexing by an index-typed Series does not)
        ts = rows["ts"]
        if ts.null_count():
            ts = ts.fill_null(-(1 << 62))
        after = st["ts"].search_sorted(ts, side="right")  # index-typed: how many steps start at or before ts
        started = after > 0
        at, ts, pos = rows["_i"].filter(started), ts.filter(started), after.filter(started) - 1
        inside = ts < st["end"][pos]
        rows_at.append(at.filter(inside))
        steps_of.append(st["step"][pos].filter(inside))
    if not rows_at:
        return pl.Series("step", [None] * n, dtype=pl.Int64)
    found_at, found_step = pl.concat(rows_at), pl.concat(steps_of)
    # _i is the row number: put each found step in its place (no join on millions of row numbers)
    out = pl.repeat(None, n, dtype=pl.Int64, eager=True).alias("step")
    return out.scatter(found_at, found_step.cast(pl.Int64)) if found_at.len() else out


def _runs(keyed: pl.DataFrame):
    """(rank, source) -> its rows. A run's tables hold each source's rows together (one source's tables after the
    other), so each key is one slice, found where the key changes (a copy of no column); partition_by copies every
    column of every row (0.06 s of a 1 GB trace's 1.2M host ops) and is left for keys that come back."""
    r, s = keyed["rank"], keyed["source"]
    at = (r.ne_missing(r.shift()) | s.ne_missing(s.shift())).arg_true().to_list()
    keys = list(zip(r.gather(at).to_list(), s.gather(at).to_list()))
    if len(set(keys)) < len(keys):
        return keyed.partition_by(_BY, as_dict=True).items()
    ends = [*at[1:], keyed.height]
    return [(k, keyed.slice(a, b - a)) for k, a, b in zip(keys, at, ends)]


def assign_steps(run: Run) -> None:
    steps = run.table("steps").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    steps = steps.with_columns(pl.col(c).cast(t) for c, t in (("rank", pl.Int32), ("source", pl.Int32)))
    for name in ("host_ops", "runtime", "collectives"):
        df = run.table(name)
        if df.height:
            run.tables[name] = df.with_columns(_by_time(df, steps).alias("step"))
    runtime = run.table("runtime")
    launch_step = (
        runtime.filter(pl.col("correlation").is_not_null() & pl.col("step").is_not_null())
        .select(*_BY, "correlation", pl.col("step").alias("_lstep"))
    )
    for name in ("kernels", "syncs"):
        df = run.table(name)
        if df.height == 0:
            continue
        # the first launch of each (rank, source, correlation), joined on one packed integer key where possible
        by_launch = first_match(df.select(*_BY, "correlation"), launch_step, [*_BY, "correlation"])["_lstep"]
        by_time = _by_time(df, steps)
        run.tables[name] = df.with_columns(by_launch.fill_null(by_time).alias("step"))


def step_times(run: Run) -> pl.DataFrame:
    """Per rank and step: the host range's length (host_ms), the span of the step's GPU work from its first kernel's
    start to its last kernel's end (gpu_span_ms), and step_ms, the longer of the two. The GPU runs behind the host,
    so a step's kernels can end well after its host range does: GPU measures are weighed against step_ms."""
    schema = {"rank": pl.Int32, "step": pl.Int64, "host_ms": pl.Float64, "gpu_span_ms": pl.Float64, "step_ms": pl.Float64}
    steps = run.table("steps")
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    st = steps.group_by("rank", "step").agg((pl.col("dur").max() / 1e6).alias("host_ms"))
    k = run.table("kernels")
    if k.height and k["step"].null_count() < k.height:
        span = (k.filter(pl.col("step").is_not_null()).group_by("rank", "step")
                .agg(((pl.col("end").max() - pl.col("ts").min()) / 1e6).alias("gpu_span_ms")))
        st = st.join(span, on=["rank", "step"], how="left")
    else:
        st = st.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_span_ms"))
    return st.with_columns(pl.max_horizontal("host_ms", "gpu_span_ms").alias("step_ms")).select(
        [pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "step")


# CUDA lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 11.7 / 12.2): the first launch of each kernel
# loads its module through these driver calls, so the step that first runs a kernel pays for it. nsys traces them.
MODULE_LOADING = ("cuLibraryLoadData", "cuLibraryLoadFromFile", "cuModuleLoadData", "cuModuleLoadDataEx",
                  "cuModuleLoadFatBinary", "cuModuleLoad")


FIRST_STEP_OUTLIER = 3.0  # a first step this many times the median of the others is a warm-up step


def warmup_steps(run: Run) -> pl.DataFrame:
    """(rank, source, step, load_ms, reason) of warm-up steps, whose idle and launch gaps say how the process started,
    not how it trains: steps whose runtime calls load CUDA modules (nsys records the driver calls), and a source's
    first step when it lasts FIRST_STEP_OUTLIER times the median of its other steps and longer than any (Kineto records no driver calls:
    lazy loading, cuBLAS initialisation, allocator growth and first-call autotuning show only as a long first step;
    judged from three steps on)."""
    schema = {"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64, "load_ms": pl.Float64, "reason": pl.Utf8}
    parts = []
    rt = run.table("runtime")
    if rt.height and "step" in rt.columns:
        w = rt.filter(pl.col("name").is_in(MODULE_LOADING) & pl.col("step").is_not_null())
        parts.append(w.group_by("rank", "source", "step").agg((pl.col("dur").sum() / 1e6).alias("load_ms"))
                     .with_columns(pl.lit("CUDA modules loaded").alias("reason")))
    st = run.table("steps").filter(pl.col("dur").is_not_null())
    if st.height:
        st = st.group_by("rank", "source", "step").agg(pl.col("dur").max()).sort("rank", "source", "step")
        st = st.with_columns(pl.len().over("rank", "source").alias("_n"), pl.col("step").rank("ordinal").over("rank", "source").alias("_i"))
        rest = st.filter(pl.col("_i") > 1).group_by("rank", "source").agg(pl.col("dur").median().alias("_med"),
                                                                          pl.col("dur").max().alias("_max"))
        first = st.filter((pl.col("_i") == 1) & (pl.col("_n") >= 3)).join(rest, on=["rank", "source"])
        # longer than every other step too: a loop whose steps vary (waiting for data now and then) has no outlier
        first = first.filter((pl.col("dur") > FIRST_STEP_OUTLIER * pl.col("_med")) & (pl.col("dur") > pl.col("_max")))
        parts.append(first.select("rank", "source", "step", pl.lit(None, pl.Float64).alias("load_ms"),
                                  pl.format("first step {}x the median step", (pl.col("dur") / pl.col("_med")).round(0).cast(pl.Int64)).alias("reason")))
    if not parts:
        return pl.DataFrame(schema=schema)
    out = pl.concat([p.select([pl.col(c).cast(t) for c, t in schema.items()]) for p in parts])
    return out.unique(["rank", "source", "step"], keep="first", maintain_order=True).sort("rank", "source", "step")


DERIVED = {"step_times": step_times, "warmup_steps": warmup_steps}
