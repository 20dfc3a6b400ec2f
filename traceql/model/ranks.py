"""Rank lists as people read them: [0, 1, 2, 3, 7] -> "0-3, 7"."""

from __future__ import annotations


def runs(ranks) -> list[tuple[int, int]]:
    """Sorted distinct ranks as (first, last) runs of consecutive ranks: [0, 1, 2, 3, 7] -> [(0, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for r in sorted({int(r) for r in ranks or []}):
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def format_runs(spans: list[tuple[int, int]], limit: int | None = None) -> str:
    """(first, last) runs as text; with `limit`, at most that many runs and then "..."."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    if limit is not None and len(parts) > limit:
        return ", ".join(parts[:limit]) + ", ..."
    return ", ".join(parts)


def format_ranks(ranks, limit: int | None = None) -> str:
    """Consecutive ranks compressed into runs; with `limit`, at most that many runs and then "...". """
    return format_runs(runs(ranks), limit)
