"""The torch.compile rules whose logic is rule SQL (TQL406, TQL408), on the real 5-rank gloo capture with planted
records appended to its TORCH_TRACE logs: ranks grouped as runs ("0-2, 4 of 5"), compile ids in compile order and
summarised past four, each sentence built from the planted facts."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from conftest import FIXTURES, REPO

SCHEDULE = FIXTURES / "compile-5rank-schedule-divergence"


def _plant(tmp_path: Path, extra_by_rank) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(SCHEDULE, dst)
    for log in sorted((dst / "tt").glob("dedicated_log_torch_trace_rank_*.log.gz")):
        r = int(log.name.split("_rank_")[1].split("_")[0])
        extra = extra_by_rank(r)
        log.write_bytes(gzip.compress(gzip.decompress(log.read_bytes()) + extra.encode()))
    return dst


def _line(record: dict, payload: str | None = None) -> str:
    head = "V1201 13:30:00.000000 1 torch/_dynamo/utils.py:1] " + json.dumps(record) + "\n"
    return head + ("\t" + payload + "\n" if payload is not None else "")


def _findings(path: Path, rule_id: str):
    from traceql import pipeline
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    run = pipeline.load_run(path, use_cache=False)
    (rule,) = [r for r in load_rules([REPO / "rules"]) if r.id == rule_id]
    res = evaluate(run, rule)
    assert res.status == "ran", res
    return res.findings


def test_a_failure_on_some_ranks_is_one_finding_naming_them_as_runs(tmp_path):
    # ranks 0, 1, 2 and 4 fail compiling frame 20 (compile ids 20/0-20/5, all six), rank 3 compiles it fine
    def extra(r):
        if r == 3:
            return ""
        return "".join(_line({"compilation_metrics": {
            "compile_id": f"20/{a}", "co_name": "broken", "co_filename": "x.py", "co_firstlineno": 7,
            "fail_type": "BackendCompilerFailed", "fail_reason": "backend='b1' raised:\nRuntimeError: no",
            "config_suppress_errors": True, "is_forward": True}, "rank": r, "frame_id": 20, "frame_compile_id": a,
            "attempt": 0}) for a in (5, 0, 1, 10, 2, 3))
    (f,) = _findings(_plant(tmp_path, extra), "TQL406")
    assert f.ranks == [0, 1, 2, 4]
    assert f.message == ("compile 20/0, 20/1, 20/2 and 3 more of broken (x.py:7) failed on ranks 0-2, 4 of 5: "
                         "BackendCompilerFailed (backend b1): RuntimeError: no; suppress_errors=True: the frame runs "
                         "in eager mode, without its compiled speed-up")
    # every compile id in the evidence, in compile order (20/10 after 20/5, not after 20/1)
    assert f.evidence["compile_ids"] == "20/0,20/1,20/2,20/3,20/5,20/10" and f.evidence["ranks_text"] == "0-2, 4"


def test_ranks_that_miss_the_cache_where_the_others_hit_are_one_finding_over_the_compile_ids(tmp_path):
    # compile ids 40/0-44/0: ranks 3 and 4 miss the FX graph cache where ranks 0-2 hit it
    def extra(r):
        name = "fx_graph_cache_miss" if r in (3, 4) else "fx_graph_cache_hit"
        return "".join(_line({"artifact": {"name": name, "encoding": "json"}, "rank": r, "frame_id": fid,
                              "frame_compile_id": 0, "attempt": 0, "has_payload": "0"},
                             json.dumps({"key": f"k{fid}", "components": []})) for fid in range(40, 45))
    fs = [f for f in _findings(_plant(tmp_path, extra), "TQL408") if f.evidence["n_compile_ids"] == 5]
    (f,) = fs
    assert f.ranks == [3, 4] and f.evidence["majority_ranks"] == "0-2"
    assert f.message.startswith("ranks 3-4 missed the FX graph cache where ranks 0-2 hit, on 5 compile ids "
                                "(40/0, 41/0, 42/0 and 2 more): a cache miss recompiles the graph from scratch")
