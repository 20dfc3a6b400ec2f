"""`traceql rules test` over the whole pack, its snapshots, and that the loop fails where it should: a snapshot
that no longer matches, an info finding on a quiet fixture."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from click.testing import CliRunner

from traceql.cli import main
from traceql.rules.loader import default_rules_dir, load_rules

REPO = Path(__file__).resolve().parents[1]


def test_the_whole_pack_passes_its_fixtures_and_snapshots():
    r = CliRunner().invoke(main, ["rules", "test"])
    assert r.exit_code == 0, "\n".join(ln for ln in r.output.splitlines() if not ln.startswith("PASS"))
    assert r.output.splitlines()[-1].endswith(" 0 failed")
    # every rule with fixtures has a snapshot, and the snapshot was checked
    with_fixtures = {x.id for x in load_rules() if x.fixtures.get("fire") or x.fixtures.get("quiet")}
    checked = {ln.split()[1] for ln in r.output.splitlines() if ln.split()[2:3] == ["snapshot"]}
    assert with_fixtures and checked == with_fixtures


def _copy_pack(tmp_path: Path) -> Path:
    d = tmp_path / "rules"
    shutil.copytree(default_rules_dir(), d)
    return d


def test_an_edited_snapshot_fails_with_a_diff_and_update_restores_it(tmp_path):
    d = _copy_pack(tmp_path)
    snap = d / "snapshots" / "TQL204.yaml"
    original = snap.read_text()
    assert "synchronous cudaMemcpy" in original
    snap.write_text(original.replace("synchronous cudaMemcpy", "synchronous cudaMemcpyX", 1))
    args = ["rules", "test", "TQL204", "--rules", str(d), "--root", str(REPO)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    fails = [ln for ln in r.output.splitlines() if ln.startswith("FAIL")]
    assert len(fails) == 1 and "snapshot" in fails[0] and "drifted" in fails[0]
    assert any(ln.strip().startswith("-") and "cudaMemcpyX" in ln for ln in r.output.splitlines())
    assert any(ln.strip().startswith("+") and "synchronous cudaMemcpy (" in ln for ln in r.output.splitlines())
    r = CliRunner().invoke(main, [*args, "--update"])
    assert r.exit_code == 0 and snap.read_text() == original  # deterministic: the same findings, the same bytes
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0


def test_a_missing_snapshot_fails(tmp_path):
    d = _copy_pack(tmp_path)
    (d / "snapshots" / "TQL206.yaml").unlink()
    r = CliRunner().invoke(main, ["rules", "test", "TQL206", "--rules", str(d), "--root", str(REPO)])
    assert r.exit_code == 1 and "no snapshot" in r.output


def test_an_info_finding_fails_a_quiet_fixture(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "TQL299-every-kernel.yaml").write_text(textwrap.dedent("""\
        id: TQL299
        name: every-kernel
        severity: info
        summary: Counts kernels; fires wherever there are any.
        select: {measure: count, table: kernels, per: [rank]}
        message: "rank {rank}: {n} kernels"
        docs: {why: a test, fix: none}
        fixtures:
          quiet: [fixtures/h200-plain-loop]
    """))
    r = CliRunner().invoke(main, ["rules", "test", "--rules", str(d), "--root", str(REPO), "--update"])
    assert r.exit_code == 1
    assert any(ln.startswith("FAIL  TQL299  quiet") for ln in r.output.splitlines()), r.output


def test_each_fixture_is_loaded_and_evaluated_once(monkeypatch):
    import traceql.pipeline as pipeline
    from traceql.rules import engine
    from traceql.rules.testing import test_rules

    loads, evals = [], []
    real_load, real_run = pipeline.load_run, engine.run_rules
    monkeypatch.setattr(pipeline, "load_run", lambda p, **kw: loads.append(p) or real_load(p, **kw))
    monkeypatch.setattr(engine, "run_rules", lambda run, rs, *a: evals.append(len(rs)) or real_run(run, rs, *a))
    rules = [r for r in load_rules() if r.id in ("TQL204", "TQL205", "TQL206", "TQL207")]
    outcomes = test_rules(rules, REPO)
    fixtures = {e if isinstance(e, str) else e["path"] for r in rules for k in ("fire", "quiet") for e in r.fixtures.get(k) or []}
    assert len(loads) == len(set(loads)) == len(fixtures) == len(evals)
    assert sum(evals) == sum(1 for o in outcomes if o.expect != "snapshot")
