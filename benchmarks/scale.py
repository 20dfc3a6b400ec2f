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
excluded and printed apart); CPU seconds are the driver's own user + sys; all CPU s is every process of the figure
(driver, its ingest pool or its Dask scheduler, nannies and workers; process and cluster start-up included), from
RUSAGE_CHILDREN of this script around the driver process. On Dask, worker CPU s is the workers'
user + sys during the check, summed, and worker peak RSS the largest worker's ru_maxrss: per-rank cost = worker CPU s
/ ranks.

After the rows it prints, per path, the least-squares line of wall s, driver CPU s and driver peak MB against the
rank count (slope per rank, intercept), and from the Dask rows the per-rank cost (worker CPU s per rank, worker peak
MB) with the projection for --project-ranks ranks of --project-mb MB each on N workers:
    wall(N) ~ ranks * (worker CPU s per rank) * (project MB / source MB) / N + ranks * (driver s per rank) + intercept
    worker memory <= (worker peak MB) * (project MB / source MB) per worker thread (imports scaled too: an upper bound)
    driver peak ~ intercept MB + ranks * (driver MB per rank)
the source MB being the uncompressed size of one synthetic rank's trace (the per-rank cost scales with it linearly,
as the ingest measurements in benchmarks/README.md show); an estimate from measured inputs, not a measurement.
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
    # each capture serialized once with marker values, the markers replaced per rank (a 35 MB trace dumped 128 times
    # took minutes)
    texts = []
    for p in files:
        doc = _load(p)
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": -987654321, "world_size": -987654322}
        texts.append(json.dumps(doc))
    dst.mkdir(parents=True)
    for r in range(n):
        text = texts[r % len(texts)].replace("-987654321", str(r), 1).replace("-987654322", str(n), 1)
        (dst / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(text.encode(), 1))
    return dst


def drive(run: Path, mode: str, workers: int, timeout: float) -> dict | None:
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        r = subprocess.run([sys.executable, "-c", DRIVER, str(run), mode, str(workers)], capture_output=True, text=True,
                           timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        print(f"  ({mode}: timed out after {timeout:.0f} s)")
        return None
    if r.returncode != 0:
        print(f"  ({mode} failed: {(r.stderr.strip().splitlines() or [''])[-1][:300]})")
        return None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # every process of the run, reaped: the driver, its ingest pool or its Dask cluster (start-up included)
    out["cpu_all"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def _rank_mb(src: Path) -> float:
    """MB of one synthetic rank's uncompressed trace (the mean over the capture's ranks)."""
    files = [src] if src.is_file() else sorted(src.glob("rank*.pt.trace.json.gz"))
    sizes = [len(gzip.decompress(p.read_bytes())) if p.read_bytes()[:2] == b"\x1f\x8b" else p.stat().st_size
             for p in files]
    return sum(sizes) / len(sizes) / 1e6


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys on xs (two rank counts at least)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def report(rows: list[dict], rank_mb: float, p_ranks: int, p_mb: float, p_workers: list[int]) -> None:
    for mode in ("local", "dask"):
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        xs = [r["ranks"] for r in mine]
        if len(set(xs)) < 2:
            print(f"{mode}: one rank count; the fit and the projection need two (--ranks 32,128)")
            continue
        print(f"{mode}: linear fit over ranks {xs} (slope per rank, intercept):")
        for key, label in (("wall", "wall s"), ("cpu", "driver CPU s"), ("rss_mb", "driver peak MB"),
                           ("worker_cpu", "worker CPU s")):
            if all(key in r for r in mine):
                s, b = fit(xs, [r[key] for r in mine])
                print(f"  {label:>15}: {s:.4f} per rank + {b:.2f}")
    dask = [r for r in rows if r["mode"] == "dask" and "worker_cpu" in r]
    if len({r["ranks"] for r in dask}) < 2:
        return
    xs = [r["ranks"] for r in dask]
    cpu_rank, _ = fit(xs, [r["worker_cpu"] for r in dask])
    drv_rank, drv_b = fit(xs, [r["cpu"] for r in dask])
    mem_rank, mem_b = fit(xs, [r["rss_mb"] for r in dask])
    wpeak = max(r["worker_rss_mb"] for r in dask)
    scale = p_mb / rank_mb
    print(f"per-rank cost (ranks of {rank_mb:.1f} MB): worker CPU {cpu_rank:.3f} s per rank (slope), worker peak "
          f"{wpeak:.0f} MB (largest worker), driver CPU {drv_rank:.4f} s per rank, driver {mem_rank:.3f} MB per rank")
    print(f"projection, {p_ranks} ranks x {p_mb:.0f} MB (x{scale:.1f} per rank): wall(N) ~ {p_ranks} x {cpu_rank:.3f}"
          f" x {scale:.1f} / N + {p_ranks} x {drv_rank:.4f} + {drv_b:.1f} s; driver peak ~ {mem_b:.0f} + {p_ranks} x "
          f"{mem_rank:.3f} = {mem_b + p_ranks * mem_rank:.0f} MB; worker peak <= {wpeak * scale:.0f} MB per worker thread (the whole peak scaled, its imports too)")
    for n in p_workers:
        wall = p_ranks * cpu_rank * scale / n + p_ranks * drv_rank + drv_b
        print(f"  N = {n:>4} workers: ~{wall:,.0f} s wall, {p_ranks * cpu_rank * scale:,.0f} worker CPU s in all")


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
    ap.add_argument("--project-ranks", type=int, default=1024)
    ap.add_argument("--project-mb", type=float, default=200.0)
    ap.add_argument("--project-workers", default="8,32,128")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tql-scale-", dir=a.tmp))
    rows = []
    try:
        print(f"{'ranks':>6} {'mode':>6} {'wall s':>8} {'driver CPU s':>13} {'driver peak RSS MB':>19} {'findings':>9}"
              f" {'same':>5} {'all CPU s':>10} {'worker CPU s':>13} {'worker peak RSS MB':>19}")
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
                print(f"{n:>6} {mode:>6} {r['wall']:>8.2f} {r['cpu']:>13.2f} {r['rss_mb']:>19.0f} {r['findings']:>9} {same:>5} {r['cpu_all']:>10.2f}{wk}",
                      flush=True)
            shutil.rmtree(run, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, _rank_mb(a.source), a.project_ranks, a.project_mb, [int(x) for x in a.project_workers.split(",")])
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
