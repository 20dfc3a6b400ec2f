"""Kineto / Chrome trace JSON (torch.profiler export_chrome_trace), plain or gzip. (stub: being written)"""

from __future__ import annotations

from pathlib import Path

KIND = "kineto"
SUPPORTED = False


def sniff(path: Path, head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] not in (b"{", b"["):
        return False
    return any(k in head for k in (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"ph"'))
