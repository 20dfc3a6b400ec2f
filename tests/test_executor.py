"""The Dask path gives the same answers as the local one: the same findings (fingerprint and message), the same rule
outcomes and the same sources, on every multi-rank run dir we recorded; and only the cross-rank stage's tables reach
the driver. Runs on an in-process LocalCluster (threads), plus one cluster of worker processes to catch what does not
pickle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed", reason="the [dask] extra is part of the test install")

from traceql import executor, link, pipeline  # noqa: E402
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


# ---------------------------------------------------------------- per-rank work stays where it ran

# rows per kernel, host op, runtime call or activity interval: what a rank task must never hand the driver
_PER_ROW = {*executor.BIG, "activity", "path_kernels", "host_cover", "blocking_calls", "gpu_idle_gaps"}
_GPU_AND_CPU = ["h200x2-straggler", "h200x2-exposed-allreduce-nsys", "cpu-straggler", "samples/demo"]


def _dir(name: str) -> Path:
    return REPO / name if "/" in name else REPO / "fixtures" / name


def test_the_ship_set_holds_no_per_row_table():
    p = executor.plan(load_rules())
    assert not p.ship & _PER_ROW, sorted(p.ship & _PER_ROW)
    # what stays on the workers is what the cluster tasks read there: the critical path's inputs, the late rules'
    assert {"path_kernels", "host_cover"} <= p.stay and p.remote == {"critical_path"}
    for r in p.late:  # a late rule compares no ranks and gets its ranks' rows of the run-scoped tables it reads
        assert not r.cross_rank and executor.given_tables(r) <= p.given


def _rank_outputs(run_dir: Path) -> list:
    """What each rank task of the run hands the driver: the Dask path's tasks called in this process, in its order."""
    from traceql.discover import discover
    from traceql.link.ranks import resolve_ranks
    from traceql.model import Run, concat

    rules = load_rules()
    p = executor.plan(rules)
    reads = {s.id: executor.read_task(str(run_dir), s, False) for s in discover(run_dir) if s.status in ("ok", "partial")}
    metas = [r[0] for r in reads.values()]
    meta = Run(path=run_dir, sources=metas, tables={n: concat(n, []) for n in SCHEMAS})
    assumed, lost = resolve_ranks(meta)
    return [executor.for_driver(executor.rank_task(str(run_dir), g, assumed, lost, [reads[s.id] for s in g], p.per_rank,
                                                   {}, sorted(p.ship), sorted(p.stay), sorted(p.counted)))
            for g in executor._groups(meta.sources)]


@pytest.mark.parametrize("name", _GPU_AND_CPU)
def test_a_rank_task_hands_the_driver_only_small_tables(name, client):
    run_dir = _dir(name)
    local = pipeline.check(run_dir, use_cache=False)
    shipped = _rank_outputs(run_dir)
    assert len(shipped) >= 2 and all(o.kept is None for o in shipped)
    names = {n for o in shipped for n in o.tables}
    assert "collectives" in names and not names & _PER_ROW, sorted(names & _PER_ROW)
    # small: the shipped rows are per step, per collective, per compile or NCCL event, never per kernel or op
    per_row = sum(local.run.table(t).height for t in ("kernels", "host_ops", "runtime"))
    assert sum(df.height for o in shipped for df in o.tables.values()) < per_row / 2
    # the driver of the Dask path gives the local answers, holds no per-row table, and its critical path, built on
    # a worker from what stayed there, is the local one
    dask = pipeline.check(run_dir, use_cache=False, scheduler=client)
    assert _answers(dask) == _answers(local)
    assert all(dask.run.table(t).height == 0 for t in executor.BIG)
    lc, dc = (link.ensure(r.run, "critical_path") for r in (local, dask))
    assert dc.sort("step").equals(lc.sort("step"))
    if name.startswith("h200"):
        assert dc.height > 0


def _frames(x) -> list:
    """Every DataFrame inside what a task handed back (tuples, lists, dicts of them)."""
    import polars as pl

    if isinstance(x, pl.DataFrame):
        return [x]
    if isinstance(x, dict):
        return [f for v in x.values() for f in _frames(v)]
    if isinstance(x, (list, tuple)):
        return [f for v in x for f in _frames(v)]
    return []


@pytest.mark.parametrize("name", ["h200x2-straggler", "h200x2-exposed-allreduce-nsys", "samples/demo"])
def test_the_critical_path_ships_rows_per_step_and_collective_never_per_kernel(name, client, monkeypatch):
    # what reaches the driver for the critical path: the parts' metas and segments, all of which the driver hands
    # the stitch (the first round's segments in its cache, later rounds' through fetch)
    from traceql.link import critical_path as cp

    run_dir = _dir(name)
    local = pipeline.check(run_dir, use_cache=False)
    shipped: list = []

    def stitch(metas, fetch, cache=None):
        shipped.extend([metas, dict(cache or {})])

        def fetched(need):
            out = fetch(need)
            shipped.extend(out.values())
            return out
        return real(metas, fetched, cache)
    real = cp.stitch
    monkeypatch.setattr(cp, "stitch", stitch)

    dask = pipeline.check(run_dir, use_cache=False, scheduler=client)
    lc, dc = (link.ensure(r.run, "critical_path") for r in (local, dask))
    assert dc.height > 0 and dc.sort("step").equals(lc.sort("step"))
    frames = _frames(shipped)
    assert frames and not any({"launch_end", "seg_ts", "cover"} & set(f.columns) for f in frames)
    # bounded by the ranks' steps and collectives: a row per step and collective kernel in the metas, a segment per
    # step and per collective kernel another rank waited for (every segment a tuple of a few integers)
    rows = sum(f.height for f in frames)
    segments = sum(len(x) for x in shipped if isinstance(x, dict))
    steps, colls = (local.run.table(t).height for t in ("steps", "collectives"))
    assert rows <= steps + colls
    assert segments <= dc.height + 2 * colls  # a collective kernel or a host-side wait's late rank per collective
    # the first round holds what the walks enter the ranks at: at most one further round per step
    assert len(shipped) - 2 <= dc.height
    assert rows + segments < local.run.table("kernels").height / 4


def _synthetic(src: Path, dst: Path, n: int) -> Path:
    """n ranks from a real two-rank capture: rank r is a copy of the capture's rank r % 2 with its rank rewritten
    (the way benchmarks/scale.py builds its runs)."""
    import gzip

    docs = [json.loads(gzip.decompress(p.read_bytes())) for p in sorted(src.glob("rank*.pt.trace.json.gz"))]
    dst.mkdir()
    for r in range(n):
        doc = docs[r % len(docs)]
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (dst / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return dst


def test_one_unreadable_rank_among_many_on_the_dask_path(tmp_path, client):
    run = _synthetic(REPO / "fixtures" / "cpu-straggler", tmp_path / "run", 16)
    whole = pipeline.check(run, use_cache=False, scheduler=client)
    import gzip

    # rank 5 unreadable (a trace that breaks before its first complete event), rank 9 cut off half-way (salvaged)
    (run / "rank5.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [' + b'{"ph": "X", ' * 10))
    cut = (run / "rank9.pt.trace.json.gz").read_bytes()
    (run / "rank9.pt.trace.json.gz").write_bytes(cut[: len(cut) // 2])
    local = pipeline.check(run, use_cache=False)
    dask = pipeline.check(run, use_cache=False, scheduler=client)
    assert _answers(dask) == _answers(local)
    status = {s.path.name: s.status for s in dask.run.sources}
    assert status["rank5.pt.trace.json.gz"] == "error" and status["rank9.pt.trace.json.gz"] == "partial"
    assert sum(v == "ok" for v in status.values()) == 14
    assert sorted(dask.run.ranks) == [r for r in range(16) if r != 5]
    # the other ranks' findings stay: every per-rank finding of the whole run on an intact rank is still there (a
    # cross-rank one may change: the medians across ranks lost a rank)
    per_rank = {r.id for r in executor.plan(load_rules()).per_rank}
    kept = {f.fingerprint for f in dask.findings}
    others = [f for f in whole.findings if f.rule in per_rank and not {5, 9} & set(f.ranks)]
    assert others and all(f.fingerprint in kept for f in others)
    # and the exit status says what the local path says
    assert dask.verdict(run, "warning") == local.verdict(run, "warning")


def test_the_local_scheduler_gives_each_worker_one_polars_thread(monkeypatch):
    # polars' own pool in every single-threaded worker oversubscribed the cores (16 workers on 16 cores: 113 CPU s
    # of worker time against 65 with one polars thread each)
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    client = executor.client_for("local")
    try:
        import os

        seen = set(client.run(lambda: os.environ.get("POLARS_MAX_THREADS")).values())
    finally:
        client.close()
        client.cluster.close()
    assert seen == {"1"}


def test_the_driver_holds_every_shipped_table_in_one_chunk(client):
    # rank outputs are concatenated once and rechunked, so that no per-rank chunk outlives its output (a plain concat
    # kept a thousand small chunks per column alive at 1,024 ranks, and every cross-rank query walked them)
    run_dir = REPO / "fixtures" / "h200x2-straggler"
    res = pipeline.check(run_dir, use_cache=False, scheduler=client)
    ship = executor.plan(load_rules()).ship
    held = {n: df for n, df in res.run.tables.items() if n in ship and df.height}
    assert len([s for s in res.run.sources if s.rank is not None]) >= 2 and held
    assert {n: df.n_chunks() for n, df in held.items()} == {n: 1 for n in held}
