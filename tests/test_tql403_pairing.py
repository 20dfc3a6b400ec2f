"""TQL403 pairs FX graphs across ranks by identity (compile id, restart attempt, position within it), and says which
ranks lack which compile ids. The inputs are the captured 2-rank DDP fixtures, copied to tmp_path with some of one
rank's TORCH_TRACE records removed, the way a rank that did not compile a frame (or whose log ends early) looks."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from conftest import FIXTURES, REPO
from traceql import link

DIVERGENT = FIXTURES / "compile-ddp-divergent"  # rank 1 trains on batches of 6, rank 0 on 8
SAME = FIXTURES / "compile-ddp-same"
_HEAD = re.compile(r"^[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]+\] (\{.*)$")


def _run(path: Path):
    from traceql.pipeline import load_run

    return load_run(path, use_cache=False)


def _findings(path: Path):
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    (rule,) = [r for r in load_rules([REPO / "rules"]) if r.id == "TQL403"]
    res = evaluate(_run(path), rule)
    assert res.status == "ran", res
    return res.findings


def _log(run_dir: Path, rank: int) -> Path:
    (p,) = sorted((run_dir / "tt").glob(f"dedicated_log_torch_trace_rank_{rank}_*.log.gz"))
    return p


def _drop(src: Path, tmp_path: Path, rank: int, keep) -> Path:
    """A copy of the run dir src in which rank's TORCH_TRACE log lost every record (header line and its tab-led
    payload lines) for which keep(envelope, index among the records so far) is false."""
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    log = _log(dst, rank)
    out, dropping, dropped = [], False, 0
    for line in gzip.decompress(log.read_bytes()).decode().splitlines(keepends=True):
        m = _HEAD.match(line)
        if m:
            dropping = not keep(json.loads(m.group(1)))
            dropped += dropping
        if not dropping:
            out.append(line)
    assert dropped, "the filter removed nothing: the test would not test anything"
    log.write_bytes(gzip.compress("".join(out).encode()))
    return dst


def _of(frame: int, compile_: int):
    return lambda env: not (env.get("frame_id") == frame and env.get("frame_compile_id") == compile_)


def _rows(div: pl.DataFrame) -> dict[tuple[int, str], dict]:
    return {(r["rank"], r["compile_id"]): r for r in div.iter_rows(named=True)}


# --- the captured fixtures keep their verdicts -----------------------------------------------------------------


def test_divergent_fixture_fires_on_rank_1_naming_the_batch_shape():
    findings = _findings(DIVERGENT)
    assert [(f.ranks, f.location) for f in findings] == [([1], {"compile_id": "4/0"})]
    msg = findings[0].message
    assert "float32[6, 512]" in msg and "float32[8, 512]" in msg
    assert findings[0].evidence["divergence"] == "key"


@pytest.mark.parametrize("name", ["compile-ddp-same", "compile-graph-break", "compile-recompile-storm",
                                  "compile-auto-dynamic", "h200-ddp-compiled"])
def test_quiet_on_runs_whose_ranks_compiled_the_same(name):
    assert _findings(FIXTURES / name) == []


# --- a compile id one rank lacks -------------------------------------------------------------------------------


def test_a_compile_id_missing_on_one_rank_is_named_with_the_ranks_that_have_it(tmp_path):
    d = _drop(DIVERGENT, tmp_path, 1, _of(5, 0))  # rank 1 never compiled grad_norm_serial (frame 5)
    rows = _rows(link.ensure(_run(d), "compile_cache_divergence"))
    assert set(rows) == {(1, "4/0"), (1, "5/0")}
    miss = rows[(1, "5/0")]
    assert miss["divergence"] == "missing"
    assert (miss["present_on"], miss["missing_on"], miss["graphs_here"], miss["graphs_majority"]) == ("0", "1", 0, 1)
    # the gap does not disturb the pairing of 4/0: still its own six graphs, still the batch shape
    key = rows[(1, "4/0")]
    assert key["divergence"] == "key" and key["graphs"] == "0,1,2,3,4,5"
    assert "float32[6, 512] on 'cpu' (rank 1) vs float32[8, 512] on 'cpu' (rank 0)" in key["differing_values"]

    by_cid = {f.location["compile_id"]: f for f in _findings(d)}
    assert set(by_cid) == {"4/0", "5/0"} and by_cid["5/0"].ranks == [1]
    assert by_cid["5/0"].message.startswith("rank 1: compile 5/0 is missing: rank 0 compiled it (1 FX graph(s)), "
                                            "rank 1's compile log has no record of it")
    assert by_cid["5/0"].evidence["missing_on"] == "1"


def test_on_agreeing_ranks_only_the_missing_compile_id_is_reported(tmp_path):
    # rank 0 lacks 4/0 (six graphs): 5/0 after it still pairs with rank 1's 5/0, whose key is the same
    d = _drop(SAME, tmp_path, 0, _of(4, 0))
    div = link.ensure(_run(d), "compile_cache_divergence")
    assert div.select("rank", "compile_id", "divergence", "present_on", "graphs_majority").rows() == [
        (0, "4/0", "missing", "1", 6)]


def test_a_log_that_ends_early_says_so(tmp_path):
    # rank 1's log cut in the middle of the first record of 5/0: the compile id may only be missing from the log
    dst = tmp_path / SAME.name
    shutil.copytree(SAME, dst)
    log = _log(dst, 1)
    text = gzip.decompress(log.read_bytes()).decode()
    cut = re.search(r'^.*"frame_id": 5, "frame_compile_id": 0.*$', text, re.M)
    assert cut
    log.write_bytes(gzip.compress(text[:cut.start() + len(cut.group(0)) // 2].encode()))
    (f,) = _findings(dst)
    assert f.ranks == [1] and f.location == {"compile_id": "5/0"}
    assert "is missing" in f.message and "truncated" in f.message


# --- a graph one rank lacks within a compile id both compiled --------------------------------------------------


def test_a_missing_graph_within_a_compile_id_is_a_count_not_a_key_difference(tmp_path):
    # drop rank 1's last FX graph cache record of 4/0: graphs 0-4 still pair and agree, graph 5 pairs with nothing
    n = {"seen": 0}

    def keep(env):
        if env.get("frame_id") == 4 and (env.get("artifact") or {}).get("name") == "fx_graph_cache_miss":
            n["seen"] += 1
            return n["seen"] < 6
        return True

    d = _drop(SAME, tmp_path, 1, keep)
    div = link.ensure(_run(d), "compile_cache_divergence")
    assert div.select("rank", "compile_id", "divergence", "graphs_here", "graphs_majority", "majority_ranks").rows() == [
        (1, "4/0", "graphs", 5, 6, "0")]
    assert div["differing"].to_list() == [None]
    (f,) = _findings(d)
    assert "5 FX graph(s) on rank 1 vs 6 on rank 0" in f.message


def test_two_gpus_differ_by_device_index_only_and_stay_quiet():
    """On two GPUs every FX graph key differs, rank 1 compiling for cuda:1 and rank 0 for cuda:0: not a divergence."""
    run = _run(FIXTURES / "h200x2-ddp-compiled")
    events = link.ensure(run, "compile_events")
    keys = events.filter(pl.col("cache_key").is_not_null()).group_by("rank").agg(pl.col("cache_key").unique())
    assert keys.height == 2 and set(keys["cache_key"][0]).isdisjoint(keys["cache_key"][1])  # the keys really differ
    assert _findings(FIXTURES / "h200x2-ddp-compiled") == []


def test_two_gpus_name_the_shape_not_the_device_index():
    (f,) = _findings(FIXTURES / "h200x2-divergent-compile")
    assert f.ranks == [1]
    values = f.evidence["differing_values"]
    assert "[2056, 2048]" in values and "[2048, 2048]" in values  # rank 1's bigger batch
    # inputs that differ only in the GPU index (the weights) are not among the named components
    assert all("2056" in part or "index" not in part for part in values.split("; "))
