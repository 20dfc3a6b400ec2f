"""Ingest speed of Nsight Systems SQLite exports.

Builds a big export by replicating the rows of a corpus export into a temporary copy (INSERT ... SELECT with
times and correlation ids shifted, doubling each round), then times traceql.ingest.nsys.read on it.

    python benchmarks/nsys.py [--size-mb 1024] [--base mfu_2gpu_before.sqlite] [--keep PATH]

Prints the file size, row counts and seconds. Numbers are recorded in benchmarks/README.md ("nsys").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CORPUS = Path(os.environ.get("TRACEQL_CORPUS", REPO.parent / "shared" / "corpus"))

# Tables that grow with the run; everything else (strings, enums, metadata) stays as it is.
GROWING = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
           "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")


def build(base: Path, out: Path, size_mb: int) -> None:
    shutil.copyfile(base, out)
    con = sqlite3.connect(out)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    tables = [t for t in GROWING if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone()]
    lo, hi = con.execute("SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    span = hi - lo + 1
    corr = (con.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] or 0) + 1
    while out.stat().st_size < size_mb * 1024 * 1024:
        for t in tables:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f'"{c}" + {span}')
                elif c == "correlationId":
                    sel.append(f"correlationId + {corr}")
                else:
                    sel.append(f'"{c}"')
            con.execute(f'INSERT INTO "{t}" SELECT {", ".join(sel)} FROM "{t}"')
        con.commit()
        span *= 2
        corr *= 2
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--base", default="mfu_2gpu_before.sqlite")
    ap.add_argument("--keep", help="build (or reuse) the big export at this path")
    args = ap.parse_args()
    base = CORPUS / "nsys" / args.base
    if not base.is_file():
        sys.exit(f"corpus export not found: {base}")
    from traceql.ingest import nsys
    from traceql.model import Source

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp()) / "big.sqlite"
    if not tmp.exists():
        t0 = time.perf_counter()
        build(base, tmp, args.size_mb)
        print(f"built {tmp} in {time.perf_counter() - t0:.1f} s")
    con = sqlite3.connect(f"file:{tmp}?mode=ro", uri=True)
    counts = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in GROWING}
    con.close()
    print(f"size {tmp.stat().st_size / 2**20:.0f} MiB; rows: " + ", ".join(f"{t.split('_')[-1].lower()} {n:,}"
                                                                           for t, n in counts.items()))
    src = Source(tmp, "nsys")
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    tables = nsys.read(tmp, src)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU seconds (all threads) is the figure to compare on a shared box; wall time depends on the load.
    print(f"nsys.read: {dt:.1f} s wall, {cpu:.1f} s CPU, {os.cpu_count()} cpus, load {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; " + ", ".join(f"{k} {v.height:,}" for k, v in tables.items()))
    if not args.keep:
        shutil.rmtree(tmp.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
