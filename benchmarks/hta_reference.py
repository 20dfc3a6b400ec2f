"""Compute HTA's own numbers for the NCCL traces of the reference corpus -> tests/data/hta_reference.json.

Run with HTA's interpreter (a separate venv, so traceql's stays clean):

    python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis
    /tmp/htavenv/bin/python benchmarks/hta_reference.py [CORPUS_DIR] > tests/data/hta_reference.json

Each corpus folder is copied to a temp dir first (HTA may write caches beside the traces; the corpus is read-only).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

DIRS = [
    "tests/data/df_index_resolver",
    "tests/data/nccl_parser_config",
    "tests/data/negative_queue_length_values_check",
    "tests/data/timeline_analysis",
    "tests/data/trace_diff/control",
    "tests/data/trace_diff/test",
    "tests/data/trace_filter",
]


def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    corpus = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "corpus")
    out = {
        "provenance": {
            "tool": "HolisticTraceAnalysis",
            "version": version("HolisticTraceAnalysis"),
            "pandas": version("pandas"),
            "python": sys.version.split()[0],
            "made_by": "benchmarks/hta_reference.py, run with HTA's own interpreter",
            "calls": [
                "TraceAnalysis(trace_dir=<copy of DIR>)",
                "analyzer.get_comm_comp_overlap(visualize=False)",
                "analyzer.get_temporal_breakdown(visualize=False)",
            ],
            "definition": (
                "HTA 0.5.0 get_comm_comp_overlap: per rank over the whole trace (not per iteration): "
                "|union(comm kernels) & union(compute kernels)| / sum(merged comm intervals), comm = name matches "
                "^nccl.*Kernel, compute = not (^nccl.*Kernel | .*Memcpy | Memset | .*Sync), events with stream != -1"
            ),
            "date": time.strftime("%Y-%m-%d"),
        },
        "traces": {},
    }
    for rel in DIRS:
        src = corpus / "hta" / rel
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / "run"
            shutil.copytree(src, d)
            t0 = time.perf_counter()
            a = TraceAnalysis(trace_dir=str(d))
            load_s = time.perf_counter() - t0
            ov = a.get_comm_comp_overlap(visualize=False)
            tb = a.get_temporal_breakdown(visualize=False)
            files = sorted(p.name for p in d.iterdir() if p.is_file())
        out["traces"][rel] = {
            "files": files,
            "load_seconds": round(load_s, 3),
            "comm_comp_overlap": [
                {k: (int(v) if k == "rank" else float(v)) for k, v in r.items()} for _, r in ov.iterrows()
            ],
            "temporal_breakdown": [
                {k: (int(v) if k == "rank" else float(v)) for k, v in r.items()} for _, r in tb.iterrows()
            ],
        }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
