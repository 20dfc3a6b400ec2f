"""Every rule against its recorded fixtures: those that must fire do, on the ranks named; those that must stay quiet do.

This is `traceql rules test` as a test: the rule author's loop and CI's guarantee are the same thing.
"""

from __future__ import annotations

import pytest

from traceql.rules.loader import default_rules_dir, load_rules
from traceql.rule_tests import test_rules as run_fixture_tests

RULES = load_rules()


@pytest.fixture(scope="module")
def outcomes():
    return run_fixture_tests(RULES, default_rules_dir().parent)


@pytest.mark.parametrize("rule_id", [r.id for r in RULES])
def test_rule_on_its_fixtures(rule_id, outcomes):
    mine = [o for o in outcomes if o.rule == rule_id]
    rule = next(r for r in RULES if r.id == rule_id)
    if not mine:
        pytest.skip(f"{rule_id} has no fixtures yet (see its YAML)")
    bad = [f"{o.expect} {o.fixture}: {o.detail}" for o in mine if not o.ok]
    assert not bad, f"{rule.path.name}: " + "; ".join(bad)


def test_most_rules_have_fixtures_both_ways():
    both = [r.id for r in RULES if r.fixtures.get("fire") and r.fixtures.get("quiet")]
    assert len(both) >= 0.75 * len(RULES), f"rules with fire and quiet fixtures: {len(both)} of {len(RULES)}"
