"""Configuration (traceql.toml / [tool.traceql]), --set, --baseline and suppression by fingerprint, and the
progress bar's manners (stderr only, never in piped machine output)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest
from _report_helpers import TRACE_FILTER, need
from click.testing import CliRunner
from conftest import FIXTURES

from traceql.cli import main
from traceql.rules import config as c
from traceql.rules.loader import load_rules


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def _write(p, text):
    p.write_text(text, encoding="utf-8")
    return p


def test_find_config_walks_up_and_reads_pyproject_only_with_its_table(tmp_path):
    run = tmp_path / "a" / "b" / "run"
    run.mkdir(parents=True)
    _write(tmp_path / "a" / "pyproject.toml", "[project]\nname = 'x'\n")
    assert c.find_config(run) is None
    _write(tmp_path / "pyproject.toml", "[tool.traceql]\nselect = ['TQL1']\n")
    assert c.find_config(run) == tmp_path / "pyproject.toml"
    _write(tmp_path / "a" / "b" / "traceql.toml", "ignore = ['TQL2']\n")
    found = c.find_config(run)
    assert found == tmp_path / "a" / "b" / "traceql.toml"
    assert c.load_config(found).ignore == ["TQL2"]
    assert c.load_config(tmp_path / "pyproject.toml").select == ["TQL1"]


def test_load_config_fields(tmp_path):
    p = _write(tmp_path / "traceql.toml", 'select = "TQL1"\nfail-on = "error"\nsuppress = ["abc"]\n[rules.TQL101]\nmin_exposed_ms = 3\n')
    cfg = c.load_config(p)
    assert cfg.select == ["TQL1"]  # a bare string is one selector, not its characters
    assert cfg.fail_on == "error" and cfg.suppress == ["abc"] and cfg.params == {"TQL101": {"min_exposed_ms": 3}}


@pytest.mark.parametrize("text, needle", [
    ('fail-on = "warn"\n', "fail-on"),
    ("select = [1, 2]\n", "select"),
    ("[rules]\nTQL101 = 5\n", "rules.TQL101"),
    ("select = [\n", "cannot read"),
])
def test_bad_config_is_one_clear_line(tmp_path, text, needle):
    p = _write(tmp_path / "traceql.toml", text)
    with pytest.raises(c.ConfigError) as e:
        c.load_config(p)
    assert needle in str(e.value) and str(p) in str(e.value)


def test_config_params_must_name_a_rule_and_a_param(tmp_path, rules):
    cfg = c.load_config(_write(tmp_path / "traceql.toml", "[rules.TQL101]\nmin_exposd_ms = 3\n"))
    with pytest.raises(c.ConfigError, match="valid: min_exposed_ms"):
        c.check_params(cfg, rules)
    cfg = c.load_config(_write(tmp_path / "traceql.toml", "[rules.TQL999]\nx = 3\n"))
    with pytest.raises(c.ConfigError, match="no such rule"):
        c.check_params(cfg, rules)
    cfg = c.load_config(_write(tmp_path / "traceql.toml", "[rules.exposed-communication]\nmin_exposed_ms = 3\n"))
    c.check_params(cfg, rules)
    assert cfg.params == {"TQL101": {"min_exposed_ms": 3}}


def test_set_is_typed_like_the_default(rules):
    out = c.parse_set(["TQL101.min_exposed_ms=5", "exposed-communication.max_overlap_pct=20"], rules)
    assert out == {"TQL101": {"min_exposed_ms": 5.0, "max_overlap_pct": 20.0}}
    assert isinstance(out["TQL101"]["min_exposed_ms"], float)
    for bad, needle in (("TQL101.min_exposed_ms=lots", "not a number"), ("TQL101=5", "RULE.param=value"),
                        ("TQL101.nope=1", "valid: "), ("TQL999.x=1", "no rule")):
        with pytest.raises(c.ConfigError, match=needle):
            c.parse_set([bad], rules)


INPUT = {"TQL001", "TQL002", "TQL003", "TQL004"}  # whether the inputs were understood: they run with any --select


def test_select_and_ignore_by_prefix_and_name(rules):
    ids = {r.id for r in c.choose(rules, ["TQL1"], ["TQL101"])}
    assert ids - INPUT and all(i.startswith("TQL1") for i in ids - INPUT) and "TQL101" not in ids
    assert {r.id for r in c.choose(rules, ["exposed-communication"], [])} == {"TQL101"} | INPUT


def test_selection_keeps_the_input_rules_unless_ignored_by_name(rules):
    assert INPUT <= {r.id for r in rules}
    assert {r.id for r in c.choose(rules, ["TQL301"], [])} == {"TQL301"} | INPUT
    assert {r.id for r in c.choose(rules, ["TQL301"], ["TQL003", "partial-source"])} == {"TQL301", "TQL001", "TQL002"}
    assert not INPUT & {r.id for r in c.choose(rules, [], ["TQL00"])}


# --- end to end: a committed capture whose manifest expects TQL101 on ranks 0 and 1, and the corpus -----------------

RUNS = [
    pytest.param(FIXTURES / "h200-exposed-allreduce", id="h200-exposed-allreduce"),
    pytest.param(TRACE_FILTER, id="corpus-trace_filter", marks=pytest.mark.corpus),
]


@pytest.fixture(params=RUNS)
def run_dir(request):
    return need(request.param)


def _check(run_dir, *args):
    # trace_filter holds 2 ranks of 128: its missing-rank finding (TQL002, which runs with any --select) is ignored
    return CliRunner().invoke(main, ["check", str(run_dir), "--select", "TQL101", "--ignore", "TQL002", "--quiet", *args])


def test_threshold_from_config_file_changes_findings(run_dir, tmp_path):
    base = orjson.loads(_check(run_dir, "--format", "json").stdout)
    assert any(f["rule"] == "TQL101" for f in base["findings"])
    p = _write(tmp_path / "traceql.toml", "[rules.TQL101]\nmax_overlap_pct = 0.0\n")  # nothing overlaps under 0%
    res = _check(run_dir, "--format", "json", "--config", str(p))
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.stdout)["findings"] == []
    bad = _write(tmp_path / "bad.toml", "[rules.TQL101]\nmax_overlap_pt = 0.0\n")
    res = _check(run_dir, "--config", str(bad))
    assert res.exit_code == 2 and "max_overlap_pct" in res.output


def test_baseline_and_suppress_by_fingerprint(run_dir, tmp_path):
    report = tmp_path / "base.json"
    res = _check(run_dir, "--format", "json", "--out", str(report))
    assert res.exit_code == 1  # TQL101 is a warning, the default fail-on
    fps = [f["fingerprint"] for f in orjson.loads(report.read_bytes())["findings"]]
    assert len(fps) == 2  # one per rank
    res = _check(run_dir, "--baseline", str(report))
    assert res.exit_code == 0 and "No findings" in res.output
    p = _write(tmp_path / "traceql.toml", f"suppress = [{fps[0]!r}]\n")
    data = orjson.loads(_check(run_dir, "--format", "json", "--config", str(p)).stdout)
    assert [f["fingerprint"] for f in data["findings"]] == fps[1:]
    never = _write(tmp_path / "never.toml", 'fail-on = "never"\n')
    assert _check(run_dir, "--config", str(never)).exit_code == 0
    junk = _write(tmp_path / "junk.json", "[1, 2]")
    res = _check(run_dir, "--baseline", str(junk))
    assert res.exit_code == 2 and "not a traceql --format json report" in res.output


# --- progress ----------------------------------------------------------------------------------------------------

def test_progress_bar_writes_to_stderr_only():
    from traceql.pipeline import _Bar

    bar = _Bar(2)
    try:
        assert bar.p.live.console.file is sys.stderr
    finally:
        bar.close()


def test_piped_json_asks_for_no_progress_bar(run_dir, monkeypatch):
    from traceql import pipeline

    asked = []
    monkeypatch.setattr(pipeline, "_progress", lambda sources: asked.append(len(sources)))
    args = ["check", str(run_dir), "--select", "TQL101"]
    res = CliRunner().invoke(main, [*args, "--format", "json"])  # CliRunner's stdout is not a terminal: piped
    orjson.loads(res.stdout)  # stdout is the report and nothing else
    assert asked == []
    CliRunner().invoke(main, args)  # text for a person: the bar is asked for (and shows only on a terminal)
    assert asked


def test_a_deeply_nested_or_huge_config_is_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from traceql.cli import main

    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    huge = tmp_path / "huge.toml"
    huge.write_text("# padding\n" * 200_000)
    demo = str(Path(__file__).resolve().parents[1] / "samples" / "demo")
    for cfg, words in ((deep, "nested too deeply"), (huge, "too large")):
        res = CliRunner().invoke(main, ["check", demo, "--config", str(cfg), "-q"])
        assert res.exit_code == 2 and words in res.output and str(cfg) in res.output, res.output
