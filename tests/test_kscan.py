"""The compiled Kineto chunk scanner (traceql/ingest/_kscan.c) against the pure-Python path it speeds up.

The scanner either gives exactly the tables msgspec's path gives for a chunk, or declines the chunk (returns None)
so that path takes it. These tests hold it to that on every real trace (corpus and fixtures), on generated events
with every odd value a trace can hold, and on damaged bytes, where it must neither crash nor accept what the
general path would read differently.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from conftest import CORPUS, DAMAGED, FIXTURES, SAMPLES
from traceql.discover import discover
from traceql.ingest import kineto
from traceql.model import Source

# setup.py builds the extension wherever a C compiler is (the README's install does): its absence here is a failed
# build, not a reason to skip.
from traceql.ingest import _kscan  # noqa: E402

HTA = CORPUS / "hta"


def _traces(root: Path) -> list[Path]:
    """The Kineto traces under root, as discovery finds them (by content)."""
    if not root.is_dir():
        return []
    return sorted(Path(s.path) for s in discover(root) if s.kind == "kineto" and Path(s.path) not in DAMAGED)


REAL = _traces(FIXTURES) + _traces(SAMPLES)
CORPUS_TRACES = _traces(HTA)


def _read_both(path: Path, monkeypatch) -> tuple:
    out = []
    for use in (True, False):
        monkeypatch.setattr(kineto, "_USE_KSCAN", use)
        src = Source(Path(path), "kineto")
        try:
            tables = kineto.read(Path(path), src)
        except Exception as e:  # the same error either way is also agreement
            tables = f"{type(e).__name__}: {e}"
        out.append((src, tables))
    return out


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, str):
        assert a == b
        return
    assert sorted(a) == sorted(b)
    for name in a:
        key = [c for c in ("id", "step", "kind", "flow_id", "src_ts", "dst_ts") if c in a[name].columns]
        assert_frame_equal(a[name].sort(key, nulls_last=True), b[name].sort(key, nulls_last=True), check_exact=True)


def _check_file(path: Path, monkeypatch) -> Source:
    (sa, ta), (sb, tb) = _read_both(path, monkeypatch)
    _same(ta, tb)
    assert (sa.status, sa.detail, sa.rank) == (sb.status, sb.detail, sb.rank)
    assert sa.meta == sb.meta
    return sa


@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_scanner_gives_the_msgspec_tables_on_recorded_traces(path, monkeypatch):
    src = _check_file(path, monkeypatch)
    assert src.meta.get("parser") == "chunks"


@pytest.mark.parametrize("rel", [str(p.relative_to(HTA)) for p in CORPUS_TRACES] or ["<corpus absent>"])
def test_scanner_gives_the_msgspec_tables_on_the_corpus(rel, corpus, monkeypatch):
    _check_file(HTA / rel, monkeypatch)


def test_scanner_takes_the_chunks_of_real_traces(monkeypatch):
    """Not a silent decline everywhere: every chunk of the recorded traces goes through the scanner."""
    calls = {"took": 0, "declined": 0}
    real = _kscan.Scanner

    class Spy:
        nest = staticmethod(_kscan.nest)
        arrow = staticmethod(_kscan.arrow)

        class Scanner:
            def __init__(self, *a):
                self.real = real(*a)
                self.take = self.real.take

            def feed(self, *a):
                got = self.real.feed(*a)
                calls["took" if got is not None else "declined"] += 1
                return got

            @property
            def pending(self):
                return self.real.pending

    monkeypatch.setattr(kineto, "_kscan", Spy)
    monkeypatch.setattr(kineto, "_USE_KSCAN", True)
    for path in REAL:
        kineto.read(path, Source(path, "kineto"))
    assert calls["took"] >= len(REAL) and calls["declined"] == 0


# ---- generated events ---------------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_odd = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    _text, st.sampled_from(["7", "-3", "007", "--1", "0x1f", "Spans", "", "stream 7", "1.5"]),
    st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(_text, st.integers(), max_size=2),
)
_num = st.one_of(st.integers(0, 2**53), st.floats(0, 2e15, allow_nan=False), st.integers(-(2**65), 2**65), _odd)
_args = st.dictionaries(
    st.sampled_from(["device", "stream", "correlation", "External id", "external id", "bytes", "cuda_sync_kind",
                     "wait_on_cuda_event_id", "event", "Collective name", "Process Group Name", "Process Group Ranks",
                     "Group size", "In msg nelems", "dtype", "Seq", "seq", "Input Dims", "Ev Idx"]),
    st.one_of(st.integers(-(2**63), 2**63 - 1), _odd), max_size=6,
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.one_of(st.sampled_from(["X", "X", "X", "s", "f", "t", "i", "I", "M", "C"]), _odd),
        "cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "Kernel", "gpu_memcpy", "cuda_sync",
                                          "user_annotation", "gpu_user_annotation", "ac2g", "python_function"]), _odd),
        "name": st.one_of(st.sampled_from(["aten::mm", "record_param_comms", "nccl:all_reduce", "gloo:broadcast",
                                           "cudaLaunchKernel", "ProfilerStep#3", "ncclDevKernel_AllReduce_Sum_f32",
                                           "Memcpy DtoH (Device -> Pageable)", "na\u00efve \u2713 \"q\" \\ /"]), _odd),
        "pid": st.one_of(st.integers(0, 2**31), _odd),
        "tid": st.one_of(st.integers(0, 2**31), _odd),
        "ts": _num, "dur": _num, "id": st.one_of(st.integers(0, 10**6), _odd),
        "args": st.one_of(_args, st.none()),
        "extra": _odd,
    },
)


# What profilers write: the scanner must take every such chunk itself, not decline it.
_i64 = st.integers(-(2**63), 2**63 - 1)
_plain_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "s", "f", "i"]), "ts": st.one_of(st.integers(0, 2**60), st.floats(-1e16, 1e16))},
    optional={
        "cat": st.one_of(st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "cuda_sync", "ac2g",
                                          "gpu_user_annotation"]), _text, st.none()),
        "name": st.one_of(st.sampled_from(["aten::mm", "record_param_comms", "nccl:all_reduce", "cudaLaunchKernel",
                                           "ProfilerStep#3", "ncclDevKernel_AllReduce_Sum_f32"]), _text),
        "pid": st.one_of(_i64, st.sampled_from(["Spans", "Traces", "12", "-4", "0", "stream 7", ""])),
        "tid": st.one_of(_i64, st.sampled_from(["PyTorch Profiler", "3", "-1"])),
        "dur": st.one_of(st.integers(0, 10**9), st.floats(0, 1e9), st.none()),
        "id": st.one_of(_i64, st.none()),
        "args": st.one_of(st.none(), st.dictionaries(
            st.sampled_from(["device", "stream", "correlation", "External id", "external id", "bytes",
                             "wait_on_cuda_event_id", "event"]), st.one_of(_i64, st.none()), max_size=4)
            | st.fixed_dictionaries({"cuda_sync_kind": st.sampled_from(["Stream Synchronize", "Event Sync"]),
                                     "Collective name": _text, "Process Group Ranks": st.lists(_i64, max_size=3),
                                     "Input Dims": st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2)})),
        "extra": st.one_of(_text, st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**80), 2**80)),
    },
)


def _scanner() -> _kscan.Scanner:
    return _kscan.Scanner(kineto._classify, kineto._SCAN_BUCKETS)


def _scan(buf: bytearray):
    """One JSON array through a fresh scanner: (n, strings, buckets, colls), or None where it declines."""
    sc = _scanner()
    n = sc.feed(buf, len(buf))
    return None if n is None else (n, *sc.take())


def _tables(acc: kineto._Acc) -> dict:
    return {b: acc.frame(b) for b in kineto._BUCKET_COLS}


def _both(buf: bytes) -> tuple:
    """The scanner's and msgspec's reading of one chunk: (accumulator or the exception, scanned?)."""
    out = []
    orig = kineto._USE_KSCAN
    try:
        for use in (True, False):
            kineto._USE_KSCAN = use
            acc = kineto._Acc()
            try:
                got = kineto._decode_chunk(bytearray(buf), len(buf), acc, 0)
                acc.flush()
                # None: the bytes are not JSON this reader takes (the region salvage then cuts them smaller), as an
                # exception said before salvage existed; a refusal is compared as such, not as an empty reading
                out.append(acc if got is not None else "refused")
            except Exception as e:
                out.append(type(e).__name__)
    finally:
        kineto._USE_KSCAN = orig
    return out[0], out[1], _scan(bytearray(buf)) is not None


def _agree(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    ta, tb = _tables(a), _tables(b)
    for k in ta:
        if ta[k] is None or tb[k] is None:
            assert ta[k] is None and tb[k] is None, k
        else:
            assert_frame_equal(ta[k], tb[k], check_exact=True)
    assert (a.coll_args, a.skipped, a.n_events, a.n_instant, a.mtia, a.ids.strings) == (
        b.coll_args, b.skipped, b.n_events, b.n_instant, b.mtia, b.ids.strings)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_plain_event, max_size=12), st.sampled_from([None, 2]), st.booleans())
def test_plain_events_are_scanned_and_read_the_same(events, indent, ascii_only):
    raw = json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode()
    scanned, general, took = _both(raw)
    assert took
    _agree(scanned, general)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, max_size=12), st.sampled_from([None, 1, 2]), st.booleans())
def test_generated_events_read_the_same_either_way(events, indent, ascii_only):
    raw = json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode()
    scanned, general, took = _both(raw)
    _agree(scanned, general)


def test_odd_values_are_declined_not_misread():
    """Values the scanner does not read itself go to msgspec's path: the chunk is declined."""
    for odd in ['{"ph": "X", "ts": "12.5"}', '{"ph": "X", "pid": 1.5}', '{"ph": 1}', '{"ph": "X", "ts": 1e400}',
                '{"ph": "X", "args": {"device": "0"}}', '{"ph": "X", "args": {"stream": true}}',
                '{"ph": "X", "id": "0x1f"}', '{"ph": "X", "pid": "007"}', '{"ph": "X", "ts": 99999999999999999999}',
                '{"p\\u0068": "X"}', '{"ph": "X", "name": "\\ud800"}', '{"ph": "X", "args": []}',
                '{"ph": "X", "name": "a\x01b"}', '[1]', '{"ph": "X"} x', '{"ph": "X", "ts": 01, "dur": 1}',
                '{"ph": "X", "args": {"device": 00, "stream": 1}}']:
        buf = bytearray(("[" + odd + "]").encode())
        assert _scan(buf) is None, odd


def test_integers_of_every_length_read_as_msgspec_reads_them():
    """Integers of 1 to 20 digits (the scanner reads those of up to 16 by whole words), signed, as fractions and
    with exponents, in the top-level and the args fields, and as the last bytes of the slice: msgspec's values."""
    vals = [0, 7, 10**7 - 1, 10**7, 10**8 - 1, 10**8, 10**15, 10**16 - 1, 10**16, 9223372036854774, 9223372036854775,
            10**17, 2**63 - 1, -5, -(10**16)]
    events = [{"ph": "X", "ts": v, "dur": v, "pid": v, "tid": v, "id": v, "args": {"External id": v, "device": v}}
              for v in vals]
    for raw in (json.dumps(events).encode(), json.dumps(events, indent=1).encode(),
                b'[{"ph": "X", "ts": 1.5e3, "dur": 12E1, "args": {"stream": 1234567890123456, "correlation": 0}}]',
                b'[{"ph": "X", "dur": 1, "ts": 1669783687471392}]', b'[{"ph": "X", "ts": 12345678}]',
                # ints beyond 2**53 beside floats in the same column: each int exactly, not as the float column holds it
                b'[{"ph": "X", "ts": 9007199254740993, "dur": 0.5}, {"ph": "X", "ts": 1.5, "dur": 9210000000000001}]',
                b'[{"ph": "X", "ts": -9007199254740993}, {"ph": "X", "ts": 2.25}, {"ph": "X", "ts": 9300000000000000}]'):
        scanned, general, took = _both(raw)
        assert took, raw
        _agree(scanned, general)


def test_values_the_scanner_reads_itself():
    buf = bytearray(json.dumps([
        {"ph": "X", "cat": "kernel", "name": "k\u00e9", "pid": "Spans", "tid": "-7", "ts": 1.0005, "dur": 3,
         "args": {"External id": None, "external id": 5, "Collective name": "allreduce"}},
        {"ph": "X", "ts": 1669783687471392, "extra": [[1, {"a": [2.5e-3, None]}]]},
        {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "ts": 2, "args": {"event": 9}},
    ]).encode())
    n, strings, buckets, colls = _scan(buf)
    assert n == 3
    assert strings == ["X", "kernel", "k\u00e9", "Spans", "cuda_sync", "Event Sync"]
    assert {b: m for b, (m, _) in buckets.items() if m} == {"k": 1, "h": 1, "s": 1}
    k, h, sy = buckets["k"][1], buckets["h"][1], buckets["s"][1]
    assert sorted(k) == sorted(dict(kineto._SCAN_BUCKETS)["k"])  # each table gets its own fields, no others
    i64 = lambda col, row=0: int.from_bytes(memoryview(col[0])[8 * row : 8 * row + 8], "little", signed=True)
    u32 = lambda col, row=0: int.from_bytes(memoryview(col[0])[4 * row : 4 * row + 4], "little")
    assert strings[u32(k["name"])] == "k\u00e9" and strings[u32(k["pid_s"])] == "Spans" and k["pid"][2] == 1
    assert i64(k["tid"]) == -7 and i64(k["ts"]) == 1000 + 0 and i64(k["dur"]) == 3000 and i64(k["id"]) == 0
    assert i64(k["external_id"]) == 5
    assert i64(h["ts"]) == 1669783687471392000 and i64(h["dur"]) == 0 and i64(h["id"]) == 1
    assert i64(sy["event"]) == 9 and i64(sy["id"]) == 2
    assert [(i, json.loads(raw)["Collective name"]) for i, raw in colls] == [(0, "allreduce")]
    with pytest.raises(TypeError):  # handed out read-only: a table over it cannot be changed under polars
        memoryview(k["ts"][0])[0] = 1


def test_a_declined_slice_leaves_nothing_behind():
    """feed() either takes a whole slice or none of it: rows read before the bad event are rolled back."""
    sc = _scanner()
    good = bytearray(b'[{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "args": {"Collective name": "x"}}]')
    assert sc.feed(good, len(good), 0, False, 0) == 1
    bad = bytearray(b'[{"ph": "X", "cat": "kernel", "name": "b", "ts": 2, "args": {"Seq": 1}}, {"ph": 1}]')
    assert sc.feed(bad, len(bad), 0, False, 1) is None
    assert sc.pending == 1
    strings, buckets, colls = sc.take()
    assert buckets["k"][0] == 1 and [i for i, _ in colls] == [0]
    assert sc.pending == 0 and sc.take()[1]["k"][0] == 0


def test_classify_errors_surface():
    """A classify that fails is a bug to see, not a slice to decline."""
    def boom(ph, cat):
        raise RuntimeError("boom")

    sc = _kscan.Scanner(boom, kineto._SCAN_BUCKETS)
    buf = bytearray(b'[{"ph": "X"}]')
    with pytest.raises(RuntimeError, match="boom"):
        sc.feed(buf, len(buf))
    sc = _kscan.Scanner(lambda ph, cat: 99, kineto._SCAN_BUCKETS)
    with pytest.raises(ValueError, match="not a bucket"):
        sc.feed(buf, len(buf))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_bytes_never_crash_and_never_disagree(data):
    base = json.dumps([
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10.5, "dur": 2,
         "args": {"External id": 3, "Input Dims": [[8, 512], []], "Collective name": "broadcast"}},
        {"ph": "s", "cat": "ac2g", "id": 7, "pid": 1, "tid": 2, "ts": 11},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 12.25, "dur": 1.5,
         "args": {"device": 0, "stream": 7, "correlation": 9}},
    ], indent=2).encode()
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["set", "cut", "dup"]))
        i = data.draw(st.integers(0, len(buf) - 1))
        if op == "set":
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[i : i + data.draw(st.integers(1, 8))]
        else:
            buf[i:i] = buf[i : i + data.draw(st.integers(1, 8))]
        if not buf:
            return
    scanned, general, took = _both(bytes(buf))
    if took and not isinstance(general, str):
        _agree(scanned, general)


def test_nest_matches_the_python_sweep():
    rng = __import__("random").Random(7)
    rows = []
    for tid in range(3):
        t = 0
        for _ in range(400):
            t += rng.choice([0, 0, 1, 5])
            rows.append({"pid": 1, "tid": tid, "ts": t if rng.random() > 0.02 else None,
                         "end": t + rng.choice([0, 1, 3, 20, 100])})
    df = pl.DataFrame(rows).with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    got = kineto._nest(df)
    orig = kineto._USE_KSCAN
    try:
        kineto._USE_KSCAN = False
        want = kineto._nest(df)
    finally:
        kineto._USE_KSCAN = orig
    assert got[0].to_list() == want[0].to_list() and got[1].to_list() == want[1].to_list()
    assert got[1].max() >= 3  # really nested


def _plain_copy() -> bytes:
    import gzip

    return gzip.decompress((SAMPLES / "demo" / "rank0.pt.trace.json.gz").read_bytes())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(0.0, 1.0), st.sampled_from([2 << 10, 64 << 10, 8 << 20]))
def test_truncated_plain_files_read_the_same_mapped_or_not(tmp_path, monkeypatch, frac, block):
    """Plain files are scanned in place (memory-mapped); a cut anywhere, and any chunk size, gives what the
    msgspec path gives: the same complete events, status and note."""
    data = _plain_copy()
    p = tmp_path / f"cut-{frac}-{block}.json"
    p.write_bytes(data[: max(1, int(len(data) * frac))])
    monkeypatch.setattr(kineto, "_BLOCK", block)
    (sa, ta), (sb, tb) = _read_both(p, monkeypatch)
    _same(ta, tb)
    assert (sa.status, sa.detail) == (sb.status, sb.detail)
    assert sa.meta == sb.meta


def test_mapped_and_copying_readers_cut_the_same_chunks(tmp_path, monkeypatch):
    """The memory-mapped reader (plain files) and the block reader (gzip) hand the scanner different slices of
    the same array: both give the same tables, chunk boundaries and collective args included."""
    import gzip

    data = _plain_copy()
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data, 1))
    monkeypatch.setattr(kineto, "_BLOCK", 16 << 10)
    assert len(data) > 8 * kineto._BLOCK  # many slices
    a, b = Source(plain, "kineto"), Source(packed, "kineto")
    ta, tb = kineto.read(plain, a), kineto.read(packed, b)
    _same(ta, tb)
    assert a.meta == b.meta and a.status == b.status == "ok"
    assert ta["collectives"].height > 0


def test_a_file_that_cannot_be_mapped_is_read_block_by_block(tmp_path, monkeypatch):
    import mmap as mmap_module

    data = _plain_copy()
    p = tmp_path / "plain.json"
    p.write_bytes(data)
    want = kineto.read(p, Source(p, "kineto"))

    def refuse(*a, **k):
        raise OSError("mmap not supported on this file system")

    monkeypatch.setattr(mmap_module, "mmap", refuse)
    src = Source(p, "kineto")
    got = kineto.read(p, src)
    assert src.status == "ok" and src.meta["parser"] == "chunks"
    _same(got, want)


def test_a_collective_call_whose_args_hold_bytes_that_are_no_utf8(tmp_path):
    """The scanner does not decode values it skips, so a collective call's args can reach Python with bytes that are
    no UTF-8 (a damaged trace): they are read with replacement characters, not as an internal error."""
    ev = ('"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1, "dur": 5, '
          '"args": {"Collective name": "allreduce", "Process Group Name": "0", "note": "\xff\xfe"}')
    other = '"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5'
    # Kineto's layout: one field group per event, the braces on their own lines
    body = b'{"traceEvents": [\n  {\n    ' + ev.encode("latin-1") + b'\n  },\n  {\n    ' + other.encode() + b'\n  }\n]}'
    p = tmp_path / "bad_utf8.json"
    p.write_bytes(body)
    src = Source(p, "kineto")
    tables = kineto.read(p, src)
    assert src.meta["parser"] == "chunks" and tables["host_ops"].height == 2
    assert tables["collectives"]["op"].to_list() == ["all_reduce"]
    assert tables["collectives"]["pg_name"].to_list() == ["0"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.sampled_from(["X", "s", "f", "t", "i", "I", "B", "E", "M", "C", "x", ""]), _text),
       st.one_of(st.none(), st.sampled_from(["kernel", "Kernel", "GPU_MEMCPY", "cuda_runtime", "cuda_sync",
                                             "gpu_user_annotation", "cpu_op", "", "KERNEL "]), _text))
def test_classify_routes_as_the_polars_expression(ph, cat):
    """The scanner's per-(ph, cat) routing, looked up in Python for ASCII categories, gives the bucket
    _bucket_expr gives (which msgspec's path routes by)."""
    want = pl.select(kineto._bucket_expr(pl.lit(ph, dtype=pl.String), pl.lit(cat, dtype=pl.String))).item() or ""
    assert kineto._SCAN_BUCKETS[kineto._classify.__wrapped__(ph, cat)][0] == want


def test_decoded_strings_are_views_into_one_dictionary_chunk():
    # a string column gathered from a dictionary of two chunks copies every row's bytes (polars' slow path); from one
    # chunk the rows are views into its buffers: the scanner's names decode through one chunk
    codes = kineto._Codes(["ncclKernel_AllReduce_RING_LL_Sum_float_with_a_long_name", "b"])
    assert pl.select(codes.strs).to_series().n_chunks() == 1
    out = pl.DataFrame({"c": pl.Series([1, 0, None, 0], dtype=pl.UInt32)}).select(codes(pl.col("c"))).to_series()
    assert out.to_list() == ["b", "ncclKernel_AllReduce_RING_LL_Sum_float_with_a_long_name", None,
                             "ncclKernel_AllReduce_RING_LL_Sum_float_with_a_long_name"]


@pytest.mark.parametrize("path", REAL[:4], ids=lambda p: str(p.relative_to(p.parents[1])))
def test_many_flushes_give_the_tables_of_one(path, tmp_path, monkeypatch):
    # a trace of more than _FLUSH_ROWS events is built in parts, one per flush, joined at the end (_frame_of): the
    # same tables, in the same row order, as one flush (a plain copy: the mapped reader cuts slices of _BLOCK // 16)
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_bytes(gzip.decompress(Path(path).read_bytes()) if path.name.endswith(".gz") else Path(path).read_bytes())
    one = kineto.read(plain, Source(plain, "kineto"))
    monkeypatch.setattr(kineto, "_FLUSH_ROWS", 97)
    monkeypatch.setattr(kineto, "_BLOCK", 64 << 10)  # slices of 4 KB: a flush is due at the end of a slice
    flushes = []
    real_flush = kineto._Acc.flush
    monkeypatch.setattr(kineto._Acc, "flush", lambda self: (flushes.append(1), real_flush(self))[1])
    many = kineto.read(plain, Source(plain, "kineto"))
    assert len(flushes) > 5
    assert sorted(one) == sorted(many)
    for name in one:
        a = one[name].read() if hasattr(one[name], "read") else one[name]
        b = many[name].read() if hasattr(many[name], "read") else many[name]
        assert_frame_equal(a, b, check_exact=True)


def test_torch_cpu_traces_are_cut_into_slices(tmp_path, monkeypatch):
    # torch's CPU-only traces open traceEvents with a blank line ("[\n    \n  {") that no later event repeats: the
    # separator is the indent alone, so the mapped reader cuts slices (before, the whole file was one slice, and a
    # gzipped one was inflated whole into memory first)
    src = FIXTURES / "cpu-ddp-eager" / "rank0.pt.trace.json.gz"
    raw = gzip.decompress(src.read_bytes())
    m = kineto._ARR_HEAD.search(raw)
    assert m.group(1) == b"\n    \n  "
    sep, _ = kineto._layout(m.group(1), raw[m.end(): m.end() + (1 << 20)])
    assert sep == b"\n  },\n  {" and raw.count(sep) > 1000
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_bytes(raw)
    monkeypatch.setattr(kineto, "_BLOCK", 64 << 10)
    feeds = []
    real_feed = kineto._Acc.feed
    monkeypatch.setattr(kineto._Acc, "feed", lambda self, *a: (feeds.append(1), real_feed(self, *a))[1])
    tables = kineto.read(plain, Source(plain, "kineto"))
    assert len(feeds) > 50 and tables["host_ops"].height > 1000
