"""sql_guard reads a statement once per process, and still checks every statement where it runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from traceql.rules import sql_guard
from traceql.rules.loader import load_rules, views_of

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"


def refusal(fn, *a):
    try:
        return fn(*a)
    except sql_guard.SqlRefused as e:
        return ("refused", str(e))


def test_a_statement_is_read_once_and_checked_against_each_call_s_tables():
    sql = "WITH w AS (SELECT * FROM kernels) SELECT * FROM w JOIN steps USING (rank) -- memo test"
    sql_guard._plan.cache_clear()
    sql_guard.check(sql, {"kernels", "steps"})
    found: set[str] = set()
    sql_guard.check(sql, None, found)  # the same text: no second reading, and found still filled
    assert found == {"kernels", "steps"}
    assert sql_guard._plan.cache_info().misses == 1 and sql_guard._plan.cache_info().hits == 1
    with pytest.raises(sql_guard.SqlRefused, match="unknown table 'steps'"):
        sql_guard.check(sql, {"kernels"})  # the memo holds the reading, never an earlier call's verdict
    bad = "SELECT * FROM read_csv('x')"
    for _ in range(2):  # a refusal is remembered as one, not as a pass
        with pytest.raises(sql_guard.SqlRefused, match="read_csv"):
            sql_guard.check(bad)


def test_the_first_problem_in_statement_order_is_reported():
    sql = "SELECT * FROM nope, kernels JOIN gen ('x') ON true"
    # unknown table before the table function: as if the statement were read again
    with pytest.raises(sql_guard.SqlRefused, match="unknown table 'nope'"):
        sql_guard.check(sql, {"kernels"})
    with pytest.raises(sql_guard.SqlRefused, match="table function gen"):
        sql_guard.check(sql, {"kernels", "nope"})


def test_the_engine_checks_a_vouched_rule_s_sql_where_it_runs():
    """A rule loaded through the manifest runs its SQL only through the guard (a swap after load is refused)."""
    from traceql import pipeline
    from traceql.rules.engine import evaluate

    rule = next(r for r in load_rules() if r.sql)
    rule.sql = "SELECT * FROM read_csv('/etc/hostname')"
    res = evaluate(pipeline.load_run(DEMO, use_cache=False), rule)
    assert res.status == "error" and "read_csv" in res.reason


def test_a_view_is_checked_where_it_runs():
    from traceql import pipeline
    from traceql.rules.views import frame

    views = dict(views_of([REPO / "rules"]))
    name = "runtime_kernels"
    v = views[name]
    hostile = type(v)(v.name, "SELECT * FROM read_csv('/etc/hostname')", v.doc, v.path, v.columns, v.reads)
    views[name] = hostile
    with pytest.raises(sql_guard.SqlRefused, match="read_csv"):
        frame(pipeline.load_run(DEMO, use_cache=False), name, views)


_PIECES = list("ab eExXnN$_'\"`-/*;(),.19\n\t\u00a0") + ["--", "/*", "*/", "$$", "$a$", "''", '""', "select", "from"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=16).map("".join))
def test_the_fast_tokenizer_gives_the_loop_s_tokens(text):
    assert refusal(sql_guard._tokenize, text) == refusal(sql_guard._tokenize_loop, text)


def test_the_fast_tokenizer_gives_the_loop_s_tokens_on_the_rule_pack():
    texts = [r.sql for r in load_rules() if r.sql] + [v.sql for v in views_of([REPO / "rules"]).values()]
    assert len(texts) > 20
    for t in texts:
        assert sql_guard._tokenize(t) == sql_guard._tokenize_loop(t)


@pytest.mark.parametrize("sql,why", [
    ("WITH a AS (SELECT 1) SELECT * FROM a, generate_series(1,2)", "generate_series"),
    ("WITH a AS (SELECT 1) SELECT * FROM a JOIN b.c ON true", "qualified table name"),
])
def test_a_refusal_after_a_cte_names_its_real_reason_not_the_cte(sql, why):
    with pytest.raises(sql_guard.SqlRefused) as e:
        sql_guard.check(sql, {"runtime"})
    assert why in str(e.value) and "unknown table 'a'" not in str(e.value)
