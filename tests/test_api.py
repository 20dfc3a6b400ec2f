"""The notebook API (traceql.load, traceql.check) on recorded fixtures, and from a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import polars as pl
import pytest

import traceql
from traceql import pipeline
from traceql.model import SCHEMAS
from traceql.report.summary import summarize

REPO = Path(__file__).resolve().parents[1]
STRAGGLER = REPO / "fixtures" / "h200x2-straggler"
GLOO = REPO / "fixtures" / "cpu-straggler"


@pytest.fixture(scope="module")
def run():
    return traceql.load(STRAGGLER, cache=False)


def test_canonical_tables_are_polars_frames_of_the_run(run):
    ref = pipeline.load_run(STRAGGLER, use_cache=False)
    for name in SCHEMAS:
        df = run[name]
        assert isinstance(df, pl.DataFrame)
        assert df.sort(df.columns, nulls_last=True).equals(ref.table(name).sort(df.columns, nulls_last=True)), name
    assert run.kernels.height == ref.table("kernels").height > 0
    assert run.ranks == [0, 1]
    assert {s["kind"] for s in run.sources} >= {"kineto"} and all("status" in s for s in run.sources)


def test_every_derived_table_is_reachable_by_name_and_attribute(run):
    from traceql import link

    names = run.tables
    assert set(SCHEMAS) | set(link.derived_tables()) == set(names)
    assert all(isinstance(doc, str) and doc for doc in names.values())
    ci = run["collective_instances"]
    assert isinstance(ci, pl.DataFrame) and ci.height > 0 and {"wait_ms", "last_arriver"} <= set(ci.columns)
    assert run.step_metrics.height > 0 and run.step_metrics.equals(run["step_metrics"])
    assert "collective_instances" in run and "nope" not in run
    assert "collective_instances" in dir(run)


def test_unknown_tables_name_the_valid_ones(run):
    with pytest.raises(KeyError, match="valid tables: kernels, host_ops"):
        run["kernel"]
    with pytest.raises(AttributeError, match="collective_instances"):
        run.kernel  # noqa: B018


def test_query_is_guarded_like_the_command(run):
    df = run.query("SELECT rank, count(*) AS n FROM kernels GROUP BY rank ORDER BY rank")
    assert df["n"].to_list() == [run.kernels.filter(pl.col("rank") == r).height for r in (0, 1)]
    waits = run.query("SELECT rank, sum(wait_ms) AS w FROM collective_instances GROUP BY rank ORDER BY rank")
    assert waits["w"][0] > waits["w"][1]  # rank 1 is the straggler: rank 0 waits for it
    with pytest.raises(traceql.QueryError, match="refused"):
        run.query("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(traceql.QueryError, match="valid tables"):
        run.query("SELECT * FROM no_such_table")


def test_summary_is_the_commands_numbers(run):
    from click.testing import CliRunner

    from traceql.cli import main

    res = CliRunner().invoke(main, ["summary", str(STRAGGLER), "--format", "json", "-q", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert run.summary()["ranks"] == json.loads(res.output)["ranks"]
    assert run.summary() == summarize(pipeline.load_run(STRAGGLER, use_cache=False))


def test_check_returns_the_findings_of_check():
    got = traceql.check(STRAGGLER, cache=False)
    ref = pipeline.check(STRAGGLER, use_cache=False)
    assert isinstance(got, list) and isinstance(got, traceql.Findings)
    assert [f.fingerprint for f in got] == [f.fingerprint for f in ref.findings] and got
    assert {r.id for r in got.rules} == {r.rule.id for r in ref.results} and not got.errors
    skipped = [r for r in got.rules if r.status == "skipped"]
    assert all(r.reason for r in skipped)
    df = got.to_polars()
    assert df.height == len(got)
    assert df.columns == ["rule", "name", "severity", "ranks", "step", "message", "fingerprint", "cost_ms_per_step",
                          "cost_pct", "caused_by", "evidence"]
    assert df["fingerprint"].to_list() == [f.fingerprint for f in got]
    assert orjson.loads(df["evidence"][0]) == orjson.loads(orjson.dumps(got[0].evidence))
    assert got.to_json()["findings"] == ref.to_json()["findings"]


def test_check_selects_ignores_and_overrides():
    sel = traceql.check(STRAGGLER, select=["TQL3"])
    # the input rules (TQL00x: was every file read, is every rank there) run with any selection
    assert sel and {f.rule[:4] for f in sel} == {"TQL3"} and {r.id[:4] for r in sel.rules} == {"TQL3", "TQL0"}
    assert not [f for f in traceql.check(STRAGGLER, ignore="TQL3") if f.rule.startswith("TQL3")]
    # a threshold no step can reach: TQL301 stays quiet, as with --set TQL301.max_ratio=100
    assert not [f for f in traceql.check(STRAGGLER, select="TQL301", params={"TQL301": {"max_ratio": 100}})]
    with pytest.raises(ValueError, match="matches no rule"):
        traceql.check(STRAGGLER, select=["TQL9"])
    with pytest.raises(ValueError, match="no param"):
        traceql.check(STRAGGLER, params={"TQL301": {"nope": 1}})


def test_check_with_another_rule_folder(tmp_path):
    src = next((REPO / "rules").glob("TQL301-*.yaml"))
    (tmp_path / src.name).write_bytes(src.read_bytes())
    got = traceql.check(GLOO, rules=tmp_path)
    # the pack's one rule, and the bundled input rules it does not define (whether the run was read at all)
    assert [r.id for r in got.rules] == ["TQL001", "TQL002", "TQL003", "TQL004", "TQL301"]
    with pytest.raises(ValueError):
        traceql.check(GLOO, rules=tmp_path / "missing")


def test_load_and_check_take_a_single_file_and_refuse_a_missing_path(tmp_path):
    one = STRAGGLER / "rank0.pt.trace.json.gz"
    r = traceql.load(one)
    assert r.ranks == [0] and r.kernels.height > 0
    assert traceql.check(one).run.ranks == [0]
    with pytest.raises(FileNotFoundError, match="no such file"):
        traceql.load(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        traceql.check(tmp_path / "absent")


NOTEBOOK = r"""
import sys, json
import traceql
assert "polars" not in sys.modules, "import traceql must not import polars"
run = traceql.load(sys.argv[1])
k = run.kernels
ci = run["collective_instances"]
top = run.query("SELECT name, sum(dur) AS ns FROM kernels GROUP BY name ORDER BY ns DESC LIMIT 3")
f = traceql.check(sys.argv[1], select=["TQL3"])
df = f.to_polars()
print(json.dumps({"kernels": k.height, "ci": ci.height, "top": top.height, "findings": len(f), "rows": df.height,
                  "rules": [r.id for r in f.rules], "ranks": run.ranks, "step_ms": run.summary()["ranks"]["1"]["step_time_ms_median"]}))
"""


def test_a_notebook_script_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", NOTEBOOK, str(STRAGGLER)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warnings
    got = json.loads(out.stdout)
    assert got["kernels"] > 0 and got["ci"] > 0 and got["top"] == 3
    assert got["findings"] == got["rows"] > 0 and set(got["rules"]) >= {"TQL301", "TQL302"}
    assert got["ranks"] == [0, 1] and got["step_ms"] > 0


def test_import_traceql_does_not_import_polars():
    code = "import sys, traceql; traceql.__version__; print('polars' in sys.modules, 'traceql.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.split() == ["False", "False"], out.stderr
    with pytest.raises(AttributeError):
        traceql.no_such_thing  # noqa: B018
