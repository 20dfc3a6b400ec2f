"""Ranks are never silently wrong: a lone rankless trace is rank 0 *assumed*, two sources claiming one rank are kept
apart (TQL001 rank-collision) and rules that compare ranks skip, and a run with no rank is not a clean exit."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from traceql import link
from traceql.cli import main
from traceql.pipeline import load_run

HTA = ("hta", "tests", "data")
NO_DIST_INFO = (*HTA, "distributed_info_unavailable", "distributed_info_not_found.json.gz")
AMD = (*HTA, "amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
CPU = FIXTURES / "cpu-straggler"  # gloo on CPU, 2 ranks, distributedInfo in each trace; rank 1 really straggles


def check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args), "--quiet"])


def check_json(*args):
    res = check(*args, "--format", "json")
    return res, json.loads(res.stdout) if res.stdout.strip().startswith("{") else None


# ---------------------------------------------------------------- a lone trace without a rank: rank 0, assumed


@pytest.mark.parametrize("parts", [NO_DIST_INFO, AMD], ids=["no-distributedInfo", "amd-rocm"])
def test_lone_rankless_trace_is_rank_0_assumed(corpus, tmp_path, parts):
    # the tensorboard_trace_handler default name: host_pid.timestamp.pt.trace.json(.gz), no rank in it
    trace = tmp_path / "run" / "node1_4242.1700000000000.pt.trace.json.gz"
    trace.parent.mkdir()
    shutil.copy(corpus.joinpath(*parts), trace)
    res, doc = check_json(trace.parent)
    assert res.exit_code in (0, 1), res.output
    assert doc["run"]["ranks"] == [0]
    (src,) = [s for s in doc["sources"] if s["kind"] == "kineto"]
    assert src["rank"] == 0 and src["rank_origin"] == "assumed" and "rank 0 assumed" in src["detail"]
    assert not [r for r in doc["rules"] if r["status"] == "error"]
    text = check(trace.parent).stdout
    assert "rank 0 assumed" in text and "0 rank(s)" not in text  # said without -v


def test_rank_in_the_file_name_is_not_an_assumption(corpus, tmp_path):
    shutil.copy(corpus.joinpath(*NO_DIST_INFO), tmp_path / "worker_rank3.json.gz")
    run = load_run(tmp_path, use_cache=False)
    (src,) = [s for s in run.sources if s.kind == "kineto"]
    assert (src.rank, src.rank_origin) == (3, "file name") and run.ranks == [3]
    assert run.table("host_ops")["rank"].unique().to_list() == [3]


def test_several_rankless_traces_collide_instead_of_being_numbered(corpus, tmp_path):
    """Path order would be a guess: all are assumed rank 0, so they collide; the first is analysed, the other named."""
    shutil.copy(corpus.joinpath(*NO_DIST_INFO), tmp_path / "a.pt.trace.json.gz")
    shutil.copy(corpus.joinpath(*AMD), tmp_path / "b.pt.trace.json.gz")
    res, doc = check_json(tmp_path)
    assert res.exit_code == 1, res.output  # TQL001 is a warning, the default fail-on
    assert doc["run"]["ranks"] == [0]
    by_name = {s["path"]: s for s in doc["sources"]}
    assert by_name["a.pt.trace.json.gz"]["status"] == "ok"
    b = by_name["b.pt.trace.json.gz"]
    assert b["status"] == "skipped" and "rank collision" in b["detail"] and "traceql check" in b["detail"]
    (f,) = [f for f in doc["findings"] if f["rule"] == "TQL001"]
    assert f["ranks"] == [0] and f["evidence"]["path"] == "b.pt.trace.json.gz" and f["evidence"]["origin"] == "assumed"
    # the other trace's rows are nowhere in the tables
    run = load_run(tmp_path, use_cache=False)
    skipped = next(s.id for s in run.sources if s.path.name.startswith("b."))
    for name in ("kernels", "host_ops", "runtime"):
        assert skipped not in run.table(name)["source"].unique().to_list(), name


# ---------------------------------------------------------------- two traces claiming one rank


def _two_runs_mixed(tmp_path):
    """Rank 0 of the CPU capture twice (as if two runs' traces were put in one folder), and its rank 1."""
    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(CPU / "rank0.pt.trace.json.gz", d / "a_rank0.pt.trace.json.gz")
    shutil.copy(CPU / "rank0.pt.trace.json.gz", d / "b_rank0.pt.trace.json.gz")
    shutil.copy(CPU / "rank1.pt.trace.json.gz", d / "c_rank1.pt.trace.json.gz")
    return d


def test_two_traces_of_one_rank_are_kept_apart(tmp_path):
    d = _two_runs_mixed(tmp_path)
    run = load_run(d, use_cache=False)
    by_name = {s.path.name: s for s in run.sources}
    assert by_name["a_rank0.pt.trace.json.gz"].status == "ok"
    b = by_name["b_rank0.pt.trace.json.gz"]
    assert b.status == "skipped" and "a_rank0.pt.trace.json.gz" in b.detail
    assert set(run.table("kernels")["source"].unique().to_list()) | set(run.table("host_ops")["source"].unique().to_list()) \
        == {by_name["a_rank0.pt.trace.json.gz"].id, by_name["c_rank1.pt.trace.json.gz"].id}
    # rank 0's steps are one trace's steps, not two runs' merged
    clean = load_run(CPU, use_cache=False)
    assert run.table("steps").filter(pl.col("rank") == 0).height == clean.table("steps").filter(pl.col("rank") == 0).height
    problems = link.ensure(run, "source_problems")
    assert problems.select("rank", "kind", "problem", "path", "kept").rows() == [
        (0, "kineto", "rank-collision", "b_rank0.pt.trace.json.gz", "a_rank0.pt.trace.json.gz")]
    assert any("rank 0 is claimed by 2 kineto sources" in n for n in run.notes)


def test_cross_rank_rules_skip_while_ranks_collide(tmp_path):
    # the clean pair (rank 0 and rank 1 of one capture) has the straggler finding; with rank 0 claimed twice the
    # rule must not compare ranks
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(CPU / "rank0.pt.trace.json.gz", clean / "a_rank0.pt.trace.json.gz")
    shutil.copy(CPU / "rank1.pt.trace.json.gz", clean / "c_rank1.pt.trace.json.gz")
    _, base = check_json(clean, "--select", "TQL302,TQL001")
    assert [f["rule"] for f in base["findings"]] == ["TQL302"]
    res, doc = check_json(_two_runs_mixed(tmp_path), "--select", "TQL3,TQL403,TQL514,TQL6,TQL001")
    assert {f["rule"] for f in doc["findings"]} == {"TQL001"}
    rules = {r["id"]: r for r in doc["rules"]}
    for rid in ("TQL301", "TQL302", "TQL303", "TQL403", "TQL514", "TQL601", "TQL602", "TQL603"):
        assert rules[rid]["status"] == "skipped", rid
    for rid in ("TQL301", "TQL302", "TQL303"):  # those whose inputs the run has: skipped for the collision
        assert "TQL001" in rules[rid]["reason"] and "rank(s) 0" in rules[rid]["reason"], rules[rid]
    assert res.exit_code == 1


def test_stdout_and_stderr_logs_of_one_rank_are_not_a_collision():
    run = load_run(FIXTURES / "h200x2-desync", use_cache=False)
    assert link.ensure(run, "source_problems").height == 0
    assert [s.status for s in run.sources if s.kind == "nccl_log"] == ["ok"] * 4


def test_an_identical_copy_of_a_log_is_a_collision():
    fx = FIXTURES / "nccl-log-copied"
    res, doc = check_json(fx)
    (f,) = [f for f in doc["findings"] if f["rule"] == "TQL001"]
    assert f["ranks"] == [0] and f["evidence"]["kind"] == "nccl_log"
    run = load_run(fx, use_cache=False)
    lost = next(s for s in run.sources if s.status == "skipped" and s.kind == "nccl_log")
    assert "identical copy" in lost.detail
    assert lost.id not in run.table("nccl_comms")["source"].to_list()
    assert sorted(run.table("nccl_comms")["rank"].drop_nulls().unique().to_list()) == [0, 1]


def test_torch_trace_whose_records_name_another_rank_than_its_file(tmp_path):
    tt = sorted((FIXTURES / "cpu-divergent-compile").rglob("*torch_trace_rank_0*"))
    assert tt, "cpu-divergent-compile lost its TORCH_TRACE logs"
    shutil.copy(tt[0], tmp_path / tt[0].name)
    # the same records under rank 1's file name: the records say rank 0
    shutil.copy(tt[0], tmp_path / tt[0].name.replace("rank_0", "rank_1"))
    run = load_run(tmp_path, use_cache=False)
    renamed = next(s for s in run.sources if "rank_1" in s.path.name)
    assert renamed.status == "skipped" and "rank collision" in renamed.detail
    assert "records say rank 0, its file name rank 1" in renamed.detail
    assert run.ranks == [0]
    assert link.ensure(run, "source_problems")["kind"].to_list() == ["torch_trace"]


# ---------------------------------------------------------------- nothing attributable: never a clean exit


def test_no_rank_analysed_is_exit_2(corpus, tmp_path):
    # two single-process TORCH_LOGS stderr files of different runs: no rank in either, so none is assumed
    logs = [corpus / "compile" / d / "stderr.txt" for d in ("graph_break_cold", "recompile_storm_static")]
    for i, p in enumerate(logs):
        shutil.copy(p, tmp_path / f"job{i}.stderr.txt")
    run = load_run(tmp_path, use_cache=False)
    assert [s for s in run.sources if s.status == "ok"], "the corpus stderr logs are no longer read as TORCH_LOGS"
    assert run.ranks == []
    res = check(tmp_path)
    assert res.exit_code == 2, res.output
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("traceql:")]
    assert len(err) == 1 and "no rank analysed" in err[0] and "rank" in err[0].split("analysed", 1)[1]
    assert "No findings" not in res.stdout


def test_nothing_readable_is_exit_2(tmp_path):
    (tmp_path / "notes.md").write_text("# not a trace\n")
    res = check(tmp_path)
    assert res.exit_code == 2
    assert "nothing could be analysed" in res.stderr and "No findings" not in res.stdout


# ---------------------------------------------------------------- ranks the world size names but no source holds


def _one_rank_of(tmp_path, world_size=None):
    """cpu-straggler's rank 0 alone (its trace says world size 2), the world size rewritten where given."""
    import gzip

    run = tmp_path / "run"
    run.mkdir()
    for f in CPU.glob("rank0*"):
        shutil.copy(f, run / f.name)
    if world_size is not None:
        p = run / "rank0.pt.trace.json.gz"
        doc = json.loads(gzip.decompress(p.read_bytes()))
        doc["distributedInfo"]["world_size"] = world_size
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return run


def test_a_rank_the_world_size_names_but_no_source_holds_is_said(tmp_path):
    run = _one_rank_of(tmp_path)
    res, doc = check_json(run)
    assert res.exit_code == 1, res.output
    (f,) = [f for f in doc["findings"] if f["rule"] == "TQL002"]
    assert f["evidence"]["missing"] == "1" and f["evidence"]["world_size"] == 2 and f["evidence"]["n_present"] == 1
    assert "rank0.pt.trace.json.gz says world size 2" in f["message"]
    assert "1 rank(s) [0] of world size 2, 1 missing (1)" in check(run).stdout


def test_an_unreadable_rank_is_an_error_not_a_missing_rank(tmp_path):
    run = _one_rank_of(tmp_path)
    (run / "rank1.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not a gzip stream")
    res, doc = check_json(run)
    assert [s["status"] for s in doc["sources"] if s["path"] == "rank1.pt.trace.json.gz"] == ["error"]
    assert not [f for f in doc["findings"] if f["rule"] == "TQL002"]
    assert res.exit_code != 0


@pytest.mark.parametrize("ws, missing, n_missing", [(1 << 20, "1-1048575", (1 << 20) - 1), (4, "1-3", 3)])
def test_missing_ranks_are_ranges_even_for_a_huge_world(tmp_path, ws, missing, n_missing):
    run = load_run(_one_rank_of(tmp_path, ws), use_cache=False)
    (row,) = run.table("source_problems").filter(pl.col("problem") == "missing-rank").iter_rows(named=True)
    assert (row["missing"], row["n_missing"], row["world_size"]) == (missing, n_missing, ws)


@pytest.mark.parametrize("ws", [10**12, True, "8", 1])
def test_an_implausible_world_size_names_no_missing_rank(tmp_path, ws):
    run = load_run(_one_rank_of(tmp_path, ws), use_cache=False)
    assert run.table("source_problems").filter(pl.col("problem") == "missing-rank").height == 0


def test_an_nsys_export_names_its_world_size_from_the_recorded_environment(tmp_path):
    # rank 0's export of a 2-rank torchrun job (WORLD_SIZE="2" in its recorded environment), without rank 1's
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / "h200x2-straggler-nsys" / "rank0.nsys.sqlite", run / "rank0.nsys.sqlite")
    res, doc = check_json(run)
    (f,) = [f for f in doc["findings"] if f["rule"] == "TQL002"]
    assert f["evidence"]["origin"] == "WORLD_SIZE in the recorded environment" and f["evidence"]["missing"] == "1"
    assert res.exit_code == 1
