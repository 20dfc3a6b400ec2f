"""Nsight Systems report files (.nsys-rep, .qdrep): binary, read only through `nsys export --type sqlite`."""

from __future__ import annotations

from pathlib import Path

KIND = "nsys_report"
SUPPORTED = False
HINT = "convert it with `nsys export --type sqlite -o FILE.sqlite FILE.nsys-rep` and check the .sqlite"


def sniff(path: Path, head: bytes) -> bool:
    return path.suffix in (".nsys-rep", ".qdrep", ".qdstrm")
