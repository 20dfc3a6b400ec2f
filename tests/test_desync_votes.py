"""TQL303's majority (its YAML): the value most ranks issue; a tie (two ranks always tie) goes to the value the group
uses most over its whole trace, then to the lowest rank's; with no op or size divergence, the call counts."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from conftest import rule_rows

from traceql.model import Run, conform


def _run(ops_per_rank: dict[int, list[str]], sizes: dict[int, list[int]] | None = None) -> Run:
    rows = []
    for rank, ops in ops_per_rank.items():
        for i, op in enumerate(ops):
            n = (sizes or {}).get(rank, [1024] * len(ops))[i]
            rows.append({"rank": rank, "source": rank, "id": i, "op": op, "pg_name": "0",
                         "pg_ranks": str(sorted(ops_per_rank)), "seq": i + 1, "in_nelems": n, "dtype": "Float",
                         "bytes": 4 * n, "ts": 1_000_000 * (i + 1), "end": 1_000_000 * (i + 1) + 500_000})
    run = Run(path=Path("."), sources=[])
    run.tables["collectives"] = conform("collectives", pl.DataFrame(rows))
    return run


def test_a_two_rank_tie_goes_to_the_op_the_group_uses_most():
    # rank 0 issues broadcast at seq 3 where rank 1 all_reduces: 1 against 1, but the group all_reduces 7 times of 8
    ar = ["all_reduce"] * 4
    for odd in (0, 1):
        ops = {r: list(ar) for r in (0, 1)}
        ops[odd][2] = "broadcast"
        (row,) = rule_rows(_run(ops), "TQL303")
        assert (row["kind"], row["seq"], row["odd_ranks"], row["majority"], row["odd_value"]) == (
            "op", 3, [odd], "all_reduce", "broadcast")


def test_a_full_tie_goes_to_the_lowest_rank():
    # two ranks, each value used as often over the trace: rank 0's value is the majority
    (row,) = rule_rows(_run({0: ["all_gather"], 1: ["all_reduce"]}), "TQL303")
    assert row["majority"] == "all_gather" and row["odd_ranks"] == [1] and row["majority_ranks"] == [0]


def test_the_first_divergent_call_is_reported_op_before_size():
    ops = {r: ["all_reduce"] * 5 for r in range(3)}
    ops[2][3] = "all_gather"
    sizes = {r: [1024] * 5 for r in range(3)}
    sizes[1][1] = 2048  # earlier: a size divergence at seq 2 comes first
    sizes[2][3] = 4096  # and at seq 4 rank 2 differs in op and size: op is named
    (row,) = rule_rows(_run(ops, sizes), "TQL303")
    assert (row["kind"], row["seq"], row["odd_ranks"], row["majority"], row["odd_value"]) == (
        "size", 2, [1], "4096 B Float", "8192 B Float")
    sizes[1][1] = 1024
    (row,) = rule_rows(_run(ops, sizes), "TQL303")
    assert (row["kind"], row["seq"], row["odd_ranks"], row["majority_ranks"]) == ("op", 4, [2], [0, 1])


def test_ranks_that_agree_on_every_call_but_make_fewer_differ_in_count():
    ops = {0: ["all_reduce"] * 6, 1: ["all_reduce"] * 6, 2: ["all_reduce"] * 4}
    (row,) = rule_rows(_run(ops), "TQL303")
    assert (row["kind"], row["seq"], row["odd_ranks"], row["majority"], row["odd_value"], row["n_ranks"]) == (
        "count", 4, [2], "6", "4", 3)
    assert rule_rows(_run({0: ["all_reduce"] * 3, 1: ["all_reduce"] * 3}), "TQL303") == []
