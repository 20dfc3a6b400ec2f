"""Clock alignment per rank, from matched collectives.

Every rank records on its own clock. The kernels of one NCCL collective end together on every rank (within
microseconds: the last step of the algorithm completes on all peers at once), so the difference of their end
times is the difference of the ranks' clocks. Per rank, the offset against a reference rank is the median of
those differences (robust to the odd collective that ends late on one rank); the residual is the median absolute
deviation of the differences around it. Host-only collectives (gloo) have no kernel: the end of the host op is the
anchor, which is less precise (ends spread by the time the library takes to hand the result to each rank), and
`method` says so.

Ranks recorded in one source (an nsys file holding several processes) share that source's clock and get one
offset; the spread of their matched ends is reported as the precision of the method.

A rank that shares no collective with the reference rank is aligned through ranks that do (the anchor of a call
is then the median aligned end of the ranks already aligned). A rank that shares none with any aligned rank keeps
offset 0 with method "unaligned".

aligned time = raw time - offset_ns.

A time measured between two ranks (a wait, a lateness) is off by up to both ranks' residuals: clock_error_ms gives
that bound per rank, and rules that compare ranks' times weigh their findings against it.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

SCHEMA = {"rank": pl.Int32, "offset_ns": pl.Int64, "residual_us": pl.Float64, "n_matched": pl.Int64,
          "method": pl.Utf8, "reference": pl.Int32}

KERNEL_METHOD = "nccl kernel end"
HOST_METHOD = "host op end (no kernel: gloo/host-only, less precise)"


def clock_offsets(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    m = ensure(run, "collective_matches")
    ranks = sorted(set(m["rank"].to_list())) if m.height else []
    if not ranks:
        return pl.DataFrame(schema=SCHEMA)
    # Ranks recorded in one source (one nsys file holding several processes) share its clock: one domain.
    domain_of = dict(m.group_by("rank").agg(pl.col("source").first()).iter_rows())
    a = m.select(
        "rank", "match_id", pl.coalesce("kernel_end", "end").alias("anchor"), pl.col("end").alias("_hend"),
        pl.col("kernel_end").is_not_null().alias("_k"),
    ).filter(pl.col("anchor").is_not_null() & (pl.len().over("match_id") >= 2))
    # Where a call has kernel ends on every rank, use kernel ends; a mixed call falls back to host ends.
    a = a.with_columns(
        pl.when(pl.col("_k").all().over("match_id")).then(pl.col("anchor")).otherwise(pl.col("_hend")).alias("anchor"),
        pl.col("_k").all().over("match_id").alias("_k"),
    ).filter(pl.col("anchor").is_not_null())
    a = a.with_columns(pl.col("rank").replace_strict(domain_of, return_dtype=pl.Int64).alias("domain"))
    # How closely ends coincide on one clock: the spread of anchors within a domain (measures the assumption).
    same_clock = a.filter(pl.len().over("match_id", "domain") >= 2)
    if same_clock.height:
        spread = same_clock.with_columns(
            (pl.col("anchor") - pl.col("anchor").median().over("match_id", "domain")).abs().alias("_dev")
        )["_dev"].median()
        _note(run, f"clock: ranks sharing one source's clock end their matched collectives within {spread / 1e3:.1f} us "
                   "of each other (median): the precision of end-time alignment")
    ad = a.group_by("domain", "match_id").agg(pl.col("anchor").median(), pl.col("_k").all())
    counts = ad.group_by("domain").len()
    if counts.height == 0:
        return _unaligned(ranks)
    ref_domain = counts.sort(["len", "domain"], descending=[True, False])["domain"][0]
    ref = min(r for r in ranks if domain_of[r] == ref_domain)
    known: dict[int, int] = {ref_domain: 0}
    stats: dict[int, tuple] = {}
    while True:
        kn = pl.DataFrame({"domain": list(known), "_off": list(known.values())}, schema={"domain": pl.Int64, "_off": pl.Int64})
        ak = ad.join(kn, on="domain", how="inner").group_by("match_id").agg(
            (pl.col("anchor") - pl.col("_off")).median().alias("_ref_end"))
        todo = ad.filter(~pl.col("domain").is_in(list(known))).join(ak, on="match_id", how="inner")
        if todo.height == 0:
            break
        d = todo.with_columns((pl.col("anchor") - pl.col("_ref_end")).alias("_d"))
        est = d.group_by("domain").agg(pl.col("_d").median().alias("_off"), pl.len().alias("_n"),
                                       pl.col("_k").all().alias("_kall"), pl.col("_k").any().alias("_kany"))
        d = d.join(est.select("domain", "_off"), on="domain").with_columns((pl.col("_d") - pl.col("_off")).abs().alias("_dev"))
        est = est.join(d.group_by("domain").agg((pl.col("_dev").median() / 1e3).alias("_res")), on="domain")
        for dom, off, n, kall, kany, rs in est.select("domain", "_off", "_n", "_kall", "_kany", "_res").iter_rows():
            known[dom] = int(round(off))
            meth = KERNEL_METHOD if kall else (HOST_METHOD if not kany else "mixed: kernel ends where every rank has one, else host op ends")
            stats[dom] = (rs, n, meth)
    ref_n = int(counts.filter(pl.col("domain") == ref_domain)["len"][0])
    ref_k = bool(ad.filter(pl.col("domain") == ref_domain)["_k"].all())
    rows = []
    for r in ranks:
        dom = domain_of[r]
        if r == ref:
            rows.append((r, 0, 0.0, ref_n, f"reference ({KERNEL_METHOD if ref_k else HOST_METHOD})", ref))
        elif dom == ref_domain:
            rows.append((r, 0, 0.0, ref_n, "same source as the reference rank (one clock)", ref))
        elif dom in stats:
            rs, n, meth = stats[dom]
            rows.append((r, known[dom], float(rs), int(n), meth, ref))
        else:
            rows.append((r, 0, None, 0, "unaligned (shares no collective with an aligned rank)", None))
    out = pl.DataFrame(rows, schema=list(SCHEMA.items()), orient="row")
    worst = out.filter(pl.col("residual_us").is_not_null() & (pl.col("rank") != ref)
                       & ~pl.col("method").str.starts_with("same source")).sort("residual_us", descending=True)
    if worst.height:
        r, res, meth = worst["rank"][0], worst["residual_us"][0], worst["method"][0]
        warn = ""
        if meth == KERNEL_METHOD and res > 100.0:
            warn = "; large for kernel ends: the ranks' call sequences may not match (see TQL303 collective-desync)"
        _note(run, f"clock: {out.height} rank(s) aligned to rank {ref} from matched collectives; worst residual "
                   f"{res:.1f} us (rank {r}, {meth}){warn}")
    unal = out.filter(pl.col("method").str.starts_with("unaligned"))["rank"].to_list()
    if unal:
        _note(run, f"clock: ranks {unal} share no matched collective with an aligned rank; their times are not "
                   "comparable with the others'")
    return out


def _unaligned(ranks: list[int]) -> pl.DataFrame:
    """Offset 0 for every rank: no collective was matched on two ranks."""
    n = len(ranks)
    return pl.DataFrame({"rank": ranks, "offset_ns": [0] * n, "residual_us": [None] * n, "n_matched": [0] * n,
                         "method": ["unaligned (no collective matched on two ranks)"] * n, "reference": [None] * n},
                        schema=SCHEMA)


def clock_error_ms(run: Run) -> pl.DataFrame:
    """Per rank: how far a wait measured between this rank and another can be off because of clock alignment, the
    alignment residual of the rank plus the largest residual among the other ranks (ms). Null where unaligned."""
    from traceql.link import ensure

    off = ensure(run, "clock_offsets")
    if off.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "clock_error_ms": pl.Float64})
    res = off.select(pl.col("rank").cast(pl.Int32), (pl.col("residual_us") / 1e3).alias("_r"))
    # the largest residual among the other ranks: the run's largest, or the second largest for the rank holding it
    # (unaligned ranks, residual null, share no collective with the others and add nothing)
    top = res.filter(pl.col("_r").is_not_null()).sort("_r", descending=True)
    first = float(top["_r"][0]) if top.height else 0.0
    second = float(top["_r"][1]) if top.height > 1 else 0.0
    holder = int(top["rank"][0]) if top.height else None
    if holder is None:
        return res.select("rank", pl.col("_r").alias("clock_error_ms"))
    other = pl.when(pl.col("rank") == holder).then(pl.lit(second)).otherwise(pl.lit(first))
    return res.select("rank", (pl.col("_r") + other).alias("clock_error_ms"))


def align(df: pl.DataFrame, offsets: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """df with its time columns on the aligned clock (raw - offset of its rank; ranks without an offset: 0)."""
    if df.height == 0 or not any(offsets["offset_ns"].to_list()):
        return df  # every clock is the reference's (one rank, one source, nothing aligned): the times as they are
    off = offsets.select(pl.col("rank").cast(df.schema["rank"]), pl.col("offset_ns").alias("_off_ns"))
    out = df.join(off, on="rank", how="left", maintain_order="left").with_columns(pl.col("_off_ns").fill_null(0))
    return out.with_columns([(pl.col(c) - pl.col("_off_ns")).alias(c) for c in cols if c in df.columns]).drop("_off_ns")


def _note(run: Run, text: str) -> None:
    if text not in run.notes:
        run.notes.append(text)


DERIVED = {"clock_offsets": clock_offsets, "clock_error": clock_error_ms}
