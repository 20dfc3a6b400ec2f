"""What-if replay: each step recomputed with one cause removed, per rank, and what that saves the run per step.

The model (times per rank and step from link.metrics' step_metrics, waits from matched collectives):
- A rank's step is T[r, s] (step_ms). A cause removed saves each rank some of its own time, save[r, s] (below, per
  cause), so the rank alone would take T[r, s] - save[r, s].
- Ranks joined by matched collectives (a sync group: connected through calls matched on two or more ranks) move in
  lockstep: every rank of the group takes the group's step, the slowest rank's. So the group's step is
  max_r T[r, s] measured and max_r (T[r, s] - save[r, s]) replayed: time saved on a rank that others do not wait for
  is spent waiting at the next collective, and a late rank made on time frees everyone who waited for it.
- A rank in no sync group (one process, or no matched collectives) is its own group.
- The cost of a cause: the run's typical step measured minus its typical step replayed, and that as a share of the
  measured one. The typical step is the median over steps of the group's step (over several groups, the median of
  all their steps): the first profiled step often carries one-off work (allocator growth, NCCL setup, a late
  kernel from the warm-up) that no cause removal explains, and a mean would charge it to the cause.

What each cause saves (`removes:` in a rule's `cost:` mapping):
- straggler_delay: the late rank x arrives with the others. Its lateness in step s is how far its arrival trailed
  the next-latest rank's at the calls it came last (the largest such gap in the step: the delay it carried into the
  step); x saves that, every other rank saves its waits for x in that step (the union of its wait intervals at
  those calls), at most x's lateness.
- exposed_comm: communication fully overlapped: each rank saves its exposed communication that is not waiting for
  a later rank (waits belong to the late rank, straggler_delay), exposed_comm_ms - wait_ms.
- host_sync: the rule's milliseconds blocked per step (`ms:`), but at most the rank's GPU idle time in the step
  where the rank has GPU activity: while the host blocks, the GPU runs the work it waits for; what the step loses
  is the GPU's idle time after the sync returns, until the host has queued work again.
- launch_gaps without `ms:`: the step's critical path (link.critical_path) through the rank loses the time the GPU
  waited for the host to launch work that the host spent launching (inside recorded ops and runtime calls; not
  fetching data, not in a host-side collective, not blocked in a sync, not outside anything recorded such as a
  sleep: those are other causes), on the ranks whose path it is.
- gpu_idle, launch_gaps, recompile, graph_breaks, input_stall: the rule's own number of milliseconds per step on its
  ranks (`ms:` names the evidence field; `unit: s` for seconds; `total: true` for a whole-run total spread over the
  run's steps: a recompile paid once is amortised over the steps).
  gpu_idle without `ms:` closes the rank's GPU idle time in the step, bounded by the host: the step cannot end
  before the host's own range does (max(host_ms, gpu_span_ms - gpu_idle_ms)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from traceql.link import POLARS_ENGINE
from traceql.model import Run

# cause -> whether it acts across ranks (a late rank makes the others wait: it explains findings on any rank of its
# sync group, not only its own) and whether it needs `ms:`
CAUSES = {
    "straggler_delay": {"cross_rank": True, "ms": False},
    "exposed_comm": {"cross_rank": False, "ms": False},
    "host_sync": {"cross_rank": False, "ms": True},
    "gpu_idle": {"cross_rank": False, "ms": None},  # ms optional
    "launch_gaps": {"cross_rank": False, "ms": None},  # ms optional
    "recompile": {"cross_rank": False, "ms": True},
    "graph_breaks": {"cross_rank": False, "ms": True},
    "input_stall": {"cross_rank": False, "ms": True},
}
COST_FIELDS = {"removes", "rank_column", "ms", "unit", "total", "explains"}

_BASE = {"rank": pl.Int32, "step": pl.Int64, "step_ms": pl.Float64, "host_ms": pl.Float64, "gpu_span_ms": pl.Float64,
         "exposed_comm_ms": pl.Float64, "wait_ms": pl.Float64, "gpu_idle_ms": pl.Float64}
_SAVE = {"rank": pl.Int32, "step": pl.Int64, "save_ms": pl.Float64}


@dataclass
class Replay:
    """One cause removed: per rank and step the measured and replayed step, and the cost per step."""
    label: str
    per_rank: pl.DataFrame  # rank, group, measured_ms, predicted_ms (medians over the rank's steps)
    cost_ms_per_step: float | None
    cost_pct: float | None
    measured_ms: float | None  # the run's typical step (median over steps of each group's slowest rank)
    predicted_ms: float | None


def base_steps(run: Run) -> pl.DataFrame:
    """Per rank and step (steps only): the numbers the replay reads."""
    from traceql.link import ensure

    sm = ensure(run, "step_metrics").filter(pl.col("step").is_not_null() & pl.col("step_ms").is_not_null())
    return sm.select([pl.col(c).cast(t) for c, t in _BASE.items()])


def sync_groups(run: Run) -> dict[int, int]:
    """rank -> group id: ranks joined by calls matched on two or more ranks (connected components), others alone."""
    from traceql.link import ensure

    parent: dict[int, int] = {r: r for r in run.ranks}

    def find(r: int) -> int:
        while parent.setdefault(r, r) != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    if run.has("collectives"):
        ci = ensure(run, "collective_instances").filter(pl.col("n_ranks") >= 2)
        for ranks in ci.group_by("match_id").agg(pl.col("rank").unique())["rank"].unique().to_list():
            ranks = [int(x) for x in ranks if x is not None]
            for r in ranks[1:]:
                a, b = find(ranks[0]), find(r)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {r: find(r) for r in list(parent)}


def _empty_save() -> pl.DataFrame:
    return pl.DataFrame(schema=_SAVE)


def straggler_saves(run: Run, late: list[int]) -> pl.DataFrame:
    """Per rank and step: what each rank saves were the late ranks on time (see the module doc)."""
    from traceql.link import ensure
    from traceql.link.collectives import wait_union

    if not run.has("collectives"):
        return _empty_save()
    ci = ensure(run, "collective_instances").filter(
        (pl.col("n_ranks") >= 2) & pl.col("step").is_not_null() & pl.col("arrival").is_not_null())
    if ci.height == 0:
        return _empty_save()
    ci = ci.with_columns(pl.col("arrival").sort(descending=True).slice(1, 1).first().over("match_id").alias("_second"))
    parts = []
    for x in late:
        mine = ci.filter((pl.col("last_arriver") == x) & (pl.col("rank") == x))
        lateness = mine.group_by("step").agg(((pl.col("arrival") - pl.col("_second")).max() / 1e6).alias("_late"))
        waits = wait_union(ci.filter((pl.col("last_arriver") == x) & (pl.col("rank") != x)), ["rank", "step"])
        waits = waits.select(pl.col("rank").cast(pl.Int32), "step", (pl.col("_u") / 1e6).alias("_wait"))
        others = waits.join(lateness, on="step", how="inner").select(
            "rank", "step", pl.min_horizontal("_wait", "_late").alias("save_ms"))
        own = lateness.select(pl.lit(x, pl.Int32).alias("rank"), "step", pl.col("_late").alias("save_ms"))
        parts += [own, others]
    if not parts:
        return _empty_save()
    out = pl.concat([p.select([pl.col(c).cast(t) for c, t in _SAVE.items()]) for p in parts])
    return out.group_by("rank", "step").agg(pl.col("save_ms").max()).with_columns(pl.col("save_ms").clip(lower_bound=0.0))


def exposed_comm_saves(base: pl.DataFrame, ranks: list[int] | None) -> pl.DataFrame:
    b = base if ranks is None else base.filter(pl.col("rank").is_in(ranks))
    return b.select("rank", "step", (pl.col("exposed_comm_ms") - pl.col("wait_ms")).fill_null(0.0).clip(lower_bound=0.0).alias("save_ms"))


def gpu_idle_saves(base: pl.DataFrame, ranks: list[int] | None) -> pl.DataFrame:
    b = base if ranks is None else base.filter(pl.col("rank").is_in(ranks))
    closed = pl.max_horizontal(pl.col("host_ms").fill_null(0.0), pl.col("gpu_span_ms") - pl.col("gpu_idle_ms").fill_null(0.0))
    return b.select("rank", "step", (pl.col("step_ms") - closed).fill_null(0.0).clip(lower_bound=0.0).alias("save_ms"))


def launch_saves(run: Run, base: pl.DataFrame, ranks: list[int] | None) -> pl.DataFrame:
    from traceql.link import ensure

    cp = ensure(run, "critical_path")
    if cp.height == 0:
        return _empty_save()
    pure = (pl.col("host_launch_ms") - pl.col("host_sync_ms") - pl.col("input_wait_ms") - pl.col("host_comm_ms")
            - pl.col("host_other_ms")).clip(lower_bound=0.0)
    per = cp.select("step", "ranks_on_path", pure.alias("_l")).explode("ranks_on_path").rename({"ranks_on_path": "rank"})
    b = base if ranks is None else base.filter(pl.col("rank").is_in(ranks))
    return b.select("rank", "step").join(per.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "step"], how="inner") \
        .select("rank", "step", pl.col("_l").alias("save_ms"))


def fixed_saves(base: pl.DataFrame, ranks: list[int] | None, ms: float, gpu_bound: bool = False) -> pl.DataFrame:
    """ms saved on the ranks in each step of base (at most the GPU's idle time there, with gpu_bound)."""
    b = base if ranks is None else base.filter(pl.col("rank").is_in(ranks))
    save = pl.lit(float(ms))
    if gpu_bound:
        save = pl.min_horizontal(save, pl.col("gpu_idle_ms").fill_null(float(ms)))
    return b.select("rank", "step", save.alias("save_ms"))


def replay(run: Run, saves: pl.DataFrame | pl.LazyFrame, label: str = "", base: pl.DataFrame | None = None,
           groups: dict[int, int] | None = None, only_ranks: list[int] | None = None) -> Replay:
    """The run's steps replayed with `saves` taken off (see the module doc). The cost is measured over the sync
    groups that hold only_ranks (default: the whole run)."""
    base = base_steps(run) if base is None else base
    groups = sync_groups(run) if groups is None else groups
    empty = pl.DataFrame(schema={"rank": pl.Int32, "group": pl.Int32, "measured_ms": pl.Float64, "predicted_ms": pl.Float64})
    if base.height == 0:
        return Replay(label, empty, None, None, None, None)
    g = pl.DataFrame({"rank": list(groups), "group": list(groups.values())}, schema={"rank": pl.Int32, "group": pl.Int32})
    b = base.join(g, on="rank", how="left").with_columns(pl.coalesce("group", "rank").alias("group"))
    saves = saves.lazy().select([pl.col(c).cast(t) for c, t in _SAVE.items()]).group_by("rank", "step").agg(pl.col("save_ms").sum())
    b = b.join(saves.collect(engine=POLARS_ENGINE), on=["rank", "step"], how="left")
    b = b.with_columns((pl.col("step_ms") - pl.col("save_ms").fill_null(0.0)).clip(lower_bound=0.0).alias("_pred"))
    per_step = b.group_by("group", "step").agg(pl.col("step_ms").max().alias("_gm"), pl.col("_pred").max().alias("_gp"))
    per_rank = b.join(per_step, on=["group", "step"]).group_by("rank", "group").agg(
        pl.col("step_ms").median().alias("measured_ms"), pl.col("_gp").median().alias("predicted_ms")).sort("rank")
    chosen = per_step
    if only_ranks:
        gids = {groups.get(r, r) for r in only_ranks}
        chosen = per_step.filter(pl.col("group").is_in(list(gids)))
    if chosen.height == 0:
        return Replay(label, per_rank.select(list(empty.schema)), None, None, None, None)
    measured = float(chosen["_gm"].median())
    predicted = float(chosen["_gp"].median())
    cost = max(0.0, measured - predicted)
    pct = 100.0 * cost / measured if measured > 0 else None
    return Replay(label, per_rank.select(list(empty.schema)), cost, pct, measured, predicted)


# --------------------------------------------------------------------------------------- findings -> causes


class CostSpecError(ValueError):
    pass


def check_spec(spec) -> None:
    """A rule's `cost:` mapping is valid: raises CostSpecError naming the field."""
    if not isinstance(spec, dict):
        raise CostSpecError("must be a mapping, e.g. {removes: exposed_comm}")
    bad = set(spec) - COST_FIELDS
    if bad:
        raise CostSpecError(f"unknown field {sorted(bad)[0]!r}; valid: {', '.join(sorted(COST_FIELDS))}")
    cause = spec.get("removes")
    if cause not in CAUSES:
        raise CostSpecError(f"removes: {cause!r} is not one of {', '.join(CAUSES)}")
    need = CAUSES[cause]["ms"]
    if need and not isinstance(spec.get("ms"), str):
        raise CostSpecError(f"removes: {cause} needs ms: <evidence field holding milliseconds per step>")
    if need is False and "ms" in spec:
        raise CostSpecError(f"removes: {cause} is measured from the run's tables; it takes no ms:")
    if spec.get("unit", "ms") not in ("ms", "s"):
        raise CostSpecError(f"unit: {spec.get('unit')!r} is not one of ms, s")
    ex = spec.get("explains", [])
    if not isinstance(ex, list) or not all(isinstance(x, str) for x in ex):
        raise CostSpecError("explains: must be a list of rule ids, e.g. [TQL101, TQL202]")


def _number(v) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return None


def finding_steps(finding) -> list[int] | None:
    """The steps a finding is about: those its evidence lists (a finding collapsed over steps), else its step, else
    None (every step)."""
    steps = finding.evidence.get("steps")
    if isinstance(steps, list) and steps and all(isinstance(s, int) for s in steps):
        return steps
    return [finding.step] if finding.step is not None else None


def finding_saves(run: Run, finding, spec: dict, base: pl.DataFrame, memo: dict | None = None
                  ) -> pl.DataFrame | pl.LazyFrame | None:
    """Per rank and step: what removing this finding's cause saves; None where the finding does not say enough.
    memo: where one check keeps straggler_saves by late ranks (several rules' findings name the same late rank)."""
    cause = spec["removes"]
    steps = finding_steps(finding)
    # lazy: the replay collects every finding's saves in one plan
    base = base.lazy() if steps is None else base.lazy().filter(pl.col("step").is_in(steps))
    ranks = [int(r) for r in (finding.ranks or [])] or None
    if spec.get("rank_column"):
        v = finding.evidence.get(spec["rank_column"], finding.ranks)
        ranks = [int(x) for x in (v if isinstance(v, list) else [v]) if x is not None] or None
    if cause == "straggler_delay":
        late = tuple(ranks or [])
        s = memo.get(late) if memo is not None else None
        if s is None:
            s = straggler_saves(run, list(late))
            if memo is not None:
                memo[late] = s
        return s if steps is None else s.filter(pl.col("step").is_in(steps))
    if cause == "exposed_comm":
        return exposed_comm_saves(base, ranks)
    if cause == "gpu_idle" and not spec.get("ms"):
        return gpu_idle_saves(base, ranks)
    if cause == "launch_gaps" and not spec.get("ms"):
        return launch_saves(run, base.collect(engine=POLARS_ENGINE), ranks)
    ms = _number(finding.evidence.get(spec["ms"]))
    if ms is None:
        return None
    if spec.get("unit") == "s":
        ms *= 1000.0
    if spec.get("total"):
        b = base if ranks is None else base.filter(pl.col("rank").is_in(ranks))
        n_steps = b.lazy().group_by("rank").agg(pl.col("step").n_unique()).select(pl.col("step").max()).collect(engine=POLARS_ENGINE).item()
        if not n_steps:
            return None
        ms /= n_steps
    return fixed_saves(base, ranks, ms, gpu_bound=cause == "host_sync")


def _together(finding, spec: dict, peers: list | None) -> list:
    """The findings one fix removes the cause of: this one and, for a cause of its own rank, its peers."""
    together = [finding]
    if peers and not CAUSES[spec["removes"]]["cross_rank"]:
        together += [p for p in peers if p is not finding]
    return together


def finding_replay(run: Run, finding, spec: dict, base: pl.DataFrame | None = None,
                   groups: dict[int, int] | None = None, peers: list | None = None,
                   saves: dict | None = None) -> Replay | None:
    """The run replayed without this finding's cause. peers: the same rule's findings of the same cause on other
    ranks (same location and collapse keys): ranks run one program, so the fix removes the cause on each of them.
    A cause acting across ranks (a late rank) is its rank's alone. saves: id(finding) -> its finding_saves, kept
    across the calls of one run (a peer's saves are the same for every finding of its group: computing them again
    for each made the costs quadratic in the ranks)."""
    base = base_steps(run) if base is None else base
    together = _together(finding, spec, peers)
    saves = {} if saves is None else saves
    for f in together:
        if id(f) not in saves:
            saves[id(f)] = finding_saves(run, f, spec, base)
    parts = [s for s in (saves[id(f)] for f in together) if s is not None]
    if not parts:
        return None
    ranks = sorted({r for f in together for r in f.ranks})
    return replay(run, pl.concat([p.lazy() for p in parts]), label=f"{finding.rule} {finding.fingerprint}", base=base, groups=groups,
                  only_ranks=ranks or None)


def replay_costs(base: pl.DataFrame, groups: dict[int, int], items: list[tuple[pl.DataFrame, list[int] | None]]
                 ) -> list[tuple[float | None, float | None]]:
    """(cost_ms_per_step, cost_pct) of each (saves, only_ranks) in items: replay's arithmetic for all of them in
    one plan, keyed by the item's index (a replay per finding was a dozen small queries each)."""
    if not items or base.height == 0:
        return [(None, None)] * len(items)
    g = pl.LazyFrame({"rank": list(groups), "group": list(groups.values())}, schema={"rank": pl.Int32, "group": pl.Int32})
    b = base.lazy().join(g, on="rank", how="left").with_columns(pl.coalesce("group", "rank").alias("group"))
    saves = pl.concat([s.lazy().select([pl.col(c).cast(t) for c, t in _SAVE.items()]).with_columns(pl.lit(k, pl.UInt32).alias("_k"))
                       for k, (s, _) in enumerate(items)])
    saves = saves.group_by("_k", "rank", "step").agg(pl.col("save_ms").sum())
    keys = pl.LazyFrame({"_k": list(range(len(items)))}, schema={"_k": pl.UInt32})
    b = b.join(keys, how="cross").join(saves, on=["_k", "rank", "step"], how="left")
    b = b.with_columns((pl.col("step_ms") - pl.col("save_ms").fill_null(0.0)).clip(lower_bound=0.0).alias("_pred"))
    per_step = b.group_by("_k", "group", "step").agg(pl.col("step_ms").max().alias("_gm"), pl.col("_pred").max().alias("_gp"))
    # the sync groups each item's cost is measured over: those holding its ranks, else every group
    pick = [(k, groups.get(r, r)) for k, (_, only) in enumerate(items) if only for r in only]
    every = [k for k, (_, only) in enumerate(items) if not only]
    chosen = pl.concat([
        per_step.join(pl.LazyFrame(pick, schema={"_k": pl.UInt32, "group": pl.Int32}, orient="row").unique(),
                      on=["_k", "group"], how="semi"),
        per_step.filter(pl.col("_k").is_in(every)),
    ])
    res = chosen.group_by("_k").agg(pl.col("_gm").median(), pl.col("_gp").median()).collect(engine=POLARS_ENGINE)
    got = {k: (gm, gp) for k, gm, gp in res.iter_rows()}
    out = []
    for k in range(len(items)):
        if k not in got:
            out.append((None, None))
            continue
        measured, predicted = float(got[k][0]), float(got[k][1])
        cost = max(0.0, measured - predicted)
        out.append((cost, 100.0 * cost / measured if measured > 0 else None))
    return out


def peer_key(finding, keys: list[str]) -> tuple:
    """What identifies a finding's cause apart from its ranks: its location and the values of `keys` (a rule's
    collapse columns other than the rank)."""
    loc = tuple(sorted((k, str(v)) for k, v in finding.location.items() if k != "rank"))
    return finding.rule, loc, tuple(str(finding.evidence.get(k)) for k in keys)


def _peers(findings: list, keys: dict[str, list[str]]) -> dict[int, list]:
    out: dict[tuple, list] = {}
    for f in findings:
        out.setdefault(peer_key(f, keys.get(f.rule, [])), []).append(f)
    return {id(f): out[peer_key(f, keys.get(f.rule, []))] for f in findings}


def apply_costs(run: Run, findings: list, specs: dict[str, dict], keys: dict[str, list[str]] | None = None) -> None:
    """Fill cost_ms_per_step and cost_pct of every finding whose rule has a `cost:` mapping (specs: rule id ->
    mapping; keys: rule id -> the columns besides the rank that tell its findings' causes apart); the others keep
    None: no number is better than a made-up one."""
    todo = [f for f in findings if specs.get(f.rule)]
    if not todo:
        return
    base = base_steps(run)
    if base.height == 0:
        return
    groups = sync_groups(run)
    peers = _peers(todo, keys or {})
    memo: dict = {}
    saves: dict = {}  # id(finding) -> its finding_saves: a peer's are the same for every finding of its group
    # Peers remove one cause together, so every finding of a peer group has the same replay: one item per group
    # (an item per finding held each group's saves once per member, quadratic in the ranks: 0.9 GB of driver at
    # 128 ranks of a two-GPU capture).
    items, owners, item_of = [], [], {}
    for f in todo:
        together = _together(f, specs[f.rule], peers[id(f)])
        group = (f.rule, frozenset(id(x) for x in together))
        if group in item_of:
            if item_of[group] is not None:
                owners[item_of[group]].append(f)
            continue
        for x in together:
            if id(x) not in saves:
                saves[id(x)] = finding_saves(run, x, specs[f.rule], base, memo)
        parts = [s for s in (saves[id(x)] for x in together) if s is not None]
        item_of[group] = None
        if parts:
            item_of[group] = len(items)
            items.append((pl.concat([p.lazy() for p in parts]), sorted({r for x in together for r in x.ranks}) or None))
            owners.append([f])
    for fs, (cost, pct) in zip(owners, replay_costs(base, groups, items)):
        if cost is None:
            continue
        for f in fs:
            f.cost_ms_per_step = round(cost, 3)
            f.cost_pct = round(pct, 1) if pct is not None else None


def whatif_table(run: Run, findings: list, specs: dict[str, dict],
                 keys: dict[str, list[str]] | None = None) -> tuple[pl.DataFrame, list[tuple[object, Replay]]]:
    """Per rank: the measured step and, per finding with a cost mapping, the replayed run (for `traceql whatif`)."""
    base = base_steps(run)
    groups = sync_groups(run)
    todo = [f for f in findings if specs.get(f.rule)]
    peers = _peers(todo, keys or {})
    out = []
    saves: dict = {}
    done: dict = {}  # a peer group's replay, the same for each member (apply_costs says why): computed once
    for f in todo:
        group = (f.rule, frozenset(id(x) for x in _together(f, specs[f.rule], peers[id(f)])))
        if group not in done:
            done[group] = finding_replay(run, f, specs[f.rule], base, groups, peers[id(f)], saves)
        r = done[group]
        if r is not None:
            out.append((f, dataclasses.replace(r, label=f"{f.rule} {f.fingerprint}")))
    measured = replay(run, _empty_save(), "measured", base, groups)
    return measured.per_rank, out


def cause_replays(run: Run, top_stragglers: int = 3) -> list[Replay]:
    """The run replayed with each cause the tables can measure removed on every rank, whatever the rules found:
    exposed communication overlapped, GPU idle closed, and each late rank on time (the costliest few)."""
    base = base_steps(run)
    if base.height == 0:
        return []
    groups = sync_groups(run)
    out = [replay(run, exposed_comm_saves(base, None), "exposed_comm (all ranks)", base, groups),
           replay(run, gpu_idle_saves(base, None), "gpu_idle (all ranks)", base, groups)]
    if run.has("collectives"):
        from traceql.link import ensure

        late = ensure(run, "collective_instances").filter(pl.col("is_last").fill_null(False))["rank"].unique().to_list()
        lr = [replay(run, straggler_saves(run, [int(x)]), f"straggler_delay (rank {x})", base, groups) for x in sorted(late)]
        out += sorted([r for r in lr if (r.cost_ms_per_step or 0) > 0], key=lambda r: -r.cost_ms_per_step)[:top_stragglers]
    return out
