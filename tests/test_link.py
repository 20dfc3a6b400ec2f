"""Linking ranks into one run: collective matching, clock alignment, the graph, critical path, and their rules.

Real material first: the Flight Recorder fixtures (3 gloo ranks, captured), the 2 sampled ranks of a 128-rank job
and a 2-GPU nsys export from the reference corpus, and the capture module's multi-rank CPU fixtures where present.
Properties that need a known truth (a planted clock offset) use small tables built in the test.
"""

from __future__ import annotations

import shutil

import json
from pathlib import Path

import networkx as nx
import polars as pl
import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO, corpus_path, rule_rows
from traceql import link
from traceql.link.graph import build_graph
from traceql.model import Run, Source, conform
from traceql.pipeline import load_run
from traceql.rules.engine import run_rules
from traceql.rules.loader import load_rule

TRACE_FILTER = corpus_path("hta", "tests", "data", "trace_filter")
DEMO = REPO / "samples" / "demo"  # 2 gloo ranks on an H200, captured; committed, so it runs where the corpus is absent
NSYS_2GPU = corpus_path("nsys", "mfu_2gpu_before.sqlite")
TRACE_DIFF = corpus_path("hta", "tests", "data", "trace_diff")


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def _findings(path: Path, rule: str):
    # only this rule's file: other rule files may be mid-edit by their authors
    (rule_file,) = (REPO / "rules").glob(f"{rule}-*.yaml")
    results = run_rules(load_run(path), [load_rule(rule_file)], {})
    assert results[0].status == "ran", results[0].reason
    return results[0].findings


# ------------------------------------------------------------------ Flight Recorder fixtures (3 real gloo ranks)


def test_op_mismatch_names_first_divergent_seq_and_odd_rank():
    run = load_run(_need(FIXTURES / "nccl-fr-op-mismatch"))
    (row,) = rule_rows(run, "TQL303")
    assert row["kind"] == "op" and row["odd_ranks"] == [1] and row["majority_ranks"] == [0, 2]
    # the first divergent call: every rank agrees on everything before it
    m = link.ensure(run, "collective_matches")
    before = m.filter(pl.col("seq") < row["seq"]).group_by("seq").agg(pl.col("op").n_unique())
    assert before.height > 0 and before["op"].max() == 1
    at = m.filter(pl.col("seq") == row["seq"])
    assert at.filter(pl.col("rank") == 1)["op"][0] == row["odd_value"] != row["majority"]


def test_size_mismatch_and_quiet_twin():
    d = rule_rows(load_run(_need(FIXTURES / "nccl-fr-size-mismatch")), "TQL303")
    assert [r["kind"] for r in d] == ["size"] and [r["odd_ranks"] for r in d] == [[2]]
    ok = load_run(_need(FIXTURES / "nccl-fr-ok"))
    assert rule_rows(ok, "TQL303") == []
    assert link.ensure(ok, "collective_gaps").height == 0


def test_rank_that_stops_early_is_reported():
    run = load_run(_need(FIXTURES / "nccl-fr-missing-rank"))
    gaps = link.ensure(run, "collective_gaps")
    early = gaps.filter(pl.col("status") == "stopped_early")
    assert early["rank"].to_list() == [2]
    n = link.ensure(run, "collective_matches").group_by("rank").len()
    assert early["n_collectives"][0] == n.filter(pl.col("rank") == 2)["len"][0] < n["len"].max()
    assert any("rank 2 stops early" in s for s in run.notes)


def test_member_rank_without_a_trace_is_reported():
    run = load_run(_need(FIXTURES / "nccl-fr-dead-rank"))
    gaps = link.ensure(run, "collective_gaps")
    assert gaps.filter(pl.col("status") == "missing")["rank"].to_list() == [2]
    assert any("no trace in the run dir" in s for s in run.notes)


def test_tql303_fires_on_desync_and_stays_quiet_on_clean_run():
    f = _findings(_need(FIXTURES / "nccl-fr-op-mismatch"), "TQL303")
    assert len(f) == 1 and f[0].ranks == [1] and "sequence number" in f[0].message
    assert _findings(FIXTURES / "nccl-fr-ok", "TQL303") == []


# ------------------------------------------------------------------ two ranks of a job: samples/demo (2 gloo ranks,
# committed) and, where present, the sampled ranks 0 and 1 of a 128-rank NCCL job


@pytest.fixture(scope="module", params=[pytest.param(DEMO, id="demo"),
                                        pytest.param(TRACE_FILTER, id="corpus-trace_filter", marks=pytest.mark.corpus)])
def sampled(request):
    return load_run(_need(request.param))


def test_sampled_ranks_match_by_call_order_per_step(sampled):
    m = link.ensure(sampled, "collective_matches")
    assert set(m["seq_origin"]) == {"call order per step"}  # the trace records no sequence numbers
    per = m.group_by("match_id").agg(pl.col("rank").sort())
    assert per["rank"].to_list() == [[0, 1]] * per.height
    # matched calls sit in the same profiler step on both ranks
    assert m.group_by("match_id").agg(pl.col("step").n_unique())["step"].max() == 1


def test_missing_world_ranks_are_noted():
    sampled = load_run(_need(TRACE_FILTER))
    gaps = link.ensure(sampled, "collective_gaps")
    missing = gaps.filter(pl.col("status") == "missing")["rank"].to_list()
    assert missing == list(range(2, 128))
    assert any("126 of 128" in s for s in sampled.notes)


def test_instances_wait_and_last_arriver(sampled):
    ci = link.ensure(sampled, "collective_instances")
    per = ci.group_by("match_id").agg(pl.col("is_last").sum().alias("n_last"), pl.col("wait_ms").min().alias("w"),
                                      pl.col("skew_ms").first(), pl.col("wait_ms").max().alias("wmax"))
    assert (per["n_last"] == 1).all() and (per["w"] == 0).all()
    assert (per["wmax"] - per["skew_ms"]).abs().max() < 1e-9  # the first arriver waits the whole skew
    last = ci.filter(pl.col("is_last"))
    assert (last["rank"] == last["last_arriver"]).all()


def test_critical_path_parts_add_up_to_the_step(sampled):
    cp = link.ensure(sampled, "critical_path")
    assert cp["step"].to_list() == sorted(sampled.table("steps")["step"].unique().to_list())
    parts = cp["compute_ms"] + cp["exposed_comm_ms"] + cp["host_launch_ms"] + cp["idle_ms"]
    assert ((parts - cp["step_ms"]).abs() < 1e-6).all()
    # a step's critical path cannot be longer than the longest profiler step window, stretched by the clock skew
    longest = sampled.table("steps")["dur"].max() / 1e6
    off = link.ensure(sampled, "clock_offsets")["offset_ns"].abs().max() / 1e6
    assert (cp["step_ms"] <= longest + off + 1.0).all()


def test_launch_bound_gaps_are_within_the_gaps(sampled):
    lb = link.ensure(sampled, "launch_bound")
    assert lb.height == sampled.table("steps").select("rank", "step").unique().height  # one row per rank and step
    assert ((lb["launch_gap_ms"] <= lb["gap_ms"] + 1e-9) & (lb["busy_ms"] <= lb["step_ms"] + 1e-9)).all()


def test_graph_skeleton(sampled):
    g = build_graph(sampled)
    assert nx.is_directed_acyclic_graph(g)
    kinds = {k for _, _, k in g.edges(data="kind")}
    assert {"launches", "stream", "calls", "peer", "step"} <= kinds
    k = sampled.table("kernels")
    assert sum(1 for _, d in g.nodes(data="kind") if d == "kernel") == k.height
    kid = f"r0:k{k.filter(pl.col('rank') == 0)['id'][0]}"
    assert g.nodes[kid]["kind"] == "kernel"
    # every kernel with a launch in the trace has exactly one launch edge in
    launched = [n for n, d in g.nodes(data="kind") if d == "kernel"
                and sum(1 for p in g.predecessors(n) if g.edges[p, n]["kind"] == "launches") == 1]
    assert len(launched) == k.filter(pl.col("correlation").is_not_null()).height
    # one match node per collective matched on both ranks, one peer edge in from each rank
    matches = [n for n, d in g.nodes(data="kind") if d == "collective_match"]
    calls = sampled.table("collectives").group_by("rank").len()["len"]
    assert calls.n_unique() == 1  # both ranks record every call of the job
    assert len(matches) == calls[0] > 0 and all(g.in_degree(n) == 2 for n in matches)


def test_graph_command_writes_node_link_json(sampled, tmp_path):
    from traceql.cli.graph import graph_command

    out = tmp_path / "g.json"
    res = CliRunner().invoke(graph_command, [str(sampled.path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["directed"] and len(data["nodes"]) > 1000 and len(data["edges"]) > 1000
    gml = tmp_path / "g.graphml"
    assert CliRunner().invoke(graph_command, [str(sampled.path), "--out", str(gml), "--graphml"]).exit_code == 0
    assert nx.read_graphml(gml).number_of_nodes() == len(data["nodes"])


def test_traces_of_different_runs_are_flagged(tmp_path):
    # control is rank 3 of an 8-rank job, test is rank 1 of a 2-rank job: not one run
    base = _need(TRACE_DIFF)
    shutil.copy(base / "control" / "control.json.gz", (tmp_path / "a.json.gz"))
    shutil.copy(base / "test" / "test.json.gz", (tmp_path / "b.json.gz"))
    run = load_run(tmp_path, use_cache=False)
    link.ensure(run, "collective_matches")
    assert any("disagree on the world size" in s for s in run.notes)


def test_a_member_rank_without_its_trace_is_noted(tmp_path):
    """samples/demo with rank 1's trace left out: a 2-rank group (distributedInfo) with one rank present."""
    shutil.copy(DEMO / "rank0.pt.trace.json.gz", (tmp_path / "rank0.pt.trace.json.gz"))
    run = load_run(tmp_path, use_cache=False)
    gaps = link.ensure(run, "collective_gaps")
    assert gaps.filter(pl.col("status") == "missing")["rank"].to_list() == [1]
    assert any("1 of 2" in s and "no trace in the run dir" in s for s in run.notes), run.notes


def test_traces_of_different_captures_are_flagged(tmp_path):
    # committed captures: rank 1 of the 2-rank demo and rank 0 of a 1-rank run (distributedInfo world sizes 2 and 1)
    shutil.copy(DEMO / "rank1.pt.trace.json.gz", (tmp_path / "a.json.gz"))
    shutil.copy(FIXTURES / "h200-host-sync-per-step" / "rank0.pt.trace.json.gz", (tmp_path / "b.json.gz"))
    run = load_run(tmp_path, use_cache=False)
    link.ensure(run, "collective_matches")
    assert any("disagree on the world size" in s for s in run.notes), run.notes


# ------------------------------------------------------------------ 2 ranks in one nsys export (one clock)


def test_ranks_in_one_nsys_file_share_its_clock():
    run = load_run(_need(NSYS_2GPU))
    off = link.ensure(run, "clock_offsets")
    assert off["offset_ns"].to_list() == [0, 0]
    assert "same source" in off.filter(pl.col("rank") == 1)["method"][0]
    # how closely the matched NCCL kernel ends coincide on one clock is reported
    note = next(s for s in run.notes if "within" in s and "us of each other" in s)
    assert float(note.split("within ")[1].split(" us")[0]) < 100.0


# ------------------------------------------------------------------ planted truth: small tables built here


def _run_from(collectives: list[dict], sources: list[Source] | None = None) -> Run:
    run = Run(path=Path("."), sources=sources or [])
    run.tables["collectives"] = conform("collectives", pl.DataFrame(collectives))
    return run


def _calls(rank, n, offset_ns, late_ns=0, jitter=(0,), host_only=False, pg_name="0", seq=True):
    rows = []
    for i in range(n):
        t = 1_000_000_000 + i * 10_000_000  # true time of the call's end, shared by all ranks
        end = t + offset_ns + jitter[i % len(jitter)]
        arrival = t - 2_000_000 + late_ns + offset_ns
        row = {"rank": rank, "source": rank, "id": i, "op": "all_reduce", "pg_name": pg_name, "pg_ranks": "[0, 1, 2]",
               "seq": i + 1 if seq else None, "in_nelems": 1024, "dtype": "Float", "bytes": 4096}
        if host_only:
            row |= {"ts": arrival, "end": end}
        else:
            row |= {"ts": arrival - 50_000, "end": arrival - 40_000, "kernel_ts": arrival, "kernel_end": end}
        rows.append(row)
    return rows


def test_clock_offsets_recover_a_planted_offset_despite_an_outlier():
    # rank 1's clock runs 5 ms ahead, rank 2's 3 ms behind; ends jitter by a few us and one call ends 2 ms late
    rows = _calls(0, 20, 0) + _calls(1, 20, 5_000_000, jitter=(0, 3_000, -2_000, 2_000_000)) + _calls(2, 20, -3_000_000, jitter=(1_000, -1_000))
    run = _run_from(rows)
    off = {r: (o, res, meth) for r, o, res, _, meth, _ in link.ensure(run, "clock_offsets").iter_rows()}
    assert abs(off[1][0] - 5_000_000) <= 3_000 and abs(off[2][0] + 3_000_000) <= 1_000
    assert off[1][2] == "nccl kernel end" and off[1][1] < 100.0  # residual in us: the outlier does not dominate


def test_one_rank_is_unaligned_as_the_general_path_says(monkeypatch):
    # one rank: no call matched on two ranks, so offset 0 and unaligned (clock._unaligned); two ranks are aligned by
    # the matching, never given that answer
    from traceql.link import clock

    early = link.ensure(_run_from(_calls(0, 5, 0)), "clock_offsets")
    assert early.to_dicts() == [{"rank": 0, "offset_ns": 0, "residual_us": None, "n_matched": 0,
                                 "method": "unaligned (no collective matched on two ranks)", "reference": None}]
    monkeypatch.setattr(clock, "_unaligned", lambda ranks: (_ for _ in ()).throw(AssertionError("shortcut taken")))
    two = link.ensure(_run_from(_calls(0, 5, 0) + _calls(1, 5, 1_000_000)), "clock_offsets")
    assert two.filter(pl.col("rank") == 1)["offset_ns"][0] != 0


def test_align_leaves_times_alone_where_every_offset_is_zero_and_shifts_them_otherwise():
    from traceql.link import clock

    df = pl.DataFrame({"rank": [0, 1, 1], "ts": [10, 20, 30], "end": [15, 25, 35]})
    zero = pl.DataFrame({"rank": [0, 1], "offset_ns": [0, None]}, schema={"rank": pl.Int32, "offset_ns": pl.Int64})
    assert clock.align(df, zero, ["ts", "end"]) is df
    off = zero.with_columns(pl.Series("offset_ns", [0, 5], dtype=pl.Int64))
    out = clock.align(df, off, ["ts", "end"])
    assert out.columns == df.columns and out["ts"].to_list() == [10, 15, 25] and out["end"].to_list() == [15, 20, 30]


def test_waits_use_aligned_times_and_name_the_straggler():
    # rank 2 arrives 4 ms late at every call; its clock is 7 ms behind, so raw times would call it early
    rows = _calls(0, 10, 0) + _calls(1, 10, 0) + _calls(2, 10, -7_000_000, late_ns=4_000_000)
    run = _run_from(rows)
    ci = link.ensure(run, "collective_instances")
    assert set(ci["last_arriver"].to_list()) == {2}
    w = ci.filter(pl.col("rank") == 0)["wait_ms"]
    assert ((w - 4.0).abs() < 0.01).all()
    s = rule_rows(run, "TQL302", rank=2)[0]
    assert s["last_pct"] == 100.0 and abs(s["wait_caused_ms"] - 10 * 2 * 4.0) < 0.1
    assert abs(s["median_lateness_ms"] - 4.0) < 0.01


def test_gloo_calls_align_on_host_op_ends_and_say_so():
    rows = _calls(0, 6, 0, host_only=True) + _calls(1, 6, 2_000_000, host_only=True)
    off = link.ensure(_run_from(rows), "clock_offsets")
    row = off.filter(pl.col("rank") == 1).row(0, named=True)
    assert abs(row["offset_ns"] - 2_000_000) < 1_000 and "host op end" in row["method"] and "less precise" in row["method"]


def test_per_process_pg_names_fall_back_to_description_and_ranks():
    # older torch: each process names the same group differently; description + rank list identify it
    rows = []
    for r, name in ((0, "140001"), (1, "140777"), (2, "139555")):
        for row in _calls(r, 4, 0, pg_name=name):
            rows.append(row | {"pg_desc": "default_pg"})
    run = _run_from(rows)
    m = link.ensure(run, "collective_matches")
    assert m["group"].n_unique() == 1 and m.group_by("match_id").len()["len"].to_list() == [3] * 4
    assert any("different pg_name values" in s for s in run.notes)


def test_without_seq_calls_match_in_call_order_not_by_time():
    # no sequence numbers, and rank 1 is so late that its first call starts after rank 0's second
    rows = _calls(0, 3, 0, seq=False) + _calls(1, 3, 0, late_ns=15_000_000, seq=False)
    m = link.ensure(_run_from(rows), "collective_matches")
    assert set(m["seq_origin"]) == {"call order"}
    pairs = m.group_by("match_id").agg(pl.col("id").sort())["id"].to_list()
    assert sorted(pairs) == [[0, 0], [1, 1], [2, 2]]


def test_sub_groups_from_pg_config():
    # pg "1" holds ranks 0 and 1 only; pg_config says so where the trace's rank list is missing
    rows = []
    for r in (0, 1):
        rows += [x | {"pg_ranks": None} for x in _calls(r, 3, 0, pg_name="1")]
    srcs = [Source(Path(f"r{r}.json"), "kineto", id=r, rank=r,
                   meta={"world_size": 4, "pg_config": [{"pg_name": "1", "pg_desc": "tp", "ranks": [0, 1]}]}) for r in (0, 1)]
    run = _run_from(rows, srcs)
    m = link.ensure(run, "collective_matches")
    assert set(m["members"]) == {"0,1"} and set(m["group_size"]) == {2}
    assert link.ensure(run, "collective_gaps").height == 0  # ranks 2 and 3 are not members of pg 1


# ------------------------------------------------------------------ capture fixtures (multi-rank CPU, when present)


@pytest.mark.parametrize("name,rule", [("cpu-straggler", "TQL302"), ("cpu-desync", "TQL303")])
def test_capture_fixture_produces_expected_finding(name, rule):
    path = FIXTURES / name
    if not (path / "manifest.json").exists():
        pytest.skip(f"{path} not captured yet")
    manifest = json.loads((path / "manifest.json").read_text())
    want = [e for e in manifest.get("expected", []) if e["rule"] == rule]
    if not want:
        pytest.skip(f"{name} does not expect {rule}")
    found = _findings(path, rule)
    assert found and sorted({r for f in found for r in f.ranks}) == sorted(want[0]["ranks"])
