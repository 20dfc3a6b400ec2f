"""Work a command no longer repeats on every run, checked by what it leaves behind (never by timing)."""

from __future__ import annotations

from pathlib import Path

from traceql import pipeline
from traceql.rules import sql_guard
from traceql.rules.loader import load_rules

DEMO = Path(__file__).resolve().parents[1] / "samples" / "demo"


def test_the_bundled_pack_reads_a_rule_s_sql_only_where_it_runs():
    sql_rules = [r for r in load_rules() if r.sql]
    sql_guard._plan.cache_clear()
    load_rules()
    assert sql_guard._plan.cache_info().currsize < len(sql_rules) // 2  # the views' statements at most
    res = pipeline.check(DEMO, use_cache=False)
    ran = {r.rule.id for r in res.results if r.status == "ran" and r.rule.sql}
    skipped = {r.rule.id for r in res.results if r.status == "skipped" and r.rule.sql}
    assert ran and skipped  # the demo has no NCCL log and no compile log: their SQL rules do not run
    read = sql_guard._plan.cache_info().currsize
    assert read < len(sql_rules)  # the skipped rules' statements were never read
    # a full validation (`traceql rules check`, a user's pack) guards every statement at load
    sql_guard._plan.cache_clear()
    load_rules(trust_manifest=False)
    assert sql_guard._plan.cache_info().currsize >= len(sql_rules)
