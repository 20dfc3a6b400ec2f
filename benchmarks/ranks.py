"""Many ranks on one machine: where `check`'s CPU goes as the rank count grows, parent and workers apart.

    python benchmarks/ranks.py [--ranks 8,16] [--mb 35] [--source TRACE] [--repeat 3] [--split] [--profile DIR]
        [--tmp DIR] [--json OUT]

A run of N ranks is N copies of one kernel-dense trace (the issue's recipe: benchmarks/ingest.scaled_copy of
df_index_resolver from the corpus, or --source, to --mb MB of JSON; rank r is that file with distributedInfo.rank
rewritten), in a temp folder deleted afterwards. Each figure is one fresh interpreter running
`pipeline.check(run, use_cache=False)` as `traceql check --no-cache` does (process start and imports excluded; the
whole command is benchmarks/whole_command.py's job), then closing the ingest pool:
- parent user / sys: the checking process's own CPU (RUSAGE_SELF: its polars threads included, the workers not);
- workers: every ingest worker's user + sys (RUSAGE_CHILDREN once the pool is closed and its workers reaped);
- all = parent + workers; per rank = the least-squares slope of `all` over the rank counts;
- peak MB: the parent's ru_maxrss (it counts the pages of the workers' Arrow IPC files it maps);
- wall: the check alone.
Figures of the same N are taken in turn (local, split, local, split ... when --split), --repeat times; the table
gives the min and the median.

--split runs the same check a second way: traceql.executor.check_distributed, the Dask path's split (read tasks,
rank tasks with the per-rank rules, the cross-rank stage on what they ship), with every task run in this process one
after another by a synchronous stand-in for the Dask client (reads still go through the ingest pool and its budgets).
Its CPU is what the split costs where the rank tasks run (in a worker, it is the same work), so the pair says whether
moving per-rank link and rule work out of the parent saves CPU or only wall time and parent memory; the findings'
fingerprints of both must be equal ("same"). Needs `distributed` (the [dask] extra) for its wait().

--profile DIR writes a cProfile (process time: CPU of every thread of the parent) per figure: DIR/local-N.prof.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ingest import scaled_copy  # the kernel-dense recipe

DRIVER = r"""
import json, os, resource, sys, time
from pathlib import Path
run, mode, prof = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


class _Done:
    # a finished task of the synchronous client: what check_distributed reads of a Dask future
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error
        self.status = "finished" if error is None else "error"

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value

    def exception(self):
        return self.error


def _resolve(x):
    if isinstance(x, _Done):
        return x.result()
    if isinstance(x, (list, tuple)):
        return type(x)(_resolve(v) for v in x)
    if isinstance(x, dict):
        return {k: _resolve(v) for k, v in x.items()}
    return x


class InProcessClient:
    # every task runs at submit, in this process, in order: the split's work without Dask's
    def submit(self, fn, *args, key=None, priority=None, pure=None, **kw):
        try:
            return _Done(fn(*_resolve(list(args)), **_resolve(kw)))
        except Exception as e:  # a task's failure is its future's, as on Dask
            return _Done(error=e)

    def scatter(self, xs, hash=False):
        return [_Done(x) for x in xs]

    def gather(self, futs):
        return [f.result() for f in futs]


from traceql import pipeline
from traceql.ingest import budget
extra = {}
if mode == "split":
    import distributed
    distributed.wait = lambda futs: None  # every future is done when submit returns
    extra = {"scheduler": InProcessClient()}
pr = None
if prof != "-":
    import cProfile
    pr = cProfile.Profile(time.process_time)
    pr.enable()
t0 = time.perf_counter()
res = pipeline.check(run, use_cache=False, **extra)
wall = time.perf_counter() - t0
if pr is not None:
    pr.disable()
    pr.dump_stats(prof)
me = resource.getrusage(resource.RUSAGE_SELF)
budget.pool().close()
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "user": me.ru_utime, "sys": me.ru_stime, "rss_mb": me.ru_maxrss / 1024,
                  "workers": kids.ru_utime + kids.ru_stime, "findings": len(res.findings),
                  "fingerprints": sorted(f.fingerprint for f in res.findings)}))
"""


def make_run(src: Path, dst: Path, n: int, mb: float) -> Path:
    first = scaled_copy(src, dst, mb, rank=0)  # rank-0.scaled.json
    data = first.read_bytes()
    for r in range(1, n):  # the same bytes, the rank rewritten in distributedInfo (benchmarks/whole_command.py)
        (dst / f"rank-{r}.scaled.json").write_bytes(data.replace(b'"rank": 0', f'"rank": {r}'.encode(), 1))
    return dst


def drive(run: Path, mode: str, prof: Path | None) -> dict | None:
    # the parent's imports are paid before the check starts: the figures are the check's own
    r = subprocess.run([sys.executable, "-c", DRIVER, str(run), mode, str(prof) if prof else "-"], check=False,
                       capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        print(f"  ({mode} failed: {(r.stderr.strip().splitlines() or [''])[-1][:300]})")
        return None
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["all"] = out["user"] + out["sys"] + out["workers"]
    return out


def _mm(xs: list[float]) -> str:
    return f"{min(xs):7.2f} {statistics.median(xs):7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--mb", type=float, default=35.0)
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--source", type=Path, default=None, help="a gzipped Kineto trace (default: df_index_resolver)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--split", action="store_true", help="also the executor's rank split, in-process")
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    src = a.source
    if src is None:
        found = sorted((a.corpus / "hta/tests/data/df_index_resolver").glob("*.json.gz"))
        src = found[0] if found else REPO / "fixtures/h200x2-straggler/rank0.pt.trace.json.gz"
    if a.profile:
        a.profile.mkdir(parents=True, exist_ok=True)
    modes = ["local", "split"] if a.split else ["local"]
    tmp = Path(tempfile.mkdtemp(prefix="tql-ranks-", dir=a.tmp))
    rows = []
    try:
        print(f"source {src} scaled to ~{a.mb:.0f} MB per rank; best and median of {a.repeat}, CPU s / MB")
        print(f"{'ranks':>5} {'path':>6} {'parent user':>15} {'parent sys':>15} {'workers':>15} {'all CPU s':>15}"
              f" {'wall s':>15} {'peak MB':>15} {'same':>5}")
        fits = {m: [] for m in modes}
        for n in [int(x) for x in a.ranks.split(",")]:
            run = make_run(src, tmp / f"run{n}", n, a.mb)
            got = {m: [] for m in modes}
            for i in range(a.repeat):
                for m in modes:
                    prof = a.profile / f"{m}-{n}.prof" if a.profile and i == 0 else None
                    r = drive(run, m, prof)
                    if r:
                        got[m].append(r)
            ref = got["local"][0]["fingerprints"] if got["local"] else None
            for m in modes:
                rs = got[m]
                if not rs:
                    continue
                same = "" if m == "local" else str(all(r["fingerprints"] == ref for r in rs))
                print(f"{n:>5} {m:>6} {_mm([r['user'] for r in rs])} {_mm([r['sys'] for r in rs])} "
                      f"{_mm([r['workers'] for r in rs])} {_mm([r['all'] for r in rs])} {_mm([r['wall'] for r in rs])} "
                      f"{_mm([r['rss_mb'] for r in rs])} {same:>5}", flush=True)
                fits[m].append((n, min(r["all"] for r in rs)))
                rows.extend({"ranks": n, "mode": m, **{k: v for k, v in r.items() if k != "fingerprints"}} for r in rs)
            shutil.rmtree(run, ignore_errors=True)
        for m, pts in fits.items():
            if len(pts) >= 2:
                (x0, y0), (x1, y1) = pts[0], pts[-1]
                print(f"{m}: all CPU s grows {(y1 - y0) / (x1 - x0):.3f} per rank between {x0} and {x1} ranks (best figures)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
