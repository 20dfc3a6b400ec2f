"""torch.compile importers and link tables on the project's own CPU captures (fixtures/compile-*,
fixtures/cpu-divergent-compile): the twins of test_compile.py's corpus tests, so CI reads real logs too.

The oracle is the TORCH_TRACE log itself, read here line by line with json (record kinds and artifact names, the
glog pid), never the importer's output. Damaged copies are made in tmp_path.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
from pathlib import Path

import polars as pl

from conftest import FIXTURES
from traceql import link
from traceql.ingest import compile_debug, compile_trace, torch_logs
from traceql.model import Source

STORM = FIXTURES / "compile-recompile-storm"
GRAPH_BREAK = FIXTURES / "compile-graph-break"
DDP_SAME = FIXTURES / "compile-ddp-same"
DIVERGENT = FIXTURES / "cpu-divergent-compile"


def _trace(d: Path, pattern: str = "*.log.gz") -> Path:
    (p,) = sorted((d / "tt").glob(pattern))
    return p


def _read_trace(path: Path) -> tuple[pl.DataFrame, Source]:
    src = Source(path, "torch_trace")
    return compile_trace.read(path, src)["compile_events"], src


def _records(path: Path) -> list[tuple[int, dict]]:
    """(glog pid, record) for every structured record of a TORCH_TRACE log; payload lines (tab-led) skipped."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    out = []
    for line in text.splitlines():
        m = re.match(r"^[VIWE]\d{4} [\d:.]+ (\d+) \S+\] (\{.*)$", line)
        if m:
            out.append((int(m.group(1)), json.loads(m.group(2))))
    return out


def _kinds(path: Path) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for _, rec in _records(path):
        if "artifact" in rec:
            c["artifact:" + rec["artifact"]["name"]] += 1
        else:
            c.update(k for k in rec if k not in ("rank", "frame_id", "frame_compile_id", "attempt", "has_payload",
                                                 "compiled_autograd_id"))
    return c


def _run(path: Path):
    from traceql.pipeline import load_run

    return load_run(path, use_cache=False)


# --- TORCH_TRACE ----------------------------------------------------------------------------------------------


def test_recompile_storm_has_one_recompile_per_reason_artifact_and_the_limit():
    path = _trace(STORM)
    ce, src = _read_trace(path)
    n = _kinds(path)["artifact:recompile_reasons"]
    rec = ce.filter(pl.col("kind") == "recompile").sort("attempt")
    assert rec.height == n >= 8  # the storm program recompiles until the cache size limit (8)
    assert rec["compile_id"].to_list() == [f"0/{i}" for i in range(1, n + 1)]
    assert rec["guard"].str.starts_with("tensor 'x' size mismatch at index 0").all()
    assert rec["function"].unique().to_list() == ["f"]
    limit = ce.filter(pl.col("kind") == "cache_limit")
    assert limit.height == 1 and limit["compile_id"][0] == f"0/{n}"
    assert json.loads(limit["detail"][0])["limit"] == 8  # torch's default recompile_limit
    assert src.rank == 0 and src.status == "ok"


def test_graph_breaks_come_from_the_artifact_once_each():
    path = _trace(GRAPH_BREAK)
    ce, _ = _read_trace(path)
    gb = ce.filter(pl.col("kind") == "graph_break")
    # compilation_metrics also carries restart_reasons and a cumulative num_graph_breaks: neither may add rows
    assert _kinds(path)["compilation_metrics"] > 0
    assert gb.height == _kinds(path)["artifact:dynamo_graph_break_reason"] > 0
    want = [r["frame_id"] for _, r in _records(path) if r.get("artifact", {}).get("name") == "dynamo_graph_break_reason"]
    assert sorted(gb["compile_id"].str.split("/").list.first().cast(int).to_list()) == sorted(want)
    assert gb["reason"].str.contains("Tensor.item()").any() and gb["reason"].str.contains("builtin operator").any()
    assert gb["user_frame"].str.contains(r"graph_break_loop\.py:\d+$").all()


def test_cache_events_carry_keys_and_components():
    path = _trace(GRAPH_BREAK)
    ce, _ = _read_trace(path)
    k = _kinds(path)
    miss = ce.filter((pl.col("kind") == "cache_miss") & pl.col("detail").str.contains('"fx_graph"'))
    hit = ce.filter((pl.col("kind") == "cache_hit") & pl.col("detail").str.contains('"fx_graph"'))
    assert miss.height == k["artifact:fx_graph_cache_miss"] > 0 and hit.height == k["artifact:fx_graph_cache_hit"] > 0
    # a hit is a key this process wrote on an earlier miss (the same graph compiled again after a recompile)
    assert set(hit["cache_key"]) <= set(miss["cache_key"])
    comps = json.loads(miss["components"][0])
    assert any(k.startswith("example_inputs") for k in comps)
    assert all(len(v["hash"]) > 20 for v in comps.values())


def test_ddp_splits_are_not_graph_breaks_and_ops_keep_collectives_in_order():
    path = _trace(DDP_SAME, "*rank_1*")
    ce, src = _read_trace(path)
    assert src.rank == 1
    splits = ce.filter(pl.col("kind") == "ddp_split")
    assert splits.height == _kinds(path)["optimize_ddp_split_child"] > 0
    assert splits["op"].to_list() == [f"submod_{i}" for i in range(splits.height)]
    gb = ce.filter(pl.col("kind") == "graph_break")
    assert gb.height == _kinds(path)["artifact:dynamo_graph_break_reason"]
    assert not gb["reason"].str.contains("optimize_ddp").any()
    ops = ce.filter((pl.col("kind") == "graph_op") & pl.col("op").str.starts_with("_c10d_functional."))
    assert ops.height > 0
    graphs = ce.filter(pl.col("kind") == "graph_op").with_columns(pl.col("detail").str.json_path_match("$.graph").alias("g"))
    seen = 0
    for cid, g in graphs.group_by("compile_id", "g"):
        seq = g.sort("op_index")["op"].to_list()
        for i, op in enumerate(seq):
            if op == "_c10d_functional.all_reduce_.default":
                seen += 1
                assert "_c10d_functional.wait_tensor.default" in seq[i + 1:], cid  # every all_reduce is waited on
    assert seen > 0


def test_gzip_and_plain_read_the_same(tmp_path):
    gz = _trace(FIXTURES / "compile-auto-dynamic")
    plain = tmp_path / "dedicated_log_torch_trace_x.log"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    a, _ = _read_trace(gz)
    b, _ = _read_trace(plain)
    assert a.height > 0 and a.equals(b)


def test_truncated_log_keeps_complete_records(tmp_path):
    text = gzip.decompress(_trace(STORM).read_bytes())
    cut = text.index(b'"recompile_reasons"', len(text) // 2)  # cut inside a record's JSON line
    p = tmp_path / "dedicated_log_torch_trace_cut.log"
    p.write_bytes(text[:cut])
    full, _ = _read_trace(_trace(STORM))
    part, src = _read_trace(p)
    assert src.status == "partial" and "truncated" in src.detail
    n_full = full.filter(pl.col("kind") == "recompile").height
    assert 0 < part.filter(pl.col("kind") == "recompile").height < n_full
    assert part.filter(pl.col("kind") == "recompile").height == text[:cut].count(b'"recompile_reasons"')  # the complete ones


# --- TORCH_LOGS and TORCH_COMPILE_DEBUG -----------------------------------------------------------------------


def test_torch_logs_recompiles_and_limit():
    p = STORM / "stderr.txt"
    assert torch_logs.sniff(p, p.read_bytes()[:65536])
    ce = torch_logs.read(p, Source(p, "torch_logs"))["compile_events"]
    rec = ce.filter(pl.col("kind") == "recompile")
    text = p.read_text()
    assert rec.height == text.count("Recompiling function f") > 0
    assert rec["function"].unique().to_list() == ["f"]
    assert rec.filter(pl.col("compile_id") == "0/2")["guard"][0] == "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    assert ce.filter(pl.col("kind") == "cache_limit")["compile_id"].to_list() == [f"0/{rec.height}"]


def test_torch_logs_rank_prefixes():
    p = DDP_SAME / "stderr.txt"
    src = Source(p, "torch_logs")
    ce = torch_logs.read(p, src)["compile_events"]
    assert src.ranks == [0, 1]
    per_rank = dict(ce.filter(pl.col("kind") == "graph_break").group_by("rank").len().iter_rows())
    lines = p.read_text().splitlines()
    want = {r: sum(1 for ln in lines if ln.startswith(f"[rank{r}]:") and "Graph break" in ln) for r in (0, 1)}
    assert per_rank == want and all(want.values())


def test_compile_debug_rank_from_the_trace_of_the_same_pid():
    pid_rank = {}
    for t in sorted((DIVERGENT / "torch_trace").glob("*.log.gz")):
        recs = _records(t)
        pid_rank[str(recs[0][0])] = recs[0][1]["rank"]
    assert sorted(pid_rank.values()) == [0, 1]
    got = {}
    for d in sorted((DIVERGENT / "torch_compile_debug").glob("run_*")):
        src = Source(d, "compile_debug")
        ce = compile_debug.read(d, src)["compile_events"]
        got[d.name.rsplit("pid_", 1)[1]] = src.rank
        folders = [f for f in (d / "torchinductor").iterdir() if f.is_dir() and f.name.startswith("model__")]
        assert ce.filter(pl.col("kind") == "cache_miss").height == len(folders) > 0  # written on misses only
    assert got == pid_rank


def test_compile_debug_without_a_trace_stays_rank_unknown(tmp_path):
    src_dir = next((DIVERGENT / "torch_compile_debug").glob("run_*"))
    d = tmp_path / "torch_compile_debug" / src_dir.name
    shutil.copytree(src_dir, d)  # the debug folder alone: no TORCH_TRACE log beside it to take the rank from
    src = Source(d, "compile_debug")
    ce = compile_debug.read(d, src)["compile_events"]
    assert ce.height > 0
    assert src.rank is None and ce["rank"].null_count() == ce.height


# --- link: derived tables --------------------------------------------------------------------------------------


def test_compiled_regions_join_kineto_to_compile_ids():
    run = _run(GRAPH_BREAK)
    reg = link.ensure(run, "compiled_regions")
    assert reg.height > 0
    fx = reg.filter(pl.col("what") == "fx_graph")
    compiled = set(run.table("compile_events").filter(pl.col("kind") == "compile")["compile_id"])
    # every CompiledFxGraph key of the Kineto trace is one the TORCH_TRACE log compiled
    assert fx.height > 0 and fx["compile_id"].null_count() == 0 and set(fx["compile_id"]) <= compiled
    regions = reg.filter(pl.col("what") == "region")
    names = set(run.table("host_ops").filter(pl.col("name").str.starts_with("Torch-Compiled Region: "))["name"])
    assert set(regions["compile_id"]) == {n.split(": ", 1)[1].strip() for n in names}


def test_evidence_prefers_torch_trace_over_text_logs():
    run = _run(GRAPH_BREAK)
    kinds = {s.id: s.kind for s in run.sources}
    assert {"torch_trace", "torch_logs"} <= set(kinds.values())  # both report the same breaks
    ev = link.ensure(run, "compile_evidence")
    gb = ev.filter(pl.col("kind") == "graph_break")
    assert gb.height == _kinds(_trace(GRAPH_BREAK))["artifact:dynamo_graph_break_reason"]
    assert {kinds[s] for s in gb["source"]} == {"torch_trace"}


def test_same_shape_ddp_ranks_agree_on_keys():
    run = _run(DDP_SAME)
    assert link.ensure(run, "compile_cache_divergence").height == 0
    keys = run.table("compile_events").filter(pl.col("kind") == "cache_miss").group_by("rank").agg(pl.col("cache_key").sort())
    assert keys.height == 2 and keys["cache_key"][0].to_list() == keys["cache_key"][1].to_list()
