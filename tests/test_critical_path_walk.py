"""The vectorised critical-path walk (link.critical_path) against the per-kernel Python walk it replaced, kept here
only as the reference: the table must be identical on every fixture and sample that has kernels, walked as one part
(the local path) and as one part per rank, each from its own rows only (the Dask path's split)."""

from __future__ import annotations

import pickle
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from traceql import link
from traceql.link.critical_path import CP_SCHEMA, _HostView, _int_view, _note, _NO_TIME, _prev_on_device
from traceql.model import Run
from traceql.pipeline import load_run

ROOT = Path(__file__).resolve().parents[1]
DIRS = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "fixtures").glob("*/manifest.json")) + ["samples/demo"]


# the reference walk's own inputs over the whole run (link.critical_path's parts build the same per rank)
def _kernels_aligned(run: Run) -> pl.DataFrame:
    from traceql.link import clock, ensure

    k = ensure(run, "path_kernels")
    if k.height and run.has("collectives"):
        k = clock.align(k, ensure(run, "clock_offsets"), ["ts", "end", "launch_ts", "launch_end"])
    return k


def _collective_waits(run: Run, k: pl.DataFrame) -> dict[int, tuple[int, int]]:
    """kernel row -> (arrival of the last arriver, row of the last arriver's collective kernel), where another rank
    arrived after this collective kernel started."""
    from traceql.link import ensure

    if not run.has("collectives"):
        return {}
    m = ensure(run, "collective_matches").filter(pl.col("kernel_ts").is_not_null())
    ci = ensure(run, "collective_instances").select("rank", "match_id", "arrival", "last_arriver", "n_ranks")
    if m.height == 0:
        return {}
    ki = k.with_row_index("_row").select("_row", "rank", "source", "kind", pl.col("ts").alias("_ats"))
    # collective kernel start on the raw clock (collectives.kernel_ts) -> aligned kernel row
    raw = ensure(run, "path_kernels").select("rank", "source", "kind", "ts").with_row_index("_row") \
        .filter(pl.col("kind") == "comm").select("_row", "rank", "source", pl.col("ts").alias("kernel_ts"))
    mk = m.select("rank", "source", "match_id", "kernel_ts").join(raw, on=["rank", "source", "kernel_ts"], how="inner") \
        .unique(["rank", "match_id"], keep="first").join(ci, on=["rank", "match_id"], how="inner").filter(pl.col("n_ranks") >= 2)
    last = mk.filter(pl.col("rank") == pl.col("last_arriver")).select("match_id", pl.col("_row").alias("_lrow"),
                                                                       pl.col("arrival").alias("_larr"))
    j = mk.join(last, on="match_id", how="inner").join(ki.select("_row", "_ats"), on="_row", how="inner").filter(
        (pl.col("rank") != pl.col("last_arriver")) & (pl.col("_larr") > pl.col("_ats")))
    return {r: (a, lr) for r, a, lr in j.select("_row", "_larr", "_lrow").iter_rows()}


def _reference(run: Run) -> pl.DataFrame:
    k = _kernels_aligned(run)
    if k.height == 0:
        if run.has("steps"):
            _note(run, "critical_path: no GPU activity in the run (host-only backends such as gloo on CPU); not computed")
        return pl.DataFrame(schema=CP_SCHEMA)
    from traceql.link import clock, ensure

    steps = run.table("steps").filter(pl.col("ts").is_not_null())
    if run.has("collectives") and steps.height:
        steps = clock.align(steps.with_columns(pl.col("rank").cast(pl.Int32)), ensure(run, "clock_offsets"), ["ts", "end"])
    step_start = {(r, s): t for r, s, t in steps.group_by("rank", "step").agg(pl.col("ts").min()).iter_rows()}
    waits = _collective_waits(run, k)

    # The walk reads a few rows of millions at random: index the columns' own memory (no Python list per column).
    # Missing values become sentinels the comparisons below treat as missing: no predecessor is -1, no launch
    # end is the smallest int64 (never later than anything).
    prev = _int_view(_prev_on_device(k).fill_null(-1))
    rank = _int_view(k["rank"])
    ts = _int_view(k["ts"])
    end = _int_view(k["end"])
    is_comm = _int_view((k["kind"] == "comm").fill_null(False))
    lend = _int_view(k["launch_end"].fill_null(_NO_TIME))
    name = k["name"]

    # the last kernel of each step over all ranks (the first such row where several end together)
    last = (
        k.select("step", "end").with_row_index("_row").filter(pl.col("step").is_not_null())
        .group_by("step").agg(pl.col("_row").get(pl.col("end").arg_max()))
    )
    cov = ensure(run, "host_cover")
    if run.has("collectives") and cov.height:
        cov = clock.align(cov, ensure(run, "clock_offsets"), ["seg_ts", "seg_end"])
    host = _HostView(cov, ensure(run, "collective_instances") if run.has("collectives") else None, k)
    rows = []
    gaps: list[tuple[int, int, int, int]] = []  # (step, rank, a, b): host-caused gaps, charged after the walk
    for s, i in last.sort("step").iter_rows():
        comp = comm = idle = 0
        t = end[i]
        t_end = end[i]
        on_path = {rank[i]}
        n_path = jumps = host_jumps = 0
        cur = i
        start_rank = rank[i]
        guard = 0
        while cur is not None and guard < 10_000_000:
            guard += 1
            n_path += 1
            w = waits.get(cur)
            if w is not None and w[0] < t:
                # a collective kernel that waited for a later rank: the time after that rank's arrival is
                # exposed communication; the path goes on from the last arriver's collective kernel
                arr, lrow = w
                comm += t - max(arr, ts[cur])
                jumps += 1
                on_path.add(rank[lrow])
                cur = lrow
                t = ts[cur]
            else:
                w0 = step_start.get((rank[cur], s))
                # a kernel that began before the step on its rank counts from the step's start: the path ends there
                dur = max(0, min(t, end[cur]) - max(ts[cur], w0 if w0 is not None else ts[cur]))
                if is_comm[cur]:
                    comm += dur
                else:
                    comp += dur
            seg_start = ts[cur]
            r = rank[cur]
            w0 = step_start.get((r, s))
            p = prev[cur]
            if p < 0:
                p = None
            p_end = end[p] if p is not None else None
            at_start = w0 is not None and (p_end is None or p_end <= w0)
            if not at_start and p is None:
                t = seg_start
                break
            a = w0 if at_start else p_end
            if lend[cur] <= a:  # the kernel was queued before the device went idle: not the host's doing
                idle += max(0, seg_start - a)
                t = a
                if at_start:
                    break
                cur = p
                continue
            # the GPU waited for the host to launch the kernel. Where the host was then waiting for a later rank
            # in a host-side collective (gloo), the path goes on from that rank at its arrival: its late launch,
            # data wait or sync is on the path of every rank that waited for it.
            hw = host.wait(r, a, seg_start)
            while hw is not None and guard < 10_000_000:
                guard += 1
                w_end, x = hw
                if seg_start > max(a, w_end):
                    gaps.append((s, r, max(a, w_end), seg_start))
                jumps += 1
                host_jumps += 1
                on_path.add(x)
                r, seg_start = x, w_end
                w0 = step_start.get((x, s))
                p = host.last_kernel_before(x, w_end)
                at_start = w0 is not None and (p is None or end[p] <= w0)
                if not at_start and p is None:
                    break
                a = w0 if at_start else end[p]
                hw = host.wait(r, a, seg_start)
            if not at_start and p is None:
                t = seg_start
                break
            if seg_start > a:
                gaps.append((s, r, a, seg_start))
            t = a
            if at_start:
                break
            cur = p
        total = t_end - t
        rows.append({
            "step": s, "rank": start_rank, "ranks_on_path": sorted(on_path), "step_ms": total / 1e6,
            "compute_ms": comp / 1e6, "exposed_comm_ms": comm / 1e6, "idle_ms": idle / 1e6,
            "exposed_comm_pct": 100.0 * comm / total if total > 0 else None,
            "path_kernels": n_path, "rank_jumps": jumps, "host_jumps": host_jumps, "last_kernel": name[i],
            "_total": total,
        })
    zero = {"launch": 0, "sync": 0, "input": 0, "comm": 0, "other": 0}
    charged = host.classify(gaps)  # host-caused gap time per step, by what the host did
    for row in rows:
        hp = charged.get(row["step"], zero)
        launch, total = sum(hp[c] for c in zero), row.pop("_total")
        row.update({"host_launch_ms": launch / 1e6, "host_sync_ms": hp["sync"] / 1e6, "input_wait_ms": hp["input"] / 1e6,
                    "host_comm_ms": hp["comm"] / 1e6, "host_other_ms": hp["other"] / 1e6,
                    "host_launch_pct": 100.0 * launch / total if total > 0 else None})
    if not rows:
        return pl.DataFrame(schema=CP_SCHEMA)
    return pl.DataFrame(rows, schema=CP_SCHEMA)


@pytest.mark.parametrize("name", DIRS)
@pytest.mark.parametrize("runs_from,charge_few,prev", [(0, None, None), (None, None, None), (None, 0, None), (0, None, True),
                                                        (0, None, False)],
                         ids=["runs", "shipped", "joins", "packed", "per-device"])
def test_vectorised_walk_equals_the_reference_walk(name, runs_from, charge_few, prev, monkeypatch):
    # runs_from 0: the runs on every fixture (they are built only from _RUNS_FROM kernels on); None: as shipped.
    # charge_few 0: every round's host gaps charged by the as-of joins (as from _CHARGE_FEW gaps on), not in Python
    # prev: each kernel's previous activity found in polars (from _PREV_IN_PYTHON kernels on), on one packed key
    # (True) or device by device (False)
    if prev is not None:
        monkeypatch.setattr("traceql.link.critical_path._PREV_IN_PYTHON", 0)
        monkeypatch.setattr("traceql.link.critical_path._PACK_DEVICES", prev)
    if runs_from is not None:
        monkeypatch.setattr("traceql.link.critical_path._RUNS_FROM", runs_from)
    if charge_few is not None:
        monkeypatch.setattr("traceql.link.critical_path._CHARGE_FEW", charge_few)
    run = load_run(ROOT / name)
    got = link.ensure(run, "critical_path")
    assert_frame_equal(got, _reference(run))


def _per_rank(run: Run) -> tuple[pl.DataFrame, list]:
    """critical_path walked as the Dask path walks it: a part per rank built from that rank's rows alone, moved
    through pickle (as between Dask workers), its segments asked for in rounds. Also: every round's requests."""
    from traceql.link import critical_path as cp
    from traceql.link import ensure

    coll = run.has("collectives")
    pk, cov, steps = ensure(run, "path_kernels"), ensure(run, "host_cover"), run.table("steps")
    offsets, matches, ci = ((ensure(run, t) if coll else None)
                            for t in ("clock_offsets", "collective_matches", "collective_instances"))
    ranks = sorted(set(pk["rank"].to_list()) | set(steps["rank"].drop_nulls().to_list()))

    def mine(df, r):
        return None if df is None else df.filter(pl.col("rank") == r)

    parts = [pickle.loads(pickle.dumps(cp._Part(mine(pk, r), mine(cov, r), mine(steps, r), mine(offsets, r),
                                                 mine(matches, r), mine(ci, r), coll))) for r in ranks]
    metas = [p.meta() for p in parts]
    jf = cp.jumps_frame(metas, ci)
    parts = [pickle.loads(pickle.dumps(p.with_jumps(jf.filter(pl.col("_part") == i)))) for i, p in enumerate(parts)]
    asked = []

    def fetch(need):
        asked.append(need)
        return {i: parts[i].segments(es) for i, es in need.items()}
    return cp.stitch(metas, fetch), asked


@pytest.mark.parametrize("name", DIRS)
def test_the_walk_split_per_rank_equals_the_reference_walk(name):
    # (the CPU fixtures have no kernels: both tables are empty there; the GPU ones hold 2 to 10 steps)
    run = load_run(ROOT / name)
    got, asked = _per_rank(run)
    assert_frame_equal(got, _reference(run))
    # a round asks each part only for entries (first kernel of a step, a collective kernel, a host-side arrival)
    assert all(e[0] in ("last", "after", "host") for need in asked for es in need.values() for e in es)


@pytest.mark.parametrize("name", ["samples/demo", "fixtures/h200-loader-bound"])
def test_gaps_charged_in_python_equal_the_joins(name):
    # every gap whose ends sit on, just before and just after the edges of the host's segments (and a rank with none):
    # the bisection over lists gives the as-of joins' split to the nanosecond
    from traceql.link import critical_path as cp

    run = load_run(ROOT / name)
    part = cp.part_of_run(run)
    cov = link.ensure(run, "host_cover")
    edges = sorted({(int(r), t + d) for r, a, b in cov.select("rank", "seg_ts", "seg_end").iter_rows()
                    for t in (a, b) for d in (-1, 0, 1)})
    gaps = [(r, a, b) for (r, a), (r2, b) in zip(edges, edges[7::3]) if r == r2 and b >= a] + [(99, 0, 10**12)]
    assert len(gaps) > 100
    g = pl.DataFrame(gaps, schema={"rank": pl.Int64, "a": pl.Int64, "b": pl.Int64}, orient="row")
    joins = part.host.charge(g).select("launch", "sync", "input", "comm", "other").rows()
    assert part.host.charge_few(gaps) == joins
    assert any(sum(x[:4]) for x in joins)  # some gaps fall on the host's recorded work, not all on "other"


def _host_cover_per_union(run: Run) -> pl.DataFrame:
    """host_cover as it was built: each union's segments on their own, concatenated in the unions' order."""
    from traceql import intervals
    from traceql.link.critical_path import HOST_COVER_SCHEMA, host_covers

    covers = host_covers(run)
    parts = []
    for name, df in covers.items():
        df = df.filter(pl.col("rank").is_not_null() & pl.col("ts").is_not_null() & pl.col("end").is_not_null()) \
            .with_columns(pl.col("rank").cast(pl.Int32))
        if df.height:
            parts.append(intervals.segments(df, ["rank"]).select("rank", pl.lit(name).alias("cover"), "seg_ts", "seg_end"))
    if not parts:
        return pl.DataFrame(schema=HOST_COVER_SCHEMA)
    return pl.concat([p.select([pl.col(c).cast(t) for c, t in HOST_COVER_SCHEMA.items()]) for p in parts])


@pytest.mark.parametrize("name", DIRS)
def test_host_cover_in_one_pass_equals_each_union_on_its_own(name):
    run = load_run(ROOT / name)
    assert_frame_equal(link.ensure(run, "host_cover"), _host_cover_per_union(run))
