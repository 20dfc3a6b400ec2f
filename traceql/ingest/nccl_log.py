"""NCCL_DEBUG=INFO logs and ProcessGroupNCCL messages. (stub: being written)"""

from __future__ import annotations

import re
from pathlib import Path

KIND = "nccl_log"
SUPPORTED = False

_NCCL = re.compile(rb"NCCL (INFO|WARN|TRACE|ABORT)|ProcessGroupNCCL|\[PG ID \d+|NCCL version \d")


def sniff(path: Path, head: bytes) -> bool:
    return bool(_NCCL.search(head))
