"""How a checking process loads polars. Two settings are read once, as polars loads, so they are chosen before it:

- its allocator (jemalloc) keeps freed pages for a minute. By default it hands them back to the kernel within seconds,
  and the next rule's columns fault them in again: on 16 ranks x 35 MB the rules took 0.36-0.46 M minor faults and
  1.0-1.6 s of system CPU in the parent, 0.13 s per rank; keeping them cut that to 0.10-0.12 M faults and 0.3-0.4 s
  (peak RSS +12-18%: pages freed by one table's query serve the next);
- its pool's threads, where the check asks for a number (traceql.cli.check sizes it from the run). Where it asks for
  one, the process keeps to the CPU it is on (pin_for_one_thread): polars hands every operation to its pool's
  thread and waits, and a wake-up on another CPU (an inter-processor interrupt: a VM exit on a cloud machine) cost
  more than most of a small run's operations themselves.

What this sets is taken out of the environment again, so that ingest workers, whose memory budgets count the growth
of a read and which choose their own threads (traceql.ingest.loader, budget), keep polars' defaults. A value the user
set wins, and nothing changes where polars was imported first (a notebook)."""

from __future__ import annotations

import os
import re
import sys

KEEP_FREED_PAGES = "dirty_decay_ms:60000"

# The oldest polars the bundled rules load on (pyproject.toml's floor says the same): 2.0.0's SQL has no
# regexp_replace (TQL401), 1.44's no window ORDER BY of mixed directions (rules/views/best_source.yaml).
MIN_POLARS = (2, 1)


class PolarsTooOld(RuntimeError):
    """The polars imported is older than MIN_POLARS."""


def require(version: str) -> None:
    """Raise PolarsTooOld where `version` (polars.__version__) is below MIN_POLARS; a version that does not read as
    MAJOR.MINOR (a local build) passes."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m and (int(m[1]), int(m[2])) < MIN_POLARS:
        need = ".".join(map(str, MIN_POLARS))
        raise PolarsTooOld(f"polars {version} is too old: traceql needs polars >= {need} "
                           f"(pip install -U 'polars>={need}')")


# The CPUs this process was allowed before pin_for_one_thread kept it to one (None: not pinned). Processes it starts
# that do work of their own (ingest workers, traceql.ingest.budget) get them back: CPUS_ENV in their environment.
UNPINNED: frozenset[int] | None = None
CPUS_ENV = "TRACEQL_CPUS"


def pin_for_one_thread() -> None:
    """Keep this thread, and the threads it starts from now on (polars' pool among them), to the CPU it runs on.

    With one pool thread the work is serial anyway: the calling thread hands each polars operation to the pool's
    thread and sleeps until it is done. On two CPUs every hand-off is a cross-CPU wake-up and a spin; on one it is a
    switch between two threads of the same core: samples/demo and the corpus traces 15-25% less CPU for the whole
    command on 2 vCPUs (a firecracker VM), less on 16 (benchmarks/README.md, eleventh round). Linux only; a
    process already kept to one CPU, or one whose CPU cannot be read, is left as it is; TRACEQL_PIN_CPU=0 leaves
    every process as it is (several checks at once on a busy machine, where one kept to a CPU cannot move off it)."""
    global UNPINNED
    if UNPINNED is not None or not hasattr(os, "sched_setaffinity") or os.environ.get("TRACEQL_PIN_CPU") == "0":
        return
    try:
        allowed = os.sched_getaffinity(0)
        with open("/proc/thread-self/stat", "rb") as f:
            cpu = int(f.read().rsplit(b")", 1)[1].split()[36])  # field 39, "processor": the CPU it last ran on
        if len(allowed) < 2 or cpu not in allowed:
            return
        os.sched_setaffinity(0, {cpu})
    except (OSError, ValueError, IndexError):
        return
    UNPINNED = frozenset(allowed)


def unpinned_env(env: dict) -> dict:
    """env for a process that does its own work, with the CPUs this one was allowed before it was pinned."""
    if UNPINNED is not None:
        env[CPUS_ENV] = ",".join(map(str, sorted(UNPINNED)))
    return env


def restore_cpus() -> None:
    """In a process started with unpinned_env: the CPUs its parent was allowed (the parent kept itself to one)."""
    cpus = os.environ.pop(CPUS_ENV, None)
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except (OSError, ValueError):
            pass


def load(threads: int | None = None) -> None:
    if "polars" in sys.modules:
        require(sys.modules["polars"].__version__)
        return
    if threads == 1 and os.environ.get("POLARS_MAX_THREADS", "1").strip() == "1":  # a pool the user sized: theirs
        pin_for_one_thread()  # before polars starts its pool, whose thread keeps the mask it is born with
    wanted = {"_RJEM_MALLOC_CONF": KEEP_FREED_PAGES}
    if threads is not None:
        wanted["POLARS_MAX_THREADS"] = str(threads)
    ours = [k for k in wanted if k not in os.environ]
    for k in ours:
        os.environ[k] = wanted[k]
    try:
        import polars

        require(polars.__version__)
        polars.Series([0])  # the allocator's first use, where it reads its configuration
        polars.thread_pool_size()  # the pool, sized now
    finally:
        for k in ours:
            os.environ.pop(k, None)
