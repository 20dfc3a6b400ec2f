"""Shared test fixtures. The reference corpus lives beside the checkout in ../shared/corpus and may be absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("TRACEQL_CORPUS", REPO.parent / "shared" / "corpus"))
FIXTURES = REPO / "fixtures"
SAMPLES = REPO / "samples"
# files the fixtures damaged on purpose (a hand-made fixture's manifest names them under "damaged"): tests of what a
# reader makes of a good trace leave them out; the rule tests (TQL003, TQL004) are where they count
DAMAGED = {m.parent / f for m in FIXTURES.glob("*/manifest.json") for f in json.loads(m.read_text()).get("damaged", [])}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own Parquet cache, so no test sees another's cached tables."""
    monkeypatch.setenv("TRACEQL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"reference corpus not present at {CORPUS}")
    return CORPUS


def corpus_path(*parts: str) -> Path:
    """For parametrize at collection time: the path, whether or not it exists."""
    return CORPUS.joinpath(*parts)


def rule_rows(run, rule_id: str, rank: int | None = None) -> list[dict]:
    """A rule's selection before its condition (every row, as evidence): the numbers a rule's YAML computes, for
    tests that check them where the rule stays quiet. With rank, only that rank's rows."""
    import dataclasses

    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    (rule,) = [r for r in load_rules() if r.id == rule_id]
    rule = dataclasses.replace(rule, condition=None, evidence=[*rule.evidence, "rank"])
    res = evaluate(run, rule)
    assert res.status == "ran", res.reason
    return [f.evidence for f in res.findings if rank is None or rank in f.ranks]


@pytest.fixture(scope="module")
def client():
    """A Dask client on an in-process LocalCluster (one worker, two threads): the executor's tests and the URL
    sources' (memory:// is per process, so its workers must share this one)."""
    import distributed

    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as c, \
            distributed.Client(c) as cl:
        yield cl

