"""Flight Recorder dumps: restricted unpickling, JSON and pickle forms, FR mismatch tables, TQL601-603.

fixtures/nccl-fr-* are real dumps captured with torch.distributed (gloo, CPU) by tests/fr_capture.py.
"""

from __future__ import annotations

import os
import pickle

import polars as pl
import pytest

from tests.conftest import FIXTURES, REPO
from traceql import link
from traceql.discover import discover
from traceql.ingest import IngestError
from traceql.ingest.collective_names import canonical_collective
from traceql.ingest.flight_recorder import _op, load_dump, read, sniff
from traceql.ingest.loader import ingest
from traceql.model import Source


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Hostile(marker)]}, protocol=2))
    assert sniff(p, p.read_bytes()[:4096])
    with pytest.raises(IngestError) as e:
        load_dump(p)
    assert str(p) in str(e.value) and "system" in str(e.value)
    assert not marker.exists()
    # through the loader the file is an error source, the run goes on
    run = ingest(tmp_path, discover(tmp_path), use_cache=False)
    assert [s.status for s in run.sources] == ["error"] and not marker.exists()


def test_truncated_pickle_is_an_ingest_error(tmp_path):
    src = (FIXTURES / "nccl-fr-ok" / "nccl_trace_rank_0").read_bytes()
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(src[: len(src) // 2])
    with pytest.raises(IngestError, match="cut short"):
        load_dump(p)


def test_pickle_and_json_forms_give_the_same_rows():
    a = ingest(FIXTURES / "nccl-fr-op-mismatch", discover(FIXTURES / "nccl-fr-op-mismatch"), use_cache=False)
    b = ingest(FIXTURES / "nccl-fr-op-mismatch-json", discover(FIXTURES / "nccl-fr-op-mismatch-json"), use_cache=False)
    cols = ["rank", "seq", "op", "pg_name", "pg_desc", "group_size", "in_nelems", "out_nelems", "dtype", "state", "ts"]
    ca, cb = (r.tables["collectives"].select(cols).sort("rank", "seq") for r in (a, b))
    assert ca.height == 12 and ca.equals(cb)


def test_entries_become_collectives_with_state_and_sizes():
    run = ingest(FIXTURES / "nccl-fr-size-mismatch", discover(FIXTURES / "nccl-fr-size-mismatch"), use_cache=False)
    c = run.tables["collectives"]
    assert set(c["rank"]) == {0, 1, 2} and set(c["backend"]) == {"gloo"} and c["state"].is_not_null().all()
    assert c.filter((pl.col("seq") == 4) & (pl.col("rank") == 2))["in_nelems"].to_list() == [512]
    assert set(c["group_size"]) == {3}


@pytest.mark.parametrize("name", ["nccl:allgather_into_tensor_coalesced", "nccl:reduce_scatter_tensor_coalesced",
                                  "nccl:_allgather_base", "nccl:allreduce_coalesced", "nccl:_broadcast_oop",
                                  "gloo:alltoall_base", "nccl:send", "nccl:barrier"])
def test_fr_ops_are_named_as_kineto_names_them(name):
    """FSDP's coalesced all_gather / reduce_scatter (and the rest) get the op name the Kineto importer gives the same
    call, so that the two sources' collectives line up; the FR reader used to keep the coalesced names as they came."""
    backend, op = _op(name)
    assert backend == name.split(":")[0] and op == canonical_collective(name)
    assert op in {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "send", "barrier"}


def test_rank_comes_from_the_file_name(tmp_path):
    p = tmp_path / "trace_dump_7"
    p.write_bytes((FIXTURES / "nccl-fr-ok" / "nccl_trace_rank_1").read_bytes())
    s = Source(p, "flight_recorder")
    t = read(p, s)
    assert s.rank == 7 and set(t["collectives"]["rank"]) == {7}


@pytest.mark.parametrize("fixture,rule,kind,rank,seq", [
    ("nccl-fr-op-mismatch", "TQL601", None, 1, 4),
    ("nccl-fr-size-mismatch", "TQL602", None, 2, 4),
    ("nccl-fr-missing-rank", "TQL603", "missing_rank", 2, 5),
    ("nccl-fr-dead-rank", "TQL603", "no_dump", 2, 4),
])
def test_fr_mismatches(fixture, rule, kind, rank, seq):
    from traceql import pipeline

    found = [f for f in pipeline.check(FIXTURES / fixture, use_cache=False).findings if f.rule.startswith("TQL6")]
    assert [(f.rule, f.evidence.get("kind"), f.ranks, f.evidence["seq"]) for f in found] == [(rule, kind, [rank], seq)]


def test_fr_group_members_from_the_dumps():
    run = ingest(FIXTURES / "nccl-fr-dead-rank", discover(FIXTURES / "nccl-fr-dead-rank"), use_cache=False)
    members = link.ensure(run, "fr_group_members")
    dumped = set(link.ensure(run, "fr_entries")["rank"])
    assert 2 in set(members["rank"]) and 2 not in dumped


def test_tql6_rules_fire_and_stay_quiet_on_their_fixtures():
    from traceql.rules.loader import load_rules
    from traceql.rule_tests import test_rules

    rules = [r for r in load_rules([REPO / "rules"]) if r.id.startswith("TQL6")]
    assert len(rules) == 3
    outcomes = test_rules(rules, REPO, use_cache=False)
    bad = [f"{o.rule} {o.expect} {o.fixture}: {o.detail}" for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
