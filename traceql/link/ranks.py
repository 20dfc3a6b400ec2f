"""Which rank each source holds, decided once for the whole run, before anything is compared across ranks.

Importers read a source's rank from what it says (distributedInfo, TORCH_TRACE records, RANK in an nsys export's
environment, log prefixes) or its file name. Two things are settled here, because they need every source:

- A source that names no rank is assumed to be rank 0 only when nothing contradicts it: it is the only rankless
  source of its kind (a lone torch.profiler trace of a single-GPU or AMD run, tensorboard_trace_handler's
  `host_pid.timestamp.pt.trace.json`). Its rank_origin says "assumed". Several rankless traces of one kind cannot
  be told apart: numbering them by path order would be a guess that cross-rank rules then report as fact (which
  rank straggles, which diverges), so they are all assumed rank 0 and collide (below): the first is analysed,
  the others are named, with how to check them. Text logs (NCCL, TORCH_LOGS) and TORCH_COMPILE_DEBUG folders are
  assumed rank 0 only in a run where no source names a rank other than 0; otherwise their rows stay unattributed.
- Two sources of one kind that claim the same rank are never merged: the first (a rank the source states before an
  assumed one, then path order) is analysed, the others are marked skipped with the collision named, their rows
  leave the tables, and the collision is a row of `source_problems` (rule TQL001). Text logs of one rank are
  complementary (NCCL INFO lines in stdout, ProcessGroupNCCL lines in stderr): only identical copies collide.

Rules that compare ranks (cross_rank) are skipped by the engine while any rank collided (`collided_ranks`).

- A rank the run's own traces say exists (Kineto distributedInfo world_size, WORLD_SIZE in an nsys export's recorded environment) but no
  source holds, readable or not, is a `source_problems` row too (problem missing-rank, rule TQL002): a run dir
  with one rank's trace lost, or only rank 0 profiled, otherwise reads as a smaller world whose cross-rank rules
  (straggler, desync, divergence) compared everyone and found nothing.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceql.model import Run, Source
from traceql.model.ranks import format_runs, runs

# A process's lines of one rank may be spread over several files of these kinds.
_COMPLEMENTARY = ("nccl_log", "torch_logs")
# Kinds whose rankless sources are assumed rank 0 only in a run that shows no other rank.
_WEAK = ("nccl_log", "torch_logs", "compile_debug")
_NOT_RANKED = ("manifest", "unknown", "nsys_report")

SOURCE_PROBLEMS_SCHEMA = {
    "rank": pl.Int32,
    "kind": pl.Utf8,
    "problem": pl.Utf8,  # rank-collision
    "source": pl.Int32,  # the source that is not analysed
    "path": pl.Utf8,
    "origin": pl.Utf8,  # how that source's rank was known
    "kept_source": pl.Int32,  # the source analysed for the rank
    "kept": pl.Utf8,
    "kept_origin": pl.Utf8,
    "detail": pl.Utf8,
    "world_size": pl.Int64,  # missing-rank: the world size the run's sources state
    "missing": pl.Utf8,  # missing-rank: the ranks no source holds, as ranges ("1-7")
    "n_missing": pl.Int64,
    "n_present": pl.Int64,
}

# A stated world size above this is not believed (an adversarial header would make the run look this large).
MAX_WORLD_SIZE = 1 << 20


def _read(s: Source) -> bool:
    return s.status in ("ok", "partial")


def _held(s: Source) -> list[int]:
    return sorted(s.ranks) if s.ranks else ([s.rank] if s.rank is not None else [])


def _rel(run: Run, p: Path) -> str:
    root = run.path if run.path.is_dir() else run.path.parent
    try:
        return str(p.relative_to(root)) if p != root else p.name
    except ValueError:
        return str(p)


def _weak_origin(s: Source) -> bool:
    return s.rank_origin.startswith("assumed") or s.rank_origin == "process order"


def _add_detail(s: Source, text: str) -> None:
    s.detail = f"{s.detail}; {text}" if s.detail else text


def _assume(run: Run) -> list[int]:
    """Give rank 0 (origin "assumed") to rankless sources where nothing contradicts it; the ids given it."""
    read = [s for s in run.sources if _read(s) and s.kind not in _NOT_RANKED]
    known = {r for s in read for r in _held(s)}
    assumed: list[int] = []
    by_kind: dict[str, list[Source]] = {}
    for s in read:
        if not _held(s):
            by_kind.setdefault(s.kind, []).append(s)
    for kind, rankless in sorted(by_kind.items()):
        if kind in _WEAK and (len(rankless) > 1 or known - {0}):
            for s in rankless:
                _add_detail(s, "rank unknown: no rank in its content or name, and the run holds other ranks or other "
                               "rankless logs, so its rows are attributed to no rank; name it rankN to attribute it")
            continue
        for s in rankless:
            # drop the importer's "rank unknown" remark: the sentence below replaces it
            s.detail = "; ".join(p for p in s.detail.split("; ") if p and not p.startswith("rank unknown"))
            s.rank, s.ranks, s.rank_origin = 0, [0], "assumed"
            _add_detail(s, "rank 0 assumed: no rank in its content or name" + (
                "" if len(rankless) == 1 else f" ({len(rankless)} such {kind} sources: see the rank collision)"))
            assumed.append(s.id)
    for s in read:
        # an nsys export of one GPU process without RANK in its environment: "process order" of one is an assumption
        if s.kind == "nsys" and s.rank_origin == "process order" and _held(s) == [0]:
            s.rank_origin = "assumed"
        # importers that assume rank 0 themselves (a TORCH_TRACE log of one process naming no rank) say so here
        if s.rank_origin == "assumed" and "assumed" not in s.detail:
            _add_detail(s, "rank 0 assumed: no rank in its content or name")
    return assumed


def _digest(p: Path) -> str | None:
    from traceql.cache import hash_path

    try:
        return hash_path(p)
    except OSError:
        return None


def _collisions(run: Run) -> list[dict]:
    """Mark every source that claims a rank another source of its kind holds; one problem row per such source."""
    claims: dict[tuple[str, int], list[Source]] = {}
    for s in run.sources:
        if _read(s) and s.kind not in _NOT_RANKED:
            for r in _held(s):
                claims.setdefault((s.kind, r), []).append(s)
    rows: list[dict] = []
    lost: set[int] = set()
    for (kind, rank), group in sorted(claims.items()):
        group = [s for s in group if s.id not in lost]
        if len(group) < 2:
            continue
        if kind in _COMPLEMENTARY:
            by_content: dict[str, list[Source]] = {}
            for s in group:
                by_content.setdefault(_digest(s.path) or f"unreadable-{s.id}", []).append(s)
            clashes = [g for g in by_content.values() if len(g) > 1]
            how = "an identical copy of"
        elif kind == "compile_debug":
            clashes = []  # debug folders name no rank themselves: several per rank are one process's restarts
        else:
            clashes = [group]
            how = "a second claim to the rank of"
        for g in clashes:
            g = sorted(g, key=lambda s: (_weak_origin(s), str(s.path)))
            kept = g[0]
            for s in g[1:]:
                lost.add(s.id)
                rel, krel = _rel(run, s.path), _rel(run, kept.path)
                if s.rank_origin == "assumed":
                    detail = (f"rank collision: no rank in its content or name, like {krel}, which is analysed as rank "
                              f"{rank}; their ranks cannot be told apart, so this one is not analysed; name the files "
                              f"after their ranks (rank1.pt.trace.json.gz) or check it on its own: traceql check {s.path}")
                else:
                    detail = (f"rank collision: {how} {krel} ({kind} rank {rank}, from {kept.rank_origin or 'unknown'}), "
                              f"which is analysed for the rank; this one (from {s.rank_origin or 'unknown'}) is not, so "
                              f"that two runs' rows never merge; check it on its own: traceql check {s.path}")
                rest = "; ".join(p for p in s.detail.split("; ") if p and not p.startswith("rank 0 assumed"))
                s.status, s.detail = "skipped", f"{detail}; {rest}" if rest else detail
                s.meta["rank_collision"] = {"rank": rank, "kept": krel}
                rows.append({"rank": rank, "kind": kind, "problem": "rank-collision", "source": s.id, "path": rel,
                             "origin": s.rank_origin or "unknown", "kept_source": kept.id, "kept": krel,
                             "kept_origin": kept.rank_origin or "unknown", "detail": detail})
    return rows


def _missing(run: Run) -> list[dict]:
    """One row when the world size the sources state names ranks that no source holds (see the module docstring).
    A source that claims a rank accounts for it even when it could not be read: that rank is an error, not missing."""
    stated = [(s.meta["world_size"], s) for s in run.sources if _read(s) and type(s.meta.get("world_size")) is int
              and 2 <= s.meta["world_size"] <= MAX_WORLD_SIZE]
    if not stated:
        return []
    ws, by = max(stated, key=lambda t: (t[0], -t[1].id))
    from traceql.discover import rank_from_name

    held_by = set()
    for s in run.sources:
        if s.kind not in _NOT_RANKED:
            held_by.update(_held(s))
        elif s.status == "error" and (r := rank_from_name(s.path)) is not None:
            held_by.add(r)  # rank1.pt.trace.json.gz that does not decompress: rank 1 is unreadable (TQL003), not missing
    held = sorted(r for r in held_by if 0 <= r < ws)
    if not held or len(held) == ws:
        return []
    # the gaps between held ranks, as ranges: never a list of a million ints for a header that claims that many
    gaps, nxt = [], 0
    for a, b in runs(held) + [(ws, ws)]:
        if a > nxt:
            gaps.append((nxt, a - 1))
        nxt = b + 1
    n_missing = ws - len(held)
    text = format_runs(gaps, limit=12)
    origin = {"kineto": "distributedInfo.world_size", "nsys": "WORLD_SIZE in the recorded environment"}.get(
        by.kind, f"{by.kind} metadata")
    rel = _rel(run, by.path)
    detail = (f"{rel} says world size {ws}, but {n_missing} rank(s) have no source in the run dir ({text}); rules that "
              f"compare ranks see only the {len(held)} present")
    run.notes.append(f"missing ranks: {detail} (TQL002)")
    return [{"rank": None, "kind": by.kind, "problem": "missing-rank", "source": by.id, "path": rel,
             "origin": origin, "kept_source": None, "kept": None, "kept_origin": None, "detail": detail,
             "world_size": ws, "missing": text, "n_missing": n_missing, "n_present": len(held)}]


def resolve_ranks(run: Run) -> tuple[list[int], list[int]]:
    """Assume ranks where it is safe, keep colliding sources apart, and record the problems (source_problems).
    Returns the ids of the sources given rank 0 and of those not analysed."""
    assumed = _assume(run)
    rows = _collisions(run)
    lost = sorted({r["source"] for r in rows})
    rows += _missing(run)
    apply_resolution(run, assumed, lost)
    run.tables["source_problems"] = pl.DataFrame(rows, schema=SOURCE_PROBLEMS_SCHEMA)
    by_rank: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["problem"] == "rank-collision":
            by_rank.setdefault((r["kind"], r["rank"]), []).append(r)
    for (kind, rank), rs in sorted(by_rank.items()):
        run.notes.append(
            f"rank {rank} is claimed by {len(rs) + 1} {kind} sources: {rs[0]['kept']} is analysed, "
            f"{', '.join(r['path'] for r in rs)} {'is' if len(rs) == 1 else 'are'} not (rank collision, TQL001); rules "
            "that compare ranks are skipped; check each run on its own")
    if run.derived_cache is not None and (assumed or lost):
        from traceql import cache

        # derived tables depend on which sources are analysed and on the ranks given here, not only on the files
        read = [s for s in run.sources if _read(s)]
        if read and all(s.cache_key for s in read):
            run.derived_cache = cache.run_dir([(s.id, f"{s.cache_key}:{_held(s)}") for s in read])
        else:
            run.derived_cache = None
    return assumed, lost


def apply_resolution(run: Run, assumed: list[int], lost: list[int]) -> None:
    """The tables after resolve_ranks decided: rows of the sources not analysed (lost) go, rankless rows of the
    sources given rank 0 (assumed) get it. Apart so that a rank task on another machine applies what the parent
    decided from every source's metadata (traceql.executor)."""
    if not (assumed or lost):
        return
    for name, df in list(run.tables.items()):
        if "source" not in df.columns or not df.height:
            continue
        if lost:
            df = df.filter(~pl.col("source").is_in(lost))
        if assumed and "rank" in df.columns:
            df = df.with_columns(
                pl.when(pl.col("rank").is_null() & pl.col("source").is_in(assumed)).then(pl.lit(0, pl.Int32))
                .otherwise(pl.col("rank")).cast(df.schema["rank"]).alias("rank"))
        run.tables[name] = df


def collided_ranks(run: Run) -> list[int]:
    """Ranks that more than one source claimed (see resolve_ranks); [] for a clean run."""
    df = run.tables.get("source_problems")
    if df is None or not df.height:
        return []
    return sorted(df.filter(pl.col("problem") == "rank-collision")["rank"].unique().to_list())


def source_problems(run: Run) -> pl.DataFrame:
    """Built by resolve_ranks while linking; an empty table for a run that was never linked."""
    return pl.DataFrame(schema=SOURCE_PROBLEMS_SCHEMA)


SOURCE_ERRORS_SCHEMA = {"rank": pl.Int32, "kind": pl.Utf8, "source": pl.Int32, "path": pl.Utf8, "detail": pl.Utf8}


def source_errors(run: Run) -> pl.DataFrame:
    """Every source that could not be read (TQL003): the exit code says so, not only the source list."""
    return _sources_with(run, "error")


def source_partials(run: Run) -> pl.DataFrame:
    """Every source read only in part (TQL004): a trace cut short keeps its complete events, and what followed the
    cut is missing from every finding; the exit code says so, not only the yellow line of the source list."""
    return _sources_with(run, "partial")


def _sources_with(run: Run, status: str) -> pl.DataFrame:
    from traceql.discover import rank_from_name

    rows = [{"rank": s.rank if s.rank is not None else rank_from_name(s.path), "kind": s.kind, "source": s.id,
             "path": _rel(run, s.path), "detail": s.detail} for s in run.sources if s.status == status]
    return pl.DataFrame(rows, schema=SOURCE_ERRORS_SCHEMA)


DERIVED = {"source_problems": source_problems, "source_errors": source_errors, "source_partials": source_partials}
