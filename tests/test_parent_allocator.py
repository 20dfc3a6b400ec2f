"""The checking process keeps freed pages longer (traceql/pipeline.py); its ingest workers keep polars' default.

jemalloc reads _RJEM_MALLOC_CONF once, as polars loads: the parent sets it only for that moment, so the workers it
starts (whose memory budgets count the growth of a read) inherit nothing new, and a value the user set wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, os, sys
first = sys.argv[1] == "polars-first"
if first:
    import polars
before = os.environ.get("_RJEM_MALLOC_CONF")
import traceql.pipeline
print(json.dumps({"before": before, "after": os.environ.get("_RJEM_MALLOC_CONF"), "polars": "polars" in sys.modules}))
"""


def _probe(mode: str, env_value: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if env_value is not None:
        env["_RJEM_MALLOC_CONF"] = env_value
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, cwd=REPO,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pipeline_leaves_no_allocator_setting_for_the_workers():
    got = _probe("pipeline-first")
    assert got["polars"]
    assert got["before"] is None
    # polars itself writes its default into the environment as it loads; the pipeline takes the variable out again,
    # so a worker started now gets polars' default from its own import, as before
    assert got["after"] is None


def test_a_users_allocator_setting_is_kept():
    got = _probe("pipeline-first", "narenas:2")
    assert got["after"] is not None and got["after"].endswith("narenas:2")
    assert "dirty_decay_ms:60000" not in got["after"]


def test_nothing_changes_where_polars_was_loaded_first():
    # a notebook that imported polars before traceql: the allocator is configured already, and the environment
    # (polars' own value) stays as polars left it
    got = _probe("polars-first")
    assert got["before"] is not None and "dirty_decay_ms:60000" not in got["before"]
    assert got["after"] == got["before"]
