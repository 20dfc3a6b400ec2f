"""Numeric precision of GEMM kernels, read from their names, per rank and kernel name (TQL209 weighs them).

cuBLAS/cuBLASLt/CUTLASS kernel names carry their data types (sm90_xmma_gemm_bf16bf16_bf16f32_f32...,
ampere_sgemm_128x64_nn, ampere_fp16_s16816gemm_fp16..., cutlass_80_tensorop_bf16_s16816gemm...); a GEMM whose
name says fp32/tf32 and nothing narrower ran in single precision. Kernels whose names carry no type (Triton,
custom) are "unknown" and never counted as fp32.
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

GEMM = r"(?i)gemm|xmma|wgmma|nvjet"
LOW = r"(?i)bf16|fp16|f16|half|hgemm|h1688|h16816|h884|e4m3|e5m2|fp8|int8|i8i8|_hsh_|_bhb_|_tst_"
FP32 = r"(?i)sgemm|f32f32_f32|gemm_f32|tf32|fp32|_sss_|s1688gemm|s884gemm|s16816gemm"


def gemm_kernels(run: Run) -> pl.DataFrame:
    """Per rank and GEMM kernel (its name without the parameter list, "void " or "fbgemm"): its precision class
    (low, fp32 or unknown), how many times it ran and for how long in all (ns). One row per distinct name, not per
    launch: kernel names repeat millions of times."""
    schema = {"rank": pl.Int32, "kernel": pl.Utf8, "precision": pl.Utf8, "kernels": pl.Int64, "dur": pl.Int64}
    # classify on the name without its parameter list, and without fbgemm (a library name, not a GEMM)
    sig = pl.col("name").str.replace(r"\(.*$", "").str.replace_all("fbgemm", "")
    k = run.table("kernels").select("rank", "name", "kind", "dur").filter(pl.col("kind") == "compute")
    per_name = k.group_by("rank", "name").agg(pl.len().alias("kernels"), pl.col("dur").sum())
    # classify each distinct name once, then join the class on
    names = per_name.select(pl.col("name").unique()).with_columns(sig.alias("_sig")).filter(pl.col("_sig").str.contains(GEMM))
    names = names.with_columns(
        pl.when(pl.col("_sig").str.contains(LOW)).then(pl.lit("low"))
        .when(pl.col("_sig").str.contains(FP32)).then(pl.lit("fp32"))
        .otherwise(pl.lit("unknown")).alias("precision"),
        pl.col("_sig").str.replace("^void ", "").alias("kernel"),
    )
    out = per_name.join(names, on="name", how="inner").group_by("rank", "kernel", "precision").agg(
        pl.col("kernels").sum(), pl.col("dur").sum())
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("rank", "kernel")


DERIVED = {"gemm_kernels": gemm_kernels}
