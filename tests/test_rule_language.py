"""The rule language: composable stages (compute, filter, steps, across_ranks, join), named views, and the checks a
rule file passes at load (tables, columns, message fields, evidence, keys), each failing with one line that names
the file and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl
import pytest

from traceql.model import Run, conform
from traceql.pipeline import load_run
from traceql.rules import compose
from traceql.rules.engine import evaluate, run_select
from traceql.rules.loader import RuleError, default_rules_dir, load_rule, load_rules, views_of
from traceql.rules.views import frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

BASE = """
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


def write(d: Path, text: str, name="TQL999-test-rule.yaml") -> Path:
    p = d / name
    p.write_text(textwrap.dedent(text))
    return p


# ---------------------------------------------------------------- stages


def _per_step() -> pl.DataFrame:
    # rank 0: steps 1..5 with a = step; rank 1: steps 1..5 with a = 10 * step (the worst step is the last)
    rows = [(r, s, float(s * (10 if r else 1)), "x" if s < 4 else "y") for r in (0, 1) for s in range(1, 6)]
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int64, "a": pl.Float64, "t": pl.Utf8}, orient="row")


def test_compute_uses_columns_params_and_earlier_computed_columns():
    df = _per_step()
    out = compose.compute(df, {"b": "a * k", "c": "when(b > 10, b - 10, null)", "d": "coalesce(c, 0.0)"}, {"k": 3})
    want_b = df["a"] * 3
    assert out["b"].to_list() == want_b.to_list()
    assert out["d"].to_list() == [(b - 10) if b > 10 else 0.0 for b in want_b]
    assert out["c"].null_count() == sum(1 for b in want_b if b <= 10)


def test_compute_names_the_column_it_cannot_find():
    with pytest.raises(compose.StageError, match=r"compute\.b: .*unknown name 'nope'"):
        compose.compute(_per_step(), {"b": "nope + 1"}, {})


def test_steps_median_skips_first_and_warmup_steps():
    df = _per_step()
    warm = pl.DataFrame({"rank": [0], "source": [0], "step": [5]}, schema={"rank": pl.Int32, "source": pl.Int32, "step": pl.Int64})
    out = compose.steps(df, {"skip_first": 1, "skip_warmup": True, "agg": "median", "of": "a"}, warm)
    r0, r1 = out.sort("rank").iter_rows(named=True)
    assert r0["n_steps"] == 3 and r0["a"] == pl.Series([2.0, 3.0, 4.0]).median()  # steps 2-4 (1 first, 5 warm-up)
    assert r1["n_steps"] == 4 and r1["a"] == pl.Series([20.0, 30.0, 40.0, 50.0]).median()
    assert r1["a_worst"] == 50.0 and r0["a_worst"] == 4.0
    assert r0["t"] == "x"  # the most frequent text of the steps judged (2, 3 are x; 4 is y)
    assert "step" not in out.columns


def test_steps_keep_warmup_steps_when_they_are_all_a_rank_has():
    df = _per_step().filter(pl.col("rank") == 0)
    warm = df.select("rank", pl.lit(0, pl.Int32).alias("source"), "step")
    out = compose.steps(df, {"skip_warmup": True, "agg": "sum"}, warm)
    assert out["n_steps"].to_list() == [5] and out["a"].to_list() == [df["a"].sum()]


def test_steps_worst_keeps_that_rows_step():
    out = compose.steps(_per_step(), {"agg": "worst", "of": "a"}, None).sort("rank")
    assert out["step"].to_list() == [5, 5] and out["a"].to_list() == [5.0, 50.0]
    assert out["n_steps"].to_list() == [5, 5]


def test_across_ranks_names_the_minority_and_what_differs():
    df = pl.DataFrame({"rank": [0, 1, 2, 3], "cid": ["0/0"] * 4, "shape": ["f32[4]", "f32[4]", "f32[8]", "f32[4]"],
                       "dev": ["cuda:0", "cuda:0", "cuda:0", "cuda:1"], "ms": [1.0, 2.0, 3.0, 4.0]},
                      schema_overrides={"rank": pl.Int32})
    one = compose.across_ranks(df, {"key": ["cid"], "value": "shape"})
    assert one["rank"].to_list() == [2] and one["majority"].to_list() == ["f32[4]"] and one["value"].to_list() == ["f32[8]"]
    assert one["majority_ranks"].to_list() == [[0, 1, 3]] and one["ms"].to_list() == [3.0]  # the rank's own row kept
    two = compose.across_ranks(df, {"key": ["cid"], "value": ["shape", "dev"]}).sort("rank")
    assert two["rank"].to_list() == [2, 3]
    assert two["differs"].to_list() == ["shape", "dev"]


def test_join_prefixes_keeps_step_ms_once_and_honours_how():
    left = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "x": [1.0, 2.0], "step_ms": [10.0, 20.0]}, schema_overrides={"rank": pl.Int32})
    right = pl.DataFrame({"rank": [0], "step": [2], "x": [5.0], "step_ms": [20.0]}, schema_overrides={"rank": pl.Int64})
    out = compose.join(left, right, ["rank", "step"], "left", {"right": "w_"})
    assert out.columns == ["rank", "step", "x", "step_ms", "w_x"]
    assert out["w_x"].to_list() == [None, 5.0]
    assert compose.join(left, right, ["rank", "step"], "inner", None)["x_right"].to_list() == [5.0]
    with pytest.raises(compose.StageError, match="how 'outer'"):
        compose.join(left, right, ["rank", "step"], "outer", None)


# ---------------------------------------------------------------- composed rules on data


def _kernels_run() -> Run:
    # rank 0: one comm kernel per step [0, 4) ms of each 10 ms step, compute [2, 10); rank 1 the same with no compute
    k, st = [], []
    for r in (0, 1):
        for s in range(4):
            t0 = s * 10_000_000
            st.append({"rank": r, "source": r, "step": s, "ts": t0, "end": t0 + 10_000_000})
            k.append({"rank": r, "source": r, "kind": "comm", "name": "nccl", "step": s, "ts": t0, "end": t0 + 4_000_000})
            if r == 0:
                k.append({"rank": r, "source": r, "kind": "compute", "name": "gemm", "step": s, "ts": t0 + 2_000_000, "end": t0 + 10_000_000})
    return Run(path=Path("."), tables={"kernels": conform("kernels", pl.DataFrame(k)), "steps": conform("steps", pl.DataFrame(st))})


def test_a_join_with_compute_and_a_window_evaluates(tmp_path):
    p = write(tmp_path, BASE.replace(
        "select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
        """select:
          measure: join
          left: {measure: exposed, table: kernels, where: {kind: comm}, against: {table: kernels, where: {kind: compute}}, per: [rank, step]}
          right: {measure: count, table: kernels, per: [rank, step]}
          prefix: {right: all_}
          compute: {share: "100.0 * exposed_ms / step_ms"}
          steps: {agg: median, of: share}""").replace('condition: "n >= limit"', 'condition: "share > 30"')
        .replace("{n} comm kernels", "{share:.0f}% exposed, {all_n:.0f} kernels per step").replace("evidence: [n]", "evidence: [share, n_steps]"))
    rule = load_rule(p)
    run = _kernels_run()
    res = evaluate(run, rule)
    assert res.status == "ran", res.reason
    (f,) = res.findings
    # rank 1: its 4 ms comm kernel of every step is exposed; rank 0: 2 of its 4 ms hidden under compute
    from traceql import link

    st = link.ensure(run, "step_times").filter(pl.col("rank") == 1)["step_ms"].median()
    share = 100.0 * 4.0 / st
    assert f.ranks == [1] and f.evidence["share"] == pytest.approx(share) and f.evidence["n_steps"] == 4
    assert f.message == f"rank 1: {share:.0f}% exposed, 1 kernels per step"
    r0 = run_select(run, rule.select, rule.defaults(), rule.views).filter(pl.col("rank") == 0)
    assert r0["exposed_ms"].to_list() == [2.0] and r0["share"][0] < 30


def test_tql105_fires_on_exposed_allreduce_and_not_on_a_straggler_victim():
    rule = next(r for r in load_rules() if r.id == "TQL105")
    fire = evaluate(load_run(FIXTURES / "h200-exposed-allreduce"), rule)
    assert fire.status == "ran" and sorted(r for f in fire.findings for r in f.ranks) == [0, 1]
    victim_run = load_run(FIXTURES / "h200x2-straggler")
    quiet = evaluate(victim_run, rule)
    assert quiet.status == "ran" and not quiet.findings
    # the victim's exposed communication alone would pass the threshold: the wait is what keeps it quiet
    out = run_select(victim_run, rule.select, rule.defaults(), rule.views)
    victim = out.filter(pl.col("rank") == 0).row(0, named=True)
    assert victim["exposed_ms"] > 0.6 * victim["step_ms"] > victim["net_ms"]


# ---------------------------------------------------------------- views


def test_runtime_kernels_view_is_the_correlation_join_within_rank_source_and_pid():
    views = views_of([default_rules_dir()])
    run = load_run(FIXTURES / "h200-sync-memcpy-nsys")
    v = frame(run, "runtime_kernels", views)
    rt, k = run.table("runtime"), run.table("kernels")
    j = rt.join(k, on=["rank", "source", "correlation"], suffix="_k").filter(pl.col("pid_k").is_null() | (pl.col("pid_k") == pl.col("pid")))
    assert v.height == j.height > 0
    assert set(v.columns) == set(views["runtime_kernels"].schema)
    best = frame(run, "best_source", views)
    assert best["rank"].n_unique() == best.height == len(run.ranks)


def test_runtime_memops_view_is_runtime_kernels_on_memory_activity_only():
    # the copy and memset rules read runtime_memops: it must hold exactly runtime_kernels' memcpy and memset rows
    # (same columns, same values), so that their findings are those runtime_kernels gave
    views = views_of([default_rules_dir()])
    run = load_run(FIXTURES / "h200-sync-memcpy-nsys")
    full = frame(run, "runtime_kernels", views)
    mem = frame(run, "runtime_memops", views)
    assert set(full["gpu_kind"].unique()) - {"memcpy", "memset"}  # the fixture launches kernels too
    want = full.filter(pl.col("gpu_kind").is_in(["memcpy", "memset"]))
    assert mem.height == want.height > 0
    assert mem.columns == full.columns
    key = ["rank", "source", "correlation", "ts", "gpu_ts"]
    assert mem.sort(key).equals(want.sort(key))


def test_a_view_may_not_read_files_or_shadow_a_table(tmp_path):
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "leak.sql").write_text("-- reads a file\nSELECT * FROM read_csv('/etc/passwd')\n")
    with pytest.raises(RuleError, match=r"leak.sql: field 'sql': read_csv"):
        views_of([tmp_path])
    (tmp_path / "views" / "leak.sql").unlink()
    (tmp_path / "views" / "kernels.sql").write_text("SELECT * FROM runtime\n")
    with pytest.raises(RuleError, match=r"kernels.sql: field 'name': 'kernels' is already a table"):
        views_of([tmp_path])


def test_a_rule_reads_a_view_of_its_folder(tmp_path):
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "comm_kernels.yaml").write_text(
        "doc: communication kernels\nsql: SELECT rank, step, ts, \"end\" FROM kernels WHERE kind = 'comm'\n")
    p = write(tmp_path, BASE.replace("select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
                                     "select: {measure: count, table: comm_kernels, per: [rank]}"))
    res = evaluate(_kernels_run(), load_rule(p))
    assert res.status == "ran" and sorted(f.evidence["n"] for f in res.findings) == [4, 4]


# ---------------------------------------------------------------- load-time checks


@pytest.mark.parametrize("old, new, field, says", [
    ("{n} comm kernels", "{nn} comm kernels", "message", "{nn} is neither a column"),
    ("table: kernels,", "table: kernel,", "select.table", "did you mean 'kernels'"),
    ("where: {kind: comm}", "where: {knd: comm}", "select.where", "no column 'knd'; did you mean 'kind'"),
    ("per: [rank]", "per: [rank, stepp]", "select.per", "no column 'stepp'"),
    ("evidence: [n]", "evidence: [n, total_ms]", "evidence", "'total_ms' is not a column"),
    ('condition: "n >= limit"', 'condition: "n >= limt"', "condition", "unknown name 'limt'"),
    ("summary: test", "summary: test\nmesage: x", "mesage", "did you mean 'message'"),
    ("evidence: [n]", "evidence: [n]\nranks_column: ranks", "ranks_column", "'ranks' is not a column"),
    ("evidence: [n]", "evidence: [n]\ncollapse: [device]", "collapse", "no column 'device'"),
    ("per: [rank]}", "per: [rank], steps: {agg: worst}}", "select.steps.of", "agg worst needs of"),
    ("evidence: [n]", "evidence: [n]\nfact: nccl_errors", "fact", "module:function"),
    ("evidence: [n]", "evidence: [n]\ncost: 3", "cost", "must be a mapping"),
    ("evidence: [n]", "evidence: [n]\nneeds: [kernels, step]", "needs", "unknown table 'step'; did you mean 'steps'"),
])
def test_a_broken_rule_fails_at_load_naming_file_and_field(tmp_path, old, new, field, says):
    assert old in BASE
    p = write(tmp_path, BASE.replace(old, new))
    with pytest.raises(RuleError) as e:
        load_rule(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: field '{field}': ") and says in msg, msg


def test_sql_rules_are_checked_on_empty_frames_of_the_declared_schemas(tmp_path):
    sql = BASE.replace("select: {measure: count, table: kernels, where: {kind: comm}, per: [rank]}",
                       "sql: SELECT rank, count(*) AS n FROM collective_instances GROUP BY rank")
    assert load_rule(write(tmp_path, sql)).sql
    bad_col = sql.replace("count(*) AS n", "sum(wait_mss) AS n")
    with pytest.raises(RuleError, match=r"field 'sql': cannot run on the declared schemas: .*wait_mss"):
        load_rule(write(tmp_path, bad_col))
    bad_table = sql.replace("collective_instances", "collective_instance")
    with pytest.raises(RuleError, match=r"field 'sql': unknown table 'collective_instance'"):
        load_rule(write(tmp_path, bad_table))
    bad_field = sql.replace("{n} comm kernels", "{wait_ms} waited")
    with pytest.raises(RuleError, match=r"field 'message': \{wait_ms\} is neither"):
        load_rule(write(tmp_path, bad_field))
    with pytest.raises(RuleError, match=r"field 'views': no view 'runtime_kernel'"):
        load_rule(write(tmp_path, sql.replace("evidence: [n]", "evidence: [n]\nviews: [runtime_kernel]")),
                  views_of([default_rules_dir()]))


def test_the_whole_pack_passes_the_load_checks():
    rules = load_rules()
    assert len(rules) >= 49 and any(r.id == "TQL105" for r in rules)
    assert all(r.views for r in rules)  # every rule can read the pack's views


def test_traceql_query_reads_views():
    from traceql.report.query import query, table_names

    run = load_run(FIXTURES / "h200-sync-memcpy")
    assert {"runtime_kernels", "best_source"} <= set(table_names(run))
    df = query(run, "SELECT count(*) AS n FROM runtime_kernels WHERE call_kind = 'memcpy' AND gpu_kind = 'memcpy'")
    rt, k = run.table("runtime"), run.table("kernels")
    want = rt.filter(pl.col("kind") == "memcpy").join(k.filter(pl.col("kind") == "memcpy"), on=["rank", "source", "correlation"])
    assert df["n"][0] == want.height > 0


def test_steps_never_mix_two_sources_of_a_rank():
    df = _per_step().with_columns(pl.lit(0, pl.Int32).alias("source"))
    other = df.filter(pl.col("rank") == 0).with_columns(pl.lit(1, pl.Int32).alias("source"), pl.col("a") * 100)
    out = compose.steps(pl.concat([df, other]), {"agg": "median"}, None).sort("rank", "source")
    assert out.select("rank", "source").rows() == [(0, 0), (0, 1), (1, 0)]
    assert out["a"].to_list() == [3.0, 300.0, 30.0]
