"""The Kineto path needs no pyarrow (issue 20: importing it is ~150 ms of every command).

The compiled scanner hands its columns to polars through the Arrow C Data Interface (_kscan.arrow: a PyCapsule pair
that pl.DataFrame takes) and the nesting sweep reads polars' columns through __arrow_c_stream__. These tests run the
reading in a fresh interpreter and read sys.modules at its end, check that validity bitmaps and null counts survive
the hand-off (against the pure-Python path, which builds its frames without the scanner), and hold _kscan.arrow to
its contract: the memory moves, an error moves nothing, a frame outlives everything that made it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from traceql.ingest import _kscan, kineto
from traceql.model import Source

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"

# Reads samples/demo (discovery and ingest, or the whole `traceql check`) and writes the modules loaded at its end.
_HARNESS = """
import json, sys
from pathlib import Path
if sys.argv[2] == "ingest":
    from traceql.discover import discover
    from traceql.ingest.loader import ingest
    run = ingest(Path(sys.argv[3]), discover(Path(sys.argv[3])), use_cache=False)
    assert run.sources and all(s.status == "ok" for s in run.sources if s.kind == "kineto"), run.sources
else:
    from traceql.cli import main
    try:
        main(sys.argv[2:], prog_name="traceql")
    except SystemExit:
        pass
open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules)))
"""


def _modules(tmp_path: Path, *args: str, **env) -> set[str]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACEQL_CACHE_DIR": str(tmp_path / "cache"), **env}
    r = subprocess.run([sys.executable, "-c", _HARNESS, str(out), *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300, check=False)  # its modules are the result; stderr shows on failure
    assert out.exists(), r.stderr[-2000:]
    return set(json.loads(out.read_text()))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m.split(".")[0] in ("pyarrow", "numpy"))


@pytest.mark.parametrize("kscan", ["1", "0"])
def test_reading_kineto_traces_imports_no_pyarrow(tmp_path, kscan):
    """Scanner and pure-Python fallback alike: reading the demo's traces loads neither pyarrow nor numpy."""
    mods = _modules(tmp_path, "ingest", str(DEMO), TRACEQL_KSCAN=kscan)
    assert "traceql.ingest.kineto" in mods
    if kscan == "1":
        assert "traceql.ingest._kscan" in mods
    assert _heavy(mods) == []


# The whole command on a small run: the critical-path walk views long columns through pyarrow (zero-copy) only from
# link.critical_path._VIEW_IN_PLACE rows on, so the demo's check imports neither pyarrow nor numpy.
def test_check_of_the_demo_imports_no_pyarrow(tmp_path):
    mods = _modules(tmp_path, "check", str(DEMO), "-q", "--no-cache", "--fail-on", "never")
    assert "traceql.rules.engine" in mods
    assert _heavy(mods) == []


def test_nulls_survive_the_hand_off(monkeypatch):
    """A real trace whose scanned columns hold nulls (kernels without External id, host ops without a pid string...):
    the scanner's frames carry them through the capsules exactly where the fallback's frames have them."""
    seen = {}
    real = _kscan.arrow

    def spy(n, cols):
        for name, _fmt, _data, _valid, nulls in cols:
            seen[name] = seen.get(name, 0) + nulls
        return real(n, cols)

    class Spy:
        Scanner = _kscan.Scanner
        nest = staticmethod(_kscan.nest)
        arrow = staticmethod(spy)

    path = DEMO / "rank0.pt.trace.json.gz"
    out = []
    for use in (True, False):
        monkeypatch.setattr(kineto, "_USE_KSCAN", use)
        monkeypatch.setattr(kineto, "_kscan", Spy)
        src = Source(path, "kineto")
        out.append(kineto.read(path, src))
        assert src.meta.get("parser") == "chunks"
    with_nulls = {k for k, v in seen.items() if v}
    assert {"external_id", "pid_s", "tid_s", "bytes"} <= with_nulls, seen  # columns this trace leaves empty in places
    a, b = out
    assert sorted(a) == sorted(b)
    for name in a:
        key = [c for c in ("id", "step", "kind", "flow_id", "src_ts", "dst_ts") if c in a[name].columns]
        assert_frame_equal(a[name].sort(key, nulls_last=True), b[name].sort(key, nulls_last=True), check_exact=True)
    assert any(a[t][c].null_count() for t in a for c in a[t].columns)


def _columns(rows: bytes):
    sc = _kscan.Scanner(kineto._classify, kineto._SCAN_BUCKETS)
    buf = bytearray(rows)
    assert sc.feed(buf, len(buf)) is not None
    return sc.take()[1]["k"]


_EVENTS = (b'[{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 2, "args": {"correlation": 7}},'
           b' {"ph": "X", "cat": "kernel", "name": "b", "ts": 3},'
           b' {"ph": "X", "cat": "kernel", "name": "a", "ts": 5, "dur": 1, "args": {"correlation": -9}}]')


def test_arrow_keeps_validity_and_types():
    n, cols = _columns(_EVENTS)
    spec = [(k, "I" if k in kineto._TEXT_FIELDS else "l", d, v, nu) for k, (d, v, nu) in cols.items()]
    df = kineto._frame(n, spec)
    assert df.height == 3
    assert df["correlation"].to_list() == [7, None, -9]
    assert df["ts"].to_list() == [1000, 3000, 5000]
    assert df["dur"].to_list() == [2000, 0, 1000]  # a missing dur is 0, not null, as the fallback has it
    assert df["name"].dtype == pl.UInt32 and df["name"].to_list()[0] == df["name"].to_list()[2]
    assert df["correlation"].null_count() == 1


def test_arrow_moves_the_memory_and_the_frame_outlives_its_makers():
    n, cols = _columns(_EVENTS)
    data, valid, nulls = cols["correlation"]
    pair = _kscan.arrow(n, [("correlation", "l", data, valid, nulls)])
    assert len(memoryview(data)) == 0 and len(memoryview(valid)) == 0  # moved, not copied
    df = pl.DataFrame(kineto._Capsules(pair))
    del pair, data, valid, cols
    gc.collect()
    assert df["correlation"].to_list() == [7, None, -9]
    # read and dropped on polars' threads (the release callback takes no GIL): still the same values after
    done = []
    t = threading.Thread(target=lambda: done.append(pl.concat([df] * 4).select(pl.col("correlation").sum()).item()))
    t.start()
    t.join()
    assert done == [-8]


def test_a_capsule_pair_is_handed_out_once():
    n, cols = _columns(_EVENTS)
    cap = kineto._Capsules(_kscan.arrow(n, [("ts", "l", *cols["ts"])]))
    pl.DataFrame(cap)
    with pytest.raises(ValueError, match="already handed out"):
        pl.DataFrame(cap)


def test_unconsumed_capsules_free_their_memory():
    """Capsules dropped without a consumer release the arrays (no leak, no crash)."""
    for _ in range(50):
        n, cols = _columns(_EVENTS)
        _kscan.arrow(n, [(k, "I" if k in kineto._TEXT_FIELDS else "l", d, v, nu) for k, (d, v, nu) in cols.items()])
    gc.collect()


@pytest.mark.parametrize("bad, exc, match", [
    (lambda c: [("ts", "q", *c["ts"])], ValueError, "format"),
    (lambda c: [("ts", "l", b"12345678", None, 0)], TypeError, "MBufs"),
    (lambda c: [("ts", "l", *c["ts"]), ("ts2", "l", *c["ts"])], ValueError, "twice"),
    (lambda c: [("correlation", "l", c["correlation"][0], None, 1)], ValueError, "null count"),
])
def test_arrow_refuses_bad_columns_and_moves_nothing(bad, exc, match):
    n, cols = _columns(_EVENTS)
    before = {k: len(memoryview(d)) for k, (d, _v, _nu) in cols.items()}
    with pytest.raises(exc, match=match):
        _kscan.arrow(n, [("id", "l", *cols["id"]), *bad(cols)])
    assert {k: len(memoryview(d)) for k, (d, _v, _nu) in cols.items()} == before


def test_arrow_refuses_a_buffer_with_an_open_view():
    n, cols = _columns(_EVENTS)
    data, valid, nulls = cols["ts"]
    view = memoryview(data)
    with pytest.raises(BufferError):
        _kscan.arrow(n, [("ts", "l", data, valid, nulls)])
    view.release()
    assert pl.DataFrame(kineto._Capsules(_kscan.arrow(n, [("ts", "l", data, valid, nulls)])))["ts"].to_list() == [
        1000, 3000, 5000]


def test_nest_reads_polars_columns_as_it_reads_buffers():
    """The sweep over Arrow columns (one chunk, read in place) and over plain buffers gives the same parents."""
    from array import array

    ts, end = [0, 1, 2, 10, 10], [9, 5, 3, 12, 11]
    flags, rows = [1, 0, 0, 0, 0], [0, 1, 2, 3, 4]
    cols = (pl.Series(ts, dtype=pl.Int64), pl.Series(end, dtype=pl.Int64), pl.Series(flags, dtype=pl.UInt8),
            pl.Series(rows, dtype=pl.UInt32))
    bufs = (array("q", ts), array("q", end), bytes(flags), array("I", rows))
    got = []
    for args in (cols, bufs):
        parent, depth = _kscan.nest(*args, 5)
        got.append((memoryview(parent).cast("q").tolist(), memoryview(depth).cast("i").tolist()))
    assert got[0] == got[1] == ([-1, 0, 1, -1, 3], [0, 1, 2, 0, 1])
    with pytest.raises(TypeError, match="format"):  # a column of another type is refused, not misread
        _kscan.nest(cols[0].cast(pl.Int32), *cols[1:], 5)
    with pytest.raises(ValueError, match="more than one chunk"):
        _kscan.nest(pl.concat([cols[0][:2], cols[0][2:]], rechunk=False), *cols[1:], 5)
