"""Collective bandwidth (link/bandwidth.py) against nccl-tests' definitions (doc/PERFORMANCE.md), on collectives of
real captures whose size (record_param_comms) and time (the NCCL kernel) the trace records."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceql import pipeline
from traceql.link import bandwidth, ensure

FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75),
    ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("barrier", 8, None),
])
def test_bus_factor_is_nccl_tests(op, n, factor):
    assert bandwidth.bus_factor(op, n) == factor


def test_all_gather_size_is_the_whole_output():
    assert bandwidth.size_bytes("all_gather", 1024, 256, 2048, 8) == 8192
    assert bandwidth.size_bytes("all_gather", 1024, None, None, 8) == 8192
    assert bandwidth.size_bytes("all_reduce", 1024, 256, 256, 8) == 1024


def test_flat_all_reduce_on_two_h200s():
    """h200x2-exposed-allreduce: one 134,430,784-byte fp32 all_reduce per step over P2P; the last arriver's kernel
    is the transfer time."""
    run = pipeline.load_run(FIX / "h200x2-exposed-allreduce")
    bw = ensure(run, "collective_bandwidth").sort("match_id")
    ci = ensure(run, "collective_instances")
    last = ci.filter(pl.col("rank") == pl.col("last_arriver")).sort("match_id")
    assert bw.height == last.height == 3
    for row, (nbytes, dur) in zip(bw.iter_rows(named=True), last.select("bytes", "dur_ms").iter_rows()):
        assert row["size_bytes"] == nbytes == 134430784
        assert row["time_ms"] == pytest.approx(dur)
        alg = nbytes / (dur / 1e3) / 1e9
        assert row["algbw_gbps"] == pytest.approx(alg)
        assert row["busbw_gbps"] == pytest.approx(alg * 2 * (2 - 1) / 2)
        assert row["link"] == "p2p" and row["inter_node"] is False and row["n_hosts"] == 1
        assert 150 < row["busbw_gbps"] < 450  # NVLink 4 between two H200s: 450 GB/s per direction at most
        assert row["ranks"] == [0, 1]


def test_all_gather_bus_bandwidth_uses_n_minus_1_over_n():
    run = pipeline.load_run(FIX / "h200x2-desync")
    ag = ensure(run, "collective_bandwidth").filter(pl.col("op") == "all_gather").row(0, named=True)
    assert ag["size_bytes"] == 2 * ag["bytes"]
    assert ag["busbw_gbps"] == pytest.approx(ag["algbw_gbps"] * 0.5)


def test_gloo_collectives_have_no_link_and_no_verdict():
    run = pipeline.load_run(FIX / "cpu-ddp-eager")
    bw = ensure(run, "collective_bandwidth")
    assert bw.height and bw["link"].null_count() == bw.height and bw["pct_of_link"].null_count() == bw.height


def test_tql106_fires_when_the_link_is_said_to_be_faster_than_measured():
    """No capture is slow enough to fire it (benchmarks: 200-285 GB/s over P2P); raising the threshold above what the
    H200s reached shows the rule reports the measured numbers, with the group's ranks."""
    quiet = pipeline.check(FIX / "h200x2-exposed-allreduce", select=["TQL106"])
    assert not quiet.findings
    res = pipeline.check(FIX / "h200x2-exposed-allreduce", select=["TQL106"], sets=["TQL106.max_pct_of_link=2000"])
    [f] = res.findings
    assert f.ranks == [0, 1] and f.evidence["link"] == "p2p" and f.evidence["n_rows"] == 3
    assert 150 < f.evidence["busbw_gbps"] < 450
