"""The Flight Recorder unpickler refuses pickles that would allocate without bound, before it builds anything, with a
one-line error; real dumps load exactly as the standard unpickler loads them."""

from __future__ import annotations

import pickle
import resource
import struct
from pathlib import Path

import pytest

from traceql.ingest import IngestError
from traceql.ingest import flight_recorder as fr

REPO = Path(__file__).resolve().parents[1]
REAL_DUMPS = sorted(p for p in REPO.glob("fixtures/*/nccl_trace_rank_*") if p.read_bytes()[:1] == b"\x80")
HEAD = b"\x80\x04\x8c\x07entries\x8c\x07version0"  # makes discovery call it a Flight Recorder dump


def _write(tmp_path: Path, body: bytes) -> Path:
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(body)
    return p


def _refused(tmp_path: Path, body: bytes, why: str) -> str:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(IngestError) as e:
        fr.load_dump(_write(tmp_path, body))
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg and why in msg, msg
    # nothing big was built: peak memory grew by far less than what the pickle asked for (hundreds of MB to GBs)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10
    return msg


def test_real_dumps_are_there():
    assert len(REAL_DUMPS) >= 10 and any("h200x2-desync" in str(p) for p in REAL_DUMPS)


@pytest.mark.parametrize("path", REAL_DUMPS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_dumps_load_identically(path):
    assert fr.load_dump(path) == pickle.loads(path.read_bytes())  # noqa: S301 - our own recorded fixtures


def test_huge_memo_index(tmp_path):
    # 33 bytes; LONG_BINPUT 2^28 made the C unpickler allocate a 2 GB memo
    _refused(tmp_path, HEAD + b"}r" + struct.pack("<I", 1 << 28) + b".", "memo index 268435456")


def test_get_before_put(tmp_path):
    _refused(tmp_path, HEAD + b"j" + struct.pack("<I", 7) + b".", "read before it was defined")


@pytest.mark.parametrize("op,width", [(b"\x8d", "<Q"), (b"\x8e", "<Q"), (b"\x96", "<Q"), (b"X", "<I"), (b"B", "<I")])
def test_huge_string_and_bytes_lengths(tmp_path, op, width):
    _refused(tmp_path, HEAD + op + struct.pack(width, (1 << 32) - 1 if width == "<I" else 1 << 40) + b"abc.", "bytes")


def test_string_over_the_cap_even_when_present(tmp_path, monkeypatch):
    monkeypatch.setattr(fr, "MAX_STR_BYTES", 1000)
    _refused(tmp_path, HEAD + b"X" + struct.pack("<I", 2000) + b"a" * 2000 + b".", "limit 1000")


def test_huge_long(tmp_path):
    _refused(tmp_path, HEAD + b"\x8b" + struct.pack("<i", 1 << 20) + b"\x01" * (1 << 20) + b".", "limit 1024")


def test_huge_frame(tmp_path):
    _refused(tmp_path, b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"\x8c\x07entries}.", "a frame of")


def test_deep_nesting(tmp_path):
    _refused(tmp_path, HEAD + b"]" * 201 + b"a" * 200 + b".", "nested deeper than 100")


def test_deep_nesting_through_the_memo(tmp_path):
    # the stack stays two deep: each level is fetched from the memo and wrapped in a new list
    body = HEAD + b"]q\x00"
    for i in range(150):
        body += b"]h" + bytes([i % 256 if i < 256 else 0]) + b"a" + b"q" + bytes([i + 1])
    _refused(tmp_path, body + b".", "nested deeper than 100")


def test_repeated_references_count_towards_the_allocation_cap(tmp_path, monkeypatch):
    # DUP and GET make one value appear many times: each appearance is a slot that costs memory
    monkeypatch.setattr(fr, "MAX_ALLOC_BYTES", 1 << 20)
    body = HEAD + b"\x8c\x04spam" + b"q\x00" + b"](" + b"h\x00" * 200_000 + b"e."
    with pytest.raises(IngestError, match="more than 1 MB of values"):
        fr._prescan(body, tmp_path / "x", fr.MAX_ALLOC_BYTES)


@pytest.mark.parametrize("body,name", [
    (b"\x80\x02cos\nsystem\n\x8c\x02id\x85R.", "GLOBAL"),
    (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "STACK_GLOBAL"),
    (b"\x80\x04\x8c\x01x\x85Q.", "BINPERSID"),
])
def test_code_loading_opcodes(tmp_path, body, name):
    _refused(tmp_path, body, name)


def test_cut_short(tmp_path):
    data = REAL_DUMPS[0].read_bytes()
    _refused(tmp_path, data[: len(data) // 2], "cut short")


def test_check_keeps_the_other_sources(tmp_path):
    """A hostile dump beside a real one: the hostile one is an error source naming its file, the real one is read."""
    from traceql import pipeline

    good = next(p for p in REAL_DUMPS if p.parent.name == "nccl-fr-ok")
    (tmp_path / "nccl_trace_rank_1").write_bytes(good.read_bytes())
    _write(tmp_path, HEAD + b"}r" + struct.pack("<I", 1 << 28) + b".")
    run = pipeline.load_run(tmp_path, use_cache=False)
    by_name = {s.path.name: s for s in run.sources}
    assert by_name["nccl_trace_rank_0"].status == "error" and "memo index" in by_name["nccl_trace_rank_0"].detail
    assert by_name["nccl_trace_rank_1"].status == "ok"
    assert run.table("collectives").height > 0
