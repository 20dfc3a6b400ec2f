"""The input pipeline's cost per step: how long the training loop waited for its next batch.

PyTorch's DataLoader wraps every batch fetch in a profiler range "enumerate(DataLoader)#<iterator>.__next__"
(torch/utils/data/dataloader.py, _BaseDataLoaderIter.__next__): _SingleProcessDataLoaderIter when num_workers=0
(the range holds the whole fetch in the training process: __getitem__, collate, pin_memory), and
_MultiProcessingDataLoaderIter with worker processes (the range is the wait for a worker's batch). Its range is
the host side of a data-loading stall; the GPU side is the device's idle time inside those ranges.

input_stall, per rank, source and step:
- loader_ms: union of the __next__ ranges in the step (host time spent fetching the batch);
- stall_ms: what the wait cost. On a source with GPU activity, the time the device sat idle inside the loader's
  ranges (a loader that returns while the GPU still runs the previous step costs nothing). On a source without GPU
  activity (a CPU run, or the host-only Kineto trace of a run recorded under nsys), the host is the step's critical
  path, so the whole loader time is its cost;
- stall_pct: stall_ms over step_ms (the step's host range);
- pin_ms (aten::pin_memory / aten::_pin_memory host time in the step), h2d_ms and h2d_pageable (host-to-device
  memcpy time on the GPU in the step, and how many of those copies came from pageable memory);
- workers: "0" for _SingleProcessDataLoaderIter, ">0" for _MultiProcessingDataLoaderIter.

input_wait_ns(run, df, ...) gives, for intervals on a rank's clock, how much of each the loader's ranges cover:
launch_bound uses it so that a GPU waiting for data is not called launch-bound.
"""

from __future__ import annotations

import polars as pl

from traceql import intervals
from traceql.model import Run

LOADER_NEXT = r"^enumerate\(DataLoader\)#\w+\.__next__$"
_LOADER_PREFIX = "enumerate(DataLoader)#"  # what every LOADER_NEXT match starts with
PIN_OPS = ("aten::pin_memory", "aten::_pin_memory")
_KEY = ["rank", "source"]


def loader_rows(h: pl.DataFrame) -> pl.DataFrame:
    """The host ops that are DataLoader fetches (LOADER_NEXT): the regex only on the ops that start with its literal
    prefix, a few if any (32 ranks x 36 MB, 1.9M host ops, loaded 2-vCPU box: 0.106-0.110 s for the regex over every
    name, 0.073-0.074 with the prefix first)."""
    return h.filter(pl.col("name").str.starts_with(_LOADER_PREFIX)).filter(pl.col("name").str.contains(LOADER_NEXT))

SCHEMA = {"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "loader_ms": pl.Float64,
          "loader_calls": pl.Int64, "stall_ms": pl.Float64, "stall_pct": pl.Float64,
          "gpu_side": pl.Boolean, "iterator": pl.Utf8, "workers": pl.Utf8, "pin_ms": pl.Float64, "h2d_ms": pl.Float64,
          "h2d_pageable": pl.Int64}


def _segments(df: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Disjoint segments (key, seg_ts, seg_end) of the union of df's [ts, end) intervals, with the covered time
    before each segment (cum_before), for cumulative look-ups."""
    seg = intervals.segments(df.select(*key, "ts", "end"), key)
    length = pl.col("seg_end") - pl.col("seg_ts")
    return seg.select(*key, "seg_ts", "seg_end", (length.cum_sum() - length).over(key).alias("cum_before"))


def _covered_before(points: pl.DataFrame, col: str, seg: pl.DataFrame, key: list[str]) -> pl.Series:
    """For each row's time `col`: how much of the segments' union lies before it (0 where none does)."""
    p = points.select(*key, pl.col(col).alias("_t")).with_row_index("_i")
    p = p.with_columns(pl.col(k).cast(seg.schema[k]) for k in key)
    j = p.filter(pl.col("_t").is_not_null()).sort("_t").join_asof(
        seg.sort("seg_ts"), left_on="_t", right_on="seg_ts", by=key, strategy="backward", check_sortedness=False)
    j = j.with_columns((pl.col("cum_before") + (pl.min_horizontal("_t", "seg_end") - pl.col("seg_ts")).clip(lower_bound=0))
                       .fill_null(0).alias("_c"))
    out = pl.repeat(0, points.height, dtype=pl.Int64, eager=True).alias("covered")
    return out.scatter(j["_i"], j["_c"].cast(pl.Int64)) if j.height else out


def covered_ns(df: pl.DataFrame, seg: pl.DataFrame, key: list[str], a: str = "ts", b: str = "end") -> pl.Series:
    """How much of each row's [a, b) the segments cover (ns), on the row's own key (rank, source)."""
    if df.height == 0 or seg.height == 0:
        return pl.repeat(0, df.height, dtype=pl.Int64, eager=True).alias("covered")
    return (_covered_before(df, b, seg, key) - _covered_before(df, a, seg, key)).clip(lower_bound=0).alias("covered")


def loader_ops(run: Run) -> pl.DataFrame:
    h = run.table("host_ops")
    if h.height == 0:
        return h.select("rank", "source", "step", "ts", "end", "name")
    return loader_rows(h).select(
        pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step", "ts", "end", "name")


def input_wait_ns(run: Run, df: pl.DataFrame, a: str, b: str) -> pl.Series:
    """For rows with rank, source and an interval [a, b) on that source's clock: the part of it the host spent
    inside a DataLoader fetch (0 where the run has none)."""
    ops = loader_ops(run)
    if ops.height == 0 or df.height == 0:
        return pl.repeat(0, df.height, dtype=pl.Int64, eager=True).alias("covered")
    keyed = df.select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), a, b)
    return covered_ns(keyed, _segments(ops, _KEY), _KEY, a, b)


def input_stall(run: Run) -> pl.DataFrame:
    ops = loader_ops(run).filter(pl.col("step").is_not_null())
    if ops.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    per = [*_KEY, "step"]
    # one row per fetch window (nested ranges of one fetch merge), then its GPU-idle share
    win = _segments(ops, per).select(*per, pl.col("seg_ts").alias("ts"), pl.col("seg_end").alias("end"))
    k = run.table("kernels").select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "ts", "end", "step",
                                    "kind", *[c for c in ("copy_kind", "src_memory", "dur") if c in run.table("kernels").columns])
    gpu_sources = k.select(_KEY).unique()
    busy = covered_ns(win, _segments(k, _KEY), _KEY)
    win = win.with_columns((pl.col("end") - pl.col("ts")).alias("_len"), busy.alias("_busy"))
    win = win.join(gpu_sources.with_columns(pl.lit(True).alias("gpu_side")), on=_KEY, how="left").with_columns(
        pl.col("gpu_side").fill_null(False))
    win = win.with_columns(pl.when(pl.col("gpu_side")).then(pl.col("_len") - pl.col("_busy")).otherwise(pl.col("_len"))
                           .clip(lower_bound=0).alias("_stall"))
    out = win.group_by(per).agg((pl.col("_len").sum() / 1e6).alias("loader_ms"), (pl.col("_stall").sum() / 1e6).alias("stall_ms"),
                                pl.col("gpu_side").first())
    calls = ops.group_by(per).agg(pl.len().cast(pl.Int64).alias("loader_calls"),
                                  pl.col("name").mode().sort().first().alias("_name"))
    out = out.join(calls, on=per, how="left")
    out = out.with_columns(
        pl.col("_name").str.extract(r"#(\w+)\.__next__", 1).alias("iterator"),
    ).with_columns(
        pl.when(pl.col("iterator").str.contains("SingleProcess")).then(pl.lit("0"))
        .when(pl.col("iterator").str.contains("MultiProcessing")).then(pl.lit(">0")).otherwise(None).alias("workers"))
    st = run.table("steps").select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step", "dur")
    st = st.group_by(per).agg((pl.col("dur").max() / 1e6).alias("step_ms"))
    out = out.join(st, on=per, how="left")
    h = run.table("host_ops")
    pin = (h.filter(pl.col("name").is_in(PIN_OPS) & pl.col("step").is_not_null())
           .select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step", "ts", "end"))
    # pin time by rank and step from any source of the rank (pinning runs on the loader's thread or its own)
    pin_ms = (_segments(pin, per).group_by(["rank", "step"]).agg(((pl.col("seg_end") - pl.col("seg_ts")).sum() / 1e6).alias("pin_ms"))
              if pin.height else pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "pin_ms": pl.Float64}))
    out = out.join(pin_ms, on=["rank", "step"], how="left")
    if "copy_kind" in k.columns:
        h2d = k.filter((pl.col("kind") == "memcpy") & (pl.col("copy_kind") == "HtoD") & pl.col("step").is_not_null())
        h2d = h2d.group_by(["rank", "step"]).agg(
            ((pl.col("end") - pl.col("ts")).sum() / 1e6).alias("h2d_ms"),
            (pl.col("src_memory") == "pageable").sum().cast(pl.Int64).alias("h2d_pageable")
            if "src_memory" in k.columns else pl.lit(0, pl.Int64).alias("h2d_pageable"))
        out = out.join(h2d, on=["rank", "step"], how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias("h2d_ms"), pl.lit(None, pl.Int64).alias("h2d_pageable"))
    out = out.with_columns(pl.col("pin_ms", "h2d_ms").fill_null(0.0), pl.col("h2d_pageable").fill_null(0))
    out = out.with_columns(pl.when(pl.col("step_ms") > 0).then(100.0 * pl.col("stall_ms") / pl.col("step_ms")).alias("stall_pct"))
    return out.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort(per)


DERIVED = {"input_stall": input_stall}
