"""The command's fast paths keep its answers: discovery sniffs without importing the readers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, SAMPLES

from traceql import ingest
from traceql.discover import discover
from traceql.ingest import sniff
from traceql.rules.loader import default_rules_dir

READERS = ["traceql.ingest.kineto", "traceql.ingest.nccl_log", "traceql.ingest.nsys", "traceql.ingest.flight_recorder",
           "traceql.ingest.compile_trace", "traceql.ingest.compile_debug", "traceql.ingest.torch_logs"]


def test_sniffers_follow_the_reader_table():
    assert list(sniff.SNIFFERS) == list(ingest._MODULES)  # same kinds, same (most specific first) order
    for kind, name in ingest._MODULES.items():
        mod = ingest.module_for(kind)
        assert mod.KIND == kind and mod.sniff is sniff.SNIFFERS[kind][0], name
        assert getattr(mod, "FOLDER", False) == sniff.SNIFFERS[kind][1], name


@pytest.mark.parametrize("run", [SAMPLES / "demo", FIXTURES / "h200-duplicate-gpu"], ids=lambda p: p.name)
def test_discovery_imports_no_reader(run):
    code = ("import sys, json; from traceql.discover import discover; "
            f"s = discover({str(run)!r}); "
            f"print(json.dumps([sorted(m for m in {READERS!r} if m in sys.modules), sorted({{x.kind for x in s}})]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported, kinds = json.loads(out)
    assert imported == []
    assert kinds == sorted({s.kind for s in discover(run)})  # the same answer as in this (reader-laden) process
    assert {"kineto", "manifest"} <= set(kinds) or "nccl_log" in kinds  # and it told the formats apart


def _pack(tmp_path):
    d = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), d)
    return d
