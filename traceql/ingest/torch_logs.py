"""TORCH_LOGS text (recompiles, graph_breaks, dynamo) in a process's stdout/stderr. (stub: being written)"""

from __future__ import annotations

import re
from pathlib import Path

KIND = "torch_logs"
SUPPORTED = False

_MARK = re.compile(rb"\[__recompiles\]|\[__graph_breaks\]|torch/_dynamo/|Recompiling function|Graph break")


def sniff(path: Path, head: bytes) -> bool:
    return bool(_MARK.search(head))
