"""A step's length for GPU measures is the longer of its host range and its GPU work's span: on two H200s the GPU
runs behind the host, so TQL101 must not weigh 13 ms of exposed communication against a 4.7 ms host range."""

from __future__ import annotations

import polars as pl

from conftest import FIXTURES
from traceql import link
from traceql.pipeline import check, load_run


def test_step_times_take_the_longer_of_host_and_gpu():
    run = load_run(FIXTURES / "h200x2-exposed-allreduce", use_cache=False)
    st = link.ensure(run, "step_times")
    assert st.height >= 4 and st["gpu_span_ms"].null_count() == 0
    assert st.select((pl.col("step_ms") == pl.max_horizontal("host_ms", "gpu_span_ms")).all()).item()
    assert (st["gpu_span_ms"] > st["host_ms"]).any()  # the GPU really lags the host somewhere


def test_exposed_communication_is_weighed_against_the_gpu_step():
    res = check(FIXTURES / "h200x2-exposed-allreduce")
    found = [f for f in res.findings if f.rule == "TQL101"]
    assert {r for f in found for r in f.ranks} == {0, 1}
    for f in found:
        assert f.evidence["exposed_ms"] <= f.evidence["step_ms"] + 1e-6, f.message


def test_cpu_runs_keep_their_host_step():
    run = load_run(FIXTURES / "cpu-straggler", use_cache=False)
    st = link.ensure(run, "step_times")
    assert st.height and st["gpu_span_ms"].null_count() == st.height
    assert (st["step_ms"] == st["host_ms"]).all()
