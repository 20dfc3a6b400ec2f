"""ProcessGroupNCCL Flight Recorder dumps, pickle or JSON form. (stub: being written)"""

from __future__ import annotations

from pathlib import Path

KIND = "flight_recorder"
SUPPORTED = False


def sniff(path: Path, head: bytes) -> bool:
    if head[:1] == b"\x80" and b"entries" in head[:4096]:
        return True
    stripped = head.lstrip()
    return stripped[:1] == b"{" and b'"entries"' in head and (b'"pg_config"' in head or b'"nccl_version"' in head)
