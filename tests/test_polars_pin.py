"""A check on one polars thread keeps itself, and polars' pool thread, to one CPU; its ingest workers (and their
zygote) get back every CPU it had (traceql.polars_env.pin_for_one_thread, traceql.ingest.budget)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")

PROBE = r"""
import json, os, sys
from pathlib import Path
from traceql import polars_env
before = sorted(os.sched_getaffinity(0))
polars_env.load(threads=int(sys.argv[1]) if sys.argv[1] != "none" else None)
import polars as pl
pl.DataFrame({"a": list(range(1000))}).group_by("a").len()  # the pool at work

def cpus(pid, tid=None):
    where = f"/proc/{pid}/task/{tid}/status" if tid else f"/proc/{pid}/status"
    for line in open(where):
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()

threads = {t: cpus(os.getpid(), t) for t in os.listdir(f"/proc/{os.getpid()}/task")}
workers = []
if len(sys.argv) > 2:
    from traceql.discover import discover
    from traceql.ingest import budget
    pool = budget.Pool()
    try:
        tasks = [(s, False, budget.Budget(120.0, None)) for s in discover(Path(sys.argv[2]))][:2]
        got = list(pool.run(tasks, 2))
        assert len(got) == len(tasks)
        pids = [w.proc.pid for w in pool.idle] + ([pool.zygote.proc.pid] if pool.zygote else [])
        workers = [cpus(p) for p in pids]
    finally:
        pool.close()
print(json.dumps({"before": before, "threads": threads, "workers": workers,
                  "env": os.environ.get(polars_env.CPUS_ENV)}))
"""


_OURS = ("POLARS_MAX_THREADS", "TRACEQL_CPUS", "TRACEQL_PIN_CPU")  # what the probes set themselves


def _probe(*args: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OURS} | extra
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _parse(listed: str) -> set[int]:
    out: set[int] = set()
    for part in listed.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_one_thread_keeps_every_thread_on_one_cpu_and_workers_on_all():
    got = _probe("1", str(REPO / "fixtures" / "h200x2-desync"))
    before = set(got["before"])
    per_thread = {t: _parse(c) for t, c in got["threads"].items()}
    assert len(per_thread) >= 2, "polars' pool thread is missing"
    if len(before) < 2:  # a process allowed one CPU has nothing to choose: left as it was
        assert all(c == before for c in per_thread.values())
    else:
        (one,) = {frozenset(c) for c in per_thread.values()}  # every thread, polars' pool too, on the same CPU
        assert len(one) == 1 and one <= before
    assert got["workers"], "no ingest worker ran"
    assert all(_parse(w) == before for w in got["workers"]), got["workers"]
    assert got["env"] is None  # the parent's own environment is not changed: only its workers' get the CPUs


def test_a_pool_of_polars_default_size_is_not_pinned():
    got = _probe("none")
    before = set(got["before"])
    assert all(_parse(c) == before for c in got["threads"].values())


def test_a_pool_the_user_sized_is_not_pinned():
    """POLARS_MAX_THREADS set by the user wins over the check's one thread: its threads keep every CPU."""
    got = _probe("1", POLARS_MAX_THREADS="2")
    before = set(got["before"])
    assert len(got["threads"]) >= 3  # the main thread and the user's two
    assert all(_parse(c) == before for c in got["threads"].values())


def test_pin_cpu_0_leaves_the_process_as_it_is():
    got = _probe("1", TRACEQL_PIN_CPU="0")
    before = set(got["before"])
    assert all(_parse(c) == before for c in got["threads"].values())


CLI_PROBE = r"""
import os, sys
real = os._exit
def report(code):  # the command ends with os._exit: say its threads' CPUs there
    print("CPUS", sorted(os.sched_getaffinity(0)), file=sys.stderr, flush=True)
    real(code)
os._exit = report
sys.argv = ["traceql", "check", sys.argv[1], "-q", "--no-cache", "--fail-on", "never"]
from traceql.__main__ import run
report(run() or 0)
"""


def test_the_check_command_of_a_small_run_is_pinned():
    """The command itself, not only the function: polars must not be imported before the check sizes its pool (an
    import moved earlier would silently give back the hand-offs across CPUs)."""
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
    r = subprocess.run([sys.executable, "-c", CLI_PROBE, str(REPO / "samples" / "demo")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    line = [x for x in r.stderr.splitlines() if x.startswith("CPUS")][-1]
    cpus = set(json.loads(line.split(" ", 1)[1]))
    allowed = os.sched_getaffinity(0)
    assert cpus <= allowed and len(cpus) == (1 if len(allowed) > 1 else len(allowed))
