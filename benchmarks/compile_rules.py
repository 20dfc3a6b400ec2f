"""Time the torch.compile rules (TQL401-TQL409) on the compile-heavy fixtures: linking their facts and evaluating
them, after ingest (the run's tables loaded once per repetition, derived tables built fresh each time).

    python benchmarks/compile_rules.py [REPS]

Prints, per fixture, the median CPU time of this process (ms) evaluating the TQL4xx rules and running a whole
`check` (no cache). CPU time, not wall time: on a shared machine wall time measures the neighbours. Run it with
POLARS_MAX_THREADS=1 (CPU time then counts the work once) on two checkouts to compare; it imports the traceql of the
current directory."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from traceql import pipeline
from traceql.rules.engine import run_rules
from traceql.rules.loader import load_rules

FIXTURES = ["compile-5rank-schedule-divergence", "compile-5rank-graph-divergence", "compile-3rank-cache-pattern",
            "compile-recompile-storm", "compile-graph-break", "compile-torch213-probe", "h200x2-divergent-compile",
            "cpu-divergent-compile"]


def main(reps: int = 5) -> None:
    rules = [r for r in load_rules([Path("rules")]) if r.id.startswith("TQL4")]
    print(f"{'fixture':36} {'TQL4xx rules ms':>16} {'whole check ms':>15}")
    for name in FIXTURES:
        d = Path("fixtures") / name
        if not d.is_dir():
            continue
        rule_ms, check_ms = [], []
        for _ in range(reps):
            run = pipeline.load_run(d, use_cache=False)
            t = time.process_time()
            run_rules(run, rules)
            rule_ms.append((time.process_time() - t) * 1e3)
            t = time.process_time()
            pipeline.check(d, use_cache=False)
            check_ms.append((time.process_time() - t) * 1e3)
        print(f"{name:36} {statistics.median(rule_ms):16.1f} {statistics.median(check_ms):15.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
