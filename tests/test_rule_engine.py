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
