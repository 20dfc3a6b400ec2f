"""GPU time utilisation in equal chunks per rank and device (the shape of nsys's gpu_time_util expert rule).

For each rank and device, the span from the start of its first GPU operation to the end of its last is cut into
CHUNKS equal chunks; a chunk's utilisation is the time GPU operations (kernels, NCCL kernels, memcpy, memset)
overlap it, summed and divided by the chunk's length. Concurrent operations add up, so it can pass 100%; it is
"time" utilisation, not how much of the GPU a kernel used. Nothing is done per row in Python: each operation is
split into the chunks it touches with an exploded integer range and clipped. Where a rank has several sources,
only the one with the most GPU time is used (their clocks differ). Where the source has steps, only the GPU work
its steps launched counts, less warm-up steps that load CUDA modules (link.steps.warmup_steps).
"""

from __future__ import annotations

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.link import _keys as keys
from traceql.model import Run

CHUNKS = 30  # nsys analyze gpu_time_util default (chunks=30)


def _in_steps(run: Run, k: pl.DataFrame) -> pl.DataFrame:
    """Where a source has steps, only its GPU operations launched in steps, less warm-up steps (CUDA modules loaded
    lazily in them) while other steps remain: start-up (model.to(device) copies, NCCL set-up) and a first step that
    loads modules are not the training loop. A source without steps keeps everything."""
    from traceql.link import ensure

    stepped = k.filter(pl.col("step").is_not_null())
    if stepped.height == 0:
        return k
    warm = ensure(run, "warmup_steps").select("rank", "source", "step")
    kept = stepped.join(warm, on=["rank", "source", "step"], how="anti")
    # a source whose every step is a warm-up keeps them (nothing else to judge)
    kept = pl.concat([kept, stepped.join(kept.select("rank", "source").unique(), on=["rank", "source"], how="anti")])
    with_steps = stepped.select("rank", "source").unique()
    rest = k.join(with_steps, on=["rank", "source"], how="anti")
    return pl.concat([kept, rest]).drop("step")


def gpu_time_util(run: Run) -> pl.DataFrame:
    k = run.table("kernels").select("rank", "source", "device", "ts", "end", "dur", "step").filter(pl.col("device").is_not_null() & pl.col("ts").is_not_null()
                                    & pl.col("end").is_not_null() & (pl.col("end") >= pl.col("ts")))
    schema = {"rank": pl.Int32, "device": pl.Int32, "chunk": pl.Int64, "ts": pl.Int64, "end": pl.Int64,
              "chunk_ms": pl.Float64, "busy_ms": pl.Float64, "util_pct": pl.Float64, "step": pl.Int64}
    if not k.height:
        return pl.DataFrame(schema=schema)
    # A rank can come from several sources (a Kineto trace and an nsys export of one process), each on its own
    # clock: use the one that recorded the most GPU activity, never a mix.
    best = (k.group_by("rank", "source").agg(pl.col("dur").sum().alias("_busy"), pl.len().alias("_n"))
            .sort(["rank", "_busy", "_n", "source"], descending=[False, True, True, False])
            .unique("rank", keep="first").select("rank", "source"))
    k = keys.join(k, best, ["rank", "source"], how="semi")
    k = _in_steps(run, k)
    key = ["rank", "device"]
    # the rest as one lazy plan (it was a dozen eager queries, each a fixed cost on a small run)
    k = k.lazy()
    span = k.group_by(key).agg(pl.col("ts").min().alias("t0"), pl.col("end").max().alias("t1"))
    # Chunk length rounded up to whole ns, as nsys does; the last chunk may then end past t1 and is cut there.
    span = span.with_columns(((pl.col("t1") - pl.col("t0") + CHUNKS - 1) // CHUNKS).clip(lower_bound=1).alias("size"))
    ops = k.select(*key, "ts", "end").join(span, on=key, how="inner")
    ops = ops.with_columns(
        ((pl.col("ts") - pl.col("t0")) // pl.col("size")).alias("c0"),
        ((pl.col("end") - 1 - pl.col("t0")).clip(lower_bound=0) // pl.col("size")).alias("c1"),
    ).with_columns(pl.max_horizontal("c0", "c1").alias("c1"))
    ops = ops.with_columns(pl.int_ranges("c0", pl.col("c1") + 1).alias("chunk")).explode("chunk")
    cs = pl.col("t0") + pl.col("chunk") * pl.col("size")
    ce = pl.min_horizontal(cs + pl.col("size"), pl.col("t1"))
    ops = ops.with_columns(
        (pl.min_horizontal("end", ce) - pl.max_horizontal("ts", cs)).clip(lower_bound=0).alias("busy"))
    busy = ops.group_by([*key, "chunk"]).agg(pl.col("busy").sum())
    chunks = span.with_columns(pl.int_ranges(0, CHUNKS).alias("chunk")).explode("chunk")
    chunks = chunks.with_columns(cs.alias("ts"), ce.alias("end")).filter(pl.col("end") > pl.col("ts"))
    out = chunks.join(busy, on=[*key, "chunk"], how="left").with_columns(pl.col("busy").fill_null(0))
    out = out.with_columns(
        ((pl.col("end") - pl.col("ts")) / 1e6).alias("chunk_ms"),
        (pl.col("busy") / 1e6).alias("busy_ms"),
    ).with_columns((100.0 * pl.col("busy_ms") / pl.col("chunk_ms")).alias("util_pct"))
    out = out.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(key + ["chunk"]).collect(engine=POLARS_ENGINE)


DERIVED = {"gpu_time_util": gpu_time_util}
