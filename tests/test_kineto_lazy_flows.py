"""The flows table, which no rule reads, is built from the scanner's rows only when read on an in-process read
(kineto.read(lazy=True)): its row count is told without building it, and what it builds is what the eager read makes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from conftest import CORPUS, DAMAGED, FIXTURES, SAMPLES
from traceql.ingest import kineto, read_source
from traceql.model import Source
from traceql.model.run import Pending

pytestmark = pytest.mark.skipif(not kineto._USE_KSCAN, reason="the compiled scanner is not built")

TRACES = sorted(SAMPLES.glob("demo/*.pt.trace.json.gz")) + \
    [p for p in sorted(FIXTURES.glob("*/*.pt.trace.json*")) if p not in DAMAGED][::3] + [
    CORPUS / "hta/tests/data/df_index_resolver/df_index_resolver.json.gz",
    CORPUS / "hta/tests/data/timeline_analysis/sampled_rank-0.json.gz",
]


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def _same(lazy: dict, eager: dict) -> None:
    assert lazy.keys() == eager.keys()
    for name, df in lazy.items():
        if isinstance(df, Pending):
            assert name == "flows" and df.rows == eager[name].height
            df = df.read()
        # the flows' row order varies from one read to the next (the pairing's join): compared sorted
        assert df.schema == eager[name].schema and _sorted(df).equals(_sorted(eager[name])), name


@pytest.mark.parametrize("path", [p for p in TRACES if p.exists()], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_lazy_flows_are_the_eager_flows(path: Path):
    src = lambda: Source(id=3, path=path, kind="kineto", rank=1)  # noqa: E731
    _same(read_source(src(), lazy=True), read_source(src()))


def test_the_demo_trace_keeps_its_flows_unread_until_asked(tmp_path):
    """Both kinds of the demo's flows (ac2g launches, fwdbwd) are named by their category: the count needs no build."""
    got = kineto.read(SAMPLES / "demo" / "rank0.pt.trace.json.gz", Source(id=0, path=Path("x"), kind="kineto"), lazy=True)
    assert isinstance(got["flows"], Pending)


def test_flows_that_the_count_cannot_tell_are_built_at_once(tmp_path):
    """A flow kind named by the event name (no category), ids missing: the count would need the pairing, so the
    flows are built as the eager read builds them."""
    doc = json.loads(gzip.decompress((SAMPLES / "demo" / "rank0.pt.trace.json.gz").read_bytes()))
    doc["traceEvents"] += [
        {"ph": "s", "name": "nameonly", "pid": 1, "tid": 1, "ts": 1.0, "id": 5},
        {"ph": "f", "name": "nameonly", "cat": "", "pid": 1, "tid": 2, "ts": 2.0, "id": 5, "bp": "e"},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "pid": 1, "tid": 1, "ts": 3.0},
    ]
    f = tmp_path / "rank0.pt.trace.json"
    f.write_text(json.dumps(doc, indent=1))
    src = lambda: Source(id=0, path=f, kind="kineto", rank=0)  # noqa: E731
    lazy = kineto.read(f, src(), lazy=True)
    assert isinstance(lazy["flows"], pl.DataFrame)
    _same(read_source(src(), lazy=True), read_source(src()))
