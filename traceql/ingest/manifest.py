"""manifest.json written by `traceql capture`: recognised so that discovery does not call it foreign."""

from __future__ import annotations

from traceql.ingest.sniff import manifest as sniff  # noqa: F401  (discovery's test, kept in one place)

KIND = "manifest"
SUPPORTED = False  # nothing to ingest: the manifest is read by benchmarks/accuracy.py and `rules test`
HINT = "traceql capture manifest: describes the run, holds no trace data"

