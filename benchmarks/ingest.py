"""Ingest benchmark: traceql's Kineto importer vs HTA's TraceAnalysis load, on the corpus's largest real traces
and a scaled-up copy (steps repeated with shifted timestamps) made in a temp dir.

    python benchmarks/ingest.py [--corpus DIR] [--scale-mb 100] [--hta-python /tmp/htavenv/bin/python]

Each measurement runs in a fresh subprocess (cold imports excluded: the child imports first, then times), so peak
RSS (resource.getrusage) belongs to that one ingest. The parent never holds a trace in memory itself: Linux carries
the high-water RSS across exec, so a fat parent would hide the children's peaks. Prints seconds (wall and CPU), MB/s of uncompressed JSON,
peak bytes per event, and the ratio to HTA. HTA is skipped with a note when its interpreter is absent.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = [
    "tests/data/df_index_resolver/df_index_resolver.json.gz",
    "tests/data/trace_diff/control/control.json.gz",
    "tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz",
]

_CHILD_TQ = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from traceql.discover import discover
from traceql.ingest.loader import ingest
p = Path(sys.argv[2]); cache = sys.argv[3] == "warm"
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if cache:
    ingest(p, discover(p), use_cache=True, jobs=1)  # fill the cache
t, c = time.perf_counter(), time.process_time()
run = ingest(p, discover(p), use_cache=cache, jobs=1)
wall, cpu = time.perf_counter() - t, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall": wall, "cpu": cpu, "peak_kb": peak, "base_kb": base,
                  "events": sum(s.meta.get("events", 0) for s in run.sources), "status": [s.status for s in run.sources]}))
"""

_CHILD_HTA = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c,
                  "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "base_kb": base}))
"""


def _run(args: list[str]) -> dict | None:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"  (failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def scaled_copy(src: Path, dst: Path, target_mb: float) -> Path:
    """Repeat the trace's events with timestamps shifted past the previous copy until ~target_mb of JSON."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts)) + 1000
    one = len(json.dumps(events))
    copies = max(1, int(target_mb * 1e6 / one))
    out = []
    for c in range(copies):
        for e in events:
            if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
                e = dict(e, ts=e["ts"] + c * span)
                if "id" in e and isinstance(e["id"], int):
                    e["id"] = e["id"] + c * 10**9
            elif c:
                continue
            out.append(e)
    doc["traceEvents"] = out
    dst.mkdir(parents=True, exist_ok=True)
    f = dst / "rank-0.scaled.json"
    f.write_bytes(json.dumps(doc).encode())
    return f


def _gunzipped_size(p: Path) -> int:
    n = 0
    with gzip.open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--make-scaled":
        scaled_copy(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--scale-mb", type=float, default=100)
    ap.add_argument("--hta-python", default="/tmp/htavenv/bin/python")
    ap.add_argument("--no-hta", action="store_true")
    a = ap.parse_args()
    hta_ok = not a.no_hta and Path(a.hta_python).exists()
    if not hta_ok:
        print(f"note: HTA interpreter {a.hta_python} absent: HTA columns skipped "
              "(python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis)")
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for rel in TRACES:
            p = a.corpus / "hta" / rel
            if p.exists():
                d = Path(tmp) / Path(rel).parent.name
                d.mkdir()
                shutil.copy(p, d / p.name)
                cases.append((rel.split("/")[2], d, _gunzipped_size(p)))
        if a.scale_mb and (a.corpus / "hta" / TRACES[0]).exists():
            out = Path(tmp) / "scaled"
            subprocess.run([sys.executable, __file__, "--make-scaled", str(a.corpus / "hta" / TRACES[0]), str(out),
                            str(a.scale_mb)], check=True)
            f = out / "rank-0.scaled.json"
            cases.append((f"df_index_resolver ~{a.scale_mb:.0f}MB", out, f.stat().st_size))
        print(f"{'trace':28} {'MB':>7} {'events':>8} {'cold s':>7} {'cpu s':>6} {'MB/s':>6} {'B/ev':>6} "
              f"{'warm s':>7} {'HTA s':>7} {'HTA B/ev':>8} {'HTA/cold':>8}")
        for name, d, nbytes in cases:
            cold = _run([sys.executable, "-c", _CHILD_TQ, str(REPO), str(d), "cold"])
            warm = _run([sys.executable, "-c", _CHILD_TQ, str(REPO), str(d), "warm"])
            hta = _run([a.hta_python, "-c", _CHILD_HTA, str(d)]) if hta_ok else None
            if cold is None:
                continue
            ev = max(cold["events"], 1)
            mb = nbytes / 1e6
            bpe = (cold["peak_kb"] - cold["base_kb"]) * 1024 / ev
            row = (f"{name:28} {mb:7.1f} {ev:8d} {cold['wall']:7.2f} {cold['cpu']:6.2f} {mb / cold['cpu']:6.1f} "
                   f"{bpe:6.0f} {warm['wall'] if warm else float('nan'):7.3f}")
            if hta:
                hb = (hta["peak_kb"] - hta["base_kb"]) * 1024 / ev
                row += f" {hta['wall']:7.2f} {hb:8.0f} {hta['wall'] / cold['wall']:8.1f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
