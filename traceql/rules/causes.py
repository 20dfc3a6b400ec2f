"""After the rules ran: what each finding costs (link.whatif's replay) and which cause explains which finding.

Both are data in the rule files. A rule's `cost:` mapping names the cause its findings stand for
(`removes: straggler_delay`, ...) and the rules whose findings that cause explains (`explains: [TQL101, TQL301]`):
a straggler's victims wait in collectives (exposed communication), their GPUs idle, and their step times differ.

A cause explains a finding of a listed rule when the cause costs something (a cause that saves nothing explains
nothing) and at least half what the finding costs (a 1 ms straggler does not explain 20 ms of exposed
communication: removing it would leave most of that), the two are about the same ranks (for a cause that acts across ranks, such as a late rank: any rank of
its sync group) and the same step (or either spans every step). Where several causes explain one finding, the
costliest is its cause. Chains are kept (a late rank -> exposed communication -> GPU idle gaps), never loops.
"""

from __future__ import annotations

from traceql.link import whatif


def _explains(cause, spec: dict, other, groups: dict[int, int]) -> bool:
    if other.rule not in spec.get("explains", []) or other is cause:
        return False
    if (other.cost_ms_per_step or 0.0) > 2.0 * (cause.cost_ms_per_step or 0.0):
        return False
    if cause.step is not None and other.step is not None and cause.step != other.step:
        return False
    mine, theirs = set(cause.ranks), set(other.ranks)
    if whatif.CAUSES[spec["removes"]]["cross_rank"]:
        mine = {r for r, g in groups.items() if g in {groups.get(x, x) for x in mine}} | mine
    return bool(mine & theirs) or not theirs


def link_causes(run, findings: list, specs: dict[str, dict]) -> None:
    """Set caused_by on the findings a costlier cause explains (see the module doc)."""
    causes = [f for f in findings if specs.get(f.rule, {}).get("explains") and (f.cost_ms_per_step or 0) > 0]
    if not causes:
        return
    groups = whatif.sync_groups(run)
    by_fp = {f.fingerprint: f for f in findings}
    causes.sort(key=lambda f: (-f.cost_ms_per_step, f.rule, f.fingerprint))

    def ancestors(f) -> set[str]:
        seen: set[str] = set()
        while f is not None and f.caused_by and f.caused_by not in seen:
            seen.add(f.caused_by)
            f = by_fp.get(f.caused_by)
        return seen

    for c in causes:  # costliest first: a finding keeps the first (costliest) cause that explains it
        cfp = c.fingerprint
        for f in findings:
            if f.caused_by is not None or not _explains(c, specs[c.rule], f, groups):
                continue
            if f.fingerprint == cfp or f.fingerprint in ancestors(c):
                continue  # f is c's own cause: a loop
            f.caused_by = cfp


def cost_specs(rules) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """rule id -> its cost mapping, and rule id -> the collapse columns besides the rank (what tells its findings'
    causes apart: one host sync call site from another)."""
    specs = {r.id: r.cost for r in rules if r.cost}
    keys = {r.id: [c for c in r.collapse if c != r.ranks_column] for r in rules if r.cost}
    return specs, keys


def attribute(run, findings: list, rules) -> None:
    """Costs for every finding whose rule says how, then causes before consequences."""
    specs, keys = cost_specs(rules)
    if not specs or not findings:
        return
    whatif.apply_costs(run, findings, specs, keys)
    link_causes(run, findings, specs)
