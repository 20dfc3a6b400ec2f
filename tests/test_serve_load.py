"""A bounded run of benchmarks/serve_load.py: concurrent uploads, a job killed mid-run, the service restarted
mid-queue. No job is lost, no report mixed up, the server's memory stays small."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")

from tests.conftest import REPO  # noqa: E402


def test_load_kill_and_restart(tmp_path):
    spec = importlib.util.spec_from_file_location("serve_load", REPO / "benchmarks" / "serve_load.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    out = load.run_load(n_jobs=6, workers=2, deadline_s=400, fixtures=["cpu-straggler", "cpu-desync", "compile-graph-break"],
                        work=tmp_path, log=lambda *_: None)
    assert out["problems"] == []
    assert out["done"] + out["failed"] == 6 and out["failed"] <= 1
    assert out["killed"] and (out["failed"] == 0 or "killed" in out["killed_reason"])
    assert out["requeued_at_restart"] >= 1  # the restart did interrupt running work, and it was resumed
    assert max(out["rss_max_mb"]) < 300  # the server holds no upload nor report in memory
