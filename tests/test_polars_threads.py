"""A small run is checked on one polars thread, a big one on at most MAX_THREADS (traceql.cli.check): the choice is
made before polars is imported, from the run's bytes, never over the user's own POLARS_MAX_THREADS, and leaves nothing
in the environment for the workers the check starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from traceql.cli.check import MAX_THREADS, ONE_THREAD_MAX_BYTES, _bytes_within, _polars_threads

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "samples" / "demo"


def test_bytes_within_counts_files_and_stops_at_the_cap(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"x" * 1000)
    assert _bytes_within(tmp_path, 2000)
    assert not _bytes_within(tmp_path, 1999)
    assert _bytes_within(tmp_path / "a", 1000) and not _bytes_within(tmp_path / "a", 999)
    for i in range(5):
        (tmp_path / f"e{i}").write_bytes(b"")
    assert not _bytes_within(tmp_path, 10**9, max_entries=4)  # too many entries to size cheaply: not small


def test_bytes_within_does_not_follow_symlinks(tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(10_000)
    run = tmp_path / "run"
    run.mkdir()
    (run / "link").symlink_to(big)
    assert _bytes_within(run, 0)


def _threads(run: Path, **env) -> int:
    code = ("import os, sys; from pathlib import Path; from traceql.cli.check import _size_polars_pool; "
            "_size_polars_pool(Path(sys.argv[1])); import polars; "
            "assert os.environ.get('POLARS_MAX_THREADS') == os.environ.get('USER_SET'), 'left in the environment'; "
            "print(polars.thread_pool_size())")
    e = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"} | env
    out = subprocess.run([sys.executable, "-c", code, str(run)], env=e, capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_one_thread_for_a_small_run_and_the_default_for_a_big_one(tmp_path):
    e = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    default = int(subprocess.run([sys.executable, "-c", "import polars; print(polars.thread_pool_size())"], env=e,
                                 capture_output=True, text=True, check=True).stdout)
    assert _threads(DEMO) == 1
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "rank0.pt.trace.json", "wb") as f:
        f.truncate(ONE_THREAD_MAX_BYTES + 1)  # sparse: no disk used
    assert _threads(big) == default
    assert _threads(DEMO, POLARS_MAX_THREADS="2", USER_SET="2") == 2  # the user's own setting wins


def test_threads_by_size_and_cores(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "rank0.pt.trace.json", "wb") as f:
        f.truncate(ONE_THREAD_MAX_BYTES + 1)
    assert _polars_threads(DEMO, 64) == 1
    assert _polars_threads(big, 64) == MAX_THREADS
    assert _polars_threads(big, MAX_THREADS) is None  # polars' default is no more than the cap
    assert _polars_threads("s3://bucket/run/", 64) is None  # a URL is not sized here
