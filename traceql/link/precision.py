"""Numeric precision of GEMM kernels, read from their names, per rank and precision class (TQL209 weighs them).

cuBLAS/cuBLASLt/CUTLASS kernel names carry their data types (sm90_xmma_gemm_bf16bf16_bf16f32_f32...,
ampere_sgemm_128x64_nn, ampere_fp16_s16816gemm_fp16..., cutlass_80_tensorop_bf16_s16816gemm...); a GEMM whose
name says fp32/tf32 and nothing narrower ran in single precision. Kernels whose names carry no type (Triton,
custom) are "unknown" and never counted as fp32.
"""

from __future__ import annotations

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.model import Run

GEMM = r"(?i)gemm|xmma|wgmma|nvjet"
LOW = r"(?i)bf16|fp16|f16|half|hgemm|h1688|h16816|h884|e4m3|e5m2|fp8|int8|i8i8|_hsh_|_bhb_|_tst_"
FP32 = r"(?i)sgemm|f32f32_f32|gemm_f32|tf32|fp32|_sss_|s1688gemm|s884gemm|s16816gemm"


def gemm_classes(run: Run) -> pl.DataFrame:
    """Per rank and precision class of its GEMM kernels (low, fp32 or unknown, read from the names): how many
    launches, their GPU time (ns) and the class's most launched kernel (its name without parameter list, "void " or
    "fbgemm"; ties: the first name). Kernel names repeat millions of times: each distinct name is classified once."""
    schema = {"rank": pl.Int32, "precision": pl.Utf8, "kernels": pl.Int64, "dur": pl.Int64, "example": pl.Utf8}
    # classify on the name without its parameter list, and without fbgemm (a library name, not a GEMM)
    sig = pl.col("name").str.replace(r"\(.*$", "").str.replace_all("fbgemm", "")
    # one lazy plan (eager steps are a fixed cost each on a small run)
    k = run.table("kernels").lazy().select("rank", "name", "kind", "dur").filter(pl.col("kind") == "compute")
    per_name = k.group_by("rank", "name").agg(pl.len().alias("kernels"), pl.col("dur").sum())
    names = per_name.select(pl.col("name").unique()).with_columns(sig.alias("_sig")).filter(pl.col("_sig").str.contains(GEMM))
    names = names.with_columns(
        pl.when(pl.col("_sig").str.contains(LOW)).then(pl.lit("low"))
        .when(pl.col("_sig").str.contains(FP32)).then(pl.lit("fp32"))
        .otherwise(pl.lit("unknown")).alias("precision"),
        pl.col("_sig").str.replace("^void ", "").alias("kernel"),
    )
    per_kernel = per_name.join(names, on="name", how="inner").group_by("rank", "precision", "kernel").agg(
        pl.col("kernels").sum(), pl.col("dur").sum())
    out = per_kernel.sort(["rank", "precision", "kernels", "kernel"], descending=[False, False, True, False]).group_by(
        "rank", "precision", maintain_order=True).agg(pl.col("kernels").sum(), pl.col("dur").sum(), pl.col("kernel").first().alias("example"))
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "precision").collect(engine=POLARS_ENGINE)


DERIVED = {"gemm_classes": gemm_classes}
