"""Exit codes CI can trust, each case checked through the CLI: 0 clean, 1 findings at or above --fail-on,
2 usage or configuration (unknown selector, unknown config key, no rules, an unwritable --out, a broken rule file),
3 a rule that fails at evaluation. Every non-zero exit that is not findings says why in one line on stderr."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import main
from traceql.rules.loader import default_rules_dir

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"
CLEAN = REPO / "fixtures" / "h200-plain-loop"


def _check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args), "--quiet"])


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceql: "), r.stderr
    return lines[0]


def test_0_when_no_finding_reaches_fail_on():
    r = _check(CLEAN, "--select", "TQL101,TQL204")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("fixture, rule", [("corrupt-rank-cpu-ddp-eager", "TQL003"), ("cut-rank-cpu-ddp-eager", "TQL004"),
                                           ("lost-rank-cpu-ddp-eager", "TQL002")])
def test_1_for_an_input_hole_whatever_is_selected(fixture, rule):
    """A rule selection narrows the analysis, not whether it says a file was unreadable, cut short or missing:
    --select TQL301 on a run with such a hole still exits 1, and only --ignore by name accepts it."""
    run = REPO / "fixtures" / fixture
    r = CliRunner().invoke(main, ["check", str(run), "--select", "TQL301", "--format", "json"])
    assert r.exit_code == 1, r.output
    assert rule in {f["rule"] for f in json.loads(r.stdout)["findings"]}
    assert _check(run, "--select", "TQL301", "--ignore", rule).exit_code == 0


def test_1_at_or_above_fail_on_and_0_below():
    assert _check(DEMO).exit_code == 1
    assert _check(DEMO, "--fail-on", "never").exit_code == 0
    assert _check(DEMO, "--fail-on", "info").exit_code == 1


def _rule_dir(tmp_path: Path, edit=None) -> Path:
    d = tmp_path / "rules"
    d.mkdir()
    src = next(default_rules_dir().glob("TQL101-*.yaml"))
    text = src.read_text()
    (d / src.name).write_text(edit(text) if edit else text)
    return d


@pytest.mark.parametrize("args, says", [
    (["--select", "TQL9"], "--select 'TQL9': matches no rule"),
    (["--ignore", "TQL1O1"], "--ignore 'TQL1O1'"),
])
def test_2_unknown_selector(args, says):
    r = _check(DEMO, *args)
    assert r.exit_code == 2 and says in _one_line(r)


def test_2_unknown_config_key(tmp_path):
    cfg = tmp_path / "traceql.toml"
    cfg.write_text('fail-on = "warning"\nselct = ["TQL1"]\n')
    r = _check(DEMO, "--config", cfg)
    assert r.exit_code == 2 and f"{cfg}: selct: unknown key; did you mean 'select'?" in _one_line(r)


@pytest.mark.parametrize("fixture, rule", [("corrupt-rank-cpu-ddp-eager", "TQL003"), ("lost-rank-cpu-ddp-eager", "TQL002")])
def test_1_for_an_input_hole_with_a_pack_of_ones_own(tmp_path, fixture, rule):
    """`--rules DIR` replaces the analysis, not the input rules: a pack of one rule still says the file it could
    not read or the rank it did not find, unless the pack defines that rule itself or it is ignored by name."""
    pack = tmp_path / "pack"
    pack.mkdir()
    own = next(default_rules_dir().glob("TQL301-*.yaml"))
    (pack / own.name).write_text(own.read_text())
    run = REPO / "fixtures" / fixture
    r = CliRunner().invoke(main, ["check", str(run), "--rules", str(pack), "--format", "json"])
    assert r.exit_code == 1, r.output
    assert rule in {f["rule"] for f in json.loads(r.stdout)["findings"]}
    assert _check(run, "--rules", pack, "--ignore", rule).exit_code == 0
    bundled = next(default_rules_dir().glob(f"{rule}-*.yaml")).read_text()
    assert "\nseverity: info\n" not in bundled
    mine = re.sub(r"(?m)^severity: \w+$", "severity: info", bundled, count=1)
    (pack / f"{rule}-mine.yaml").write_text(mine)
    r = CliRunner().invoke(main, ["check", str(run), "--rules", str(pack), "--format", "json"])
    assert r.exit_code == 0, r.output  # the pack's own TQL00x (at info) is the one that ran
    assert {f["severity"] for f in json.loads(r.stdout)["findings"] if f["rule"] == rule} == {"info"}


def test_2_no_rules_loaded(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _check(DEMO, "--rules", tmp_path / "empty")
    assert r.exit_code == 2 and "no rule files" in _one_line(r)


def test_2_unwritable_out(tmp_path):
    r = _check(DEMO, "--out", tmp_path / "missing" / "report.json")
    assert r.exit_code == 2 and "does not exist" in _one_line(r)
    r = _check(DEMO, "--out", tmp_path)
    assert r.exit_code == 2 and "is a directory" in _one_line(r)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        import os

        if not os.access(ro, os.W_OK):  # root can write anywhere: the case cannot be made there
            r = _check(DEMO, "--out", ro / "report.json")
            assert r.exit_code == 2 and "not writable" in _one_line(r)
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("old, new, field", [
    ("{side} with no compute", "{sidee} with no compute", "message"),  # a typo in a message field
    ("table: activity\n", "table: activty\n", "select.table"),  # an unknown table
    ("where: {kind: comm}", "where: {knd: comm}", "select.where"),  # an unknown column
    ("evidence: [side,", "evidence: [sidee,", "evidence"),
    ("collapse: [rank]", "colapse: [rank]", "colapse"),  # a misspelled key
])
def test_2_broken_rule_file_names_file_and_field(tmp_path, old, new, field):
    d = _rule_dir(tmp_path, lambda t: (t.replace(old, new, 1) if old in t else pytest.fail(f"{old!r} not in TQL101")))
    r = _check(DEMO, "--rules", d)
    line = _one_line(r)
    assert r.exit_code == 2 and "TQL101-exposed-communication.yaml: field '" + field + "':" in line, line


def test_3_a_rule_that_fails_at_evaluation(tmp_path):
    d = _rule_dir(tmp_path)
    (d / "TQL299-cast.yaml").write_text(textwrap.dedent("""\
        id: TQL299
        name: cast-names
        severity: warning
        summary: Casts kernel names to integers, which every real trace refuses.
        sql: "SELECT rank, CAST(name AS BIGINT) AS number FROM kernels"
        message: "rank {rank}: {number}"
        docs: {why: a test, fix: none}
    """))
    r = _check(DEMO, "--rules", d, "--fail-on", "never")
    assert r.exit_code == 3
    assert "TQL299" in _one_line(r) and "No findings" not in r.stdout
    assert any("TQL299" in ln and "rule error" in ln for ln in r.stdout.splitlines())
