"""The general facts the 1xx/2xx rules read (gemm_classes, microbatches) against the raw tables, and the rules' YAML
over them on runs changed to what they must tell apart."""

from __future__ import annotations

import polars as pl
from conftest import FIXTURES, rule_rows

from traceql import link
from traceql.pipeline import load_run
from traceql.rules.engine import evaluate
from traceql.rules.loader import load_rules

RULES = {r.id: r for r in load_rules()}
FP32_LEAK = FIXTURES / "h200-fp32-leak"
ACCUM = FIXTURES / "cpu-grad-accum-without-no_sync"


def test_gemm_classes_count_every_launch_once_with_its_class():
    run = load_run(FP32_LEAK, use_cache=False, jobs=1)
    g = link.ensure(run, "gemm_classes")
    assert sorted(g["precision"]) == ["fp32", "low"]
    k = run.table("kernels").filter((pl.col("kind") == "compute") & pl.col("name").str.contains(r"(?i)gemm|xmma|nvjet"))
    k = k.with_columns(pl.col("name").str.replace(r"\(.*$", "").str.replace("^void ", "").alias("kernel"))
    # the name says the type: sgemm / f32f32 are single precision, nvjet's tst tiles bf16
    fp32 = k.filter(pl.col("kernel").str.starts_with("sgemm") | pl.col("kernel").str.contains("f32f32_f32f32"))
    assert g["kernels"].sum() == k.height and g["dur"].sum() == k["dur"].sum()
    row32 = g.filter(pl.col("precision") == "fp32").row(0, named=True)
    assert row32["kernels"] == fp32.height and row32["dur"] == fp32["dur"].sum()
    # the example is the fp32 kernel launched most often, ties to the first name
    top = fp32.group_by("kernel").len().sort(["len", "kernel"], descending=[True, False])["kernel"][0]
    assert row32["example"] == top
    (row,) = rule_rows(run, "TQL209")
    assert row["fp32_gemms"] == fp32.height and row["fp32_example"] == top
    assert abs(row["fp32_ms"] - fp32["dur"].sum() / 1e6) < 1e-3


def test_grad_accum_with_no_sync_is_quiet():
    run = load_run(ACCUM, use_cache=False, jobs=1)
    assert [f.ranks for f in evaluate(run, RULES["TQL103"]).findings] == [[0], [1]]
    # the same run as if the first micro-batches ran under no_sync(): only the last one's collectives remain
    mb = link.ensure(run, "microbatches")
    last = mb.group_by("rank", "step").agg(pl.col("ts").max().alias("_last"))
    c = run.table("collectives").join(last, on=["rank", "step"], how="left")
    run = load_run(ACCUM, use_cache=False, jobs=1)
    run.tables["collectives"] = c.filter(pl.col("_last").is_null() | (pl.col("ts") >= pl.col("_last"))).drop("_last")
    rows = rule_rows(run, "TQL103")
    assert rows and all(r["synced"] == 1 and r["micro_batches"] == 4 for r in rows)
    assert evaluate(run, RULES["TQL103"]).findings == []
