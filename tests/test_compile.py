"""torch.compile evidence: TORCH_TRACE, TORCH_LOGS and TORCH_COMPILE_DEBUG importers, link/compile tables, TQL401-405.

Real data first: the reference corpus (../shared/corpus/compile, skipped where absent) and the CPU captures under
fixtures/compile-*. Hand-made inputs (truncation, unknown record kinds, garbage) are built in tmp_path by the
tests themselves from corpus files or a few literal lines.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import FIXTURES, corpus_path
from traceql import link
from traceql.ingest import IngestError
from traceql.ingest import compile_debug, compile_trace, torch_logs
from traceql.ingest._compile_common import parse_graph_ops
from traceql.model import Source

COMPILE = corpus_path("compile")
REPO = Path(__file__).resolve().parents[1]


def _trace(case: str) -> Path:
    return next((COMPILE / case / "tt").glob("*.log.gz"))


def _read_trace(path: Path) -> tuple[pl.DataFrame, Source]:
    src = Source(path, "torch_trace")
    return compile_trace.read(path, src)["compile_events"], src


def _run(path: Path):
    from traceql.pipeline import load_run

    return load_run(path, use_cache=False)


needs_corpus = pytest.mark.skipif(not COMPILE.is_dir(), reason="reference corpus not present")


# --- TORCH_TRACE ----------------------------------------------------------------------------------------------


@needs_corpus
def test_recompile_storm_trace_has_eight_recompiles_and_the_limit():
    ce, src = _read_trace(_trace("recompile_storm_static"))
    rec = ce.filter(pl.col("kind") == "recompile").sort("attempt")
    assert rec["compile_id"].to_list() == [f"0/{i}" for i in range(1, 9)]
    assert rec["guard"].str.starts_with("tensor 'x' size mismatch at index 0").all()
    assert rec["frame_id"].unique().to_list() == [0] and rec["function"].unique().to_list() == ["f"]
    limit = ce.filter(pl.col("kind") == "cache_limit")
    assert limit.height == 1 and limit["compile_id"][0] == "0/8"
    assert json.loads(limit["detail"][0])["limit"] == 8
    assert src.rank == 0 and src.status == "ok"


@needs_corpus
def test_graph_breaks_come_from_the_artifact_once_each():
    ce, _ = _read_trace(_trace("graph_break_cold"))
    gb = ce.filter(pl.col("kind") == "graph_break").sort("compile_id")
    # compilation_metrics also carries restart_reasons and a cumulative num_graph_breaks: neither may add rows
    assert gb.height == 2
    assert gb["user_frame"].str.extract(r":(\d+)$").to_list() == ["11", "12"]
    assert "Tensor.item()" in gb["reason"][0] and "builtin operator" in gb["reason"][1]
    assert gb["function"].to_list() == ["forward", "torch_dynamo_resume_in_forward_at_11"]


@needs_corpus
def test_cache_events_carry_keys_and_components():
    cold, _ = _read_trace(_trace("graph_break_cold"))
    warm, _ = _read_trace(_trace("graph_break_warm"))
    miss = cold.filter((pl.col("kind") == "cache_miss") & pl.col("detail").str.contains('"fx_graph"'))
    hit = warm.filter((pl.col("kind") == "cache_hit") & pl.col("detail").str.contains('"fx_graph"'))
    assert miss.height == 4 and hit.height == 4
    assert set(miss["cache_key"]) == set(hit["cache_key"])  # the warm run hit exactly the keys the cold one wrote
    comps = json.loads(miss["components"][0])
    shapes = [v["value"] for k, v in comps.items() if k.startswith("example_inputs")]
    assert any("torch.Size([4, 16])" in s for s in shapes)
    assert all(len(v["hash"]) > 20 for v in comps.values())


@needs_corpus
def test_ddp_splits_are_not_graph_breaks_and_ops_keep_collectives_in_order():
    ce, src = _read_trace(next((COMPILE / "ddp_gloo_same" / "tt").glob("*rank_1*")))
    assert src.rank == 1
    splits = ce.filter(pl.col("kind") == "ddp_split")
    assert splits["op"].to_list() == ["submod_0", "submod_1", "submod_2", "submod_3"]
    assert not ce.filter(pl.col("kind") == "graph_break")["reason"].str.contains("optimize_ddp").any()
    ops = ce.filter((pl.col("kind") == "graph_op") & (pl.col("compile_id") == "5/0")
                    & pl.col("detail").str.contains('"post_grad"')).sort("op_index")["op"].to_list()
    i = ops.index("_c10d_functional.all_reduce_.default")
    assert ops[i + 1] == "_c10d_functional.wait_tensor.default"


@needs_corpus
def test_gzip_and_plain_read_the_same(tmp_path):
    gz = _trace("recompile_auto_dynamic")
    plain = tmp_path / "dedicated_log_torch_trace_x.log"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    a, _ = _read_trace(gz)
    b, _ = _read_trace(plain)
    assert a.equals(b)


@needs_corpus
def test_truncated_log_keeps_complete_records(tmp_path):
    text = gzip.decompress(_trace("recompile_storm_static").read_bytes())
    cut = text.index(b'"recompile_reasons"', len(text) // 2)  # cut inside a record's JSON line
    p = tmp_path / "dedicated_log_torch_trace_cut.log"
    p.write_bytes(text[:cut])
    full, _ = _read_trace(_trace("recompile_storm_static"))
    part, src = _read_trace(p)
    assert src.status == "partial" and "truncated" in src.detail
    assert 0 < part.filter(pl.col("kind") == "recompile").height < full.filter(pl.col("kind") == "recompile").height


def test_unknown_record_kinds_are_counted_not_fatal(tmp_path):
    # hand-made: two records in TORCH_TRACE's shape, one of a kind no torch version has written yet
    p = tmp_path / "dedicated_log_torch_trace_rank_3_x.log"
    p.write_text(
        'V1129 09:20:23.443000 1 torch/_dynamo/convert_frame.py:1] {"dynamo_start": {"stack": [{"line": 5, "name": "f", '
        '"filename": 0}]}, "rank": 3, "frame_id": 0, "frame_compile_id": 0, "attempt": 0}\n'
        'V1129 09:20:23.444000 1 torch/x.py:2] {"quantum_flux_report": {"n": 1}, "rank": 3, "frame_id": 0, '
        '"frame_compile_id": 0, "attempt": 0, "has_payload": "abc"}\n\t{"payload": 1}\n'
    )
    ce, src = _read_trace(p)
    assert src.meta["unknown_kinds"] == {"quantum_flux_report": 1}
    unk = ce.filter(pl.col("kind") == "unknown")
    assert unk.height == 1 and unk["rank"][0] == 3 and unk["function"][0] == "f"
    assert src.status == "ok" and "unknown" in src.detail


def test_garbage_is_one_line_ingest_error(tmp_path):
    p = tmp_path / "dedicated_log_torch_trace_bad.log"
    p.write_text("V1129 09:20:23.443000 1 torch/x.py:2] {not json\n" * 3)
    with pytest.raises(IngestError) as e:
        _read_trace(p)
    assert "\n" not in str(e.value) and p.name in str(e.value)


@given(ca=st.none() | st.integers(0, 50), f=st.integers(0, 10_000), c=st.integers(0, 10_000))
def test_compile_id_round_trip(ca, f, c):
    cid = compile_trace.compile_id_of({"compiled_autograd_id": ca, "frame_id": f, "frame_compile_id": c})
    assert cid == (f"!{ca}/{f}/{c}" if ca is not None else f"{f}/{c}")
    assert compile_trace.parse_compile_id(cid) == (f, c)


def test_graph_ops_in_order_with_inputs():
    text = '''class GraphModule(torch.nn.Module):
    def forward(self, arg0_1: "f32[4][1]cpu"):
        # File: x.py:1 in f, code: y = x * x
        mul: "f32[4][1]cpu" = torch.ops.aten.mul.Tensor(arg0_1, arg0_1);  arg0_1 = None
        all_reduce: "f32[4][1]cpu" = torch.ops._c10d_functional.all_reduce_.default(mul, 'sum', '0');  mul = None
        wait_tensor: "f32[4][1]cpu" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        s = wait_tensor.sum()
        t = s * 2
        return (t,)
'''
    ops = parse_graph_ops(text)
    assert [o["op"] for o in ops] == ["aten.mul.Tensor", "_c10d_functional.all_reduce_.default",
                                      "_c10d_functional.wait_tensor.default", "Tensor.sum", "operator.mul"]
    assert ops[2]["in"] == ["all_reduce"] and ops[0]["in"] == ["arg0_1"]


# --- TORCH_LOGS and TORCH_COMPILE_DEBUG -----------------------------------------------------------------------


@needs_corpus
def test_torch_logs_recompiles_and_limit():
    p = COMPILE / "recompile_storm_static" / "stderr.txt"
    assert torch_logs.sniff(p, p.read_bytes()[:65536])
    ce = torch_logs.read(p, Source(p, "torch_logs"))["compile_events"]
    rec = ce.filter(pl.col("kind") == "recompile")
    assert rec.height == 8 and rec["function"].unique().to_list() == ["f"]
    assert rec.filter(pl.col("compile_id") == "0/2")["guard"][0] == "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    assert ce.filter(pl.col("kind") == "cache_limit")["compile_id"].to_list() == ["0/8"]


@needs_corpus
def test_torch_logs_rank_prefixes():
    p = COMPILE / "ddp_gloo_same" / "stderr.txt"
    src = Source(p, "torch_logs")
    ce = torch_logs.read(p, src)["compile_events"]
    assert src.ranks == [0, 1]
    per_rank = ce.filter(pl.col("kind") == "graph_break").group_by("rank").len().sort("rank")
    assert per_rank["len"].to_list() == [3, 3]


@needs_corpus
def test_tlparse_output_is_not_taken_for_torch_logs():
    html = COMPILE / "graph_break_cold" / "tlparse_out" / "index.html"
    assert not torch_logs.sniff(html, html.read_bytes()[:65536])


@needs_corpus
def test_compile_debug_rank_from_the_trace_of_the_same_pid():
    folders = sorted((COMPILE / "ddp_gloo_same" / "torch_compile_debug").glob("run_*"))
    got = {}
    for d in folders:
        src = Source(d, "compile_debug")
        ce = compile_debug.read(d, src)["compile_events"]
        got[d.name.rsplit("pid_", 1)[1]] = src.rank
        assert ce.filter(pl.col("kind") == "cache_miss").height == 7  # model__* folders: written on misses only
    assert got == {"14422": 0, "14423": 1}


@needs_corpus
def test_compile_debug_without_rank_stays_unknown():
    d = next((COMPILE / "recompile_storm_static" / "torch_compile_debug").glob("run_*"))
    src = Source(d, "compile_debug")
    ce = compile_debug.read(d, src)["compile_events"]
    assert src.rank is None and ce["rank"].null_count() == ce.height
    assert ce.filter(pl.col("kind") == "compile")["compile_id"].to_list() == [f"0/{i}" for i in range(8)]


# --- link: derived tables --------------------------------------------------------------------------------------


@needs_corpus
def test_compiled_regions_join_kineto_to_compile_ids():
    run = _run(COMPILE / "kineto_link")
    reg = link.ensure(run, "compiled_regions")
    if reg.height == 0:
        pytest.skip("Kineto importer produced no host ops")
    fx = reg.filter(pl.col("what") == "fx_graph")
    # every CompiledFxGraph key of the trace is one the TORCH_TRACE log compiled, including backward graphs
    assert fx["compile_id"].null_count() == 0
    assert set(fx["compile_id"]) == {"0/0", "1/0"}
    assert set(reg.filter(pl.col("what") == "region")["compile_id"]) == {"0/0", "1/0"}


@needs_corpus
def test_evidence_prefers_torch_trace_over_text_logs():
    run = _run(COMPILE / "graph_break_cold")
    ev = link.ensure(run, "compile_evidence")
    gb = ev.filter(pl.col("kind") == "graph_break")
    assert gb.height == 2  # three sources report the same two breaks
    kinds = {s.id: s.kind for s in run.sources}
    assert {kinds[s] for s in gb["source"]} == {"torch_trace"}


@needs_corpus
def test_same_shape_ddp_ranks_agree_on_keys():
    run = _run(COMPILE / "ddp_gloo_same")
    assert link.ensure(run, "compile_cache_divergence").height == 0
    coll = link.ensure(run, "graph_collectives")
    assert coll.filter(pl.col("compute_between") == 0)["rank"].sort().to_list() == [0, 1]


# --- rules on the captured fixtures ----------------------------------------------------------------------------

_FIXTURE_NAMES = ["compile-graph-break", "compile-recompile-storm", "compile-auto-dynamic", "compile-ddp-divergent",
                  "compile-ddp-same"]


def _rule_files():
    return sorted((REPO / "rules").glob("TQL40[1-5]-*.yaml"))


@pytest.mark.parametrize("name", _FIXTURE_NAMES)
def test_fixture_manifest(name):
    d = FIXTURES / name
    if not d.is_dir():
        pytest.skip(f"{name} not captured")
    m = json.loads((d / "manifest.json").read_text())
    assert m["hand_made"] is False and m["command"] and m["scenario"]
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert size < 500_000


def test_rules_fire_and_stay_quiet_on_their_fixtures():
    from traceql.rules.loader import load_rules
    from traceql.rule_tests import test_rules

    files = _rule_files()
    assert len(files) == 5
    rules = [r for r in load_rules([REPO / "rules"]) if r.id in {f"TQL40{i}" for i in range(1, 6)}]
    assert sorted(r.id for r in rules) == [f"TQL40{i}" for i in range(1, 6)]
    outcomes = test_rules(rules, REPO, use_cache=False)
    bad = [f"{o.rule} {o.expect} {o.fixture}: {o.detail}" for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
    assert {o.rule for o in outcomes if o.expect == "fire"} == {f"TQL40{i}" for i in range(1, 6)}


def test_divergent_fixture_names_the_shape_component():
    d = FIXTURES / "compile-ddp-divergent"
    if not d.is_dir():
        pytest.skip("fixture not captured")
    run = _run(d)
    div = link.ensure(run, "compile_cache_divergence")
    assert div.height > 0 and set(div["rank"]) == {1}
    assert div["differing"].str.contains("example_inputs").any()
    assert div["differing_values"].str.contains(r"\[6, 512\]").any()
