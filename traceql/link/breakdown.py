"""Per rank and step: where the GPU time went (compute, communication, exposed communication, idle).

Communication is NCCL/RCCL kernels (kind comm); compute is every other kernel except memcpy/memset: the
definitions Holistic Trace Analysis uses, so the numbers can be compared with it. Kernels belong to the step
that launched them (link.steps). A rank without steps gets one row with step null covering its whole trace.

idle_ms is the device's idle time inside the step's GPU span plus its lead gap: the idle time between the end of
the previous GPU work and the step's first operation belongs to the step it delays (a training loop that waits
for its next batch, or for the host, between steps). gpu_idle_gaps lists every such gap on each device's own
timeline (all operations of one source, whichever step launched them), with the step it delays, whether it leads
the step, what the host was doing, and how much of it the host spent fetching a batch (link.input_pipeline).
"""

from __future__ import annotations

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.link._keys import sorted_by
from traceql.model import Run
from traceql import intervals as measures

_PER = ["rank", "step"]


def keyed_unions(frames: list[pl.DataFrame], per: list[str]) -> pl.LazyFrame:
    """_t, per, _u: the union (ns) of each frame's intervals per group (_t: the frame's place in the list), all of them
    in one sweep (intervals.union_ns keyed by _t) instead of a sweep and its fixed cost per union."""
    tagged = pl.concat([d.lazy().select(pl.lit(t, dtype=pl.Int8).alias("_t"), *per, "ts", "end") for t, d in enumerate(frames)])
    clean = pl.col("ts").is_not_null() & pl.col("end").is_not_null() & (pl.col("end") >= pl.col("ts"))
    for c in per:
        clean = clean & pl.col(c).is_not_null()
    return measures.union_ns(tagged.filter(clean).collect(engine=POLARS_ENGINE), ["_t", *per]).lazy()


def overlap_columns(df: pl.LazyFrame, comm: str, comp: str, both: str) -> pl.LazyFrame:
    """comm_ms, overlap_ms, exposed_comm_ms and comm_comp_overlap_pct from the unions (ns) of communication, compute
    and both, as intervals.coverage computes them (|A ∩ B| = |A| + |B| - |A ∪ B|); null where comm is."""
    df = df.with_columns((pl.col(comm) + pl.col(comp).fill_null(0) - pl.col(both)).alias("_i")).with_columns(
        (pl.col(comm) / measures.NS_PER_MS).alias("comm_ms"), (pl.col("_i") / measures.NS_PER_MS).alias("overlap_ms"))
    return df.with_columns(
        (pl.col("comm_ms") - pl.col("overlap_ms")).clip(lower_bound=0.0).alias("exposed_comm_ms"),
        pl.when(pl.col("comm_ms") > 0).then(pl.col("overlap_ms") / pl.col("comm_ms") * 100.0).otherwise(None)
        .alias("comm_comp_overlap_pct")).drop("_i")


def step_breakdown(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    # only the columns used below: filtering the wide kernel table copies every column
    k = run.table("kernels").select("rank", "step", "kind", "ts", "end", "dur").filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    schema = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "gpu_span_ms": pl.Float64, "busy_ms": pl.Float64,
              "compute_ms": pl.Float64, "comm_ms": pl.Float64, "overlap_ms": pl.Float64, "exposed_comm_ms": pl.Float64,
              "comm_comp_overlap_pct": pl.Float64, "idle_ms": pl.Float64, "kernel_time_ms": pl.Float64, "kernels": pl.Int64}
    if k.height == 0:
        return pl.DataFrame(schema=schema)
    steps = run.table("steps")
    ranks_with_steps = set(steps["rank"].drop_nulls().to_list())
    # ranks without steps: the whole trace is one window (step stays null, kept as a group by a sentinel)
    k = k.with_columns(
        pl.when(pl.col("rank").is_in(list(ranks_with_steps))).then(pl.col("step")).otherwise(pl.lit(-1)).alias("step")
    ).filter(pl.col("step").is_not_null())
    # the four unions (all kernels, compute, comm, and comm with compute for their overlap) in one sweep, keyed by
    # which union: |comm ∩ compute| = |comm| + |compute| - |comm ∪ compute| (intervals.coverage's identity)
    sel = k.filter(pl.col("kind").is_in(["compute", "comm"]))
    has_comm = (sel["kind"] == "comm").any()
    parts = [k, sel.filter(pl.col("kind") == "compute")] + ([sel.filter(pl.col("kind") == "comm"), sel] if has_comm else [])
    u = keyed_unions(parts, _PER)

    def union_of(t: int, name: str) -> pl.LazyFrame:
        return u.filter(pl.col("_t") == t).select(*_PER, pl.col("_u").alias(name))

    lk = k.lazy()
    span = lk.group_by(_PER).agg(((pl.col("end").max() - pl.col("ts").min()) / 1e6).alias("gpu_span_ms"))
    kt = lk.filter(pl.col("kind").is_in(["compute", "comm"])).group_by(_PER).agg(
        (pl.col("dur").sum() / 1e6).alias("kernel_time_ms"), pl.len().cast(pl.Int64).alias("kernels")
    )
    out = span.join(union_of(0, "_busy"), on=_PER, how="left").join(union_of(1, "_comp"), on=_PER, how="left")
    out = out.join(kt, on=_PER, how="left")
    if has_comm:
        out = out.join(union_of(2, "_comm"), on=_PER, how="left").join(union_of(3, "_both"), on=_PER, how="left")
        # coverage's numbers, null where the step has no communication (as its left join leaves them)
        out = overlap_columns(out, "_comm", "_comp", "_both")
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias(c) for c in ("comm_ms", "overlap_ms", "exposed_comm_ms", "comm_comp_overlap_pct"))
    out = out.with_columns((pl.col("_busy") / measures.NS_PER_MS).alias("busy_ms"),
                           (pl.col("_comp") / measures.NS_PER_MS).alias("compute_ms"))
    out = out.with_columns(
        pl.col("compute_ms", "kernel_time_ms").fill_null(0.0),
        pl.col("kernels").fill_null(0),
        pl.col("comm_ms", "overlap_ms", "exposed_comm_ms").fill_null(0.0),
        (pl.col("gpu_span_ms") - pl.col("busy_ms")).clip(lower_bound=0.0).alias("idle_ms"),
    )
    # Ranks with steps: idle is the gaps on the device's own timeline charged to the step (inside it and its lead-in
    # since the previous work, e.g. the loop waiting for its next batch), not span minus busy of the step's kernels:
    # when the host runs ahead, one step's kernels are spread between others' and that difference is not idle.
    # Of two sources of one rank (their clocks differ) the one with more idle is kept, never their sum.
    rank_t = k.schema["rank"]
    g = ensure(run, "gpu_idle_gaps").lazy().group_by(["rank", "source", "step"]).agg(pl.col("gap_ms").sum().alias("_gap_ms"))
    g = g.group_by(_PER).agg(pl.col("_gap_ms").max())
    out = out.join(g.with_columns(pl.col("rank").cast(rank_t)), on=_PER, how="left").with_columns(
        pl.when(pl.col("step") == -1).then(pl.col("idle_ms")).otherwise(pl.col("_gap_ms").fill_null(0.0)).alias("idle_ms")
    ).drop("_gap_ms")
    st = steps.lazy().select("rank", "source", "step", (pl.col("dur") / 1e6).alias("step_ms")).group_by(["rank", "step"]).agg(pl.col("step_ms").max())
    out = out.join(st.with_columns(pl.col("rank").cast(rank_t)), on=_PER, how="left")
    out = out.with_columns(pl.when(pl.col("step") == -1).then(None).otherwise(pl.col("step")).alias("step"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(_PER, nulls_last=True).collect(engine=POLARS_ENGINE)


HOST_OP_MIN_GAP_MS = 0.05  # gaps shorter than this get no host_op (rules report gaps of a millisecond and more)
GAP_SCHEMA = {"rank": pl.Int32, "source": pl.Int32, "device": pl.Int32, "step": pl.Int64, "gap_ts": pl.Int64,
              "gap_end": pl.Int64, "gap_ms": pl.Float64, "lead": pl.Boolean, "prev_name": pl.Utf8, "next_name": pl.Utf8,
              "host_op": pl.Utf8, "input_wait_ms": pl.Float64}


_PACK_DEVICES = True  # tests turn it off to compare the packed running end with the windows per device


def _raw_gaps(run: Run) -> pl.DataFrame:
    """Gaps between busy stretches of each (rank, source, device), charged to the step of the operation after them."""
    k = run.table("kernels").lazy().select("rank", "source", "device", "step", "ts", "end", "name").filter(
        pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("rank").is_not_null()).collect(engine=POLARS_ENGINE)
    if k.height == 0:
        return pl.DataFrame(schema={c: t for c, t in GAP_SCHEMA.items() if c not in ("host_op", "input_wait_ms")})
    ends, rows = (k["end"].min(), k["end"].max()), k.height
    # the rest as one lazy query on the in-memory engine (it was a dozen eager ones)
    k = k.lazy().with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), pl.col("device").fill_null(-1).cast(pl.Int32))
    key = ["rank", "source", "device"]
    k = k.sort([*key, "ts"], maintain_order=True).with_columns(pl.struct(key).rle_id().alias("_g"))
    # the operation that reached the running end last: the one whose end the gap starts from (its row: its name is
    # fetched for the gaps only, not filled forward as a string column over every kernel), and its step
    lo, width = ends[0], max(1, (ends[1] - ends[0]).bit_length())
    if not _PACK_DEVICES or rows.bit_length() + width > 62:  # the device's number and end do not fit one integer
        k = k.with_columns(pl.col("end").cum_max().over("_g").alias("_cm"))
        k = k.with_row_index("_ri").with_columns(
            pl.col("_cm").shift(1).over("_g").alias("_busy_until"),
            pl.when(pl.col("end") == pl.col("_cm")).then(pl.col("_ri")).forward_fill().over("_g").shift(1).over("_g").alias("_prev_row"),
            pl.when(pl.col("end") == pl.col("_cm")).then(pl.col("step")).forward_fill().over("_g").shift(1).over("_g").alias("_prev_step"),
        ).collect(engine=POLARS_ENGINE)
    else:
        # the same without windows over the devices: the running end as one cum_max of the device's number above the
        # end's offset from the earliest end (a later device's values exceed every earlier one's); a device's first
        # row reaches its running end, so a fill forward of the rows that reach it never crosses devices; the step of
        # the last such row with a step (-1 on a device's first row stops that fill there); each shifted to the next
        # row of the device (null on its first)
        first = (pl.col("_g") != pl.col("_g").shift(1)).fill_null(True)

        def after(e: pl.Expr) -> pl.Expr:
            return pl.when(~first).then(e.shift(1))

        dev = pl.col("_g").cast(pl.Int64) * (1 << width)
        k = k.with_columns(((dev + (pl.col("end") - lo)).cum_max() - dev + lo).alias("_cm"))
        reach = pl.col("end") == pl.col("_cm")
        k = k.with_row_index("_ri").with_columns(
            after(pl.col("_cm")).alias("_busy_until"),
            after(pl.when(reach).then(pl.col("_ri")).forward_fill()).alias("_prev_row"),
            pl.when(reach & pl.col("step").is_not_null()).then(pl.col("_ri").cast(pl.Int64)).when(first).then(-1)
            .forward_fill().alias("_si"),
        ).with_columns(after(pl.when(pl.col("_si") >= 0).then(pl.col("step").gather(pl.col("_si").clip(0))))
                       .alias("_prev_step")).drop("_si").collect(engine=POLARS_ENGINE)
    g = k.lazy().filter(pl.col("step").is_not_null() & (pl.col("ts") > pl.col("_busy_until")))
    # A lead gap starts no earlier than the previous step's host range (for the first step: its own): idle time before
    # profiling or between start-up and the loop is nobody's step.
    st = run.table("steps").lazy().select(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step", "ts")
    st = st.group_by("rank", "source", "step").agg(pl.col("ts").min().alias("_host_ts")).sort("rank", "source", "step")
    st = st.with_columns(pl.col("_host_ts").shift(1).over("rank", "source").fill_null(pl.col("_host_ts")).alias("_floor"))
    g = g.join(st.select("rank", "source", "step", "_floor"), on=["rank", "source", "step"], how="left")
    lead = pl.col("_prev_step").is_null() | (pl.col("_prev_step") != pl.col("step"))
    g = g.with_columns(
        lead.alias("lead"),
        pl.when(lead & pl.col("_floor").is_not_null()).then(pl.max_horizontal("_busy_until", "_floor"))
        .otherwise(pl.col("_busy_until")).alias("gap_ts"),
    ).filter(pl.col("ts") > pl.col("gap_ts"))
    g = g.select("rank", "source", "device", "step", "gap_ts", pl.col("ts").alias("gap_end"),
                 ((pl.col("ts") - pl.col("gap_ts")) / 1e6).alias("gap_ms"), "lead", "_prev_row",
                 pl.col("name").alias("next_name")).collect(engine=POLARS_ENGINE)
    return g.select(*g.columns[:8], k["name"].gather(g["_prev_row"]).alias("prev_name"), "next_name")


def gpu_idle_gaps(run: Run) -> pl.DataFrame:
    from traceql.link.context import host_context
    from traceql.link.input_pipeline import input_wait_ns

    g = _raw_gaps(run)
    if g.height == 0:
        return pl.DataFrame(schema=GAP_SCHEMA)
    # what the host was doing, for gaps that can matter: a trace has a gap of a few microseconds between most
    # kernels, and naming each would cost an as-of join per gap for nothing
    g = measures.short_names(g, ["prev_name", "next_name"])  # row by row: once for both parts
    # the named gaps' host_op put back at their rows: the gaps keep _raw_gaps' order (device by device, in time),
    # which is the table's, so they need no sort at the end (a sort of 352k gaps: 0.16 s at 16 ranks)
    g = g.with_row_index("_gi")
    worth = g.filter(pl.col("gap_ms") >= HOST_OP_MIN_GAP_MS)
    named = host_context(run, worth.select("_gi", "rank", "source", "gap_ts", "gap_end"))
    host_op = pl.repeat(None, g.height, dtype=pl.Utf8, eager=True)
    if named.height:
        host_op = host_op.scatter(named["_gi"], named["host_op"])
    g = g.drop("_gi").with_columns(host_op.alias("host_op"))
    g = g.with_columns((input_wait_ns(run, g, "gap_ts", "gap_end") / 1e6).alias("input_wait_ms"))
    g = g.select([pl.col(c).cast(t) for c, t in GAP_SCHEMA.items()])
    return sorted_by(g, ["rank", "source", "device", "gap_ts"])


def gpu_step_gaps(run: Run) -> pl.DataFrame:
    """Per rank, source and step with GPU work: the step's longest idle gap (gpu_idle_gaps; 0 where it has none)."""
    from traceql.link import ensure

    schema = {"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64, "max_gap_ms": pl.Float64}
    k = run.table("kernels").filter(pl.col("step").is_not_null()).select(
        pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "step").unique()
    if k.height == 0:
        return pl.DataFrame(schema=schema)
    worst = ensure(run, "gpu_idle_gaps").group_by("rank", "source", "step").agg(pl.col("gap_ms").max().alias("max_gap_ms"))
    out = k.join(worst, on=["rank", "source", "step"], how="left").with_columns(pl.col("max_gap_ms").fill_null(0.0))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "source", "step")


DERIVED = {"step_breakdown": step_breakdown, "gpu_idle_gaps": gpu_idle_gaps, "gpu_step_gaps": gpu_step_gaps}
