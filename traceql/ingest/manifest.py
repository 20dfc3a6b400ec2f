"""manifest.json written by `traceql capture`: recognised so that discovery does not call it foreign."""

from __future__ import annotations

from pathlib import Path

KIND = "manifest"
SUPPORTED = False  # nothing to ingest: the manifest is read by benchmarks/accuracy.py and `rules test`
HINT = "traceql capture manifest: describes the run, holds no trace data"


def sniff(path: Path, head: bytes) -> bool:
    return path.name == "manifest.json" and b'"scenario"' in head
