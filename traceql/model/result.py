"""What `traceql check` produced: each rule's outcome and the findings, ready for any renderer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceql import __version__
from traceql.model.finding import SEVERITY_ORDER, Finding
from traceql.model.run import Run

if TYPE_CHECKING:  # the rule type is rules.loader.Rule; model/ never imports rules/
    from traceql.rules.loader import Rule


@dataclass
class RuleResult:
    rule: Rule
    status: str  # ran | skipped | error
    reason: str = ""
    findings: list[Finding] = field(default_factory=list)


@dataclass
class CheckResult:
    run: Run
    results: list[RuleResult]
    suppressed: int = 0
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self):
        if not self.findings:
            self.findings = [f for r in self.results for f in r.findings]
        self.findings.sort(key=lambda f: (-SEVERITY_ORDER[f.severity], f.rule, f.ranks, f.step if f.step is not None else -1))

    def worst(self) -> str | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=lambda s: SEVERITY_ORDER[s])

    def to_json(self) -> dict:
        root = self.run.path
        return {
            "version": __version__,
            "run": {"path": str(root), "ranks": self.run.ranks},
            "sources": [s.to_json(root if root.is_dir() else root.parent) for s in self.run.sources],
            "rules": [
                {"id": r.rule.id, "name": r.rule.name, "status": r.status, "reason": r.reason, "findings": len(r.findings)}
                for r in self.results
            ],
            "findings": [f.to_json() for f in self.findings],
            "notes": self.run.notes,
        }
