"""Content tests for every format, kept apart from the readers: discovery sniffs each file of a run dir, and importing
all nine readers to do so (their regexes, pyarrow, sqlite3) cost more than reading a small run. A reader module is
imported only when a source of its kind is read; each reader's `sniff` is the function here.

Only the standard library and nothing heavy: this module runs on every command that looks at a run dir.
"""

from __future__ import annotations

import re
from pathlib import Path

BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

# NCCL core lines, c10d ProcessGroupNCCL lines and the desync report's wording (the NCCL log reader's inputs).
_NCCL = re.compile(rb"NCCL (INFO|WARN|TRACE|ABORT)|ProcessGroupNCCL|\[PG ID \d+|NCCL version \d"
                   rb"|ranks that caused (?:this timeout|the desync)|joined but didn't finish collective #")
# glog prefix then a JSON object: `V1129 09:20:23.443000 14423 torch/_dynamo/...py:123] {"dynamo_start": ...`
TORCH_TRACE_LINE = re.compile(rb"^[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] \{")
# A glog line from torch, with a compile id bracket or one of the artifacts we read; a launcher prefix may lead.
_TORCH_LOGS_MARK = re.compile(
    rb"(?m)^(?:\[rank\d++\]:)?(?:[VIWE]\d{4} \d\d:\d\d:\d\d\.\d++ ++\d++ torch/[^\]\n]++\] "
    rb"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d++\] (?:\[[!\d/]++\] )?torch\._dynamo\.[\w\.]++: \[[A-Z]++\] )"
    rb"(?:\[[!\d/]+\] )?(?:\[__recompiles|\[__graph_breaks|Recompiling function|Graph break|torch\._dynamo hit config"
    rb"|WON'T CONVERT)"
)


def manifest(path: Path, head: bytes) -> bool:
    return path.name == "manifest.json" and b'"scenario"' in head


def nsys(path: Path, head: bytes) -> bool:
    return head.startswith(b"SQLite format 3\x00")


def nsys_report(path: Path, head: bytes) -> bool:
    return path.suffix in (".nsys-rep", ".qdrep", ".qdstrm")


def flight_recorder(path: Path, head: bytes) -> bool:
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return b"entries" in head and (b"pg_config" in head or b"version" in head)
    stripped = head.lstrip()
    return stripped[:1] == b"{" and b'"entries"' in head and (b'"pg_config"' in head or b'"nccl_version"' in head)


def kineto(path: Path, head: bytes) -> bool:
    if head[:2] in UTF16_BOMS:  # a trace saved as UTF-16 (Windows editors): read as UTF-8 after conversion
        head = head[: len(head) & ~1].decode("utf-16", "ignore").encode("utf-8", "ignore")
    text = head.removeprefix(BOM).lstrip(b" \t\r\n")
    if text[:1] not in (b"{", b"["):
        return False
    return any(k in head for k in (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"ph"'))


def torch_trace(path: Path, head: bytes) -> bool:
    for line in head.split(b"\n", 4)[:4]:
        if line.startswith(b"[rank"):
            line = line.split(b"]:", 1)[-1]
        if TORCH_TRACE_LINE.match(line):
            return b'"frame_id"' in head or b'"str"' in head or b'"artifact"' in head or b'"dynamo_start"' in head
    return False


def compile_debug(path: Path, head: bytes) -> bool:
    return path.is_dir() and path.name.startswith("run_") and "-pid_" in path.name


def nccl_log(path: Path, head: bytes) -> bool:
    return bool(_NCCL.search(head))


def torch_logs(path: Path, head: bytes) -> bool:
    return bool(_TORCH_LOGS_MARK.search(head))


# kind -> (content test, whether it takes folders), in sniffing order: the most specific formats first. The order and
# the kinds are those of traceql.ingest._MODULES (tests/test_sniff.py holds them together).
SNIFFERS = {
    "manifest": (manifest, False),
    "nsys": (nsys, False),
    "nsys_report": (nsys_report, False),
    "flight_recorder": (flight_recorder, False),
    "kineto": (kineto, False),
    "torch_trace": (torch_trace, False),
    "compile_debug": (compile_debug, True),
    "nccl_log": (nccl_log, False),
    "torch_logs": (torch_logs, False),
}
