"""Rule SQL and `traceql query` read only the run's tables: polars' file-reading table functions are refused before
polars sees the statement, and no output or error carries the content of the file they named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import main
from traceql.rules import sql_guard
from traceql.rules.loader import RuleError, load_rule, load_rules

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"
SECRET = "tq-secret-7f3a9c"  # written into a private file; must never appear in any output

TABLES = {"kernels", "host_ops", "collectives", "steps"}

ATTEMPTS = [
    "SELECT * FROM read_csv('{f}')",
    "select * from READ_CSV('{f}')",
    "SELECT * FROM \"read_csv\"('{f}')",
    "SELECT * FROM `read_csv`('{f}')",
    "SELECT * FROM /* x */ read_csv /* y */ ('{f}')",
    "SELECT * FROM read_csv -- c\n ('{f}')",
    "SELECT * FROM read_csv('{f}', has_header => false)",
    "SELECT * FROM kernels, read_csv('{f}', has_header => false)",
    "SELECT * FROM kernels k JOIN read_csv('{f}', has_header => false) r ON true",
    "SELECT * FROM (read_csv('{f}', has_header => false))",
    "SELECT * FROM kernels WHERE rank IN (SELECT 1 FROM read_csv('{f}', has_header => false))",
    "WITH x AS (SELECT * FROM read_csv('{f}', has_header => false)) SELECT * FROM x",
    "SELECT * FROM read_parquet('{f}')",
    "SELECT * FROM read_ipc('{f}')",
    "SELECT * FROM read_json('{f}')",
    "SELECT * FROM read_ndjson('{f}')",
    "SELECT * FROM scan_csv('{f}')",
    "SELECT E'\\'' AS a FROM read_csv('{f}', has_header => false) --'",
    "CREATE TABLE t AS SELECT * FROM read_csv('{f}', has_header => false)",
    "SELECT * FROM kernels; SELECT * FROM read_csv('{f}', has_header => false)",
]


@pytest.fixture
def secret_file(tmp_path) -> Path:
    p = tmp_path / "private.csv"
    p.write_text(f"name\n{SECRET}\n{SECRET}-2\n")
    return p


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_guard_refuses_every_file_read(attempt, secret_file):
    with pytest.raises(sql_guard.SqlRefused) as e:
        sql_guard.check(attempt.format(f=secret_file), TABLES)
    msg = str(e.value)
    assert SECRET not in msg and "\n" not in msg


def test_unguarded_polars_would_read_the_file(secret_file):
    """The attack is real: polars itself runs the statement the guard refuses."""
    import polars as pl

    out = pl.SQLContext(frames={"kernels": pl.DataFrame({"a": [1]})}).execute(
        f"SELECT * FROM read_csv('{secret_file}')", eager=True)
    assert SECRET in out.to_series(0).to_list()


@pytest.mark.parametrize("sql", [
    "SELECT rank, count(*) AS n FROM kernels GROUP BY rank",
    "SELECT * FROM (kernels)",
    "SELECT * FROM ((SELECT * FROM kernels))",
    "SELECT k.name FROM kernels AS k JOIN steps s ON k.rank = s.rank, host_ops h",
    "WITH a AS (SELECT * FROM kernels), b(x) AS (SELECT 1) SELECT * FROM a, b",
    "SELECT extract(year FROM current_date) AS y, substring('abc' FROM 1 FOR 2) AS s FROM kernels",
    "SELECT 1 AS x FROM kernels WHERE rank IS DISTINCT FROM 2",
    "SELECT 'read_csv(x)' AS s FROM kernels".replace("read_csv(x)", "from read csv"),
    "SELECT * FROM unnest([1, 2]) AS t(x)",
    "SELECT * FROM (VALUES (1, 2)) AS t(a, b)",
    "SELECT \"name\" FROM \"kernels\" -- trailing comment",
    "SELECT name FROM KERNELS /* nested /* comment */ here */;",
])
def test_guard_passes_queries_over_the_run_tables(sql):
    sql_guard.check(sql, TABLES)


@pytest.mark.parametrize("sql,why", [
    ("SELECT * FROM passwd", "unknown table"),
    ("SELECT * FROM public.kernels", "qualified"),
    ("SHOW TABLES", "only SELECT"),
    ("SELECT * FROM kernels WHERE name = 'x", "unterminated"),
    ("SELECT * FROM kernels /* x", "unterminated"),
    ("SELECT * FROM kernels, some_function('x')", "table function"),
])
def test_guard_refuses_other_shapes(sql, why):
    with pytest.raises(sql_guard.SqlRefused, match=why):
        sql_guard.check(sql, TABLES)


def _rule_yaml(sql: str) -> str:
    body = "\n".join("  " + line for line in sql.splitlines())
    return (
        "id: TQL990\nname: leak-a-file\nseverity: error\nsummary: reads a private file\n"
        "message: 'leaked {name}'\nevidence: [name]\nsql: |\n" + body + "\ncross_rank: true\n"
        "docs: {why: x, fix: y}\n"
    )


def test_rule_file_with_read_csv_is_refused_at_load(tmp_path, secret_file):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "TQL990-leak.yaml").write_text(_rule_yaml(f"SELECT * FROM read_csv('{secret_file}', has_header => false)"))
    with pytest.raises(RuleError) as e:
        load_rules([rules])
    assert "TQL990-leak.yaml" in str(e.value) and "field 'sql'" in str(e.value)
    assert SECRET not in str(e.value)


def test_check_with_hostile_rule_never_reports_the_file(tmp_path, secret_file):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "TQL990-leak.yaml").write_text(_rule_yaml(f"SELECT * FROM read_csv('{secret_file}', has_header => false)"))
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    for fmt in ("text", "sarif", "json"):
        r = CliRunner().invoke(main, ["check", str(run), "--rules", str(rules), "--format", fmt, "--no-cache", "-q"])
        assert r.exit_code == 2, r.output  # a broken rule file is configuration (exit 2), refused before any source is read
        assert SECRET not in r.output
        assert "field 'sql'" in r.output


def test_engine_refuses_a_rule_that_skipped_the_loader(tmp_path, secret_file):
    """A Rule built in code (not from a file) is checked again at run time, with the run's table names."""
    from traceql import pipeline
    from traceql.rules.engine import evaluate

    good = REPO / "rules"
    rule = load_rule(next(p for p in sorted(good.glob("TQL*.yaml")) if "sql:" in p.read_text()))
    rule.sql = f"SELECT * FROM read_csv('{secret_file}', has_header => false)"
    run = pipeline.load_run(DEMO, use_cache=False)
    res = evaluate(run, rule)
    assert res.status == "error" and "read_csv" in res.reason and SECRET not in res.reason
    rule.sql = "SELECT * FROM secrets"
    res = evaluate(run, rule)
    assert res.status == "error" and "unknown table" in res.reason


@pytest.mark.parametrize("attempt", ATTEMPTS[:12])
def test_query_command_refuses_and_echoes_nothing(attempt, secret_file):
    r = CliRunner().invoke(main, ["query", str(DEMO), attempt.format(f=secret_file), "--no-cache"])
    assert r.exit_code != 0
    assert SECRET not in r.output
    assert "refused" in r.output


def test_query_command_still_answers(tmp_path):
    r = CliRunner().invoke(main, ["query", str(DEMO), "SELECT rank, count(*) AS n FROM kernels GROUP BY rank ORDER BY rank",
                                  "--format", "csv", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "rank,n" and len(r.output.splitlines()) == 3
