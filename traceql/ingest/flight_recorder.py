"""ProcessGroupNCCL Flight Recorder dumps (pickle or JSON form) -> collectives (one row per entry) and nccl_events.

A dump (torch/csrc/distributed/c10d/FlightRecorder, format version "2.x") is a dict: version, pg_config
{pg_name: {name, desc, ranks}}, pg_status {pg_id: {last_enqueued_collective, last_started_collective,
last_completed_collective}}, comm_lib_version / nccl_version, and entries, each with record_id, pg_id,
process_group (pg_name, pg_desc), collective_seq_id, p2p_seq_id, op_id, profiling_name ("nccl:all_reduce"),
time_created_ns, input_sizes, output_sizes, input_dtypes, state (scheduled, started, completed), timeout_ms,
is_p2p, retired, frames.

Pickles are untrusted input: they are read by an unpickler that resolves no class at all, since a dump holds only
dicts, lists, tuples, str, int, float, bool and None. Anything else is refused, and nothing in the file runs.
"""

from __future__ import annotations

import io
import math
import pickle
import re
import struct
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError
from traceql.ingest.collective_names import canonical_collective, dtype_bytes
from traceql.model import SCHEMAS, Source

KIND = "flight_recorder"
SUPPORTED = True
MAX_BYTES = 2 << 30  # a dump of the default 2000 entries is a few MB; refuse absurd sizes rather than exhaust memory

def sniff(path: Path, head: bytes) -> bool:
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return b"entries" in head and (b"pg_config" in head or b"version" in head)
    stripped = head.lstrip()
    return stripped[:1] == b"{" and b'"entries"' in head and (b'"pg_config"' in head or b'"nccl_version"' in head)


# Bounds for the pickle pre-scan (_prescan), checked on the opcodes before the unpickler builds anything. A torch dump
# of the default 2000 entries is ~5 MB, about 10^6 opcodes, nested 5 deep, with a few hundred thousand memo entries.
MAX_STR_BYTES = 64 << 20  # one string or bytes value
MAX_LONG_BYTES = 1024  # one LONG1/LONG4 integer (timestamps take 8 bytes)
MAX_DEPTH = 100  # nesting of containers (and of MARKs)
MAX_STACK = 1 << 20  # values pending on the unpickler's stack
MAX_ALLOC_BYTES = 2 << 30  # estimated memory of everything the pickle builds

_REFUSED_OPS = {
    b"c": "GLOBAL", b"\x93": "STACK_GLOBAL", b"R": "REDUCE", b"b": "BUILD", b"i": "INST", b"o": "OBJ",
    b"\x81": "NEWOBJ", b"\x92": "NEWOBJ_EX", b"\x82": "EXT1", b"\x83": "EXT2", b"\x84": "EXT4", b"P": "PERSID",
    b"Q": "BINPERSID", b"\x97": "NEXT_BUFFER", b"\x98": "READONLY_BUFFER",
}
_SCALAR_FIXED = {b"N": 0, b"\x88": 0, b"\x89": 0, b"J": 4, b"K": 1, b"M": 2, b"G": 8}  # op -> argument bytes
_SIZED = {  # op -> (length bytes, struct format): strings, bytes and long integers carry their length first
    b"X": (4, "<I"), b"\x8c": (1, "<B"), b"\x8d": (8, "<Q"), b"T": (4, "<i"), b"U": (1, "<B"), b"B": (4, "<I"),
    b"C": (1, "<B"), b"\x8e": (8, "<Q"), b"\x96": (8, "<Q"), b"\x8a": (1, "<B"), b"\x8b": (4, "<i"),
}
_LINE_SCALARS = {b"I", b"L", b"F", b"S", b"V"}  # protocol 0: the argument is a line
_EMPTY = {b"]", b"}", b")", b"\x8f"}
_FROM_MARK = {b"l", b"d", b"t", b"\x91"}  # LIST, DICT, TUPLE, FROZENSET: build one container from the marked items
_INTO_MARK = {b"e": 16, b"u": 24, b"\x90": 16}  # APPENDS, SETITEMS, ADDITEMS: add the marked items to the container


def _prescan(data: bytes, path: Path, max_alloc: int = MAX_ALLOC_BYTES) -> None:
    """Walk the pickle's opcodes without building anything, and refuse one that would allocate without bound.

    The C unpickler sizes its memo to the largest index it is given (a 33-byte pickle with LONG_BINPUT 2^28 takes
    2 GB), reads strings of the length they announce, and builds whatever nesting it is told. Here the memo must be
    dense (a PUT names at most the next free index; a GET names a defined one), every length must fit in the file and
    under MAX_STR_BYTES, nesting stays under MAX_DEPTH, and the estimated size of all that gets built stays under
    max_alloc. Each stack value is tracked as its nesting depth only."""
    def bad(what: str) -> IngestError:
        return IngestError(f"{path}: Flight Recorder pickle refused at byte {at}: {what}; a torch dump never does "
                           "this, so the file is damaged or hostile (re-take the dump, or use its JSON form)")

    def short(what: str) -> IngestError:
        return IngestError(f"{path}: Flight Recorder pickle is cut short at byte {at} ({what}); the dump was probably "
                           "cut short, take it again")

    n = len(data)
    pos = at = 0
    stack: list[int] = []
    marks: list[int] = []
    memo: list[int] = []
    alloc = 0

    def pop_mark() -> list[int]:
        if not marks:
            raise bad("items closed without a MARK")
        k = marks.pop()
        items = stack[k:]
        del stack[k:]
        return items

    def top() -> int:
        if len(stack) <= (marks[-1] if marks else 0):
            raise bad("stack underflow")
        return stack[-1]

    while pos < n:
        op = data[pos:pos + 1]
        at = pos
        pos += 1
        if op in _SCALAR_FIXED:
            pos += _SCALAR_FIXED[op]
            stack.append(0)
            alloc += 32
        elif op in _SIZED:
            width, fmt = _SIZED[op]
            if pos + width > n:
                raise short("end of file inside an opcode")
            (length,) = struct.unpack_from(fmt, data, pos)
            pos += width
            limit = MAX_LONG_BYTES if op in (b"\x8a", b"\x8b") else MAX_STR_BYTES
            if length < 0 or length > limit:
                raise bad(f"a value of {length} bytes (limit {limit})")
            if pos + length > n:
                raise short(f"a value of {length} bytes with {n - pos} left in the file")
            pos += length
            stack.append(0)
            alloc += 49 + length * (4 if op in (b"X", b"\x8c", b"\x8d") else 1)
        elif op in _LINE_SCALARS:
            end = data.find(b"\n", pos, pos + MAX_LONG_BYTES + 1 if op in (b"I", b"L", b"F") else pos + MAX_STR_BYTES)
            if end < 0:
                raise bad("an unterminated or oversized text value") if n - pos > MAX_LONG_BYTES else short("a text value")
            alloc += 49 + 4 * (end - pos)
            pos = end + 1
            stack.append(0)
        elif op in _EMPTY:
            stack.append(1)
            alloc += 64
        elif op == b"(":
            marks.append(len(stack))
            if len(marks) > MAX_DEPTH:
                raise bad(f"MARKs nested deeper than {MAX_DEPTH}")
        elif op == b"a":
            v = top()
            stack.pop()
            stack[-1] = max(top(), v + 1)
            alloc += 16
        elif op == b"s":
            v = top()
            stack.pop()
            k = top()
            stack.pop()
            stack[-1] = max(top(), k + 1, v + 1)
            alloc += 24
        elif op in _INTO_MARK:
            items = pop_mark()
            stack[-1] = max(top(), max(items, default=0) + 1)
            alloc += _INTO_MARK[op] * len(items)
        elif op in _FROM_MARK:
            items = pop_mark()
            stack.append(max(items, default=0) + 1)
            alloc += 64 + 16 * len(items)
        elif op in (b"\x85", b"\x86", b"\x87"):
            k = op[0] - 0x84
            if len(stack) - (marks[-1] if marks else 0) < k:
                raise bad("stack underflow")
            items = stack[-k:]
            del stack[-k:]
            stack.append(max(items) + 1)
            alloc += 64 + 8 * k
        elif op == b"0":
            if marks and len(stack) == marks[-1]:
                marks.pop()
            else:
                top()
                stack.pop()
        elif op == b"1":
            pop_mark()
        elif op == b"2":
            stack.append(top())
        elif op in (b"q", b"r", b"p", b"\x94"):
            if op == b"\x94":
                idx = len(memo)
            elif op == b"p":
                end = data.find(b"\n", pos, pos + 24)
                if end < 0 or not data[pos:end].isdigit():
                    raise bad("a malformed PUT")
                idx, pos = int(data[pos:end]), end + 1
            else:
                width = 1 if op == b"q" else 4
                if pos + width > n:
                    raise short("end of file inside an opcode")
                idx = data[pos] if width == 1 else struct.unpack_from("<I", data, pos)[0]
                pos += width
            if idx > len(memo):
                raise bad(f"memo index {idx} with only {len(memo)} entries defined (the unpickler would size its memo "
                          "to that index)")
            if idx == len(memo):
                memo.append(top())
                alloc += 16
            else:
                memo[idx] = top()
        elif op in (b"h", b"j", b"g"):
            if op == b"g":
                end = data.find(b"\n", pos, pos + 24)
                if end < 0 or not data[pos:end].isdigit():
                    raise bad("a malformed GET")
                idx, pos = int(data[pos:end]), end + 1
            else:
                width = 1 if op == b"h" else 4
                if pos + width > n:
                    raise short("end of file inside an opcode")
                idx = data[pos] if width == 1 else struct.unpack_from("<I", data, pos)[0]
                pos += width
            if idx >= len(memo):
                raise bad(f"memo index {idx} read before it was defined")
            stack.append(memo[idx])
        elif op == b"\x80":
            if pos >= n or data[pos] > 5:
                raise bad("an unknown pickle protocol")
            pos += 1
        elif op == b"\x95":  # FRAME: only a hint of how many bytes follow
            if pos + 8 > n:
                raise short("end of file inside an opcode")
            (length,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            if length > n - pos:
                raise short(f"a frame of {length} bytes with {n - pos} left in the file")
        elif op == b".":
            if len(stack) != 1 or marks:
                raise bad("STOP with an unfinished stack")
            return
        elif op in _REFUSED_OPS:
            what = _REFUSED_OPS[op]
            if op in (b"c", b"i"):  # GLOBAL/INST name the class on two lines: say which one was asked for
                parts = data[pos:pos + 512].split(b"\n")[:2]
                what += " " + ".".join(x.decode("ascii", "replace") for x in parts)
            raise bad(f"opcode {what} (loads a class or code; a dump holds only plain data)")
        else:
            raise bad(f"unknown opcode {op!r}")
        pos = max(pos, at + 1)
        if stack and stack[-1] > MAX_DEPTH:
            raise bad(f"values nested deeper than {MAX_DEPTH}")
        if len(stack) > MAX_STACK:
            raise bad(f"more than {MAX_STACK} values pending")
        if alloc > max_alloc:
            raise bad(f"it would build more than {max_alloc >> 20} MB of values")
    raise short("no STOP opcode")


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds only the pickle protocol's own containers and scalars; every class lookup is refused."""

    def __init__(self, f, path: Path):
        super().__init__(f)
        self._path = path

    def find_class(self, module, name):  # noqa: D401 - pickle API
        raise IngestError(
            f"{self._path}: Flight Recorder pickle tries to load class {module}.{name}; a dump holds only plain data, "
            "so it was refused unread (re-dump it with torch, or convert it to JSON with TORCH_FR_DUMP_JSON)"
        )

    def persistent_load(self, pid):
        raise IngestError(f"{self._path}: Flight Recorder pickle uses persistent ids; refused (not a torch FR dump)")


def load_dump(path: Path) -> dict:
    """The dump as plain Python data, from its pickle or JSON form."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise IngestError(f"{path}: {size} bytes is too large for a Flight Recorder dump; check the file")
        data = path.read_bytes()
    except OSError as e:
        raise IngestError(f"{path}: cannot read Flight Recorder dump ({e.strerror or e}); check permissions") from e
    if data[:1] == b"\x80":
        _prescan(data, path)  # bounds memo, lengths, nesting and total size before anything is built
        try:
            dump = _DataOnlyUnpickler(io.BytesIO(data), path).load()
        except IngestError:
            raise
        except Exception as e:
            raise IngestError(f"{path}: broken Flight Recorder pickle ({type(e).__name__}: {e}); the dump was probably "
                              "cut short, take it again") from e
    else:
        try:
            dump = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise IngestError(f"{path}: Flight Recorder JSON does not parse ({e}); the dump was probably cut short") from e
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise IngestError(f"{path}: not a Flight Recorder dump (no 'entries' list); expected torch's FR dump format")
    return dump


def _numel(sizes) -> int | None:
    if not isinstance(sizes, list | tuple):
        return None
    total = 0
    for s in sizes:
        if not isinstance(s, list | tuple):
            return None
        total += math.prod(int(x) for x in s)
    return total


def _op(profiling_name: str | None) -> tuple[str | None, str | None]:
    """'nccl:all_reduce' -> ('nccl', 'all_reduce'); 'nccl:_allgather_base' -> ('nccl', 'all_gather'): the op named as
    the Kineto importer names it (collective_names), so that the same call matches across the two sources."""
    if not profiling_name:
        return None, None
    backend, _, op = profiling_name.partition(":")
    if not op:
        backend, op = None, backend
    return backend, canonical_collective(op)


def _i(v) -> int | None:
    """An int from the dump (JSON dumps write some counters as strings)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    try:
        return int(str(v))
    except ValueError:
        return None


def _pg_cfg(pg_config: dict, pg_name: str, pg_desc: str) -> dict:
    """pg_config is keyed by pg name; gloo dumps key the default group by '' instead, so fall back on desc/one entry."""
    cfg = pg_config.get(pg_name)
    if isinstance(cfg, dict):
        return cfg
    for c in pg_config.values():
        if isinstance(c, dict) and pg_desc and c.get("desc") == pg_desc:
            return c
    if len(pg_config) == 1:
        c = next(iter(pg_config.values()))
        return c if isinstance(c, dict) else {}
    return {}


_RANK_IN_NAME = re.compile(r"(\d+)(?:\.\w+)?$")


def read(path: Path, source: Source) -> dict[str, pl.DataFrame]:
    dump = load_dump(path)
    rank = source.rank
    if rank is None:
        # torch names dumps <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE, default nccl_trace_rank_N)
        m = _RANK_IN_NAME.search(path.name)
        if m:
            rank = int(m.group(1))
            source.rank, source.rank_origin = rank, "file name"
    if rank is None and isinstance(dump.get("rank"), int):
        rank = source.rank = dump["rank"]
    if rank is None:
        raise IngestError(f"{path}: cannot tell which rank wrote this Flight Recorder dump; name it with its rank "
                          "(e.g. nccl_trace_rank_3) as torch does")
    pg_config = dump.get("pg_config") or {}
    version = str(dump.get("version", ""))
    lib_version = dump.get("comm_lib_version") or dump.get("nccl_version") or ""
    rows = []
    timeouts: set[int] = set()
    for i, e in enumerate(dump["entries"]):
        if not isinstance(e, dict):
            raise IngestError(f"{path}: entry {i} is a {type(e).__name__}, not a dict; not a torch FR dump")
        pg = e.get("process_group") or ("", "")
        pg_name, pg_desc = (str(pg[0]), str(pg[1])) if isinstance(pg, list | tuple) and len(pg) == 2 else (str(pg), "")
        cfg = _pg_cfg(pg_config, pg_name, pg_desc)
        ranks_s = cfg.get("ranks")
        try:
            group_size = len(orjson.loads(ranks_s)) if isinstance(ranks_s, str) else (len(ranks_s) if ranks_s else None)
        except orjson.JSONDecodeError:
            group_size = None
        backend, op = _op(e.get("profiling_name"))
        in_n, out_n = _numel(e.get("input_sizes")), _numel(e.get("output_sizes"))
        dtypes = e.get("input_dtypes") or []
        dtype = dtypes[0] if dtypes else None
        is_p2p = bool(e.get("is_p2p"))
        seq = _i(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"))
        t0 = _i(e.get("time_created_ns"))
        t_start = _i(e.get("time_discovered_started_ns")) or None
        t_end = _i(e.get("time_discovered_completed_ns")) or None
        rows.append({
            "rank": rank, "id": _i(e.get("record_id", i)), "op": op, "backend": backend, "pg_name": pg_name,
            "pg_desc": pg_desc or cfg.get("desc"), "pg_ranks": ranks_s if isinstance(ranks_s, str) else None,
            "group_size": group_size, "seq": seq, "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype,
            "bytes": in_n * size if in_n is not None and (size := dtype_bytes(dtype)) else None,
            "ts": t0, "end": t_end, "dur": (t_end - t0) if t_end and t0 else None,
            "kernel_ts": t_start, "state": e.get("state"),
        })
        if _i(e.get("timeout_ms")):
            timeouts.add(_i(e["timeout_ms"]))
    schema = SCHEMAS["collectives"]
    df = pl.DataFrame({c: [r.get(c) for r in rows] for c in schema}, schema=schema)
    # pg_status: where each process group stood when the dump was taken.
    ev = []
    for pg_id, st in (dump.get("pg_status") or {}).items():
        if not isinstance(st, dict):
            continue
        ev.append({
            "rank": rank, "kind": "fr_pg_status", "pg_name": str(pg_id), "level": "INFO",
            "seq": _i(st.get("last_enqueued_collective")),
            "text": f"Flight Recorder pg {pg_id}: last enqueued {st.get('last_enqueued_collective')}, "
                    f"started {st.get('last_started_collective')}, completed {st.get('last_completed_collective')}",
            "detail": orjson.dumps({**{k: _i(v) for k, v in st.items()}, "fr_version": version, "comm_lib_version": lib_version}).decode(),
        })
    for t in sorted(timeouts):  # the collective timeout the job ran with, for the error-handling rule
        ev.append({"rank": rank, "kind": "fr_timeout", "level": "INFO", "timeout_ms": t,
                   "text": f"Flight Recorder entries ran with Timeout(ms)={t}", "detail": "{}"})
    ev_schema = SCHEMAS["nccl_events"]
    events = pl.DataFrame({c: [r.get(c) for r in ev] for c in ev_schema}, schema=ev_schema)
    source.ranks = [rank]
    source.meta.update({"fr_version": version, "comm_lib_version": lib_version, "entries": len(rows)})
    return {"collectives": df, "nccl_events": events}
