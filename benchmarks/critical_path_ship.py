"""What each rank hands over for the critical path on the Dask path, before and after the walk was split per rank.

    python benchmarks/critical_path_ship.py [RUN_DIR ...] [--synthetic N --source fixtures/h200x2-straggler]

before: the rows the single cluster task gathered from every rank group to walk the whole run (the group's kept
  path_kernels and host_cover, one row per kernel and per host segment);
after: what the rank group's part of the walk hands the driver (link.critical_path._Part: its meta, a row per step and
  per collective kernel, and the segments the walks asked of it, a tuple of a few integers each).
Bytes are len(pickle.dumps(x, protocol=5)) of those objects (what Dask sends for them, within its framing), per rank
rank (a group of several ranks, one nsys file holding them, counts its bytes over its ranks); printed as mean and max
over the ranks; runs without kernels are left out. The Dask path runs on an in-process
LocalCluster; --synthetic makes N ranks from a real two-rank capture (benchmarks/scale.py's make_run).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _bytes(x) -> int:
    return len(pickle.dumps(x, protocol=5))  # frames rechunked first: a cached read and a fresh one differ in chunks


def measure(run_dir: Path, client) -> dict:
    import polars as pl

    from traceql import link, pipeline
    from traceql.link import critical_path as cp

    local = pipeline.load_run(run_dir, use_cache=False)
    pk, cov = link.ensure(local, "path_kernels"), link.ensure(local, "host_cover")
    before = [_bytes(pk.filter(pl.col("rank") == r).rechunk()) + _bytes(cov.filter(pl.col("rank") == r).rechunk())
              for r in sorted(set(pk["rank"].to_list()))]
    got: dict = {}
    real = cp.stitch

    def stitch(metas, fetch, cache=None):
        got["metas"], got["segs"] = metas, [dict(cache or {})]

        def fetched(need):
            out = fetch(need)
            got["segs"].append({(i, e): v for i, segs in out.items() for e, v in segs.items()})
            return out
        return real(metas, fetched, cache)
    cp.stitch = stitch
    try:
        res = pipeline.check(run_dir, use_cache=False, scheduler=client)
    finally:
        cp.stitch = real
    after = []
    for i, meta in enumerate(got.get("metas", [])):
        segs = {e: v for d in got["segs"] for (p, e), v in d.items() if p == i}
        after += [(_bytes(meta) + _bytes(segs)) / max(1, len(meta[2]))] * max(1, len(meta[2]))
    cp_rows = link.ensure(res.run, "critical_path").height
    return {"run": run_dir.name, "ranks": len(before), "steps": cp_rows, "before": before, "after": after,
            "kernel_rows": pk.height, "host_rows": cov.height, "collectives": local.table("collectives").height}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--source", type=Path, default=REPO / "fixtures" / "h200x2-straggler")
    a = ap.parse_args()
    import distributed

    runs = list(a.runs)
    tmp = tempfile.TemporaryDirectory()
    if a.synthetic:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from scale import make_run

        runs.append(make_run(a.source, Path(tmp.name) / f"synthetic-{a.synthetic}", a.synthetic))
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as c, \
            distributed.Client(c) as client:
        print(f"{'run':<34} {'ranks':>5} {'before B/rank mean':>19} {'max':>9} {'after B/rank mean':>18} {'max':>8}")
        for r in runs:
            m = measure(r, client)
            if not m["before"]:
                continue
            b, f = m["before"], m["after"]
            print(f"{m['run']:<34} {m['ranks']:>5} {sum(b) / len(b):>19,.0f} {max(b):>9,} {sum(f) / len(f):>18,.0f} "
                  f"{max(f):>8,.0f}   ({m['kernel_rows']:,} kernel + {m['host_rows']:,} host rows, "
                  f"{m['collectives']:,} collectives, {m['steps']} steps)")
    tmp.cleanup()


if __name__ == "__main__":
    main()
