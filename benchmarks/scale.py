"""Scale-out: the driver's memory and the time of `check` as the rank count grows, locally and through Dask.

    python benchmarks/scale.py [--ranks 64,256,1024] [--workers 2] [--source fixtures/cpu-straggler | TRACE] [--tmp DIR]
        [--no-local] [--no-dask] [--json OUT]

A synthetic run of N ranks is made from a real capture (default fixtures/cpu-straggler: gloo on CPU, torch 2.13,
two ranks of about 230 KB of JSON each): rank r is a copy of the capture's rank r % 2 with distributedInfo.rank set
to r, gzipped, in a temp folder deleted afterwards. --source TRACE (one Kineto trace, e.g. the corpus's 35 MB
hta/tests/data/trace_diff/control/control.json.gz) makes every rank a copy of it: the per-rank cost of a realistic
rank. Each figure is one fresh driver process running
`pipeline.check(run, use_cache=False)`:
- local: today's default path (the local ingest pool; every rank's tables come to the driver);
- dask: `scheduler=` a LocalCluster of --workers worker processes (one thread each) started by the driver; only the
  tables the cross-rank rules reach come back.
Driver peak RSS is the driver process's own ru_maxrss (RUSAGE_SELF: the workers are not counted, since the claim is
about what the one process that gathers results must hold); wall seconds are the check alone (cluster start-up
excluded and printed apart); CPU seconds are the driver's own user + sys. On Dask, worker CPU s is the workers'
user + sys during the check, summed, and worker peak RSS the largest worker's ru_maxrss: per-rank cost = worker CPU s
/ ranks.
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

DRIVER = r"""
import json, resource, sys, time
from pathlib import Path
from traceql import pipeline
run, mode, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
extra, t_start = {}, 0.0
if mode == "dask":
    from distributed import Client, LocalCluster
    t = time.perf_counter()
    cluster = LocalCluster(processes=True, n_workers=workers, threads_per_worker=1, dashboard_address=":0")
    client = Client(cluster)
    t_start = time.perf_counter() - t
    extra = {"scheduler": client}
c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
def usage():
    import resource
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 1024
if mode == "dask":
    w0 = client.run(usage)
res = pipeline.check(run, use_cache=False, **extra)
wall = time.perf_counter() - t0
c1 = resource.getrusage(resource.RUSAGE_SELF)
out = {"wall": wall, "cpu": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), "rss_mb": c1.ru_maxrss / 1024,
       "cluster_start": t_start, "findings": len(res.findings), "fingerprints": sorted(f.fingerprint for f in res.findings),
       "errors": sum(s.status == "error" for s in res.run.sources)}
if mode == "dask":
    w1 = client.run(usage)
    # the workers' own CPU during the check (summed) and their peak RSS (the largest worker; start-up included)
    out["worker_cpu"] = sum(w1[w][0] - w0[w][0] for w in w1 if w in w0)
    out["worker_rss_mb"] = max(v[1] for v in w1.values())
    client.close(); cluster.close()
print(json.dumps(out))
"""


def _load(p: Path) -> dict:
    raw = p.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def make_run(src: Path, dst: Path, n: int) -> Path:
    """rank r: the capture's rank r % (its ranks), or the one trace `src` names, with its rank rewritten."""
    files = [src] if src.is_file() else sorted(src.glob("rank*.pt.trace.json.gz"))
    docs = [_load(p) for p in files]
    dst.mkdir(parents=True)
    for r in range(n):
        doc = docs[r % len(docs)]
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (dst / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return dst


def drive(run: Path, mode: str, workers: int, timeout: float) -> dict | None:
    try:
        r = subprocess.run([sys.executable, "-c", DRIVER, str(run), mode, str(workers)], capture_output=True, text=True,
                           timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        print(f"  ({mode}: timed out after {timeout:.0f} s)")
        return None
    if r.returncode != 0:
        print(f"  ({mode} failed: {(r.stderr.strip().splitlines() or [''])[-1][:300]})")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--source", type=Path, default=REPO / "fixtures" / "cpu-straggler")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tql-scale-", dir=a.tmp))
    rows = []
    try:
        print(f"{'ranks':>6} {'mode':>6} {'wall s':>8} {'driver CPU s':>13} {'driver peak RSS MB':>19} {'findings':>9}"
              f" {'same':>5} {'worker CPU s':>13} {'worker peak RSS MB':>19}")
        for n in [int(x) for x in a.ranks.split(",")]:
            run = make_run(a.source, tmp / f"run{n}", n)
            got = {}
            for mode in [m for m in ("local", "dask") if not (m == "local" and a.no_local or m == "dask" and a.no_dask)]:
                r = drive(run, mode, a.workers, a.timeout)
                if r is None:
                    continue
                got[mode] = r
                same = "" if mode == "local" or "local" not in got else str(got["local"]["fingerprints"] == r["fingerprints"])
                rows.append({"ranks": n, "mode": mode, **{k: v for k, v in r.items() if k != "fingerprints"}})
                wk = f" {r['worker_cpu']:>13.2f} {r['worker_rss_mb']:>19.0f}" if "worker_cpu" in r else ""
                print(f"{n:>6} {mode:>6} {r['wall']:>8.2f} {r['cpu']:>13.2f} {r['rss_mb']:>19.0f} {r['findings']:>9} {same:>5}{wk}",
                      flush=True)
            shutil.rmtree(run, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
