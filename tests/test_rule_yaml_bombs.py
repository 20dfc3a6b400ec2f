"""Rule files from --rules folders are untrusted: YAML aliases (billion laughs), oversized and over-nested files are
refused with one line naming the file, before any value is built."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import main
from traceql.rules.loader import MAX_RULE_BYTES, RuleError, load_rule, load_rules

HEAD = "id: TQL999\nname: bomb\nseverity: info\nmessage: x\nsql: SELECT 1 AS x\n"


def _laughs() -> str:
    """Nine levels of nine aliases: 9^9 = 387 million strings once turned into text (str(summary))."""
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return HEAD + "docs:\n  why: x\n  fix: y\n" + "\n".join(lines) + "\nsummary: *a8\n"


def _write(tmp_path: Path, text: str, name: str = "TQL999-bomb.yaml") -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(text)
    return p


def test_billion_laughs_is_refused_before_expansion(tmp_path):
    p = _write(tmp_path, _laughs())
    assert p.stat().st_size < 600
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RuleError) as e:
        load_rule(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: line ") and "aliases" in msg and "\n" not in msg
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KB: nothing was expanded


def test_merge_keys_are_aliases_too(tmp_path):
    p = _write(tmp_path, HEAD + "summary: s\nbase: &b {why: x, fix: y}\ndocs:\n  <<: *b\n")
    with pytest.raises(RuleError, match="aliases"):
        load_rule(p)


def test_rules_list_refuses_the_bomb_in_a_user_folder(tmp_path):
    p = _write(tmp_path, _laughs())
    r = CliRunner().invoke(main, ["rules", "list", "--rules", str(p.parent)])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and str(p) in r.output and "aliases" in r.output


def test_oversized_rule_file(tmp_path):
    p = _write(tmp_path, HEAD + "summary: s\ndocs: {why: x, fix: y}\n# " + "x" * MAX_RULE_BYTES + "\n")
    with pytest.raises(RuleError, match=r"too large for a rule file \(limit 256 KB\)"):
        load_rule(p)


def test_deep_nesting_is_a_one_line_yaml_error(tmp_path):
    p = _write(tmp_path, HEAD + "summary: " + "[" * 5000 + "]" * 5000 + "\ndocs: {why: x, fix: y}\n")
    with pytest.raises(RuleError) as e:
        load_rule(p)
    assert str(e.value).startswith(f"{p}: not valid YAML") and "\n" not in str(e.value)


def test_an_anchor_without_alias_and_the_bundled_pack_still_load(tmp_path):
    p = _write(tmp_path, HEAD + "summary: &s plain text\ndocs: {why: x, fix: y}\n")
    assert load_rule(p).summary == "plain text"
    assert len(load_rules()) >= 40
