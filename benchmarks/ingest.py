"""Ingest benchmark: traceql's Kineto importer vs HTA's TraceAnalysis load, on the corpus's largest real traces and
scaled-up copies (steps repeated with shifted timestamps) made in a temp dir, never committed.

    python benchmarks/ingest.py [--corpus DIR] [--sizes 100,1000] [--ranks 8x250] [--gzip] [--one-core]
                                [--hta-python /tmp/htavenv/bin/python] [--no-hta] [--repeat 2]

Each measurement runs in a fresh subprocess (imports excluded: the child imports first, then times), so peak RSS
(resource.getrusage) belongs to that one ingest. The parent never holds a trace in memory itself: Linux carries the
high-water RSS across exec, so a fat parent would hide the children's peaks. With --repeat N the best of N runs is
kept (the box is shared: the minimum is the least disturbed run).

Columns: MB of uncompressed JSON, events, traceql cold seconds (wall and CPU; CPU includes polars' threads), MB/s over
CPU seconds, peak RSS growth per event (measured after discovery, which imports every format module, and after a
warm-up ingest of one small real trace, the demo's rank 0: what any first ingest pages in once per process, polars'
code and allocator arenas, is not per event; HTA gets the same warm-up), the same counting that first-ingest growth
("B/ev 1st", from a second run with no warm-up: what a process that reads a single trace pays; "MB/s 1st" is
that run's speed), warm
(Parquet cache) seconds, HTA wall and CPU seconds and bytes per event, and HTA's time over traceql's, by wall clock
and by CPU (on a loaded box the CPU ratio is the steadier one).

Scaled copies are written in Kineto's own layout (one field group per line), which is what torch.profiler writes
and what the chunked parser cuts at; --compact writes them as one line instead, to time the whole-document path.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
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
p = Path(sys.argv[2]); mode = sys.argv[3]; jobs = int(sys.argv[4]); warmup = sys.argv[5] if len(sys.argv) > 5 else ""
sources = discover(p)  # imports every format module (sniffing): a constant, kept out of the per-event peak
cold_base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if warmup:  # a tiny trace first: the code pages and allocator arenas any first ingest touches, once per process
    ingest(Path(warmup), discover(Path(warmup)), use_cache=False, jobs=1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if mode == "warm":
    ingest(p, sources, use_cache=True, jobs=jobs)  # fill the cache
    sources = discover(p)
t, c = time.perf_counter(), time.process_time()
run = ingest(p, sources, use_cache=mode == "warm", jobs=jobs)
wall, cpu = time.perf_counter() - t, time.process_time() - c
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall": wall, "cpu": cpu + ch.ru_utime + ch.ru_stime, "peak_kb": max(peak, ch.ru_maxrss),
                  "base_kb": base, "cold_base_kb": cold_base,
                  "events": sum(s.meta.get("events", 0) for s in run.sources),
                  "parser": sorted({s.meta.get("parser", "?") for s in run.sources}),
                  "status": sorted({s.status for s in run.sources})}))
"""

_CHILD_HTA = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
cold_base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if len(sys.argv) > 2 and sys.argv[2]:  # the same warm-up trace as traceql's
    TraceAnalysis(trace_dir=sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t, c = time.perf_counter(), time.process_time()
TraceAnalysis(trace_dir=sys.argv[1])
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c + ch.ru_utime + ch.ru_stime,
                  "peak_kb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ch.ru_maxrss), "base_kb": base,
                  "cold_base_kb": cold_base}))
"""


# --one-core: every child pinned to CPU 0 (taskset), traceql's with one polars thread: "MB/s on one core" literally.
_PIN: list[str] = []
_ENV: dict | None = None


def _run(args: list[str], timeout: float = 3600) -> dict | None:
    try:
        r = subprocess.run(_PIN + args, capture_output=True, text=True, timeout=timeout, env=_ENV)
    except subprocess.TimeoutExpired:
        print(f"  (timed out after {timeout:.0f} s)")
        return None
    if r.returncode != 0:
        print(f"  (failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _best(args: list[str], repeat: int, timeout: float = 3600) -> dict | None:
    runs = [r for r in (_run(args, timeout) for _ in range(repeat)) if r]
    return min(runs, key=lambda r: r["cpu"]) if runs else None


def _kineto_layout(e: dict) -> bytes:
    """One event the way Kineto writes it: "  {", the fields on one indented line, "  }"."""
    return b"  {\n    " + json.dumps(e)[1:-1].encode() + b"\n  }"


_TS = re.compile(rb'"ts": (-?)(\d+)')
_ID = re.compile(rb'"id": (\d+)')
# the ids that pair a launch with its kernel and an op with its children: a copy with the first copy's ids would pair
# every kernel with every copy's launch (benchmarks measured a join 18x its size before these were shifted)
_LINK_ID = re.compile(rb'"(correlation|External id|Python id|Python parent id)": (\d+)')


def scaled_copy(src: Path, dst: Path, target_mb: float, rank: int = 0, compact: bool = False) -> Path:
    """Repeat the trace's events with timestamps shifted past the previous copy until ~target_mb of JSON.

    The events are serialised once; each further copy is the same bytes with the integer part of every "ts", and every
    flow "id", correlation, External id and Python id, shifted by a regex, which writes GBs in minutes rather than
    re-encoding every event: each copy's launches pair with its own kernels only, as in a longer real trace."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = int(max(ts) - min(ts)) + 1000
    if isinstance(doc.get("distributedInfo"), dict):
        doc["distributedInfo"]["rank"] = rank
    dst.mkdir(parents=True, exist_ok=True)
    f = dst / f"rank-{rank}.scaled.json"
    enc = (lambda e: json.dumps(e).encode()) if compact else _kineto_layout
    sep = b", " if compact else b",\n"
    first_copy = sep.join(enc(e) for e in events)
    again = sep.join(enc(e) for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M")
    copies = max(1, round(target_mb * 1e6 / (len(first_copy) + 2)))
    head = json.dumps(doc)[:-1].encode() + b', "traceEvents": ['
    with open(f, "wb") as out:
        out.write(head if compact else head.replace(b'"traceEvents": [', b'\n  "traceEvents": [\n'))
        out.write(first_copy)
        for c in range(1, copies):
            dt, did = c * span, c * 10**9
            body = _TS.sub(lambda m: b'"ts": ' + str(int(m[1] + m[2]) + dt).encode(), again)
            body = _ID.sub(lambda m: b'"id": ' + str(int(m[1]) + did).encode(), body)
            body = _LINK_ID.sub(lambda m: b'"' + m[1] + b'": ' + str(int(m[2]) + did).encode(), body)
            out.write(sep + body)
        out.write(b"]}" if compact else b"\n  ]\n}\n")
    return f


def _gunzipped_size(p: Path) -> int:
    n = 0
    with gzip.open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n


def _gunzip_cpu(p: Path) -> float:
    """CPU seconds zlib alone takes to decompress p in 8 MB pieces (the floor for a gzip ingest)."""
    c = time.process_time()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    with open(p, "rb") as f:
        while raw := f.read(1 << 20):
            while raw:
                d.decompress(raw, 8 << 20)
                raw = d.unconsumed_tail
    return time.process_time() - c


def _make(args: list[str]) -> None:
    subprocess.run([sys.executable, __file__, "--make-scaled", *args], check=True)


def main() -> None:
    if len(sys.argv) >= 5 and sys.argv[1] == "--make-scaled":
        scaled_copy(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1")
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--sizes", default="100", help="comma-separated MB of scaled single-rank copies (e.g. 100,1000)")
    ap.add_argument("--ranks", default="", help="NxMB: N scaled ranks of MB each in one run dir (e.g. 8x250)")
    ap.add_argument("--gzip", action="store_true", help="also time a gzipped copy of the first scaled size")
    ap.add_argument("--compact", action="store_true", help="write scaled copies on one line (non-Kineto layout)")
    ap.add_argument("--no-corpus", action="store_true", help="skip the corpus traces themselves")
    ap.add_argument("--hta-python", default="/tmp/htavenv/bin/python")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-max-mb", type=float, default=1200, help="skip HTA above this many MB (its memory)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tmp", default=None, help="where to write scaled copies (default: the system temp dir)")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm (cached) column: no Parquet cache is written")
    ap.add_argument("--recheck", type=int, default=0, metavar="N",
                    help="time `traceql check` end to end on N ranks of df_index_resolver with a warm cache")
    ap.add_argument("--one-core", action="store_true",
                    help="pin every child to one CPU (taskset -c 0) and run polars with one thread")
    a = ap.parse_args()
    if a.one_core:
        global _PIN, _ENV
        if not shutil.which("taskset"):
            sys.exit("--one-core needs taskset (util-linux)")
        _PIN = ["taskset", "-c", "0"]
        _ENV = dict(os.environ, POLARS_MAX_THREADS="1")
        print("one core: children pinned to CPU 0, polars with one thread")
    try:
        mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:")) / 2**20
        print(f"machine: {os.cpu_count()} CPUs, {mem:.1f} GiB of memory")
    except (OSError, StopIteration):
        pass
    hta_ok = not a.no_hta and Path(a.hta_python).exists()
    if not hta_ok:
        print(f"note: HTA interpreter {a.hta_python} absent or disabled: HTA columns skipped "
              "(python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis)")
    src0 = a.corpus / "hta" / TRACES[0]
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        warmup = Path(tmp) / "warmup"  # one small real trace (the demo's rank 0), ingested before each measurement
        warmup.mkdir()
        shutil.copy(REPO / "samples" / "demo" / "rank0.pt.trace.json.gz", warmup)
        cases = []  # (name, dir, bytes of JSON, jobs, files)
        if not a.no_corpus:
            for rel in TRACES:
                p = a.corpus / "hta" / rel
                if p.exists():
                    d = Path(tmp) / Path(rel).parent.name
                    d.mkdir()
                    shutil.copy(p, d / p.name)
                    cases.append((rel.split("/")[2], d, _gunzipped_size(p), 1, 1))
        if src0.exists():
            sizes = [float(s) for s in a.sizes.split(",") if s]
            for i, mb in enumerate(sizes):
                out = Path(tmp) / f"scaled{mb:.0f}"
                _make([str(src0), str(out), str(mb), "0", "1" if a.compact else "0"])
                f = out / "rank-0.scaled.json"
                cases.append((f"dfi scaled ~{mb:.0f}MB", out, f.stat().st_size, 1, 1))
                if a.gzip and i == 0:
                    gz = Path(tmp) / f"scaled{mb:.0f}gz"
                    gz.mkdir()
                    with open(f, "rb") as fi, gzip.open(gz / "rank-0.scaled.json.gz", "wb", compresslevel=6) as fo:
                        shutil.copyfileobj(fi, fo, 1 << 22)
                    zcpu = _gunzip_cpu(gz / "rank-0.scaled.json.gz")
                    print(f"zlib alone decompresses the gzipped ~{mb:.0f}MB copy in {zcpu:.2f} CPU s "
                          f"({f.stat().st_size / 1e6 / zcpu:.0f} MB/s of output)")
                    cases.append((f"dfi scaled ~{mb:.0f}MB .gz", gz, f.stat().st_size, 1, 1))
            if a.ranks:
                n, mb = a.ranks.lower().split("x")
                out = Path(tmp) / f"ranks{a.ranks}"
                for r in range(int(n)):
                    _make([str(src0), str(out), mb, str(r), "1" if a.compact else "0"])
                total = sum(p.stat().st_size for p in out.iterdir())
                cases.append((f"{n} ranks x ~{mb}MB", out, total, os.cpu_count() or 1, int(n)))
        print(f"{'trace':26} {'MB':>7} {'events':>9} {'cold s':>7} {'cpu s':>7} {'MB/s':>6} {'MB/s 1st':>7} {'B/ev':>6} "
              f"{'B/ev 1st':>7} "
              f"{'warm s':>7} {'HTA s':>7} {'HTA cpu':>7} {'HTA B/ev':>8} {'wall x':>6} {'cpu x':>6}  parser")
        for name, d, nbytes, jobs, nfiles in cases:
            cold = _best([sys.executable, "-c", _CHILD_TQ, str(REPO), str(d), "cold", str(jobs), str(warmup)], a.repeat)
            if cold is None:
                continue
            # the same ingest as the process's first (no warm-up): polars' first-use costs included
            first = _best([sys.executable, "-c", _CHILD_TQ, str(REPO), str(d), "cold", str(jobs)], a.repeat)
            warm = None if a.no_warm else _best([sys.executable, "-c", _CHILD_TQ, str(REPO), str(d), "warm", str(jobs)],
                                                a.repeat)
            hta = None
            if hta_ok and nbytes / 1e6 <= a.hta_max_mb:
                hta = _best([a.hta_python, "-c", _CHILD_HTA, str(d), str(warmup)], a.repeat)
            ev = max(cold["events"], 1)
            mb = nbytes / 1e6
            # Several ranks ingest in worker processes: the peak is the largest worker's, per event of one rank.
            bpe = (cold["peak_kb"] - (cold["base_kb"] if nfiles == 1 else 0)) * 1024 / (ev / nfiles)
            # the first ingest of a process: its one-off growth counted too (what a one-trace process pays)
            bpe1 = (first["peak_kb"] - (first["cold_base_kb"] if nfiles == 1 else 0)) * 1024 / (ev / nfiles)
            row = (f"{name:26} {mb:7.1f} {ev:9d} {cold['wall']:7.2f} {cold['cpu']:7.2f} {mb / cold['cpu']:6.1f} "
                   f"{mb / first['cpu']:7.1f} "
                   f"{bpe:6.0f} {bpe1:7.0f} {warm['wall'] if warm else float('nan'):7.3f}")
            if hta:
                hb = (hta["peak_kb"] - hta["base_kb"]) * 1024 / ev
                row += (f" {hta['wall']:7.2f} {hta['cpu']:7.2f} {hb:8.0f} {hta['wall'] / cold['wall']:6.1f}"
                        f" {hta['cpu'] / cold['cpu']:6.1f}")
            else:
                row += f" {'-':>7} {'-':>7} {'-':>8} {'-':>6} {'-':>6}"
            print(row + f"  {','.join(cold['parser'])} {','.join(cold['status'])}", flush=True)
        if a.recheck and src0.exists():
            recheck(src0, Path(tmp), a.recheck, max(a.repeat, 3))


def recheck(src: Path, tmp: Path, n: int, repeat: int) -> None:
    """`traceql check` (Python start, discovery, cache reads, link, every rule, text report) on n copies of one
    trace as ranks 0..n-1, after one run that fills the Parquet cache; best and median of `repeat` runs."""
    d = tmp / f"recheck{n}"
    d.mkdir()
    for r in range(n):
        shutil.copy(src, d / f"rank-{r}.json.gz")
    env = dict(os.environ, TRACEQL_CACHE_DIR=str(tmp / "recheck-cache"))
    cmd = [str(Path(sys.executable).parent / "traceql"), "check", str(d), "--fail-on", "error"]
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if rc not in (0, 1):
            print(f"recheck: traceql check exited {rc}")
            return
    walls.sort()
    cpus.sort()
    print(f"warm re-check, `traceql check` on {n} ranks x {src.name}: wall best {walls[0]:.2f} s, median "
          f"{walls[len(walls) // 2]:.2f} s; CPU best {cpus[0]:.2f} s, median {cpus[len(cpus) // 2]:.2f} s "
          f"({repeat} runs after one that filled the cache)")


if __name__ == "__main__":
    main()
