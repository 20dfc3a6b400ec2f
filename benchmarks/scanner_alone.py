"""The compiled Kineto scanner alone over one plain trace: every slice fed as kineto._scan_mapped cuts them, the columns
taken about every million rows and dropped (no table building). Prints the events and the CPU of the scan.

    python benchmarks/scanner_alone.py TRACE.json [--so-dir DIR]

--so-dir: a folder holding another build of _kscan (to compare two builds, run each in turn, interleaved)."""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import resource
import time

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--so-dir")
a = ap.parse_args()
gc.disable()
if a.so_dir:
    import traceql.ingest as ti

    ti.__path__.insert(0, a.so_dir)
from traceql.ingest import _kscan, kineto  # noqa: E402

with open(a.trace, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
m = kineto._ARR_HEAD.search(mm, 0, min(size, 4 * kineto._BLOCK))
sep, _ = kineto._layout(m.group(1), mm[m.end(): m.end() + (1 << 20)])
comma, pos, chunk = sep.index(b","), m.start(1), kineto._slice_bytes()
sc = _kscan.Scanner(kineto._classify, kineto._SCAN_BUCKETS)
n = 0
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
while size - pos > chunk:
    cut = mm.rfind(sep, pos, pos + chunk)
    got = sc.feed(mm, cut + comma, pos, True, n)
    if got is None:
        raise SystemExit(f"the scanner declined the slice at byte {pos}")
    n += got
    pos = cut + comma + 1
    if sc.pending >= 1 << 20:
        sc.take()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"events {n} user {r1.ru_utime - r0.ru_utime:.2f} sys {r1.ru_stime - r0.ru_stime:.2f} "
      f"wall {time.perf_counter() - t0:.2f} minflt {r1.ru_minflt - r0.ru_minflt}")
