"""TQL302 counts only collectives matched on two or more ranks: a call that no other rank made (unmatched) waits for
nobody and makes nobody wait, so it must not lower the straggler's "last at X% of N"."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from conftest import rule_rows

from traceql import link
from traceql.model import Run, conform
from traceql.rules.engine import evaluate
from traceql.rules.loader import load_rules

RULES = {r.id: r for r in load_rules()}


def _calls(rank: int, seqs: range, late_ns: int = 0, members: str = "[0, 1]") -> list[dict]:
    rows = []
    for i in seqs:
        end = 1_000_000_000 + i * 10_000_000  # every matched call ends together on every rank
        arrival = end - 2_000_000 + late_ns
        rows.append({"rank": rank, "source": rank, "id": i, "op": "all_reduce", "pg_name": "0", "pg_ranks": members,
                     "seq": i + 1, "in_nelems": 1024, "dtype": "Float", "bytes": 4096,
                     "ts": arrival - 50_000, "end": arrival - 40_000, "kernel_ts": arrival, "kernel_end": end})
    return rows


def _run(rows: list[dict]) -> Run:
    run = Run(path=Path("."), sources=[])
    run.tables["collectives"] = conform("collectives", pl.DataFrame(rows))
    return run


def test_unmatched_collectives_do_not_dilute_the_straggler_share():
    # rank 1 is 1.5 ms late at the 10 calls both ranks made; rank 1 alone then makes 30 more (seq 11-40: rank 0's
    # trace ended, or they belong to a group only rank 1 recorded)
    run = _run(_calls(0, range(10)) + _calls(1, range(40), late_ns=1_500_000))
    ci = link.ensure(run, "collective_instances")
    assert ci.filter(pl.col("n_ranks") == 1).height == 30  # the run does hold unmatched calls
    (row,) = rule_rows(run, "TQL302", rank=1)
    assert row["n_collectives"] == 10 and row["n_last"] == 10 and row["last_pct"] == 100.0
    assert abs(row["wait_caused_ms"] - 10 * 1.5) < 0.01
    (f,) = evaluate(run, RULES["TQL302"]).findings
    assert f.ranks == [1] and "last at 100% of 10 collectives" in f.message


def test_waits_per_waiting_rank_are_unions_and_name_whom_they_waited_for():
    # three ranks; rank 2 is 3 ms late at every call, rank 1 1 ms late: rank 0 waits 3 ms per call for rank 2, rank 1
    # 2 ms; rank 2 waits for nobody
    three = "[0, 1, 2]"
    run = _run(_calls(0, range(5), members=three) + _calls(1, range(5), 1_000_000, three) + _calls(2, range(5), 3_000_000, three))
    w = link.ensure(run, "collective_waits").sort("rank")
    assert w.select("rank", "waited_for", "calls").rows() == [(0, 2, 5), (1, 2, 5)]
    assert abs(w["wait_ms"][0] - 15.0) < 0.01 and abs(w["wait_ms"][1] - 10.0) < 0.01
