"""The bundled rule pack's validation manifest (rules/manifest.json, traceql.rules.manifest): current, equivalent to
a full validation, and trusted for nothing beyond unchanged bundled files under the code that wrote it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import main
from traceql.rules import loader, manifest, schema
from traceql.rules.loader import RuleError, default_rules_dir, load_rules

REPO = Path(__file__).resolve().parents[1]


def fields(r) -> dict:
    return {k: v for k, v in vars(r).items() if k != "views"}


def test_the_shipped_manifest_is_current():
    why = manifest.stale(default_rules_dir())
    assert why is None, f"{why}: run `{manifest.REFRESH}` and commit rules/manifest.json"


def test_a_load_through_the_manifest_gives_the_rules_a_full_validation_gives():
    vouched = load_rules()
    full = load_rules(trust_manifest=False)
    assert [r.id for r in vouched] == [r.id for r in full]
    for a, b in zip(vouched, full):
        assert fields(a) == fields(b), a.id
        assert sorted(a.views) == sorted(b.views)


@pytest.fixture
def pack(tmp_path, monkeypatch):
    """A copy of the bundled pack, manifest included, standing in for the bundled folder."""
    d = tmp_path / "rules"
    d.mkdir()
    for p in default_rules_dir().glob("*.yaml"):
        shutil.copy(p, d / p.name)
    shutil.copytree(default_rules_dir() / "views", d / "views")
    shutil.copy(default_rules_dir() / manifest.FILE, d / manifest.FILE)
    monkeypatch.setattr(loader, "default_rules_dir", lambda: d)
    loader._VIEWS.clear()
    return d


@pytest.fixture
def inferred(monkeypatch):
    """The rules whose outputs were inferred (run on empty frames) in this test."""
    seen: list[str] = []
    real = schema.output

    def spy(rule):
        seen.append(rule.id)
        return real(rule)

    monkeypatch.setattr(schema, "output", spy)
    return seen


def edit(p: Path, old: str, new: str) -> None:
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))


def test_an_unchanged_pack_is_not_re_inferred(pack, inferred):
    assert len(load_rules()) == len(list(pack.glob("*.yaml")))
    assert inferred == []
    load_rules(trust_manifest=False)
    assert len(inferred) == len(list(pack.glob("*.yaml")))


def test_an_edited_rule_file_gets_full_validation_and_its_error(pack, inferred):
    p = pack / "TQL101-exposed-communication.yaml"
    edit(p, "evidence: [", "evidence: [no_such_column, ")
    with pytest.raises(RuleError) as e:
        load_rules()
    msg = str(e.value)
    assert msg.startswith(f"{p}: field 'evidence': 'no_such_column' is not a column") and "\n" not in msg
    assert inferred == ["TQL101"]  # the others still came through the manifest


def test_an_added_rule_file_is_validated_in_full(pack, inferred):
    src = pack / "TQL101-exposed-communication.yaml"
    new = pack / "TQL199-copy.yaml"
    new.write_text(src.read_text().replace("id: TQL101", "id: TQL199").replace("name: exposed-communication",
                                                                                "name: copy"))
    assert "TQL199" in {r.id for r in load_rules()}
    assert inferred == ["TQL199"]


def test_wrong_outputs_in_an_entry_cannot_pass_an_edited_rule(pack):
    p = pack / "TQL101-exposed-communication.yaml"
    edit(p, "evidence: [", "evidence: [no_such_column, ")
    man = json.loads((pack / manifest.FILE).read_text())
    entry = man["rules"][p.name]
    entry["columns"].append("no_such_column")  # the entry claims the column, for the file's old bytes
    entry["output"].append("no_such_column")
    (pack / manifest.FILE).write_text(json.dumps(man))
    with pytest.raises(RuleError, match="field 'evidence': 'no_such_column' is not a column"):
        load_rules()


def test_recorded_outputs_a_good_rule_does_not_fit_are_not_believed(pack, inferred):
    man = json.loads((pack / manifest.FILE).read_text())
    name = "TQL101-exposed-communication.yaml"
    man["rules"][name]["columns"] = ["nothing"]
    man["rules"][name]["output"] = ["nothing"]
    (pack / manifest.FILE).write_text(json.dumps(man))
    rules = {r.id: r for r in load_rules()}
    assert inferred == ["TQL101"]  # inferred again, and it loads as it is
    full = {r.id: r for r in load_rules(trust_manifest=False)}
    assert fields(rules["TQL101"]) == fields(full["TQL101"])


def test_a_manifest_in_a_user_pack_is_never_read(tmp_path, inferred):
    d = tmp_path / "mine"
    d.mkdir()
    p = d / "TQL101-exposed-communication.yaml"
    shutil.copy(default_rules_dir() / p.name, p)
    shutil.copytree(default_rules_dir() / "views", d / "views")
    edit(p, "evidence: [", "evidence: [no_such_column, ")
    man = json.loads((default_rules_dir() / manifest.FILE).read_text())
    entry = man["rules"][p.name]
    entry.update(sha256=manifest.sha256(p.read_bytes()), columns=[*entry["columns"], "no_such_column"],
                 output=[*entry["output"], "no_such_column"])  # a manifest that vouches for exactly these bytes
    (d / manifest.FILE).write_text(json.dumps(man))
    with pytest.raises(RuleError, match="field 'evidence': 'no_such_column'"):
        load_rules([d])
    assert inferred == ["TQL101"]
    r = CliRunner().invoke(main, ["rules", "list", "--rules", str(d)])
    assert r.exit_code == 2 and "field 'evidence'" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("spoil", ["code", "views", "format", "corrupt", "absent"])
def test_a_manifest_of_other_code_views_or_format_is_ignored(pack, inferred, spoil):
    mp = pack / manifest.FILE
    man = json.loads(mp.read_text())
    if spoil == "code":
        man["code"] = "0" * 64
    elif spoil == "format":
        man["format"] = manifest.FORMAT + 1
    if spoil == "views":  # a changed view: every rule is validated in full against it
        edit(pack / "views" / "runtime_kernels.yaml", "doc: >-", "doc: >-\n  (edited)")
    if spoil == "corrupt":
        mp.write_text(mp.read_text()[:1000])
    elif spoil == "absent":
        mp.unlink()
    else:
        mp.write_text(json.dumps(man))
    rules = load_rules()
    assert sorted(inferred) == sorted(r.id for r in rules)  # every rule validated in full


def test_rules_check_validates_in_full_and_writes_the_manifest(pack, inferred):
    runner = CliRunner()
    r = runner.invoke(main, ["rules", "check"])
    assert r.exit_code == 0, r.output
    assert f"{len(list(pack.glob('*.yaml')))} rules valid" in r.output and "is current" in r.output
    assert len(inferred) >= len(list(pack.glob("*.yaml")))
    edit(pack / "TQL202-gpu-idle-gap.yaml", "summary:", "summary: (edited)")
    r = runner.invoke(main, ["rules", "check"])
    assert r.exit_code == 0 and "TQL202-gpu-idle-gap.yaml differs" in r.output and manifest.REFRESH in r.output
    r = runner.invoke(main, ["rules", "check", "--write-manifest"])
    assert r.exit_code == 0 and "wrote" in r.output
    assert manifest.stale(pack) is None
    r = runner.invoke(main, ["rules", "check", "--rules", str(REPO / "fixtures"), "--write-manifest"])
    assert r.exit_code == 2 and "bundled pack's manifest only" in r.output


def test_rules_check_reports_a_broken_rule_in_one_line(pack):
    edit(pack / "TQL301-step-time-imbalance.yaml", "message: >-", "message: >-\n  {nope}")
    r = CliRunner().invoke(main, ["rules", "check", "--write-manifest"])
    assert r.exit_code == 2 and "field 'message': {nope}" in r.output and len(r.output.strip().splitlines()) == 1
    assert manifest.stale(pack) is not None  # nothing written


def test_a_vouched_load_parses_no_yaml():
    code = "import sys, traceql.rules.loader as L; L.load_rules(); print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"YAML parsed: is rules/manifest.json stale? run `{manifest.REFRESH}`"
    assert out.stderr == ""


def test_yaml_uses_libyaml_where_present():
    import yaml

    from traceql.rules.yamlfile import _yaml

    assert _yaml()[1] is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


def test_check_under_no_cache_still_uses_the_manifest(inferred):
    """The manifest is part of the package, not of the cache folder: --no-cache validates nothing again."""
    r = CliRunner().invoke(main, ["check", str(REPO / "samples" / "demo"), "-q", "--no-cache", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    assert inferred == [], f"re-inferred {inferred}: is rules/manifest.json stale? run `{manifest.REFRESH}`"


def test_rules_test_update_refreshes_the_manifest(pack):
    shutil.copytree(default_rules_dir() / "snapshots", pack / "snapshots")
    edit(pack / "TQL202-gpu-idle-gap.yaml", "summary:", "summary: (edited)")
    assert manifest.stale(pack) is not None
    r = CliRunner().invoke(main, ["rules", "test", "TQL202", "--update", "--root", str(REPO)])
    assert f"wrote {pack / manifest.FILE}" in r.output, r.output
    assert manifest.stale(pack) is None
