"""TQL303 judges only sequences it can trust: a group the traces name, or a run whose traces say it has one group."""

from __future__ import annotations


from tests.conftest import FIXTURES, rule_rows

from traceql.pipeline import load_run
from traceql.rules.engine import evaluate
from traceql.rules.loader import load_rules

TQL303 = next(r for r in load_rules() if r.id == "TQL303")


def test_planted_desync_on_a_single_group_run_is_trusted():
    run = load_run(FIXTURES / "cpu-desync")
    (row,) = rule_rows(run, "TQL303")
    assert row["identity"] == "single group"  # the gloo traces carry no group names, but pg_config lists one group
    res = evaluate(run, TQL303)
    assert [f.ranks for f in res.findings] == [[1]]


def test_sampled_ranks_of_a_multi_group_job_are_not_called_desynced(corpus):
    d = corpus / "hta" / "tests" / "data" / "trace_filter"  # 2 of 128 ranks; all_to_all and all_reduce groups, unnamed
    run = load_run(d)
    rows = rule_rows(run, "TQL303")
    assert rows and {r["identity"] for r in rows} == {"assumed"}
    assert evaluate(run, TQL303).findings == []
    trusting = evaluate(run, TQL303, {"trust_assumed_groups": True})
    assert trusting.findings, "the divergence is still computed and can be asked for"
