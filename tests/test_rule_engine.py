"""Rule files are validated with errors naming file and field; conditions and messages never execute input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl
import pytest

from traceql.model import Run
from traceql.rules.condition import ConditionError, compile_condition
from traceql.rules.engine import evaluate
from traceql.rules.loader import RuleError, load_rule, load_rules

GOOD = """
id: TQL999
name: test-rule
severity: warning
summary: test
params: {limit: {default: 2, doc: d}}
select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}
condition: "n >= limit"
message: "rank {rank}: {n} comm kernels"
evidence: [n]
docs: {why: w, fix: f}
"""


def write(tmp_path: Path, text: str, name="TQL999-test-rule.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def run_with_kernels(kinds_by_rank: dict[int, list[str]]) -> Run:
    rows = [(r, k) for r, ks in kinds_by_rank.items() for k in ks]
    df = pl.DataFrame({"rank": [r for r, _ in rows], "kind": [k for _, k in rows], "ts": list(range(len(rows))), "end": list(range(1, len(rows) + 1))})
    from traceql.model import conform

    return Run(path=Path("."), tables={"kernels": conform("kernels", df)})


def test_the_bundled_pack_loads_and_every_rule_has_docs():
    rules = load_rules()
    assert rules, "no rules bundled"
    for r in rules:
        assert r.docs.get("why") and r.docs.get("fix"), r.id
        assert r.docs.get("references"), f"{r.id} has no references"


@pytest.mark.parametrize(
    "patch,field",
    [
        (("severity: warning", "severity: fatal"), "severity"),
        (("id: TQL999", "id: X1"), "id"),
        (("measure: count", "measure: magic"), "select.measure"),
        (("where: {kind: comm}", "where: {kind: {like: comm}}"), "select.where.kind"),
        (("docs: {why: w, fix: f}", "docs: {why: w}"), "docs"),
        (("summary: test", "summary: test\nexec: rm -rf /"), "exec"),
    ],
)
def test_invalid_rule_names_file_and_field(tmp_path, patch, field):
    p = write(tmp_path, GOOD.replace(*patch))
    with pytest.raises(RuleError) as e:
        load_rule(p)
    assert str(p) in str(e.value) and f"'{field}'" in str(e.value)


def test_yaml_tags_are_not_constructed(tmp_path):
    p = write(tmp_path, GOOD + "\ntags: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RuleError, match="not valid YAML"):
        load_rule(p)


def test_rule_fires_per_rank_with_param_override(tmp_path):
    rule = load_rule(write(tmp_path, GOOD))
    run = run_with_kernels({0: ["comm", "comm", "compute"], 1: ["comm"]})
    res = evaluate(run, rule)
    assert res.status == "ran"
    assert [(f.ranks, f.message) for f in res.findings] == [([0], "rank 0: 2 comm kernels")]
    res = evaluate(run, rule, {"limit": 1})
    assert sorted(f.ranks[0] for f in res.findings) == [0, 1]


def test_rule_skips_with_reason_when_its_table_is_missing(tmp_path):
    rule = load_rule(write(tmp_path, GOOD.replace("summary: test", "summary: test\nneeds: [kernels]")))
    res = evaluate(Run(path=Path(".")), rule)
    assert res.status == "skipped" and "kernels" in res.reason


def test_sql_rule_runs_per_rank(tmp_path):
    text = GOOD.replace(
        "select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
        "sql: \"SELECT count(*) AS n, count(DISTINCT rank) AS ranks_seen FROM kernels WHERE kind = 'comm'\"",
    ).replace("evidence: [n]", "evidence: [n, ranks_seen]")
    rule = load_rule(write(tmp_path, text))
    res = evaluate(run_with_kernels({0: ["comm", "comm"], 1: ["comm", "comm", "comm"]}), rule)
    got = {f.ranks[0]: f.evidence for f in res.findings}
    assert got == {0: {"n": 2, "ranks_seen": 1}, 1: {"n": 3, "ranks_seen": 1}}


@pytest.mark.parametrize("cond", ["__import__('os').system('x')", "n.__class__", "[x for x in n]", "lambda: 1", "open('f')"])
def test_conditions_refuse_anything_but_the_grammar(cond):
    with pytest.raises(ConditionError):
        compile_condition(cond, {}, ["n"])


def test_condition_grammar():
    df = pl.DataFrame({"a": [1, 5, None], "s": ["x", "y", "z"]})
    e = compile_condition("a is not null and (a * 2 >= lim or s in ['x'])", {"lim": 10}, df.columns)
    assert df.filter(e)["a"].to_list() == [1, 5]


def test_message_template_cannot_reach_attributes(tmp_path):
    # refused at load now (before any run), naming the file and the field
    with pytest.raises(RuleError, match=r"TQL999-test-rule.yaml: field 'message': .*attribute and index access"):
        load_rule(write(tmp_path, GOOD.replace('"rank {rank}: {n} comm kernels"', '"{rank.__class__}"')))


def test_split_ctes_gives_up_on_an_unterminated_comment():
    from traceql.rules.engine import split_ctes

    # the character scan used to loop forever here (the comment opener matched nothing and the scan stood still)
    assert split_ctes("WITH a AS (SELECT 1 /* no end") is None
    assert split_ctes("WITH a AS (SELECT ')' AS x /* ) */ -- )\n), b AS (SELECT (1) FROM a) SELECT * FROM b") == (
        [("a", "SELECT ')' AS x /* ) */ -- )\n"), ("b", "SELECT (1) FROM a")], "SELECT * FROM b")


def _per_rank_one_by_one(run, rule):
    """The per-rank SQL as it ran before the batches: each rank's partition on its own, in rank order."""
    from traceql import link
    from traceql.rules import engine

    names = [n for n in sorted(set(run.tables) | set(link.derived_tables()) | set(rule.views or {}))
             if n.lower() in engine.sql_guard.read_tables(rule.sql)]
    frames = {n: engine.table(run, n, rule.views) for n in names}
    ranks = sorted({r for df in frames.values() if "rank" in df.columns for r in df["rank"].drop_nulls().unique().to_list()})
    outs = []
    for r in ranks:
        part = {n: (df.lazy().filter(pl.col("rank") == r) if "rank" in df.columns else df.lazy()) for n, df in frames.items()}
        res = engine.execute_sql(pl.SQLContext(frames=part), rule.sql)
        if res.height:
            outs.append(res if "rank" in res.columns else res.with_columns(pl.lit(r, pl.Int32).alias("rank")))
    return pl.concat(outs, how="diagonal_relaxed") if outs else pl.DataFrame()


@pytest.mark.parametrize("fixture", ["cpu8-straggler", "cpu8-desync", "h200x2-straggler"])
def test_per_rank_sql_in_batches_gives_each_ranks_own_rows(fixture, monkeypatch):
    """Every per-rank SQL rule of the pack: the ranks run together (collect_all, batches of 3 here, so that batches
    split the ranks) and give the rows each rank's partition gives run alone (a filter, not the cached slices)."""
    from traceql import pipeline
    from traceql.rules import engine

    monkeypatch.setattr(engine, "RANK_BATCH", 3)
    run = pipeline.load_run(Path(__file__).resolve().parents[1] / "fixtures" / fixture)
    checked = []
    for rule in load_rules():
        if not rule.sql or rule.cross_rank or not all(run.has(t) or t in run.tables for t in rule.needs or []):
            continue
        try:
            want = _per_rank_one_by_one(run, rule)
        except pl.exceptions.PolarsError:
            continue  # the rule's tables are not in this run
        got = engine._sql(run, rule)
        # as multisets of rows: a GROUP BY without ORDER BY has no row order, run alone or not
        assert got.columns == want.columns and sorted(map(repr, got.rows())) == sorted(map(repr, want.rows())), rule.id
        checked.append(got.height)
    assert len(checked) >= 5 and any(checked), checked


def test_a_per_rank_sql_rule_failing_on_one_rank_is_an_error_and_the_others_run(tmp_path):
    from traceql.rules.engine import run_rules

    bad = GOOD.replace(
        "select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
        # rank 1's rows hold a kind that is not a number: the cast fails in its partition only
        "sql: \"SELECT count(*) AS n FROM kernels WHERE CAST(CASE WHEN rank = 1 THEN kind ELSE '1' END AS INT) > 0\"",
    )
    good = load_rule(write(tmp_path, GOOD))
    broken = load_rule(write(tmp_path, bad.replace("TQL999", "TQL998"), "TQL998-test-rule.yaml"))
    res = run_rules(run_with_kernels({0: ["comm", "comm"], 1: ["comm", "comm"], 2: ["comm", "comm"]}), [broken, good])
    assert res[0].status == "error" and "TQL998-test-rule.yaml" in res[0].reason
    assert res[1].status == "ran" and sorted(f.ranks[0] for f in res[1].findings) == [0, 1, 2]


def _sql_rule(tmp_path, rid: str, sql: str, cross: bool = False, validate: bool = True):
    from traceql.rules.loader import load_yaml, parse_rule

    text = GOOD.replace("TQL999", rid).replace(
        "select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
        f"sql: \"{sql}\"" + ("\ncross_rank: true" if cross else ""))
    p = write(tmp_path, text, f"{rid}-test-rule.yaml")
    return load_rule(p) if validate else parse_rule(load_yaml(p), p, validate=False)


@pytest.mark.parametrize("where", ["plan", "collect"])
def test_a_sql_rule_failing_beside_others_gets_its_own_error_and_the_others_their_findings(tmp_path, where, monkeypatch):
    """SQL rules over small tables run side by side (one collect_all per step of every rule): a rule whose plan (an
    unknown column) or whose rows (a cast that fails in its second CTE) fail runs again alone, with the error it gets
    alone, and the rules beside it give the findings they give alone."""
    from traceql.rules.engine import run_rules

    bad_sql = ("WITH a AS (SELECT rank, kind FROM kernels), b AS (SELECT rank, CAST(kind AS INT) AS k FROM a) "
               "SELECT rank, count(*) AS n FROM b GROUP BY rank") if where == "collect" else \
        "SELECT rank, count(no_such_column) AS n FROM kernels GROUP BY rank"
    rules = [
        _sql_rule(tmp_path, "TQL991", "WITH c AS (SELECT rank, kind FROM kernels WHERE kind = 'comm') "
                                      "SELECT rank, count(*) AS n FROM c GROUP BY rank ORDER BY rank"),
        _sql_rule(tmp_path, "TQL992", bad_sql, validate=where == "collect"),  # load would refuse the unknown column
        _sql_rule(tmp_path, "TQL993", "WITH c AS (SELECT rank FROM kernels), d AS (SELECT rank FROM c) "
                                      "SELECT rank, count(*) AS n FROM d GROUP BY rank ORDER BY rank", cross=True),
        load_rule(write(tmp_path, GOOD)),
    ]
    run = run_with_kernels({0: ["comm", "comm", "compute"], 1: ["comm", "comm"], 2: ["compute"]})
    from traceql.rules import engine

    seen = []
    side_by_side = engine._run_side_by_side

    def spy(jobs):
        side_by_side(jobs)
        seen.extend(j.failed for j in jobs)

    monkeypatch.setattr(engine, "_run_side_by_side", spy)
    together = run_rules(run, rules)
    assert seen == [False, True, False]  # the three SQL rules ran side by side, and the broken one failed there
    alone = [evaluate(run, r) for r in rules]
    # polars names the first chunk a cast failed in, which its threads make vary from run to run ("for 3 out of 3
    # values" or "for 2 out of 2"): the reasons are compared up to it
    def said(r):
        return r.status, r.reason.split(" for ")[0]

    assert [said(r) for r in together] == [said(r) for r in alone]
    assert together[1].status == "error" and "TQL992-test-rule.yaml" in together[1].reason
    for t, a in zip(together, alone):
        assert [(f.ranks, f.message, f.evidence) for f in t.findings] == [(f.ranks, f.message, f.evidence) for f in a.findings]
    assert [f.ranks for f in together[0].findings] == [[0], [1]]
    assert [f.ranks for f in together[2].findings] == [[0], [1]]  # n >= 2: rank 2 has one kernel


def test_cte_steps_run_independent_ctes_together_and_keep_text_order_where_names_meet():
    from traceql.rules.engine import cte_steps

    q = "WITH a AS (SELECT 1 AS x), b AS (SELECT 2 AS x), c AS (SELECT * FROM a JOIN b USING (x)) SELECT * FROM c"
    assert [[n for n, _ in s] for s in cte_steps(q)] == [["a", "b"], ["c"], [None]]
    # b shadows the table kernels that a reads: a must run first, or it would read b's rows
    q = "WITH a AS (SELECT * FROM kernels), kernels AS (SELECT 1 AS x) SELECT * FROM a, kernels"
    assert [[n for n, _ in s] for s in cte_steps(q)] == [["a"], ["kernels"], [None]]
    # one name twice: the later definition wins, as run one by one
    q = "WITH a AS (SELECT 1 AS x), a AS (SELECT 2 AS x) SELECT * FROM a"
    assert [[n for n, _ in s] for s in cte_steps(q)] == [["a"], ["a"], [None]]
    assert cte_steps("SELECT 1 AS x") == (((None, "SELECT 1 AS x"),),)


def _rows(df: pl.DataFrame) -> list[str]:
    """The rows as a multiset, floats to 12 significant digits: polars' threads may sum a group in another order."""
    def norm(v):
        return float(f"{v:.12g}") if isinstance(v, float) else [norm(x) for x in v] if isinstance(v, list) else v

    return sorted(repr([norm(v) for v in row]) for row in df.rows())


def _one_by_one(ctx: pl.SQLContext, query: str) -> pl.DataFrame:
    """A statement's CTEs run one by one in text order, each registered for the next: the order before steps."""
    from traceql.rules.engine import split_ctes

    parts = split_ctes(query)
    if parts is None:
        return ctx.execute(query, eager=False).collect()
    for name, body in parts[0]:
        ctx.register(name, ctx.execute(body, eager=False).collect())
    return ctx.execute(parts[1], eager=False).collect()


@pytest.mark.parametrize("fixture", ["cpu8-desync", "h200x2-straggler"])
def test_every_pack_statement_gives_by_steps_what_it_gives_cte_by_cte(fixture):
    from traceql import link, pipeline
    from traceql.rules import engine

    run = pipeline.load_run(Path(__file__).resolve().parents[1] / "fixtures" / fixture)
    checked = 0
    for rule in load_rules():
        if not rule.sql or engine.split_ctes(rule.sql) is None:
            continue
        names = [n for n in sorted(set(run.tables) | set(link.derived_tables()) | set(rule.views or {}))
                 if n.lower() in engine.sql_guard.read_tables(rule.sql)]
        try:
            frames = {n: engine.table(run, n, rule.views) for n in names}
            want = _one_by_one(pl.SQLContext(frames=frames), rule.sql)
        except pl.exceptions.PolarsError:
            continue  # the rule's tables are not in this run
        got = engine.execute_sql(pl.SQLContext(frames=frames), rule.sql)
        assert got.columns == want.columns and _rows(got) == _rows(want), rule.id
        checked += 1
    assert checked >= 10, checked


@pytest.mark.parametrize("fixture,batch_rows", [("cpu8-desync", None), ("h200x2-straggler", None), ("cpu8-desync", 0)])
def test_the_pack_side_by_side_gives_what_each_rule_gives_alone(fixture, batch_rows, monkeypatch):
    """run_rules holds the SQL rules back and runs them side by side (or, over tables above BATCH_ROWS, one by one from
    the job it prepared); each rule evaluated on its own must give the same status, reason and findings (messages,
    evidence), in the same order."""
    from traceql import pipeline
    from traceql.rules import engine
    from traceql.rules.engine import run_rules

    if batch_rows is not None:
        monkeypatch.setattr(engine, "BATCH_ROWS", batch_rows)
    rules = load_rules()
    run = pipeline.load_run(Path(__file__).resolve().parents[1] / "fixtures" / fixture)
    together = run_rules(run, rules)
    alone = [evaluate(run, r) for r in rules]

    def seen(res):
        return [(r.rule.id, r.status, r.reason, [(f.ranks, f.step, f.message, f.evidence) for f in r.findings])
                for r in res]

    assert seen(together) == seen(alone)
    assert sum(1 for r in together if r.rule.sql and r.status == "ran") >= 8
    assert any(r.findings for r in together if r.rule.sql)


def test_a_kept_condition_is_never_used_where_its_names_or_params_differ():
    df = pl.DataFrame({"n": [1, 2, 3], "m": [3, 2, 1]})
    assert df.filter(compile_condition("n >= limit", {"limit": 2}, ["n", "m"]))["n"].to_list() == [2, 3]
    assert df.filter(compile_condition("n >= limit", {"limit": 3}, ["n", "m"]))["n"].to_list() == [3]
    # True and 1 hash alike; they compile to different literals
    assert compile_condition("flag", {"flag": True}, []).meta.serialize(format="json") != \
        compile_condition("flag", {"flag": 1}, []).meta.serialize(format="json")
    # "m" is a column here and a param there
    assert df.filter(compile_condition("n >= m", {}, ["n", "m"]))["n"].to_list() == [2, 3]
    assert df.filter(compile_condition("n >= m", {"m": 3}, ["n", "m"]))["n"].to_list() == [3]
    # compiled once against columns that have "m": a frame without it still gets its own error
    with pytest.raises(ConditionError, match="unknown name 'm'"):
        compile_condition("n >= m", {}, ["n", "x"])
