"""Numeric precision of GEMM kernels, read from their names, per rank.

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


def gemm_precision(run: Run) -> pl.DataFrame:
    # classify on the name without its parameter list, and without fbgemm (a library name, not a GEMM)
    sig = pl.col("name").str.replace(r"\(.*$", "").str.replace_all("fbgemm", "")
    k = run.table("kernels").select("rank", "name", "kind", "dur").filter(pl.col("kind") == "compute")
    # classify each distinct name once (kernel names repeat millions of times), then join the class on
    names = k.select(pl.col("name").unique()).with_columns(sig.alias("_sig")).filter(pl.col("_sig").str.contains(GEMM))
    names = names.with_columns(
        pl.when(pl.col("_sig").str.contains(LOW)).then(pl.lit("low"))
        .when(pl.col("_sig").str.contains(FP32)).then(pl.lit("fp32"))
        .otherwise(pl.lit("unknown")).alias("precision")
    )
    k = k.join(names, on="name", how="inner", maintain_order="left")
    per = k.group_by("rank").agg(
        (pl.col("precision") == "fp32").sum().alias("fp32_gemms"),
        (pl.col("precision") == "low").sum().alias("low_gemms"),
        (pl.col("dur").filter(pl.col("precision") == "fp32").sum() / 1e6).alias("fp32_ms"),
        (pl.col("dur").filter(pl.col("precision") == "low").sum() / 1e6).alias("low_ms"),
        pl.col("_sig").str.replace("^void ", "").filter(pl.col("precision") == "fp32").mode().sort().first().alias("fp32_example"),
        pl.col("_sig").str.replace("^void ", "").filter(pl.col("precision") == "low").mode().sort().first().alias("low_example"),
    )
    return per.with_columns(
        (pl.col("fp32_ms") / (pl.col("fp32_ms") + pl.col("low_ms")) * 100).alias("fp32_pct")
    ).sort("rank")


DERIVED = {"gemm_precision": gemm_precision}
