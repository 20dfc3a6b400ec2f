"""The torch.compile readers' patterns are linear-time: adversarial reasons of growing length (issue 16).

Before the fix a 68 KB fail reason took 17.8 s (`_LIMIT`), 20,000 blank lines 7.4 s (`Explanation:`) and a 116 KB
graph-break text 17.6 s (`_GB_AT`) on the development box.
"""

from __future__ import annotations

import time

import pytest

from traceql.ingest import _compile_common as cc
from traceql.ingest import compile_trace as ct


def _best(fn, arg, n=5) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - t)
    return best


CASES = {
    "limit-many-mentions": (ct._LIMIT.search, lambda k: "recompile_limit " * k),
    "graph-break-many-phrases": (cc.graph_break, lambda k: "Graph break in user code at " * k),
    "graph-break-blank-lines": (cc.graph_break, lambda k: "\n" * (k * 4) + "Hint"),
    "unsupported-blank-lines": (cc._GB_UNSUPPORTED.search, lambda k: " \n" * (k * 4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_grows_linearly(name):
    fn, make = CASES[name]
    small, large = _best(fn, make(1_000)), _best(fn, make(16_000))
    # 16x the input: linear takes ~16x, quadratic ~256x. Tiny absolute times are noise, not growth.
    assert large < 1.0, f"{name}: {large:.3f} s on {len(make(16_000))} characters"
    # On a loaded 2-core box a few ms move by 10x; below 0.1 s nothing blew up (the old patterns took seconds here).
    assert large < 0.1 or large / max(small, 1e-6) < 100, f"{name}: {small:.5f} s -> {large:.5f} s for 16x the input"
