"""Helpers shared by the report tests: one checked corpus run per session, a hostile copy of a real trace."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import CORPUS, SAMPLES

TRACE_FILTER = CORPUS / "hta" / "tests" / "data" / "trace_filter"
DEMO = SAMPLES / "demo"  # a real 2-rank capture (H200, gloo) committed with the repo: runs where the corpus is absent
HOSTILE = "<script>alert(1)</script>"

# The run dirs the report tests run on: the committed sample always, the corpus's trace_filter where present.
RUN_DIRS = [pytest.param(DEMO, id="demo"), pytest.param(TRACE_FILTER, id="corpus-trace_filter", marks=pytest.mark.corpus)]
# The real cpu-ddp-eager capture less rank 1's files (hand-made): gloo on CPU, so no kernels, and a finding about the
# run (the missing rank) rather than about a rank. The reports that must cope with any run (HTML, SARIF) take it too.
LOST_RANK = Path(__file__).resolve().parents[1] / "fixtures" / "lost-rank-cpu-ddp-eager"
ANY_RUN_DIRS = [*RUN_DIRS, pytest.param(LOST_RANK, id="lost-rank")]


def need(path: Path) -> Path:
    """The path, or a clean skip when it is absent (the corpus may not be beside the checkout)."""
    if not path.exists():
        pytest.skip(f"reference corpus not present at {path}")
    return path


@functools.lru_cache(maxsize=None)
def checked(path: str):
    """CheckResult of `traceql check path` (no cache), computed once per session."""
    from traceql import pipeline

    return pipeline.check(Path(path), use_cache=False)


def hostile_run(dst: Path, base: Path = TRACE_FILTER) -> Path:
    """A copy of a run dir's traces (trace_filter by default) whose first kernels on every rank are renamed to markup
    and a quote-breaking string."""
    dst.mkdir(parents=True, exist_ok=True)
    for src in sorted(base.glob("*.json.gz")):
        data = json.loads(gzip.decompress(src.read_bytes()))
        n = 0
        for ev in data["traceEvents"]:
            if ev.get("ph") == "X" and ev.get("cat") == "kernel" and n < 5:
                ev["name"] = HOSTILE if n % 2 == 0 else f'"><img src=x onerror=alert(2)>{n}'
                n += 1
        assert n, f"{src}: no kernel to rename"
        (dst / src.name.replace(".gz", "")).write_text(json.dumps(data))
    return dst


def copy_corpus_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
