"""Nsight Systems report files (.nsys-rep, .qdrep): binary, read only through `nsys export --type sqlite`."""

from __future__ import annotations

from traceql.ingest.sniff import nsys_report as sniff  # noqa: F401  (discovery's test, kept in one place)

KIND = "nsys_report"
SUPPORTED = False
HINT = "convert it with `nsys export --type sqlite -o FILE.sqlite FILE.nsys-rep` and check the .sqlite"


