"""A finding: what a rule concluded, about which ranks and step, with the evidence behind it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

SEVERITIES = ("info", "warning", "error")
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class Finding:
    rule: str  # TQL101
    name: str  # exposed-communication
    severity: str
    message: str
    ranks: list[int] = field(default_factory=list)
    step: int | None = None
    evidence: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # paths of the sources the evidence came from
    location: dict = field(default_factory=dict)  # logical location: rank, step, stream, compile_id...
    # What the cause costs (filled after the rules ran, by the what-if replay; None where it cannot be said):
    # the time per step the run would save without it, and that as a share of the step time.
    cost_ms_per_step: float | None = None
    cost_pct: float | None = None
    # fingerprint of the finding whose cause explains this one (a straggler's victims' waits), else None
    caused_by: str | None = None

    @property
    def fingerprint(self) -> str:
        """Stable across re-runs of the same input: rule, ranks, step and the identifying location only."""
        loc = ",".join(f"{k}={self.location[k]}" for k in sorted(self.location))
        key = f"{self.rule}|{sorted(self.ranks)}|{self.step}|{loc}"
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity,
            "ranks": self.ranks,
            "step": self.step,
            "message": self.message,
            "evidence": self.evidence,
            "fingerprint": self.fingerprint,
            "cost_ms_per_step": self.cost_ms_per_step,
            "cost_pct": self.cost_pct,
            "caused_by": self.caused_by,
        }
