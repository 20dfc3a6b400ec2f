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
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError
from traceql.ingest.collective_names import canonical_collective, dtype_bytes
from traceql.ingest.sniff import flight_recorder as sniff  # noqa: F401  (discovery's test, kept in one place)
from traceql.model import SCHEMAS, Source

KIND = "flight_recorder"
SUPPORTED = True
MAX_BYTES = 2 << 30  # a dump of the default 2000 entries is a few MB; refuse absurd sizes rather than exhaust memory


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

# Opcode classes for the pre-scan, one table lookup per opcode (the loop runs once per opcode of a multi-MB dump).
(_UNKNOWN, _GET1, _GET4, _PUT1, _PUT4, _MEMOIZE, _MARK, _INTO_MARK, _FIXED, _SHORT, _SIZED4, _SIZED8, _EMPTY, _APPEND,
 _SETITEM, _FROM_MARK, _TUPLEN, _POP, _POP_MARK, _DUP, _PROTO, _FRAME, _STOP, _LINE, _GETL, _PUTL, _REFUSED) = range(27)
_KIND = [_UNKNOWN] * 256
_ARG = [0] * 256  # argument bytes of _FIXED opcodes; items cost of _INTO_MARK; arity of _TUPLEN
for _ops, _k in ((b"h", _GET1), (b"j", _GET4), (b"q", _PUT1), (b"r", _PUT4), (b"\x94", _MEMOIZE), (b"(", _MARK),
                 (b"e\x90u", _INTO_MARK), (b"N\x88\x89JKMG", _FIXED), (b"\x8cUC\x8a", _SHORT), (b"XTB\x8b", _SIZED4),
                 (b"\x8d\x8e\x96", _SIZED8), (b"])}\x8f", _EMPTY), (b"a", _APPEND), (b"s", _SETITEM),
                 (b"ldt\x91", _FROM_MARK), (b"\x85\x86\x87", _TUPLEN), (b"0", _POP), (b"1", _POP_MARK), (b"2", _DUP),
                 (b"\x80", _PROTO), (b"\x95", _FRAME), (b".", _STOP), (b"ILFSV", _LINE), (b"g", _GETL),
                 (b"p", _PUTL), (b"".join(_REFUSED_OPS), _REFUSED)):
    for _o in _ops:
        _KIND[_o] = _k
for _o, _w in zip(b"N\x88\x89JKMG", (0, 0, 0, 4, 1, 2, 8)):
    _ARG[_o] = _w
for _o, _w in zip(b"e\x90u", (16, 16, 24)):
    _ARG[_o] = _w
for _o, _w in zip(b"\x85\x86\x87", (1, 2, 3)):
    _ARG[_o] = _w
_UNICODE = set(b"X\x8c\x8dV")  # str values: up to 4 bytes a character once decoded
_LONGS = set(b"\x8a\x8bIL")


def _prescan(data: bytes, path: Path, max_alloc: int = MAX_ALLOC_BYTES) -> None:
    """Walk the pickle's opcodes without building anything, and refuse one that would allocate without bound.

    The C unpickler sizes its memo to the largest index it is given (a 33-byte pickle with LONG_BINPUT 2^28 takes
    2 GB), reads strings of the length they announce, and builds whatever nesting it is told. Here the memo must be
    dense (a PUT names at most the next free index; a GET names a defined one), every length must fit in the file and
    under MAX_STR_BYTES (MAX_LONG_BYTES for integers), nesting stays under MAX_DEPTH, and the estimated size of all that
    gets built (a fixed cost per value and per container slot, plus string lengths) stays under max_alloc. Each stack
    value is tracked as its nesting depth only. It costs about 10x the C unpickler's time (a 2000-entry dump of 3.7 MB
    is 614k opcodes)."""
    n = len(data)
    pos = at = 0
    stack: list[int] = []
    marks: list[int] = []
    memo: list[int] = []
    alloc = 0
    kind, arg = _KIND, _ARG

    def bad(what: str) -> IngestError:
        return IngestError(f"{path}: Flight Recorder pickle refused at byte {at}: {what}; a torch dump never does "
                           "this, so the file is damaged or hostile (re-take the dump, or use its JSON form)")

    def short(what: str) -> IngestError:
        return IngestError(f"{path}: Flight Recorder pickle is cut short at byte {at} ({what}); the dump was probably "
                           "cut short, take it again")

    try:
        while pos < n:
            at = pos
            op = data[pos]
            pos += 1
            k = kind[op]
            if k == _GET1 or k == _GET4:
                if k == _GET1:
                    idx = data[pos]
                    pos += 1
                else:
                    idx = int.from_bytes(data[pos:pos + 4], "little")
                    pos += 4
                if idx >= len(memo) or pos > n:
                    raise short("end of file inside an opcode") if pos > n else bad(
                        f"memo index {idx} read before it was defined")
                stack.append(memo[idx])
            elif k == _MARK:
                marks.append(len(stack))
                if len(marks) > MAX_DEPTH:
                    raise bad(f"MARKs nested deeper than {MAX_DEPTH}")
            elif k == _INTO_MARK:
                m = marks.pop()
                items = stack[m:]
                del stack[m:]
                if items:
                    d = max(items) + 1
                    if d > stack[-1]:
                        if d > MAX_DEPTH:
                            raise bad(f"values nested deeper than {MAX_DEPTH}")
                        stack[-1] = d
                    alloc += arg[op] * len(items)
                    if alloc > max_alloc:
                        raise bad(f"it would build more than {max_alloc >> 20} MB of values")
                elif not stack:
                    raise IndexError
            elif k == _FIXED:
                pos += arg[op]
                stack.append(0)
                alloc += 32
            elif k == _PUT1 or k == _PUT4 or k == _MEMOIZE or k == _PUTL:
                if k == _PUT1:
                    idx = data[pos]
                    pos += 1
                elif k == _PUT4:
                    idx = int.from_bytes(data[pos:pos + 4], "little")
                    pos += 4
                elif k == _MEMOIZE:
                    idx = len(memo)
                else:
                    end = data.find(b"\n", pos, pos + 24)
                    if end < 0 or not data[pos:end].isdigit():
                        raise bad("a malformed PUT")
                    idx, pos = int(data[pos:end]), end + 1
                if pos > n:
                    raise short("end of file inside an opcode")
                if idx < len(memo):
                    memo[idx] = stack[-1]
                elif idx == len(memo):
                    memo.append(stack[-1])
                    alloc += 16
                else:
                    raise bad(f"memo index {idx} with only {len(memo)} entries defined (the unpickler would size its "
                              "memo to that index)")
            elif k == _SHORT or k == _SIZED4 or k == _SIZED8:
                if k == _SHORT:
                    length = data[pos]
                    pos += 1
                elif k == _SIZED4:
                    length = int.from_bytes(data[pos:pos + 4], "little", signed=op in b"T\x8b")
                    pos += 4
                else:
                    length = int.from_bytes(data[pos:pos + 8], "little")
                    pos += 8
                limit = MAX_LONG_BYTES if op in _LONGS else MAX_STR_BYTES
                if length < 0 or length > limit:
                    raise bad(f"a value of {length} bytes (limit {limit})")
                if pos + length > n:
                    raise short(f"a value of {length} bytes with {max(0, n - pos)} left in the file")
                pos += length
                stack.append(0)
                alloc += 49 + (length << 2 if op in _UNICODE else length)
                if alloc > max_alloc:
                    raise bad(f"it would build more than {max_alloc >> 20} MB of values")
            elif k == _EMPTY:
                stack.append(1)
                alloc += 64
            elif k == _APPEND or k == _SETITEM:
                d = stack.pop() + 1
                if k == _SETITEM:
                    d = max(d, stack.pop() + 1)
                if d > stack[-1]:
                    if d > MAX_DEPTH:
                        raise bad(f"values nested deeper than {MAX_DEPTH}")
                    stack[-1] = d
                alloc += 24
            elif k == _FROM_MARK or k == _TUPLEN:
                if k == _FROM_MARK:
                    m = marks.pop()
                else:
                    m = len(stack) - arg[op]
                    if m < (marks[-1] if marks else 0):
                        raise IndexError
                items = stack[m:]
                del stack[m:]
                d = max(items, default=0) + 1
                if d > MAX_DEPTH:
                    raise bad(f"values nested deeper than {MAX_DEPTH}")
                stack.append(d)
                alloc += 64 + 16 * len(items)
                if alloc > max_alloc:
                    raise bad(f"it would build more than {max_alloc >> 20} MB of values")
            elif k == _LINE:
                end = data.find(b"\n", pos, pos + (MAX_LONG_BYTES + 1 if op in _LONGS or op == 70 else MAX_STR_BYTES))
                if end < 0:
                    raise bad("an unterminated or oversized text value") if n - pos > MAX_LONG_BYTES else short(
                        "a text value")
                alloc += 49 + 4 * (end - pos)
                pos = end + 1
                stack.append(0)
            elif k == _GETL:
                end = data.find(b"\n", pos, pos + 24)
                if end < 0 or not data[pos:end].isdigit():
                    raise bad("a malformed GET")
                idx, pos = int(data[pos:end]), end + 1
                if idx >= len(memo):
                    raise bad(f"memo index {idx} read before it was defined")
                stack.append(memo[idx])
            elif k == _POP:
                if marks and len(stack) == marks[-1]:
                    marks.pop()
                else:
                    stack.pop()
            elif k == _POP_MARK:
                del stack[marks.pop():]
            elif k == _DUP:
                stack.append(stack[-1])
            elif k == _PROTO:
                if data[pos] > 5:
                    raise bad("an unknown pickle protocol")
                pos += 1
            elif k == _FRAME:  # only a hint of how many bytes follow
                length = int.from_bytes(data[pos:pos + 8], "little")
                pos += 8
                if pos > n or length > n - pos:
                    raise short(f"a frame of {length} bytes with {max(0, n - pos)} left in the file")
            elif k == _STOP:
                if len(stack) != 1 or marks:
                    raise bad("STOP with an unfinished stack")
                return
            elif k == _REFUSED:
                what = _REFUSED_OPS[bytes([op])]
                if op in b"ci":  # GLOBAL/INST name the class on two lines: say which one was asked for
                    parts = data[pos:pos + 512].split(b"\n")[:2]
                    what += " " + ".".join(x.decode("ascii", "replace") for x in parts)
                raise bad(f"opcode {what} (loads a class or code; a dump holds only plain data)")
            else:
                raise bad(f"unknown opcode {bytes([op])!r}")
            if len(stack) > MAX_STACK:
                raise bad(f"more than {MAX_STACK} values pending")
    except IndexError:  # data[pos] past the end, or a pop from an empty stack or mark list
        if pos >= n:
            raise short("end of file inside an opcode") from None
        raise bad("stack underflow") from None
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
        try:
            total += math.prod(int(x) for x in s)
        except (TypeError, ValueError, OverflowError):  # a size that is not a number: unknown
            return None
    return _int64(total)


def _op(profiling_name: str | None) -> tuple[str | None, str | None]:
    """'nccl:all_reduce' -> ('nccl', 'all_reduce'); 'nccl:_allgather_base' -> ('nccl', 'all_gather'): the op named as
    the Kineto importer names it (collective_names), so that the same call matches across the two sources."""
    if not profiling_name or not isinstance(profiling_name, str):
        return None, None
    backend, _, op = profiling_name.partition(":")
    if not op:
        backend, op = None, backend
    return backend, canonical_collective(op)


def _int64(v: int) -> int | None:
    """v where an int64 column can hold it, else None (unknown: a damaged dump's number, not an error)."""
    return v if -(1 << 63) <= v < (1 << 63) else None


def _i(v) -> int | None:
    """An int from the dump (JSON dumps write some counters as strings)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return _int64(v)
    if not isinstance(v, str | float):
        return None
    try:
        n = int(v) if isinstance(v, float) else int(str(v))
    except (ValueError, OverflowError):
        return None
    return _int64(n)


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
    pg_config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
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
            listed = orjson.loads(ranks_s) if isinstance(ranks_s, str) else ranks_s
            group_size = len(listed) if isinstance(listed, list | tuple) and listed else None
        except orjson.JSONDecodeError:
            group_size = None
        backend, op = _op(e.get("profiling_name"))
        in_n, out_n = _numel(e.get("input_sizes")), _numel(e.get("output_sizes"))
        dtypes = e.get("input_dtypes")
        dtype = dtypes[0] if isinstance(dtypes, list | tuple) and dtypes and isinstance(dtypes[0], str) else None
        is_p2p = bool(e.get("is_p2p"))
        seq = _i(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"))
        t0 = _i(e.get("time_created_ns"))
        t_start = _i(e.get("time_discovered_started_ns")) or None
        t_end = _i(e.get("time_discovered_completed_ns")) or None
        rows.append({
            "rank": rank, "id": _i(e.get("record_id", i)), "op": op, "backend": backend, "pg_name": pg_name,
            "pg_desc": pg_desc or (cfg.get("desc") if isinstance(cfg.get("desc"), str) else None), "pg_ranks": ranks_s if isinstance(ranks_s, str) else None,
            "group_size": group_size, "seq": seq, "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype,
            "bytes": in_n * size if in_n is not None and (size := dtype_bytes(dtype)) else None,
            "ts": t0, "end": t_end, "dur": (t_end - t0) if t_end and t0 else None,
            "kernel_ts": t_start, "state": e.get("state") if isinstance(e.get("state"), str) else None,
        })
        if _i(e.get("timeout_ms")):
            timeouts.add(_i(e["timeout_ms"]))
    schema = SCHEMAS["collectives"]
    for r in rows:  # sums and products of a damaged dump's numbers can leave int64: unknown, not an error
        for c, v in r.items():
            if type(v) is int:
                r[c] = _int64(v)
    df = pl.DataFrame({c: [r.get(c) for r in rows] for c in schema}, schema=schema)
    # pg_status: where each process group stood when the dump was taken.
    ev = []
    pg_status = dump.get("pg_status")
    for pg_id, st in (pg_status.items() if isinstance(pg_status, dict) else ()):
        if not isinstance(st, dict):
            continue
        ev.append({
            "rank": rank, "kind": "fr_pg_status", "pg_name": str(pg_id), "level": "INFO",
            "seq": _i(st.get("last_enqueued_collective")),
            "text": f"Flight Recorder pg {pg_id}: last enqueued {st.get('last_enqueued_collective')}, "
                    f"started {st.get('last_started_collective')}, completed {st.get('last_completed_collective')}",
            "detail": orjson.dumps({**{str(k): _i(v) for k, v in st.items()}, "fr_version": version,
                                    "comm_lib_version": str(lib_version)}).decode(),
        })
    for t in sorted(timeouts):  # the collective timeout the job ran with, for the error-handling rule
        ev.append({"rank": rank, "kind": "fr_timeout", "level": "INFO", "timeout_ms": t,
                   "text": f"Flight Recorder entries ran with Timeout(ms)={t}", "detail": "{}"})
    ev_schema = SCHEMAS["nccl_events"]
    events = pl.DataFrame({c: [r.get(c) for r in ev] for c in ev_schema}, schema=ev_schema)
    source.ranks = [rank]
    source.meta.update({"fr_version": version, "comm_lib_version": lib_version, "entries": len(rows)})
    return {"collectives": df, "nccl_events": events}
