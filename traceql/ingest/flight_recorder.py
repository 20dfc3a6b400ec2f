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
from traceql.model import SCHEMAS, Source

KIND = "flight_recorder"
SUPPORTED = True
MAX_BYTES = 2 << 30  # a dump of the default 2000 entries is a few MB; refuse absurd sizes rather than exhaust memory

def sniff(path: Path, head: bytes) -> bool:
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return b"entries" in head and (b"pg_config" in head or b"version" in head)
    stripped = head.lstrip()
    return stripped[:1] == b"{" and b'"entries"' in head and (b'"pg_config"' in head or b'"nccl_version"' in head)


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
    return total if -(1 << 63) <= total < (1 << 63) else None


def _op(profiling_name: str | None) -> tuple[str | None, str | None]:
    """'nccl:all_reduce' -> ('nccl', 'all_reduce'); 'nccl:_allgather_base' -> ('nccl', 'all_gather'): the op named as
    the Kineto importer names it (collective_names), so that the same call matches across the two sources."""
    if not profiling_name or not isinstance(profiling_name, str):
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
        return v if -(1 << 63) <= v < (1 << 63) else None  # beyond int64: no column can hold it
    if not isinstance(v, str | float):
        return None
    try:
        n = int(v) if isinstance(v, float) else int(str(v))
    except (ValueError, OverflowError):
        return None
    return n if -(1 << 63) <= n < (1 << 63) else None


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
            if type(v) is int and not -(1 << 63) <= v < (1 << 63):
                r[c] = None
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
