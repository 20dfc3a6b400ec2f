"""traceql capture: the scenario list without torch, a real tiny CPU capture, the committed fixtures' manifests,
and the accuracy benchmark's bookkeeping."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli.capture import capture_group
from traceql.capture.scenarios import SCENARIOS

REPO = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None
RULE_ID = re.compile(r"^TQL\d{3}$")
ENV_KEYS = {"torch", "cuda", "nccl", "gpu", "gpus", "nsys"}
BRIEF_SCENARIOS = {
    "ddp-eager", "ddp-compiled", "exposed-allreduce", "recompile-storm", "graph-break-hot-loop",
    "host-sync-per-step", "divergent-compile", "straggler", "desync", "fp32-leak", "small-allreduce-storm",
    "grad-accum-without-no_sync",
}


def _load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return json.loads(f.read())


# --- the scenario list, without torch ---------------------------------------------------------------------------


def test_capture_list_works_without_torch():
    # sys.modules["torch"] = None makes every `import torch` fail, as on an install without the capture extra.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from traceql.cli.capture import capture_group\n"
        "capture_group(['list', '--format', 'json'], standalone_mode=False)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert {r["scenario"] for r in rows} >= BRIEF_SCENARIOS
    by_name = {r["scenario"]: r for r in rows}
    assert by_name["ddp-eager"]["clean"] and by_name["ddp-compiled"]["clean"]
    assert by_name["straggler"]["expected"] == ["TQL301", "TQL302"]


def test_capture_list_text_names_every_scenario():
    res = CliRunner().invoke(capture_group, ["list"])
    assert res.exit_code == 0, res.output
    for name in SCENARIOS:
        assert name in res.output


def test_unknown_scenario_is_a_usage_error_naming_the_valid_ones():
    res = CliRunner().invoke(capture_group, ["no-such-thing", "--out", "x"])
    assert res.exit_code == 2
    assert "no-such-thing" in res.output and "straggler" in res.output


def test_scenario_needing_two_ranks_refuses_one(tmp_path):
    res = CliRunner().invoke(capture_group, ["straggler", "--out", str(tmp_path / "run"), "--ranks", "1"])
    assert res.exit_code != 0
    assert "at least 2 ranks" in res.output
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_expected_ranks_follow_the_planted_rank():
    assert SCENARIOS["straggler"].expected_for(4, "cpu") == [
        {"rule": "TQL301", "ranks": [3]},
        {"rule": "TQL302", "ranks": [3]},
    ]
    assert SCENARIOS["small-allreduce-storm"].expected_for(2, "cpu") == [{"rule": "TQL102", "ranks": [0, 1]}]
    # The fp32 GEMM shows only in GPU kernel names: nothing is promised on CPU.
    assert SCENARIOS["fp32-leak"].expected_for(1, "cpu") == []
    assert SCENARIOS["fp32-leak"].expected_for(1, "cuda") == [{"rule": "TQL209", "ranks": [0]}]


# --- a real capture -----------------------------------------------------------------------------------------------


@pytest.mark.capture
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (the capture extra)")
def test_tiny_cpu_capture_writes_a_complete_run_dir(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(
        capture_group, ["small-allreduce-storm", "--out", str(out), "--ranks", "2", "--steps", "2", "--timeout", "120"]
    )
    assert res.exit_code == 0, res.output

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["scenario"] == "small-allreduce-storm"
    assert manifest["hand_made"] is False and manifest["clean"] is False
    assert manifest["expected"] == [{"rule": "TQL102", "ranks": [0, 1]}]
    assert ENV_KEYS <= set(manifest["environment"])
    assert manifest["environment"]["torch"]  # filled in by rank 0, not left null
    assert manifest["exit_codes"] == [0, 0]
    assert "traceql capture small-allreduce-storm" in manifest["command"]
    assert not (out / ".env.json").exists()

    for rank in (0, 1):
        assert (out / f"rank{rank}.stdout.log").exists() and (out / f"rank{rank}.stderr.log").exists()
        trace = _load_trace(out / f"rank{rank}.pt.trace.json.gz")
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        events = trace["traceEvents"]
        steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # wait=1, warmup=1, then the 2 active steps
        # The planted storm: many all_reduce calls per step, one per parameter tensor.
        ar = [e for e in events if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce"]
        assert len(ar) >= 2 * 10
    # Compiled-scenario outputs must not appear in an eager run.
    assert not (out / "torch_trace").exists() and not (out / "torch_compile_debug").exists()

    from traceql.discover import discover

    kinds = {(s.kind, s.rank) for s in discover(out)}
    assert {("kineto", 0), ("kineto", 1)} <= kinds
    assert any(k == "manifest" for k, _ in kinds)


# --- committed fixtures and samples ----------------------------------------------------------------------------------

MANIFESTS = sorted([*(REPO / "fixtures").glob("*/manifest.json"), *(REPO / "samples").glob("*/manifest.json")])
CAPTURED = [m for m in MANIFESTS
            if m.parent.name.split("-", 1)[0] in ("cpu", "cpu8", "h200", "h200x2") or m.parent.parent.name == "samples"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_fixture_manifest_is_valid(manifest):
    m = json.loads(manifest.read_text())
    assert isinstance(m, dict) and isinstance(m.get("scenario"), str) and m["scenario"]
    assert isinstance(m.get("hand_made"), bool), "manifest must say hand_made: true/false"
    if m["hand_made"]:
        assert m.get("why") or m.get("note") or m.get("notes"), "hand-made fixtures must say why"
    if "expected" in m:
        assert isinstance(m["expected"], list)
        for e in m["expected"]:
            assert RULE_ID.match(e["rule"]), e
            assert all(isinstance(r, int) and r >= 0 for r in e["ranks"]), e
        if "clean" in m and not m.get("hand_edited"):  # a hand edit says why it departs from this
            assert m["clean"] == (m["expected"] == [])


def test_there_are_enough_captured_run_dirs():
    assert len(CAPTURED) >= 8
    backends = {m.parent.name.split("-", 1)[0] for m in CAPTURED}
    assert {"cpu", "h200"} <= backends


@pytest.mark.parametrize("manifest", CAPTURED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_captured_run_dir_matches_its_manifest(manifest):
    run = manifest.parent
    m = json.loads(manifest.read_text())
    sc = SCENARIOS[m["scenario"]]
    assert m["hand_made"] is False
    assert ENV_KEYS <= set(m["environment"])
    backend = m["environment"].get("backend", "cpu")
    assert m["expected"] == sc.expected_for(m["ranks"], backend), "expected findings drifted from the scenario"
    assert m["clean"] == sc.clean or m.get("hand_edited")
    assert (m["exit_codes"] != [0] * m["ranks"]) == sc.fails
    for rank in range(m["ranks"]):
        assert (run / f"rank{rank}.stdout.log").exists()
        trace_path = run / f"rank{rank}.pt.trace.json.gz"
        if not sc.distributed:  # tensorboard_trace_handler's own name: HOST_PID.TIMESTAMP.pt.trace.json.gz
            (trace_path,) = run.glob("*.pt.trace.json.gz")
        if sc.fails and not trace_path.exists():
            continue  # a run planted to fail at init (duplicate-gpu) never reaches the profiler
        trace = _load_trace(trace_path)
        assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])
    if sc.compiled:
        assert list((run / "torch_trace").glob("dedicated_log_torch_trace_rank_*"))
    if "--nsys" in m["command"]:
        assert m["environment"]["nsys"]
        assert list(run.glob("rank*.nsys.sqlite"))
    size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    assert size < 2 << 20, f"{run.name} is {size >> 10} KiB: profile fewer steps"


def test_sample_demo_is_small_and_plants_several_findings():
    demo = REPO / "samples" / "demo"
    m = json.loads((demo / "manifest.json").read_text())
    assert len({e["rule"] for e in m["expected"]}) >= 3
    assert sum(p.stat().st_size for p in demo.rglob("*") if p.is_file()) < 1 << 20


# --- benchmarks/accuracy.py bookkeeping ------------------------------------------------------------------------------


def _accuracy():
    spec = importlib.util.spec_from_file_location("accuracy", REPO / "benchmarks" / "accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fixture(root: Path, name: str, expected: list, clean: bool) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"scenario": name, "expected": expected, "clean": clean,
                                                 "hand_made": True, "why": "bookkeeping test"}))
    return d


def test_accuracy_scores_pairs_and_flags_a_baseline_regression(tmp_path, monkeypatch):
    acc = _accuracy()
    root = tmp_path / "fixtures"
    _fixture(root, "slow", [{"rule": "TQL302", "ranks": [1]}], False)
    _fixture(root, "clean", [], True)
    _fixture(root, "later", [{"rule": "TQL999", "ranks": [0]}], False)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "TQL302-straggler-rank.yaml").write_text("id: TQL302\n")
    (rules / "TQL201-host-sync-in-step.yaml").write_text("id: TQL201\n")

    reports = {
        "slow": {"findings": [{"rule": "TQL302", "severity": "warning", "ranks": [1]}]},
        "clean": {"findings": [{"rule": "TQL201", "severity": "info", "ranks": [0]}]},
        "later": {"findings": []},
    }
    monkeypatch.setattr(acc, "check", lambda run, timeout: (reports[run.name], "", 0.0))
    baseline = tmp_path / "baseline.json"
    assert acc.main([str(root), "--rules", str(rules), "--write-baseline", str(baseline)]) == 0
    pairs = json.loads(baseline.read_text())["pairs"]
    assert pairs[f"{root / 'slow'}::TQL302"] == "pass"
    assert pairs[f"{root / 'clean'}::quiet"] == "pass"  # an info finding is no false alarm
    assert pairs[f"{root / 'later'}::TQL999"] == "not_yet"

    # Wrong rank: the finding names rank 0, the manifest rank 1.
    reports["slow"] = {"findings": [{"rule": "TQL302", "severity": "warning", "ranks": [0]}]}
    reports["clean"] = {"findings": [{"rule": "TQL201", "severity": "warning", "ranks": [0]}]}
    assert acc.main([str(root), "--rules", str(rules), "--check-baseline", str(baseline)]) == 1
    rows = acc.evaluate(root / "slow", reports["slow"], "", {"TQL302"})
    assert rows[0]["status"] == "wrong_ranks"
    rows = acc.evaluate(root / "clean", reports["clean"], "", {"TQL201"})
    assert rows[-1]["status"] == "false_alarm" and rows[-1]["alarms"] == {"TQL201": 1}

    # Back to passing: no regression.
    reports["slow"] = {"findings": [{"rule": "TQL302", "severity": "warning", "ranks": [1]}]}
    reports["clean"] = {"findings": []}
    assert acc.main([str(root), "--rules", str(rules), "--check-baseline", str(baseline)]) == 0


def test_accuracy_reads_the_hand_made_expect_shape():
    acc = _accuracy()
    assert acc.expectations({"expect": {"fire": ["TQL507"]}}) == ([{"rule": "TQL507", "ranks": []}], False)
    assert acc.expectations({"expect": {"fire": []}}) == ([], True)
    assert acc.expectations({"scenario": "x"}) is None


def test_multi_gpu_runs_used_nccl_between_gpus():
    """The h200x2 run dirs come from two GPUs with NCCL (not gloo on one shared GPU) and carry real NCCL kernels."""
    from traceql.pipeline import load_run

    multi = [m for m in CAPTURED if m.parent.name.startswith("h200x2-")]
    assert len(multi) >= 5
    for manifest in multi:
        env = json.loads(manifest.read_text())["environment"]
        assert env["gpus"] >= 2 and env["process_group"] == "nccl", manifest
    k = load_run(REPO / "fixtures" / "h200x2-exposed-allreduce", use_cache=False).tables["kernels"]
    assert set(k.filter(k["kind"] == "comm")["rank"].unique().to_list()) == {0, 1}


def test_single_process_scenarios_refuse_several_ranks(tmp_path):
    from traceql.capture.runner import CaptureError, capture
    from traceql.capture.scenarios import SCENARIOS

    for name in ("plain-loop", "loader-bound", "loader-fixed"):
        assert SCENARIOS[name].distributed is False and SCENARIOS[name].default_ranks == 1
    with pytest.raises(CaptureError, match="without torch.distributed"):
        capture("loader-bound", tmp_path / "out", ranks=2)
    assert SCENARIOS["loader-bound"].expected_for(1, "cpu") == [{"rule": "TQL210", "ranks": [0]}]
