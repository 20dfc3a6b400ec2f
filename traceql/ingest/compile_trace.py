"""TORCH_TRACE structured logs (dedicated_log_torch_trace_rank_N_*.log, plain or gzip). (stub: being written)"""

from __future__ import annotations

import re
from pathlib import Path

KIND = "torch_trace"
SUPPORTED = False

# glog prefix then a JSON object: `V1129 09:20:23.443000 14423 torch/_dynamo/...py:123] {"dynamo_start": ...`
_LINE = re.compile(rb"^[VIWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] \{")


def sniff(path: Path, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    return bool(_LINE.match(first))
