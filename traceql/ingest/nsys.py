"""Nsight Systems SQLite exports (`nsys export --type sqlite`). (stub: being written)"""

from __future__ import annotations

from pathlib import Path

KIND = "nsys"
SUPPORTED = False


def sniff(path: Path, head: bytes) -> bool:
    return head.startswith(b"SQLite format 3\x00")
