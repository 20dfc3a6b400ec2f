"""How a checking process loads polars. Two settings are read once, as polars loads, so they are chosen before it:

- its allocator (jemalloc) keeps freed pages for a minute. By default it hands them back to the kernel within seconds,
  and the next rule's columns fault them in again: on 16 ranks x 35 MB the rules took 0.36-0.46 M minor faults and
  1.0-1.6 s of system CPU in the parent, 0.13 s per rank; keeping them cut that to 0.10-0.12 M faults and 0.3-0.4 s
  (peak RSS +12-18%: pages freed by one table's query serve the next);
- its pool's threads, where the check asks for a number (traceql.cli.check sizes it from the run).

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


def load(threads: int | None = None) -> None:
    if "polars" in sys.modules:
        require(sys.modules["polars"].__version__)
        return
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
