"""Gzip sources read in-process under the inflate cap (ingest/_gz.py, budget.in_process_allowance): a moderate one
is read here without a worker; one that inflates past the cap (a forged trailer, a bomb, many members) stops at the
cap and a budget worker reads it; damaged streams read the same either way."""

from __future__ import annotations

import gzip
import io
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest

from traceql.discover import discover
from traceql.ingest import _gz, budget
from traceql.ingest.loader import ingest

REPO = Path(__file__).resolve().parents[1]
DEMO_TRACE = REPO / "samples" / "demo" / "rank0.pt.trace.json.gz"
MB = 1 << 20


@pytest.fixture
def fresh_pool(monkeypatch):
    """A pool of its own, so that `spawned` counts this test's workers; auto isolation, no budget set by hand."""
    monkeypatch.delenv("TRACEQL_SOURCE_ISOLATION", raising=False)
    monkeypatch.delenv("TRACEQL_SOURCE_MAX_MB", raising=False)
    pool = budget.Pool()
    monkeypatch.setattr(budget, "_POOL", pool)
    yield pool
    pool.close()


@pytest.fixture
def inflated_here(monkeypatch):
    """Bytes the readers inflated in this process (not in a worker), by every gzip stream opened here."""
    seen = []
    real = _gz._inflate_pieces

    def counting(f, notes, block, allowance, progress):
        for piece in real(f, notes, block, allowance, progress):
            seen.append(len(piece))
            yield piece

    monkeypatch.setattr(_gz, "_inflate_pieces", counting)
    return seen


def _doc() -> dict:
    return orjson.loads(gzip.decompress(DEMO_TRACE.read_bytes()))


def _write(path: Path, data: bytes, level: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, compresslevel=level))
    return path


def _widened_json(times: int) -> bytes:
    doc = _doc()
    doc["traceEvents"] = doc["traceEvents"] * times
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


def _forge_isize(path: Path, isize: int) -> None:
    """Overwrite the gzip trailer's ISIZE (the last member's inflated size mod 4 GiB, which nothing checks until the
    stream's end): the file claims to be small."""
    data = bytearray(path.read_bytes())
    data[-4:] = (isize % (1 << 32)).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def _tables(run) -> dict[str, pl.DataFrame]:
    out = {}
    for name, df in run.tables.items():
        keys = [c for c, t in df.schema.items() if not isinstance(t, (pl.List, pl.Struct, pl.Array))]
        out[name] = df.drop("source").sort([k for k in keys if k != "source"], nulls_last=True)
    return out


def _same(a, b) -> None:
    ta, tb = _tables(a), _tables(b)
    for name in ta:
        assert ta[name].equals(tb[name]), name


def _isolated(path: Path, monkeypatch):
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "always")
    try:
        return ingest(path, discover(path), use_cache=False)
    finally:
        monkeypatch.delenv("TRACEQL_SOURCE_ISOLATION")


# ---------------------------------------------------------------- the size learned, not the file's


def test_size_hint_reads_the_trailer_and_never_goes_below_the_file(tmp_path):
    gz = _write(tmp_path / "a.json.gz", b" " * (3 * MB))
    assert _gz.size_hint(gz) == 3 * MB
    _forge_isize(gz, 7)
    assert _gz.size_hint(gz) == gz.stat().st_size  # a trailer claiming less than the file holds is not believed
    _forge_isize(gz, 1033 * gz.stat().st_size)
    assert _gz.size_hint(gz) == gz.stat().st_size  # nor one claiming more than deflate can inflate
    plain = tmp_path / "b.json"
    plain.write_bytes(b"{}" * 100)
    assert _gz.size_hint(plain) == 200


def test_a_moderate_gzip_trace_is_read_in_process(tmp_path, fresh_pool, monkeypatch):
    """A gzip trace over the old 2 MB-of-files line, inflating to less than the cap: no worker starts, and the tables
    are those a worker reads."""
    data = _widened_json(40)
    trace = _write(tmp_path / "run" / "rank0.pt.trace.json.gz", data, level=1)
    assert trace.stat().st_size > budget.IN_PROCESS_MAX_BYTES and len(data) < budget.INFLATE_CAP
    here = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert fresh_pool.spawned == 0
    assert [s.status for s in here.sources] == ["ok"] and here.table("kernels").height > 0
    _same(here, _isolated(trace.parent, monkeypatch))
    assert fresh_pool.spawned == 1


def test_a_large_trailer_goes_to_a_worker_without_inflating_here(tmp_path, fresh_pool, inflated_here, monkeypatch):
    monkeypatch.setattr(budget, "INFLATE_CAP", 4 * MB)
    trace = _write(tmp_path / "run" / "rank0.pt.trace.json.gz", _widened_json(6))  # ~7 MB inflated, says so
    run = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert fresh_pool.spawned == 1 and run.sources[0].status == "ok" and run.table("kernels").height > 0
    assert sum(inflated_here) < 1 * MB  # discovery's look at the head only: the read was the worker's


@pytest.mark.parametrize("how", ["forged-trailer", "members"])
def test_a_stream_inflating_past_the_cap_stops_there_and_a_worker_reads_it(tmp_path, fresh_pool, inflated_here,
                                                                           monkeypatch, how):
    """The trailer lies (a bomb claiming 100 bytes) or only counts the last of several members: the read here stops
    once it has inflated the cap, and a worker, under its memory budget, reads the source in full."""
    cap = 4 * MB
    monkeypatch.setattr(budget, "INFLATE_CAP", cap)
    data = _widened_json(8)
    assert len(data) > 2 * cap
    trace = tmp_path / "run" / "rank0.pt.trace.json.gz"
    trace.parent.mkdir()
    if how == "forged-trailer":
        _write(trace, data)
        _forge_isize(trace, 100)
    else:  # `cat a.gz b.gz`: each member small, the trailer only the last one's size
        step = 256 << 10
        trace.write_bytes(b"".join(gzip.compress(data[i : i + step]) for i in range(0, len(data), step)))
    assert _gz.size_hint(trace) < cap
    run = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert fresh_pool.spawned == 1, "a worker read it"
    assert cap <= sum(inflated_here) <= cap + 8 * MB  # the cap and at most one block past it, not the whole stream
    src = run.sources[0]
    n = 8 * len(_doc()["traceEvents"])
    if how == "forged-trailer":  # inflate checks the trailer at the stream's end: the lie is named (and the last
        # piece inflated with the check is lost, as for any stream damaged there)
        assert src.status == "partial" and "gzip stream is corrupt" in src.detail and 0.9 * n < src.meta["events"] < n
    else:
        assert src.status == "ok" and src.detail == "" and src.meta["events"] == n
    monkeypatch.setattr(budget, "INFLATE_CAP", 64 * MB)
    _same(run, ingest(trace.parent, discover(trace.parent), use_cache=False))  # here, under a cap it fits


def test_a_gzip_bomb_costs_this_process_only_the_cap(tmp_path, fresh_pool, inflated_here, monkeypatch):
    """64 MB of zeros in 64 KB of gzip, its trailer forged: this process inflates the cap and no more; the
    worker meets the bomb under its own budget and the source ends with a one-line reason."""
    monkeypatch.setattr(budget, "INFLATE_CAP", 4 * MB)
    trace = tmp_path / "run" / "rank0.pt.trace.json.gz"
    trace.parent.mkdir()
    head = b'{"traceEvents": [\n  {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},\n  {'
    with gzip.open(trace, "wb", compresslevel=9) as f:
        f.write(head)
        zeros = bytes(16 * MB)
        for _ in range(4):
            f.write(zeros)
    _forge_isize(trace, 1000)
    assert trace.stat().st_size < 1 * MB
    run = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert sum(inflated_here) <= 4 * MB + 8 * MB
    assert fresh_pool.spawned >= 1  # (a worker stopped at its memory budget is replaced)
    src = run.sources[0]
    assert src.status in ("error", "partial") and src.detail and "\n" not in src.detail, src.detail


# ---------------------------------------------------------------- damaged streams: the same here and in a worker


def _gz_cases(tmp_path: Path) -> dict[str, Path]:
    data = _widened_json(2)
    whole = gzip.compress(data)
    cases = {}
    d = tmp_path / "truncated"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(whole[: len(whole) * 2 // 3])
    cases["truncated"] = d
    d = tmp_path / "members"
    d.mkdir()
    half = len(data) // 2
    (d / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    cases["members"] = d
    d = tmp_path / "padded"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(whole + bytes(4096))  # zeros after the last member, as some copiers leave
    cases["padded"] = d
    d = tmp_path / "corrupt"
    d.mkdir()
    bad = bytearray(whole)
    bad[len(bad) // 2 : len(bad) // 2 + 64] = b"\xff" * 64
    (d / "rank0.pt.trace.json.gz").write_bytes(bytes(bad))
    cases["corrupt"] = d
    return cases


@pytest.mark.parametrize("case", ["truncated", "members", "padded", "corrupt"])
def test_damaged_and_many_member_streams_read_the_same_here_and_in_a_worker(tmp_path, fresh_pool, monkeypatch, case):
    d = _gz_cases(tmp_path)[case]
    here = ingest(d, discover(d), use_cache=False)
    assert fresh_pool.spawned == 0
    there = _isolated(d, monkeypatch)
    s_here, s_there = here.sources[0], there.sources[0]
    assert (s_here.status, s_here.detail) == (s_there.status, s_there.detail)
    _same(here, there)
    n = 2 * len(_doc()["traceEvents"])
    if case in ("members", "padded"):  # every member read, the padding ignored: the whole trace
        assert s_here.status == "ok" and s_here.meta["events"] == n
    elif case == "truncated":
        assert s_here.status == "partial" and "gzip stream ends early" in s_here.detail
        assert 0 < s_here.meta["events"] < n
    else:  # the damage shows as a broken stream, or as bytes that are no JSON, wherever inflate first notices it
        assert s_here.status == "partial" and s_here.detail


def test_many_member_logs_are_read_to_the_last_member(tmp_path):
    """The line readers (NCCL logs, TORCH_TRACE) go through the same stream: `cat a.gz b.gz` is one log."""
    from traceql.ingest import nccl_log

    lines = [f"node1:1234:1240 [0] NCCL INFO comm 0x5{i:03d} rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
             for i in range(40)]
    text = "".join(lines).encode()
    log = tmp_path / "rank0.nccl.log.gz"
    log.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))
    with _gz.open_binary(log) as f:
        assert f.read() == text
    with _gz.open_text(log, encoding="utf-8") as f:
        assert f.read() == text.decode()
    assert nccl_log.KIND == "nccl_log"


def test_a_capped_line_reader_stops_at_the_cap(tmp_path):
    """OverCap passes through the readers' own `except Exception` / `except OSError`: the loader sees it."""
    log = tmp_path / "big.log.gz"
    log.write_bytes(gzip.compress(b"x" * (3 * MB)))
    with _gz.capped(_gz.Allowance(1 * MB)):
        f = _gz.open_text(log, encoding="utf-8")
        with pytest.raises(_gz.OverCap):
            try:
                f.read()
            except (Exception, EOFError):  # noqa: BLE001 - what the readers catch
                pytest.fail("OverCap was caught as an error")
        f.close()
    assert _gz.current() is None
    assert issubclass(_gz.OverCap, BaseException) and not issubclass(_gz.OverCap, Exception)


# ---------------------------------------------------------------- the settings that force workers


@pytest.mark.parametrize("var,value", [("TRACEQL_SOURCE_ISOLATION", "always"), ("TRACEQL_SOURCE_MAX_MB", "2000")])
def test_settings_still_send_every_source_to_a_worker(tmp_path, fresh_pool, inflated_here, monkeypatch, var, value):
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(DEMO_TRACE, d)
    monkeypatch.setenv(var, value)
    run = ingest(d, discover(d), use_cache=False)
    assert fresh_pool.spawned == 1 and run.sources[0].status == "ok"
    assert sum(inflated_here) < 1 * MB  # discovery's head only


def test_the_whole_document_parser_in_process_takes_only_small_documents(tmp_path, fresh_pool, monkeypatch):
    """B/E events send a trace to the whole-document parser (some ten times the JSON in objects): past WHOLE_MAX it
    is a worker's, the same tables either way."""
    doc = _doc()
    extra = [{"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 1.0}, {"ph": "E", "pid": 1, "tid": 1, "ts": 9.0}]
    doc["traceEvents"] = doc["traceEvents"] * 2 + extra
    trace = _write(tmp_path / "run" / "rank0.pt.trace.json.gz", orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    monkeypatch.setattr(_gz, "WHOLE_MAX", 256 << 10)
    run = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert fresh_pool.spawned == 1 and run.sources[0].meta["parser"] == "whole"
    monkeypatch.setattr(_gz, "WHOLE_MAX", 16 * MB)
    again = ingest(trace.parent, discover(trace.parent), use_cache=False)
    assert fresh_pool.spawned == 1 and again.sources[0].meta["parser"] == "whole"
    _same(run, again)


def test_the_allowance_is_shared_by_the_runs_sources(tmp_path, fresh_pool, monkeypatch):
    """Two traces whose trailers add up to more than the cap: both to workers (the bound is for the run)."""
    data = _widened_json(2)
    monkeypatch.setattr(budget, "INFLATE_CAP", len(data) + 1000)
    d = tmp_path / "run"
    _write(d / "rank0.pt.trace.json.gz", data)
    _write(d / "rank1.pt.trace.json.gz", data)
    assert budget.in_process_allowance(discover(d)) is None
    monkeypatch.setattr(budget, "INFLATE_CAP", 16 * MB)
    assert budget.in_process_allowance(discover(d)) == 16 * MB
    plain = d / "rank2.pt.trace.json"
    plain.write_bytes(data)
    assert budget.in_process_allowance(discover(d)) == 16 * MB - len(data)


def test_an_io_stream_is_not_needed(tmp_path):
    """open_binary of a plain file is the file itself: no wrapper, nothing charged."""
    p = tmp_path / "x.log"
    p.write_bytes(b"abc")
    with _gz.capped(_gz.Allowance(0)):
        with _gz.open_binary(p) as f:
            assert isinstance(f, io.BufferedReader) and f.read() == b"abc"


def test_line_logs_count_by_their_reading_speed(tmp_path, monkeypatch):
    """An NCCL log's bytes count 4 x against the cap (its reader is that much slower than the Kineto scanner): a
    20 MB log goes to a worker, as a 20 MB trace does not."""
    monkeypatch.setattr(budget, "INFLATE_CAP", 64 * MB)
    d = tmp_path / "run"
    d.mkdir()
    line = b"node1:1234:1240 [0] NCCL INFO Channel 00/02 :    0   1\n"
    (d / "rank0.nccl.log").write_bytes(line * (20 * MB // len(line)))
    srcs = discover(d)
    assert [s.kind for s in srcs] == ["nccl_log"]
    assert budget.in_process_allowance(srcs) is None
    (d / "rank0.nccl.log").write_bytes(line * (10 * MB // len(line)))
    left = budget.in_process_allowance(discover(d))
    assert left is not None and 64 * MB - left == 4 * (d / "rank0.nccl.log").stat().st_size
