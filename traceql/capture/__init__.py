"""traceql capture: real workloads with planted pathologies, written as run dirs.

Only worker.py imports torch (inside the rank processes); everything else here works without it.
"""

from traceql.capture.scenarios import SCENARIOS, Scenario

__all__ = ["SCENARIOS", "Scenario"]
