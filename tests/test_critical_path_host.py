"""The critical path includes the host: the GPU's waits for launches are split by what the host did (a DataLoader
fetch, a blocking sync, launching), and a host blocked in a gloo collective hands the path to the rank it waited
for, so that rank's late host work is on the path of every rank that waited. Real captures throughout."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceql import link
from traceql.pipeline import load_run

ROOT = Path(__file__).resolve().parents[1]


def _cp(name):
    return link.ensure(load_run(ROOT / name), "critical_path")


@pytest.mark.parametrize("name", ["fixtures/h200-loader-bound", "samples/demo", "fixtures/h200-straggler",
                                  "fixtures/h200x2-straggler", "fixtures/h200-host-sync-per-step"])
def test_parts_add_up_and_host_parts_are_within_the_host_time(name):
    cp = _cp(name)
    assert cp.height
    parts = cp["compute_ms"] + cp["exposed_comm_ms"] + cp["host_launch_ms"] + cp["idle_ms"]
    assert ((parts - cp["step_ms"]).abs() < 1e-6).all()
    host_parts = cp["host_sync_ms"] + cp["input_wait_ms"] + cp["host_comm_ms"] + cp["host_other_ms"]
    assert (host_parts <= cp["host_launch_ms"] + 1e-6).all()
    assert (cp["host_jumps"] <= cp["rank_jumps"]).all()


def test_a_loader_bound_step_has_the_loader_on_its_path():
    bound, fixed = _cp("fixtures/h200-loader-bound"), _cp("fixtures/h200-loader-fixed")
    # the planted loader: most of the host's share of the path is the batch fetch
    assert (bound["input_wait_ms"] > 0.5 * bound["host_launch_ms"]).all()
    assert bound["input_wait_ms"].median() > 10 * max(fixed["input_wait_ms"].median(), 0.1)


@pytest.mark.parametrize("name", ["fixtures/h200-straggler", "samples/demo"])
def test_the_late_rank_is_on_the_path_of_the_rank_that_waited(name):
    """Two ranks over gloo (host-blocking collectives), rank 1 late every step (planted): whichever rank's kernel
    ends the step, the path goes through rank 1 by a host-side collective wait."""
    cp = _cp(name)
    assert (cp["host_jumps"] >= 1).all()
    assert all(1 in r for r in cp["ranks_on_path"].to_list())
    assert (cp.filter(pl.col("rank") == 0).height) >= 1  # some step ends on rank 0, the rank that waited


def test_nccl_paths_have_no_host_jumps():
    """NCCL calls do not block the host: waits are the GPU's (collective kernels), crossed as before."""
    cp = _cp("fixtures/h200x2-ddp-compiled")
    assert (cp["host_jumps"] == 0).all()


def test_the_late_ranks_sleep_is_on_the_path_as_unrecorded_host_time():
    """h200-straggler: rank 1 sleeps 50 ms (time.sleep: no op records it) before each forward; rank 0 waits in
    gloo. The path reaches the sleep through the wait, and names it as host time outside any op, not launching."""
    cp = _cp("fixtures/h200-straggler")
    assert (cp["host_other_ms"] > 40).all() and (cp["host_other_ms"] < 60).all()
    assert (cp["host_comm_ms"] > 0).all()  # gloo's own transfer time on the host, after the wait
