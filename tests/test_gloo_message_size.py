"""gloo collectives take their message size from their annotation's Input Dims / Input type (record_shapes), since
no record_param_comms op carries it: TQL102 fires on small per-parameter all-reduces and stays quiet on buckets."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceql import pipeline
from traceql.ingest._kineto_coll import _input_size
from traceql.pipeline import load_run

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dims,types,want", [
    ([[321271]], ["float"], (321271, "float", 1285084)),  # the HTA cpu_only trace's gloo:all_reduce
    ([[8192, 64]], ["float"], (524288, "float", 2097152)),
    ([[1024, 512], [512]], ["c10::BFloat16", "c10::BFloat16"], (524800, "BFloat16", 1049600)),
    ([[4, 4]], ["c10::Float8_e4m3fn"], (16, "Float8_e4m3fn", 16)),
    ([[4, 4]], ["some_new_dtype"], None),
    ([[65536, 384], [], []], ["float", "", "Scalar"], (25165824, "float", 100663296)),  # scalars are no tensors
    ([[], [], []], ["Scalar", "Scalar", ""], None),
    ([[]], ["TensorList"], None),
    ("[[4]]", ["float"], None),
])
def test_input_size(dims, types, want):
    assert _input_size(dims, types) == want


def _tql102(path):
    res = pipeline.check(path, select=["TQL102"], use_cache=False, jobs=1)
    return [f for f in res.findings if f.rule == "TQL102"]


def test_ddp_gloo_buckets_have_their_sizes_and_are_no_storm():
    path = REPO / "fixtures" / "gloo-shapes-buckets"
    c = load_run(path, use_cache=False, jobs=1).table("collectives").filter(pl.col("step").is_not_null())
    assert set(c["backend"]) == {"gloo"} and c["bytes"].null_count() == 0
    per = c.group_by("rank", "step").agg(pl.len().alias("n"), pl.col("bytes").median().alias("med"))
    assert (per["n"] >= 12).all()  # as many calls per step as a storm: only their size tells them apart
    assert (per["med"] > 2_000_000).all()  # Linear(1024, 512) weight plus bias per bucket: 2.1 MB
    assert _tql102(path) == []


def test_small_gloo_all_reduces_still_storm_with_their_size():
    found = _tql102(REPO / "fixtures" / "gloo-shapes-small-allreduce-storm")
    assert sorted(r for f in found for r in f.ranks) == [0, 1]
    assert all(f.evidence["median_bytes"] == 544 and "544 B" in f.message for f in found)


def test_storm_without_shapes_says_why_the_size_is_missing():
    found = _tql102(REPO / "fixtures" / "cpu-small-allreduce-storm")
    assert sorted(r for f in found for r in f.ranks) == [0, 1]
    assert all("record_shapes=True" in f.message and f.evidence["median_bytes"] is None for f in found)


def test_corpus_gloo_trace_sizes(corpus):
    c = load_run(corpus / "hta" / "tests" / "data" / "cpu_only", use_cache=False, jobs=1).table("collectives")
    assert c.height == 10 and set(c["backend"]) == {"gloo"}
    # each call's size is its tensor's, as the trace's Input Dims say: 321271 floats for half the calls, 2082411 for
    # the other half
    assert set(c["dtype"]) == {"float"} and (c["bytes"] == 4 * c["in_nelems"]).all()
    assert sorted(c["bytes"].value_counts().rows()) == [(4 * 321271, 5), (4 * 2082411, 5)]
