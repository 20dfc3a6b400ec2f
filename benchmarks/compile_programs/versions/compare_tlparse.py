"""Compile ids (restart attempts included) and graph breaks per rank: traceql against tlparse 0.4.3's compile_directory.json,
on the reference corpus (TRACEQL_CORPUS or ../shared/corpus). Usage: python benchmarks/compile_programs/versions/compare_tlparse.py"""
import os
import json
import re
from pathlib import Path
import polars as pl
from traceql.pipeline import load_run
from traceql import link
root = Path(os.environ.get("TRACEQL_CORPUS", Path(__file__).resolve().parents[4] / "shared" / "corpus")) / "compile"
for case in sorted(p for p in root.iterdir() if (p / "tlparse_out").is_dir()):
    run = load_run(case, use_cache=False)
    ev = link.ensure(run, "compile_evidence")
    tt = {s.id for s in run.sources if s.kind == "torch_trace"}
    ev = ev.filter(pl.col("source").is_in(list(tt)))
    dirs = sorted((case / "tlparse_out").glob("**/compile_directory.json"))
    for d in dirs:
        rank = int(m.group(1)) if (m := re.search(r"rank_(\d+)", str(d))) else 0
        cd = json.load(open(d))
        tl_ids = {k.strip("[]") for k in cd if k != "[-/-]"}
        tl_gb = sum(1 for k, v in cd.items() for a in v.get("artifacts", []) if a["name"].startswith("dynamo_graph_break_reason"))
        e = ev.filter(pl.col("rank") == rank)
        ours = set()
        for cid, det in e.filter(pl.col("compile_id").is_not_null()).select("compile_id", "detail").iter_rows():
            r = json.loads(det).get("restart") if det else None
            ours.add(f"{cid}_{r}" if r else cid)
        gb = e.filter(pl.col("kind") == "graph_break").height
        print(f"{case.name:24s} rank {rank}: tlparse {len(tl_ids)} compile ids, traceql {len(ours)}; only tlparse {sorted(tl_ids - ours)[:5]}, only traceql {sorted(ours - tl_ids)[:5]}; graph breaks tlparse {tl_gb} traceql {gb}")
