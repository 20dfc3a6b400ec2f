"""The Dask path gives the same answers as the local one: the same findings (fingerprint and message), the same rule
outcomes and the same sources, on every multi-rank run dir we recorded; and only the cross-rank stage's tables reach
the driver. Runs on an in-process LocalCluster (threads), plus one cluster of worker processes to catch what does not
pickle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed", reason="the [dask] extra is part of the test install")

from traceql import executor, pipeline  # noqa: E402
from traceql.model import SCHEMAS  # noqa: E402
from traceql.model.derived import DERIVED  # noqa: E402
from traceql.rules.loader import load_rules  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _multi_rank_dirs() -> list[Path]:
    out = []
    for d in sorted([*(REPO / "fixtures").iterdir(), REPO / "samples" / "demo"]):
        m = d / "manifest.json"
        if not d.is_dir() or not m.is_file():
            continue
        ranks = json.loads(m.read_text()).get("ranks")
        if (isinstance(ranks, int) and ranks >= 2) or (isinstance(ranks, list) and len(ranks) >= 2):
            out.append(d)
    return out


MULTI = _multi_rank_dirs()


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as c, \
            distributed.Client(c) as cl:
        yield cl


def _answers(result):
    findings = sorted((f.fingerprint, f.rule, f.message, f.cost_ms_per_step, f.caused_by) for f in result.findings)
    rules = sorted((r.rule.id, r.status) for r in result.results)
    sources = sorted((str(s.path), s.status, s.rank) for s in result.run.sources)
    return findings, rules, sources


def test_there_are_multi_rank_fixtures_to_compare():
    assert len(MULTI) >= 10, [d.name for d in MULTI]


@pytest.mark.parametrize("run_dir", MULTI, ids=lambda d: d.name)
def test_dask_and_local_give_the_same_answers(run_dir, client):
    local = pipeline.check(run_dir, use_cache=False)
    dask = pipeline.check(run_dir, use_cache=False, scheduler=client)
    lf, lr, ls = _answers(local)
    df, dr, ds = _answers(dask)
    assert df == lf
    assert dr == lr
    assert ds == ls


def test_worker_processes_pickle_everything_they_hand_over():
    run_dir = REPO / "fixtures" / "h200x2-straggler"
    local = pipeline.check(run_dir, use_cache=False)
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0") as c, \
            distributed.Client(c) as cl:
        dask = pipeline.check(run_dir, use_cache=False, scheduler=cl)
    assert _answers(dask) == _answers(local)


def test_the_plan_follows_the_declarations():
    p = executor.plan(load_rules())
    assert p.per_rank and p.cross
    for r in p.per_rank:  # a per-rank rule reaches no run-scoped table, and compares no ranks
        assert not r.cross_rank
        assert all(t not in DERIVED or DERIVED[t].scope == "rank" for t in executor.reach(r)), r.id
    assert "collectives" in p.ship  # the straggler and desync rules need every rank's calls
    assert "kernels" not in p.ship or any("kernels" in executor.reach(r) for r in p.cross)
    # a run-scoped table is built by the driver from what was shipped, never shipped itself
    assert not any(t in DERIVED and DERIVED[t].scope == "run" for t in p.ship)


def test_the_driver_gets_only_the_shipped_tables(client):
    run_dir = REPO / "samples" / "demo"
    res = pipeline.check(run_dir, use_cache=False, scheduler=client)
    ship = executor.plan(load_rules()).ship
    canonical_with_rows = {n for n, df in res.run.tables.items() if df.height and n in SCHEMAS}
    assert canonical_with_rows and canonical_with_rows <= ship


def test_costs_agree_when_only_some_rules_run(client):
    # the what-if replay costs findings on the driver: what it reads must come back even when no cross-rank rule
    # asked for it
    run_dir = REPO / "samples" / "demo"
    for select in (["TQL101"], ["TQL2"]):
        local = pipeline.check(run_dir, use_cache=False, select=select)
        dask = pipeline.check(run_dir, use_cache=False, select=select, scheduler=client)
        assert _answers(dask) == _answers(local), select
        assert any(f.cost_ms_per_step for f in dask.findings), select


def test_a_rank_that_cannot_be_read_becomes_an_error_source_and_the_others_go_on(tmp_path, client):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(REPO / "fixtures" / "cpu-straggler", run)
    victim = sorted(run.glob("rank1*.json*"))[0]
    victim.write_bytes(b'{"traceEvents": [' + b'{"ph": "X", ' * 10)  # truncated garbage
    local = pipeline.check(run, use_cache=False)
    dask = pipeline.check(run, use_cache=False, scheduler=client)
    assert _answers(dask) == _answers(local)
    assert any(s.status == "error" for s in dask.run.sources)
    assert any(s.status == "ok" and s.rank == 0 for s in dask.run.sources)


def test_a_scheduler_that_is_not_there_is_one_line():
    with pytest.raises(executor.SchedulerError, match="no such scheduler file"):
        executor.client_for("/nonexistent/scheduler.json")
