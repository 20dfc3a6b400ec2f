"""Discovery: inputs by content, ranks from names, and a reason for every file that is not an input."""

from __future__ import annotations

import gzip
import shutil

import pytest

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


def test_read_head_reads_past_the_first_gzip_member(tmp_path):
    import gzip

    from traceql.discover import read_head

    # pigz --independent, `cat a.gz b.gz`, a writer that closes a member per flush: one stream of several members
    p = tmp_path / "multi.json.gz"
    p.write_bytes(gzip.compress(b'{"schemaVersion": 1, ') + gzip.compress(b'"traceEvents": []}'))
    assert read_head(p) == b'{"schemaVersion": 1, "traceEvents": []}'
    # a first member that ends one byte before a 64 KiB read: the next member's magic spans two reads
    n0 = 200_000
    delta = (65535 - len(gzip.compress(b"x" * n0, compresslevel=0)) % 65536) % 65536
    sizes = (gzip.compress(b"x" * (n0 + delta + d), compresslevel=0) for d in range(-16, 17))
    first = next(g for g in sizes if len(g) % 65536 == 65535)  # stored blocks: one more byte in, one more out
    p.write_bytes(first + gzip.compress(b"SECOND"))
    assert read_head(p, 1 << 20).endswith(b"SECOND")
    p.write_bytes(gzip.compress(b"abc") + b"\x00 trailing garbage")
    assert read_head(p) == b"abc"


@pytest.mark.parametrize("name, content, status", [
    ("rank3.pt.trace.json", b"hello, not a trace\n", "error"),
    ("trace.json.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00", "error"),  # a gzip header and nothing after it
    ("nccl_trace_rank_2", b"\x00\x01 not a pickle", "error"),
    ("config.json", b'{"lr": 0.1}', "skipped"),  # a neighbour of the inputs, not one
    ("metrics.txt", b"step 1 loss 2.3\n", "skipped"),
])
def test_a_file_named_like_a_trace_that_is_none_is_an_error(tmp_path, name, content, status):
    from traceql.discover import discover

    (tmp_path / name).write_bytes(content)
    (src,) = discover(tmp_path)
    assert src.status == status, src.detail
    if status == "error":
        assert "again" in src.detail  # what to do
