"""`traceql check` and `traceql summary` end to end: output contract, exit codes, bad inputs beside good ones."""

from __future__ import annotations

import gzip
import json
import textwrap
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import main

from conftest import SAMPLES, corpus_path

# Two-rank runs, with the file of rank 0 and of rank 1 in each: the committed sample always, the corpus where present.
RUNS = [
    pytest.param((SAMPLES / "demo", "rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"), id="demo"),
    pytest.param((corpus_path("hta", "tests", "data", "trace_filter"), "sampled_rank-0.json.gz", "sampled_rank-1.json.gz"),
                 id="corpus-trace_filter", marks=pytest.mark.corpus),
]


def run_cli(*args):
    r = CliRunner().invoke(main, [*map(str, args), "--quiet"] if args[0] in ("check", "summary") else list(map(str, args)))
    return r


@pytest.fixture(params=RUNS)
def run_files(request):
    src, rank0, rank1 = request.param
    if not src.is_dir():
        pytest.skip(f"reference corpus not present at {src}")
    return src, rank0, rank1


@pytest.fixture
def two_ranks(run_files, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(run_files[0], d)
    return d


def test_json_contract_on_a_real_two_rank_run(two_ranks):
    r = run_cli("check", two_ranks, "--format", "json")
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    assert set(doc) >= {"version", "run", "sources", "rules", "findings"}
    assert doc["run"]["ranks"] == [0, 1]
    assert {s["status"] for s in doc["sources"] if s["kind"] == "kineto"} == {"ok"}
    # the capture's own manifest and stdout/stderr logs (samples/demo) are skipped, each saying why
    assert all(s["status"] == "skipped" and s["detail"] for s in doc["sources"] if s["kind"] != "kineto")
    assert all(set(s) >= {"path", "kind", "rank", "status", "detail"} for s in doc["sources"])
    assert all(r["status"] in ("ran", "skipped", "error") and "reason" in r for r in doc["rules"])
    assert not [r for r in doc["rules"] if r["status"] == "error"], doc["rules"]
    for f in doc["findings"]:
        assert set(f) >= {"rule", "name", "severity", "ranks", "step", "message", "evidence"}
        assert f["severity"] in ("error", "warning", "info")
    # exit code follows the worst finding
    worst = {f["severity"] for f in doc["findings"]}
    assert r.exit_code == (1 if worst & {"warning", "error"} else 0)


def test_fail_on_and_select(two_ranks):
    assert run_cli("check", two_ranks, "--fail-on", "never").exit_code == 0
    r = run_cli("check", two_ranks, "--format", "json", "--select", "TQL3")
    # the input rules (TQL00x) run with any selection: trace_filter's two ranks of 128 stay a finding (TQL002)
    assert {x["rule"][:4] for x in json.loads(r.stdout)["findings"]} <= {"TQL3", "TQL0"}
    ran = [x["id"] for x in json.loads(r.stdout)["rules"]]
    assert ran and all(i.startswith(("TQL3", "TQL00")) for i in ran) and any(i.startswith("TQL3") for i in ran)


def test_set_overrides_a_threshold(two_ranks):
    base = json.loads(run_cli("check", two_ranks, "--format", "json", "--select", "TQL202").stdout)["findings"]
    assert base, "the sampled 128-rank trace has GPU idle gaps of over 1 ms"
    high = json.loads(run_cli("check", two_ranks, "--format", "json", "--select", "TQL202", "--set", "TQL202.min_gap_ms=100000").stdout)
    assert [f for f in high["findings"] if f["rule"] == "TQL202"] == []
    bad = run_cli("check", two_ranks, "--set", "TQL202.no_such=1")
    assert bad.exit_code == 2 and "no param" in bad.output


def test_truncated_and_foreign_files_beside_good_ones(two_ranks, run_files):
    _, rank0, rank1 = run_files
    good = two_ranks / rank1
    raw = gzip.decompress(good.read_bytes())
    (two_ranks / "rank-5.json").write_bytes(raw[: len(raw) // 2])  # killed mid-write
    (two_ranks / "notes.json").write_text('{"hello": "world"}')
    (two_ranks / "empty.json").write_bytes(b"")
    (two_ranks / "binary.bin").write_bytes(bytes(range(256)) * 10)
    doc = json.loads(run_cli("check", two_ranks, "--format", "json").stdout)
    by_name = {Path(s["path"]).name: s for s in doc["sources"]}
    assert by_name["rank-5.json"]["status"] == "partial"
    assert "byte" in by_name["rank-5.json"]["detail"]
    assert by_name["empty.json"]["status"] == "skipped" and "empty" in by_name["empty.json"]["detail"]
    assert by_name["notes.json"]["status"] in ("skipped", "error")
    assert by_name["binary.bin"]["status"] == "skipped"
    assert by_name[rank0]["status"] == "ok"
    assert doc["run"]["ranks"] == [0, 1]  # distributedInfo (rank 1) wins over the file name
    assert any("rank 1" in n and "rank-5.json" in n for n in doc["notes"]), doc["notes"]


def test_nothing_analysable_exits_2(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    r = run_cli("check", tmp_path)
    assert r.exit_code == 2
    assert run_cli("check", tmp_path / "missing").exit_code == 2


def test_summary_contract(two_ranks):
    r = run_cli("summary", two_ranks, "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    ranks = data["ranks"]
    assert set(ranks) == {"0", "1"}
    for row in ranks.values():
        # every column is defined, and every number says whether it is a per-step median or a total
        assert set(row) == set(data["columns"])
        assert {k for k in row if k.endswith(("_median", "_total"))} >= {
            "step_time_ms_median", "compute_ms_median", "comm_ms_median", "exposed_comm_ms_median", "idle_ms_median",
            "exposed_comm_ms_total", "kernels_total"}
        assert row["exposed_comm_ms_total"] <= row["comm_ms_total"]
        assert row["comm_ms_total"] > 0  # communication on the host (gloo) counts as communication too
        if row["comm_comp_overlap_pct"] is not None:  # HTA's window: GPU communication kernels only
            assert 0 <= row["comm_comp_overlap_pct"] <= 100
        assert 0 <= row["comm_comp_overlap_pct_steps"] <= 100
        assert 0 < row["kernels_in_steps"] <= row["kernels_total"]


def test_cache_gives_the_same_answer(two_ranks):
    cold = json.loads(run_cli("check", two_ranks, "--format", "json", "--no-cache").stdout)
    warm1 = json.loads(run_cli("check", two_ranks, "--format", "json").stdout)
    warm2 = json.loads(run_cli("check", two_ranks, "--format", "json").stdout)
    assert cold["findings"] == warm1["findings"] == warm2["findings"]


def test_rules_explain_and_list():
    r = CliRunner().invoke(main, ["rules", "explain", "TQL101"])
    assert r.exit_code == 0 and "Why it matters" in r.output and "How to fix it" in r.output
    assert CliRunner().invoke(main, ["rules", "explain", "TQL000"]).exit_code == 2
    lst = CliRunner().invoke(main, ["rules", "list"]).output
    assert "TQL101" in lst and "exposed-communication" in lst


def test_a_trace_cut_before_its_first_event_is_an_error_not_a_partial(tmp_path):
    (tmp_path / "rank-0.json").write_text('{"schemaVersion": 1, "traceEvents": [\n  {"ph": "X", "cat": "ker')
    r = run_cli("check", tmp_path, "--format", "json")
    assert r.exit_code == 2  # nothing could be analysed
    src = json.loads(r.stdout)["sources"][0]
    assert src["status"] == "error" and "before its first complete event" in src["detail"]


def test_derived_tables_are_cached_per_input_and_give_the_same_report(tmp_path):
    """The second check of the same run reads link/'s tables from the cache: same findings, same notes."""
    from traceql import pipeline

    demo = tmp_path / "demo"
    shutil.copytree(SAMPLES / "demo", demo)
    cold = json.loads(run_cli("check", demo, "--format", "json", "--no-cache").stdout)
    first = pipeline.check(demo)
    folder = first.run.derived_cache
    assert folder is not None and (folder / "collective_instances.parquet").exists()
    second = pipeline.check(demo)
    assert second.run.derived_cache == folder
    assert [f.to_json() for f in second.findings] == [f.to_json() for f in first.findings]
    assert second.run.notes == first.run.notes == cold["notes"]
    assert [f.to_json() for f in second.findings] == cold["findings"]
    # another input (one rank's trace removed) is another cache entry
    (demo / "rank1.pt.trace.json.gz").unlink()
    assert pipeline.check(demo).run.derived_cache != folder


def test_a_changed_importer_misses_the_cache(tmp_path, monkeypatch):
    """Cached tables are keyed by the importers' code too: after an upgrade that changes what an importer writes
    (same version string), the old tables are not served."""
    from traceql import cache
    from traceql.model import Source

    trace = next((SAMPLES / "demo").glob("rank0*"))
    src = Source(trace, "kineto")
    before = cache.digest(src)
    assert cache.digest(src) == before  # stable
    monkeypatch.setattr(cache, "_INGEST", "another importer")
    assert cache.digest(src) != before
    monkeypatch.setattr(cache, "_INGEST", None)
    assert cache.digest(src) == before


# --- exit codes are a contract: 0 clean, 1 findings, 2 usage or configuration, 3 a rule or internal error ------------

DEMO = SAMPLES / "demo"


def _broken_rules(tmp_path) -> Path:
    """The bundled TQL101 plus a rule that loads (its names are all valid) and fails when it runs on data: it casts
    kernel names to integers."""
    from traceql.rules.loader import default_rules_dir

    d = tmp_path / "rules"
    d.mkdir()
    shutil.copy(next(default_rules_dir().glob("TQL101-*.yaml")), d)
    (d / "TQL208-broken.yaml").write_text(textwrap.dedent("""\
        id: TQL208
        name: broken-at-evaluation
        severity: info
        summary: Casts kernel names to numbers, which fails on any real trace.
        sql: "SELECT rank, CAST(name AS BIGINT) AS name_number FROM kernels"
        message: "rank {rank}: {name_number}"
        docs: {why: a test, fix: none}
    """))
    return d


def test_a_rule_that_errors_is_exit_3_and_never_no_findings(tmp_path):
    rules = _broken_rules(tmp_path)
    r = CliRunner().invoke(main, ["check", str(DEMO), "--rules", str(rules), "--quiet", "--fail-on", "never"])
    assert r.exit_code == 3, r.output
    errs = [ln for ln in r.stdout.splitlines() if "rule error" in ln]
    assert len(errs) == 1 and "TQL208" in errs[0] and "TQL208-broken.yaml" in errs[0]
    assert "No findings" not in r.stdout and "1 rule(s) failed" in r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("traceql:") and "TQL208" in line and "incomplete" in line
    # the JSON report says the same: the rule's status is error, the exit is 3
    r = CliRunner().invoke(main, ["check", str(DEMO), "--rules", str(rules), "--quiet", "--format", "json"])
    assert r.exit_code == 3
    assert {x["id"]: x["status"] for x in json.loads(r.stdout)["rules"]}["TQL208"] == "error"


def test_no_findings_only_when_every_rule_ran(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for t in DEMO.glob("rank*.pt.trace.json.gz"):  # both ranks: one alone would be a missing-rank finding
        shutil.copy(t, d)
    r = run_cli("check", d, "--select", "TQL5", "--fail-on", "never")  # NCCL rules: no NCCL log here
    assert r.exit_code == 0
    assert "No findings" not in r.stdout and "skipped" in r.stdout.splitlines()[-1]
    r = run_cli("check", d, "--select", "TQL001", "--fail-on", "never")  # runs on every run
    assert r.exit_code == 0 and "No findings" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--select", "TQL9"], "--select 'TQL9'"),
    (["--ignore", "TQL1O1"], "--ignore 'TQL1O1'"),
    (["--select", "TQL101", "--ignore", "TQL1"], "no rule to run"),
    (["--set", "TQL101.min_exposed_ms=lots"], "not a number"),
])
def test_usage_errors_are_exit_2_in_one_line(args, needle):
    r = CliRunner().invoke(main, ["check", str(DEMO), "--quiet", *args])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert needle in line


def test_an_empty_rule_folder_is_exit_2(tmp_path):
    (tmp_path / "rules").mkdir()
    r = CliRunner().invoke(main, ["check", str(DEMO), "--rules", str(tmp_path / "rules"), "--quiet"])
    assert r.exit_code == 2 and "no rule files" in r.stderr


def test_an_invalid_rule_file_is_exit_2(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "TQL101-x.yaml").write_text("id: TQL101\nname: Not Kebab\n")
    r = CliRunner().invoke(main, ["check", str(DEMO), "--rules", str(d), "--quiet"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "TQL101-x.yaml" in r.stderr


def test_a_source_error_is_one_line_even_with_a_newline_in_its_name(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(DEMO / "rank0.pt.trace.json.gz", d)
    with gzip.open(DEMO / "rank1.pt.trace.json.gz", "rb") as f:
        head = f.read()[:300]  # the header only: cut before the first complete event
    (d / "rank1\nforged line.pt.trace.json").write_bytes(head)
    r = run_cli("check", d, "--fail-on", "never", "--width", "400")  # wide: the entry is not wrapped
    assert r.exit_code == 0, r.output
    errs = [ln for ln in r.stdout.splitlines() if ln.startswith("  error ")]  # the source lines, not TQL003's head
    assert len(errs) == 1 and "rank1\\nforged line.pt.trace.json" in errs[0] and "no complete trace event" in errs[0]
    assert not any(ln.startswith("forged line") for ln in r.stdout.splitlines())


def test_an_importer_bug_is_exit_3(tmp_path, monkeypatch):
    import traceql.ingest.kineto as kineto

    def broken(path, source):
        raise KeyError("boom")

    monkeypatch.setattr(kineto, "read", broken)
    r = CliRunner().invoke(main, ["check", str(DEMO), "--quiet", "--no-cache", "--fail-on", "never"])
    assert r.exit_code == 3, r.output
    (line,) = r.stderr.strip().splitlines()
    assert "internal error" in line and "rank0.pt.trace.json.gz" in line


def test_an_internal_error_while_linking_is_exit_3_in_one_line(monkeypatch):
    import traceql.link.ranks as ranks

    def broken(run):
        raise ValueError("first line\nsecond line")

    monkeypatch.setattr(ranks, "resolve_ranks", broken)
    monkeypatch.delenv("TRACEQL_DEBUG", raising=False)
    for cmd in ("check", "summary"):
        r = CliRunner().invoke(main, [cmd, str(DEMO), "--quiet"])
        assert r.exit_code == 3, (cmd, r.output)
        (line,) = r.stderr.strip().splitlines()
        assert "internal error: ValueError: first line" in line and "second line" not in line
