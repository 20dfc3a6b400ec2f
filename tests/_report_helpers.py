"""Helpers shared by the report tests: one checked corpus run per session, a hostile copy of a real trace."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
from pathlib import Path

from conftest import CORPUS

TRACE_FILTER = CORPUS / "hta" / "tests" / "data" / "trace_filter"
HOSTILE = "<script>alert(1)</script>"


@functools.lru_cache(maxsize=None)
def checked(path: str):
    """CheckResult of `traceql check path` (no cache), computed once per session."""
    from traceql import pipeline

    return pipeline.check(Path(path), use_cache=False)


def hostile_run(dst: Path) -> Path:
    """A copy of trace_filter whose first kernels on every rank are renamed to markup and a quote-breaking string."""
    dst.mkdir(parents=True, exist_ok=True)
    for src in sorted(TRACE_FILTER.glob("*.json.gz")):
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
