"""The command's fast paths keep its answers: discovery sniffs without importing the readers, and the compiled-rule
cache returns exactly the rules a checked load gives, missing whenever a rule file, its path or the loader changes."""

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
from traceql.rules import loader
from traceql.rules.loader import RuleError, default_rules_dir, load_rules

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


def test_cached_pack_equals_the_checked_load(tmp_path):
    d = _pack(tmp_path)
    first = load_rules([d])
    stored = list(loader._pack_dir().glob("*.pickle"))
    assert stored
    again = load_rules([d])
    assert again == first and [r.path for r in again] == [r.path for r in first]


def test_an_edited_rule_file_misses_the_cache(tmp_path):
    d = _pack(tmp_path)
    before = load_rules([d])
    p = sorted(d.glob("*.y*ml"))[0]
    text = p.read_text()
    assert "\nsummary:" in text
    p.write_text(text.replace("\nsummary:", "\nsummary: EDITED", 1))
    after = {r.path.name: r for r in load_rules([d])}
    assert after[p.name].summary.startswith("EDITED")
    assert after[p.name].summary != {r.path.name: r for r in before}[p.name].summary


def test_a_moved_pack_gets_its_own_paths(tmp_path):
    d = _pack(tmp_path)
    load_rules([d])
    moved = tmp_path / "elsewhere"
    shutil.copytree(d, moved)
    assert all(r.path.parent == moved for r in load_rules([moved]))


def test_a_damaged_entry_is_a_miss(tmp_path):
    d = _pack(tmp_path)
    first = load_rules([d])
    for p in loader._pack_dir().glob("*.pickle"):
        p.write_bytes(b"not a pickle")
    assert load_rules([d]) == first


def test_invalid_files_are_refused_every_time(tmp_path):
    d = _pack(tmp_path)
    load_rules([d])
    (d / "TQL998-broken.yaml").write_text("id: TQL998\nname: [unclosed\n")
    for _ in range(2):  # never stored, so never served
        with pytest.raises(RuleError, match="TQL998-broken.yaml"):
            load_rules([d])
