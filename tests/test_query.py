"""`traceql query RUN_DIR "SQL"`: polars SQL over canonical and derived tables, with errors that name what is valid."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import polars as pl
import pytest
from _report_helpers import RUN_DIRS, need

from traceql.report import query as q


@pytest.fixture(scope="module", params=RUN_DIRS)
def run(request):
    """The committed sample run (always) and the corpus's trace_filter (where present)."""
    from traceql import pipeline

    return pipeline.load_run(need(request.param), use_cache=False)


def test_canonical_table_aggregate_matches_polars(run):
    df = q.query(run, "SELECT rank, kind, count(*) AS n FROM kernels GROUP BY rank, kind ORDER BY rank, kind")
    expect = run.table("kernels").group_by("rank", "kind").agg(pl.len().alias("n")).sort("rank", "kind")
    assert df["n"].to_list() == expect["n"].to_list()
    assert df.height == expect.height > 0


def test_derived_tables_are_built_only_when_named(run):
    run.tables.pop("step_breakdown", None)
    q.query(run, "SELECT count(*) FROM kernels")
    assert "step_breakdown" not in run.tables
    df = q.query(run, 'SELECT rank, step, exposed_comm_ms FROM "step_breakdown" WHERE step IS NOT NULL')
    # one row per profiler step of each rank
    assert "step_breakdown" in run.tables and df.height == run.table("steps").select("rank", "step").unique().height > 0


def test_names_in_string_literals_do_not_build_tables(run):
    run.tables.pop("critical_path", None)
    q.query(run, "SELECT count(*) AS n FROM kernels WHERE name = 'critical_path'")
    assert "critical_path" not in run.tables


def test_bad_table_names_the_valid_ones(run):
    with pytest.raises(q.QueryError) as e:
        q.query(run, "SELECT * FROM kernelz")
    msg = str(e.value)
    assert "kernelz" in msg and "valid tables:" in msg and "kernels" in msg and "step_breakdown" in msg
    assert "\n" not in msg


def test_bad_column_names_the_valid_ones(run):
    with pytest.raises(q.QueryError) as e:
        q.query(run, "SELECT nme FROM kernels")
    msg = str(e.value)
    assert "nme" in msg and '"name"' in msg and "\n" not in msg


def test_syntax_error_is_one_line(run):
    with pytest.raises(q.QueryError) as e:
        q.query(run, "SELEC rank FROM kernels")
    assert "\n" not in str(e.value)
    with pytest.raises(q.QueryError):
        q.query(run, "   ")


def test_formats(run):
    df = q.query(run, "SELECT rank, count(*) AS n FROM kernels GROUP BY rank ORDER BY rank")
    rows = list(csv.DictReader(io.StringIO(q.render(df, "csv"))))
    assert [int(r["n"]) for r in rows] == df["n"].to_list()
    assert orjson.loads(q.render(df, "json")) == df.to_dicts()
    assert f"({df.height} rows)" in q.render(df, "table") and df.height == len(run.ranks) == 2
    nested = pl.DataFrame({"steps": [[1, 2], [3]]})
    assert [r["steps"] for r in csv.DictReader(io.StringIO(q.render(nested, "csv")))] == ["[1,2]", "[3]"]


def test_cli(run):
    from click.testing import CliRunner

    from traceql.cli import main

    res = CliRunner().invoke(main, ["query", str(run.path), "SELECT count(*) AS n FROM steps", "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.stdout) == [{"n": run.table("steps").height}]
    res = CliRunner().invoke(main, ["query", str(run.path), "SELECT x FROM nowhere", "-q"])
    assert res.exit_code == 2 and "valid tables:" in res.output


def test_query_and_diff_text_show_control_characters_as_escapes(tmp_path):
    # a kernel name carrying OSC 52 (clipboard), a screen clear and a forged line must not reach the terminal raw
    import gzip
    import shutil

    from click.testing import CliRunner

    from traceql.cli import main

    demo = Path(__file__).resolve().parents[1] / "samples" / "demo"
    run = tmp_path / "evil"
    run.mkdir()
    shutil.copy(demo / "rank0.pt.trace.json.gz", run / "rank0.pt.trace.json.gz")
    doc = orjson.loads(gzip.decompress((run / "rank0.pt.trace.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = "gemm\x1b]52;c;cHduZWQ=\x07\x1b[2J\nerror TQL999 forged"
    (run / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(doc)))
    res = CliRunner().invoke(main, ["query", str(run), "select distinct name from kernels", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert "\\x1b]52" in res.output and "\x1b" not in res.output and "\x07" not in res.output
    d = CliRunner().invoke(main, ["diff", str(demo), str(run), "--no-cache", "-q"])
    assert "\x1b" not in d.output and "\nerror TQL999" not in d.output


def test_text_table_shows_list_cells_as_json_and_escapes_text():
    out = q.render(pl.DataFrame({"ranks": [[0, 1]], "name": ["gemm\x1b[2J"]}), "table")
    assert "[0,1]" in out and "Series" not in out
    assert "gemm\\x1b[2J" in out and "\x1b" not in out
