"""What `traceql check` produced: each rule's outcome and the findings, ready for any renderer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from traceql import __version__
from traceql.model.finding import SEVERITY_ORDER, Finding
from traceql.model.run import Run
from traceql.exit_codes import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE

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

    def verdict(self, run_dir, level: str) -> tuple[int, str | None]:
        """The exit status CI relies on (0 clean, 1 findings at or above `level`, 2 nothing analysable, 3 an
        internal or rule error) and, for 2 and 3, the one line that says why."""
        run = self.run
        broken = [s for s in run.sources if s.meta.get("internal_error")]
        if broken:
            return EXIT_INTERNAL, (f"{len(broken)} source(s) hit an internal error of traceql "
                                   f"({', '.join(s.path.name for s in broken[:3])}): the report is incomplete; please "
                                   "report it with the file")
        analysed = [s for s in run.sources if s.status in ("ok", "partial")]
        if not analysed:
            return EXIT_USAGE, (f"nothing could be analysed in {run_dir}: no readable input (see the sources listed "
                                "above); point traceql at a run dir holding Kineto traces, nsys SQLite exports, "
                                "TORCH_TRACE logs, NCCL logs or Flight Recorder dumps")
        if not run.ranks:
            return EXIT_USAGE, (f"no rank analysed in {run_dir}: {len(analysed)} source(s) read, none attributable to a "
                                "rank; name the files after their rank (rank0.pt.trace.json.gz, rank1.log) and check "
                                "again")
        errors = [r for r in self.results if r.status == "error"]
        if errors:
            return EXIT_INTERNAL, (f"{len(errors)} rule(s) failed ({', '.join(r.rule.id for r in errors)}): the report "
                                   "is incomplete; see the rule errors above (or in the report)")
        if level != "never":
            worst = self.worst()
            if worst is not None and SEVERITY_ORDER[worst] >= SEVERITY_ORDER[level]:
                return EXIT_FINDINGS, None
        return EXIT_OK, None
