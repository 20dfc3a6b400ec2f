"""`traceql annotate`: one Chrome/Perfetto trace over all ranks, from the canonical tables, with the findings on it."""

from __future__ import annotations

import shutil

import orjson
import polars as pl
import pytest
from _report_helpers import RUN_DIRS, checked, need

from traceql.report import annotate


@pytest.fixture(scope="module", params=RUN_DIRS)
def result(request):
    """The committed sample run (always) and the corpus's trace_filter (where present)."""
    return checked(str(need(request.param)))


@pytest.fixture(scope="module")
def doc(result):
    return annotate.annotate(result)


def _shift(doc, result, rank):
    """The trace time (us) minus the rank's own clock (ns) for one kernel: constant per rank if merging is right."""
    base = doc["otherData"]["traceql"]["base_ns"]
    k = result.run.table("kernels").filter(pl.col("rank") == rank).sort("ts")
    evs = sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e["cat"].startswith("kernel.")), key=lambda e: e["ts"])
    return [round(e["ts"] * 1000) + base - ts for e, ts in zip(evs, k["ts"].to_list(), strict=True)]


def test_one_process_per_rank_and_one_thread_per_stream(doc, result):
    evs = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {r: f"rank {r}" for r in result.run.ranks}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    k = result.run.table("kernels")
    streams = k.select("rank", "device", "stream").unique()
    assert sum(1 for n in threads.values() if n.startswith("GPU ")) == streams.height
    for e in evs:
        if e["ph"] == "X" and e["cat"].startswith("kernel."):
            assert threads[(e["pid"], e["tid"])].startswith("GPU ")


def test_every_kernel_and_host_event_is_there(doc, result):
    x = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != annotate.FINDING_CAT]
    run = result.run
    assert sum(1 for e in x if e["cat"].startswith("kernel.")) == run.table("kernels").height
    assert len(x) == run.table("kernels").height + run.table("host_ops").height + run.table("runtime").height
    assert all(e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in x)


def test_ranks_keep_their_own_spacing(doc, result):
    # alignment (or none) shifts a whole rank; it never changes the time between two events of one rank
    for r in result.run.ranks:
        shifts = _shift(doc, result, r)
        assert max(shifts) - min(shifts) <= 1, (r, min(shifts), max(shifts))


def test_findings_are_markers_with_their_args(doc, result):
    marks = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == annotate.FINDING_CAT]
    assert len(marks) == sum(len(f.ranks) or len(result.run.ranks) for f in result.findings) > 0
    assert doc["otherData"]["traceql"]["findings"] == len(marks)
    fps = {f.fingerprint for f in result.findings}
    for e in marks:
        assert e["tid"] == annotate.FINDINGS_TID
        assert {"message", "severity", "fingerprint", "placed_at", "cost_ms_per_step", "cost_pct", "caused_by", "evidence"} <= set(e["args"])
        assert e["args"]["fingerprint"] in fps and e["args"]["placed_at"]


def test_wait_arrows_pair_up_across_ranks(doc, result):
    from traceql import link

    if "collective_instances" not in link.derived_tables():
        pytest.skip("collective_instances is not registered in this tree")
    s = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    f = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    # NCCL (kernels) and gloo (samples/demo: host ops only) alike
    assert s and s.keys() == f.keys()
    for i in s:
        assert s[i]["pid"] != f[i]["pid"] and f[i]["bp"] == "e"
    assert doc["otherData"]["traceql"]["flows"] == len(s)


def test_unaligned_runs_say_so(result, monkeypatch):
    from traceql import link

    reg = {k: v for k, v in link.derived_tables().items() if k not in ("clock_offsets", "collective_instances")}
    monkeypatch.setattr(link, "derived_tables", lambda: reg)
    saved = {k: result.run.tables.pop(k) for k in ("clock_offsets", "collective_instances") if k in result.run.tables}
    try:
        d = annotate.annotate(result)
    finally:
        result.run.tables.update(saved)
    meta = d["otherData"]["traceql"]
    assert meta["aligned"] is False and meta["flows"] == 0
    assert any("own clocks" in n for n in meta["notes"])
    assert not [e for e in d["traceEvents"] if e["ph"] in ("s", "f")]


@pytest.mark.parametrize("src", RUN_DIRS)
def test_cli_builds_from_tables_not_files(src, tmp_path):
    """The trace is written after the inputs are gone from the run dir only if it is built from tables: so the
    command is checked end to end on a copy, and the module on a run whose files were deleted after ingest.
    Both run dirs hold the traces of two ranks."""
    from click.testing import CliRunner

    from traceql import pipeline
    from traceql.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(need(src), run_dir)
    out = tmp_path / "merged.json.gz"
    res = CliRunner().invoke(main, ["annotate", str(run_dir), "--out", str(out), "--quiet", "--no-cache"])
    assert res.exit_code == 0, res.output
    import gzip

    d = orjson.loads(gzip.decompress(out.read_bytes()))
    assert {e["args"]["name"] for e in d["traceEvents"] if e.get("name") == "process_name"} == {"rank 0", "rank 1"}

    r = pipeline.check(run_dir, use_cache=False, select=["TQL101"])
    shutil.rmtree(run_dir)
    d2 = annotate.annotate(r)
    def events(doc):
        return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != annotate.FINDING_CAT]

    assert len(events(d2)) == len(events(d))
