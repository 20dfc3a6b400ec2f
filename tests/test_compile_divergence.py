"""Ranks that compiled differently, named as people read them ("ranks 3-4 vs 0-2"): the collective schedule inside
compiled graphs (TQL407), the FX graph cache hit/miss pattern (TQL408), the graphs' input shapes (TQL409), compile
ids some ranks lack or have extra (TQL403). Inputs: real 5-rank and 3-rank gloo captures with torch 2.13."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import polars as pl
import pytest

from conftest import FIXTURES, REPO
from traceql import link
from traceql.link.compile import summarise

SCHEDULE = FIXTURES / "compile-5rank-schedule-divergence"  # ranks 3-4 all_reduce inside the graph, 0-2 in eager code
GRAPH = FIXTURES / "compile-5rank-graph-divergence"  # ranks 3-4: batches of 6 and a rank-conditional graph break
CACHE = FIXTURES / "compile-3rank-cache-pattern"  # a second run; rank 2's cache dir was wiped before it
SAME = FIXTURES / "compile-ddp-same"


def _run(path: Path):
    from traceql.pipeline import load_run

    return load_run(path, use_cache=False)


def _findings(path: Path, *rule_ids: str):
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    run = _run(path)
    out = []
    for rule in [r for r in load_rules([REPO / "rules"]) if r.id in rule_ids]:
        res = evaluate(run, rule)
        assert res.status == "ran", res
        out += res.findings
    return out


def test_a_different_collective_order_names_the_minority_ranks_and_both_schedules():
    (f,) = _findings(SCHEDULE, "TQL407")
    assert f.ranks == [3, 4] and f.severity == "error" and f.location == {"compile_id": "0/0"}
    assert f.evidence["majority_ranks"] == "0-2"
    assert f.evidence["here"] == "all_reduce -> all_gather_into_tensor" and f.evidence["majority"] == "all_gather_into_tensor"
    assert "ranks 3-4" in f.message and "ranks 0-2" in f.message


def test_a_graph_break_that_moves_a_collective_into_the_resume_frame_is_not_a_schedule_divergence():
    # ranks 3-4 issue their all_gather from compile 1/0 (the resume frame) instead of 0/0: still the same order
    assert _findings(GRAPH, "TQL407") == []
    sched = link.ensure(_run(GRAPH), "graph_collectives")
    assert set(sched.filter(pl.col("compile_id") == "1/0")["rank"]) == {3, 4}


def test_different_input_shapes_name_the_input_and_both_shapes():
    (f,) = _findings(GRAPH, "TQL409")
    assert f.ranks == [3, 4] and f.evidence["majority_ranks"] == "0-2"
    assert "L_x_ f32[6, 16] on ranks 3-4 vs L_x_ f32[8, 16] on ranks 0-2" in f.message


def test_compile_ids_on_some_ranks_only_are_one_finding_for_the_group():
    (f,) = _findings(GRAPH, "TQL403")
    assert f.ranks == [3, 4] and f.evidence["divergence"] == "extra"
    assert f.evidence["compile_ids"] == "1/0" and f.evidence["missing_on"] == "0,1,2"
    assert f.message.startswith("ranks 3-4: compile 1/0 is extra: ranks 3-4 compiled it") and "ranks 0-2 have no record" in f.message


def test_a_rank_whose_cache_was_wiped_misses_where_the_others_hit():
    assert CACHE.is_dir(), "fixture compile-3rank-cache-pattern missing"
    (f,) = _findings(CACHE, "TQL408")
    assert f.ranks == [2] and f.evidence["majority_ranks"] == "0-1"
    assert f.evidence["here"] == "missed" and f.evidence["majority"] == "hit"
    assert f.message.startswith("rank 2 missed the FX graph cache where ranks 0-1 hit")


@pytest.mark.parametrize("rule", ["TQL403", "TQL407", "TQL408", "TQL409"])
def test_ranks_that_compiled_alike_stay_quiet(rule):
    assert _findings(SAME, rule) == []


def test_summaries_keep_messages_short_and_the_evidence_full():
    assert summarise(["0/0", "1/0", "2/0", "3/0"]) == "0/0, 1/0, 2/0, 3/0"
    assert summarise([f"{i}/0" for i in range(44)]) == "0/0, 1/0, 2/0 and 41 more"


def test_many_missing_compile_ids_make_one_short_finding(tmp_path):
    # ranks 3-4's logs lose every record from frame 2 on: 40-odd facts become one finding per kind, not 40
    dst = tmp_path / GRAPH.name
    shutil.copytree(GRAPH, dst)
    for r in (3, 4):
        (log,) = (dst / "tt").glob(f"dedicated_log_torch_trace_rank_{r}_*.log.gz")
        text = gzip.decompress(log.read_bytes()).decode()
        lines, keep = [], True
        for ln in text.splitlines(keepends=True):
            if not ln.startswith("\t"):
                keep = '"frame_id": 1,' not in ln  # drop the resume frame 1/0: ranks 3-4 now lack nothing extra
            if keep:
                lines.append(ln)
        log.write_bytes(gzip.compress("".join(lines).encode()))
    # and ranks 0-2 compiled 40 frames more that nobody else has
    for r in (0, 1, 2):
        (log,) = (dst / "tt").glob(f"dedicated_log_torch_trace_rank_{r}_*.log.gz")
        extra = "".join(
            f'V1201 13:30:00.000000 1 torch/_dynamo/utils.py:1] {{"compilation_metrics": {{"co_name": "f{i}", '
            f'"co_filename": "x.py", "co_firstlineno": {i}}}, "rank": {r}, "frame_id": {10 + i}, '
            f'"frame_compile_id": 0, "attempt": 0}}\n' for i in range(40))
        log.write_bytes(gzip.compress(gzip.decompress(log.read_bytes()) + extra.encode()))
    fs = _findings(dst, "TQL403")
    (miss,) = [f for f in fs if f.evidence["divergence"] == "missing"]
    assert miss.ranks == [3, 4] and miss.evidence["n_compile_ids"] == 40
    assert len(miss.evidence["compile_ids"].split(",")) == 40 and "and 37 more" in miss.message
    assert len(miss.message) < 400, miss.message


def test_every_compile_message_on_the_fixtures_stays_readable():
    # the longest TQL40x message on these inputs: before grouping and summaries TQL403 printed every key component
    longest = 0
    for d in [SCHEDULE, GRAPH, FIXTURES / "cpu-divergent-compile", FIXTURES / "h200x2-divergent-compile",
              FIXTURES / "compile-ddp-divergent"]:
        for f in _findings(d, "TQL403", "TQL406", "TQL407", "TQL408", "TQL409"):
            longest = max(longest, len(f.message))
    assert 0 < longest < 700


def test_two_logs_claiming_one_rank_do_not_crash_the_comparison(tmp_path):
    # the rank-collision policy is not this module's; two TORCH_TRACE files with the same embedded rank must still
    # give tables and findings, not an exception
    dst = tmp_path / "collide"
    (dst / "tt").mkdir(parents=True)
    (a,) = (SCHEDULE / "tt").glob("dedicated_log_torch_trace_rank_0_*.log.gz")
    (b,) = (SCHEDULE / "tt").glob("dedicated_log_torch_trace_rank_3_*.log.gz")
    shutil.copy(a, dst / "tt" / a.name)
    shutil.copy(b, dst / "tt" / "dedicated_log_torch_trace_rank_0_copy.log.gz")
    text = gzip.decompress((dst / "tt" / "dedicated_log_torch_trace_rank_0_copy.log.gz").read_bytes()).decode()
    (dst / "tt" / "dedicated_log_torch_trace_rank_0_copy.log.gz").write_bytes(
        gzip.compress(text.replace('"rank": 3,', '"rank": 0,').encode()))
    run = _run(dst)
    for table in ("compile_divergence_groups", "compile_evidence",
                  "graph_collectives", "compiled_regions"):
        assert isinstance(link.ensure(run, table), pl.DataFrame)
    # the comparison itself is not run on collided ranks (the rank-collision policy): skipped, with the reason named
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    # TQL406 groups the ranks a failure happened on ("ranks 0-2 of 5"): collided ranks would mix two runs there too
    for rule in [r for r in load_rules([REPO / "rules"]) if r.id in ("TQL403", "TQL406", "TQL407", "TQL408", "TQL409")]:
        res = evaluate(run, rule)
        assert res.status == "skipped" and "TQL001" in res.reason, res
