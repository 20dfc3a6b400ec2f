"""Collective and dtype names as profilers spell them -> the names and sizes traceql's tables use, and the
reading of the few args values collective calls carry.

One table for every importer that names collectives (Kineto's record_param_comms and nccl:/gloo: annotations,
Flight Recorder's profiling names), so that the same call is the same op whichever file it comes from.
"""

from __future__ import annotations

import functools
import re

_I64 = 1 << 63

# Kineto's annotation of a collective call: "nccl:all_reduce", "gloo:broadcast".
ANNOTATION = re.compile(r"^(nccl|gloo|mpi|ucc|hccl|xccl|rccl|mtia|custom):(\w+)$", re.IGNORECASE)

# Record_param_comms entries that are not collective calls.
NOT_COLLECTIVE = {"wait", "init", "split", ""}

COLL_NAMES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
    "sendrecv": "send_recv",
}

# Element sizes by dtype name, lowercased: Kineto writes "float", "c10::BFloat16" is "bfloat16", Flight Recorder
# writes c10 ScalarType names ("Float", "BFloat16", "UInt32").
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1, "byte": 1,
    "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complexfloat": 8, "complexdouble": 16, "uint16": 2, "uint32": 4, "uint64": 8,
}


def dtype_bytes(name) -> int | None:
    """Bytes per element of a dtype name, any case, with or without c10's namespace (Input type args say
    "c10::BFloat16"); None where unknown."""
    if name is None:
        return None
    s = str(name).lower()
    return DTYPE_BYTES.get(s[5:] if s.startswith("c10::") else s)


@functools.lru_cache(maxsize=4096)
def canonical_collective(name: str | None) -> str | None:
    """allreduce -> all_reduce, _allgather_base -> all_gather, reduce_scatter_tensor_coalesced -> reduce_scatter,
    _broadcast_oop -> broadcast (out of place)."""
    if not name:
        return None
    s = name.strip().lower()
    if ":" in s:  # nccl:all_reduce, gloo:broadcast
        s = s.split(":", 1)[1]
    s = s.lstrip("_")
    changed = True
    while changed:
        changed = False
        for suf in ("_coalesced", "_base", "_into_tensor", "_tensor", "_single", "_multigpu", "_oop"):
            if s.endswith(suf):
                s = s[: -len(suf)]
                changed = True
    return COLL_NAMES.get(s, COLL_NAMES.get(s.replace("_", ""), s))


def arg_int(v) -> int | None:
    """One args value as int64 (collective sizes, sequence numbers, ids): ints in range, integral floats, numeric
    strings (any base prefix); None otherwise."""
    if type(v) is int:
        return v if -_I64 <= v < _I64 else None
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9e18 else None
    try:
        return int(str(v), 0)
    except ValueError:
        return None
