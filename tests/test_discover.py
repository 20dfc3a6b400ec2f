"""Discovery: inputs by content, ranks from names, and a reason for every file that is not an input."""

from __future__ import annotations

import gzip
import shutil

from conftest import FIXTURES, SAMPLES

from traceql.discover import discover, rank_from_name


def test_kinds_by_content_not_extension(tmp_path):
    shutil.copy(SAMPLES / "demo" / "rank0.pt.trace.json.gz", tmp_path / "trace.bin")  # a Kineto trace, odd name
    shutil.copy(FIXTURES / "h200-host-sync-per-step-nsys" / "rank0.nsys.sqlite", tmp_path / "export.db")
    shutil.copy(FIXTURES / "h200-duplicate-gpu" / "rank0.stderr.log", tmp_path / "rank0.txt")
    kinds = {s.path.name: s.kind for s in discover(tmp_path)}
    assert kinds == {"trace.bin": "kineto", "export.db": "nsys", "rank0.txt": "nccl_log"}


def test_rank_from_file_and_folder_names(tmp_path):
    for name, rank in [("rank-3.json", 3), ("rank_12.pt.trace.json", 12), ("trace_rank7.json.gz", 7),
                       ("dedicated_log_torch_trace_rank_5_ab12.log", 5), ("trace.json", None)]:
        assert rank_from_name(tmp_path / name) == rank, name
    assert rank_from_name(tmp_path / "rank4" / "trace.json") == 4
    assert rank_from_name(tmp_path / "frank2.json") is None  # a word containing "rank" is not a rank


def test_every_non_input_says_why(tmp_path):
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "broken.json.gz").write_bytes(b"\x1f\x8b" + b"not deflate at all")
    with gzip.open(tmp_path / "model_et.json.gz", "wb") as f:
        f.write(b'{\n  "schema": "1.0.1", "pid": 1, "nodes": [\n    {"name": "[pytorch|profiler|execution_trace|thread]"}]}')
    (tmp_path / "memory_timeline.raw").write_text("[[-1, 1, 512, 7], [-1, 1, 512, 7]]")
    (tmp_path / "notes.md").write_text("# not a trace")
    details = {s.path.name: (s.status, s.detail) for s in discover(tmp_path)}
    assert details["empty.json"] == ("skipped", "empty file (0 bytes)")
    assert "does not decompress" in details["broken.json.gz"][1]
    assert "execution trace" in details["model_et.json.gz"][1] and "Kineto" in details["model_et.json.gz"][1]
    assert "memory timeline" in details["memory_timeline.raw"][1]
    assert details["notes.md"][0] == "skipped" and "not a recognised input" in details["notes.md"][1]
