"""Rank lists as people read them: [0, 1, 2, 3, 7] -> "0-3, 7"."""

from __future__ import annotations


def format_ranks(ranks, limit: int | None = None) -> str:
    """Consecutive ranks compressed into runs; with `limit`, at most that many runs and then "...". """
    ranks = sorted({int(r) for r in ranks or []})
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    if limit is not None and len(parts) > limit:
        return ", ".join(parts[:limit]) + ", ..."
    return ", ".join(parts)
