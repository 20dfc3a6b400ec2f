"""Kineto / Chrome trace JSON (torch.profiler export_chrome_trace), plain or gzip.

Three readers, one set of tables:
- The compiled scanner (_kscan.c, built by setup.py where a C compiler is): a plain file is memory-mapped and
  scanned where it lies (each slice's pages released once scanned); gzip is inflated block by block, one block
  ahead in a thread. The traceEvents array is cut at event boundaries (Kineto's "  },\n  {", other indentations,
  one-line "}, {") into 512 KB slices. One Scanner per file reads every slice in C: each event's table is worked out
  once per distinct (ph, cat), and its fields go straight to that table's Arrow columns (strings as codes into the
  file's distinct values, times already in ns). About every million rows (once, for most traces) the columns are
  handed to polars without a copy and become table parts. No Python object is made per event.
- msgspec, over 8 MB slices, into structs that hold only the fields the tables need: where the scanner is
  not built, and for any slice the scanner declines (a value of an unexpected type, a key with escapes, invalid
  JSON...). It gives the same tables (tests/test_kscan.py).
- The fallback (orjson over the whole document) takes B/E events, unknown layouts and damage the chunked paths do
  not handle; it keeps every event in memory, so it is for small or odd files.
The chunked paths keep one slice, plus the columns read so far, in memory, whatever the size. Only the host-op nesting
sweep (in C where built), flow pairing and collectives run over whole tables.

Damaged input is read as far as it goes: a truncated file or gzip stream keeps every complete event
(status "partial", detail naming the byte offset); a damaged stretch inside the event array costs only the events it
touches (a slice that does not decode is cut at the event separators and halved until each bad event stands alone;
the detail names how many were dropped and their byte ranges); raw control characters in strings are escaped before
parsing (only in a chunk that fails to decode); a UTF-8 byte order mark is skipped and UTF-16 converted; and args
keys are looked up on every event, never inferred from the first.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import json
import mmap
import os
import re
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import polars as pl

try:  # the compiled chunk scanner (setup.py builds it where a C compiler is available); else msgspec decodes chunks
    from traceql.ingest import _kscan
except ImportError:  # pragma: no cover - depends on the build
    _kscan = None

from traceql.ingest import IngestError, _gz, _kineto_coll
from traceql.ingest.budget import report_progress, watch_point
from traceql.ingest.collective_names import ANNOTATION as _ANNOT
from traceql.ingest.collective_names import arg_int as _int1
from traceql.ingest.kernel_names import comm_kernel_expr, kernel_collective_expr, runtime_kind_expr
from traceql.ingest.sniff import BOM as _BOM
from traceql.ingest.sniff import UTF16_BOMS as _UTF16_BOMS
from traceql.ingest.sniff import kineto as sniff  # noqa: F401  (discovery's test, kept in one place)
from traceql.model import Source
from traceql.model.run import Pending

# TRACEQL_KSCAN=0 turns the compiled scanner off (benchmarks compare both; tests check both give the same tables).
_USE_KSCAN = _kscan is not None and os.environ.get("TRACEQL_KSCAN", "1") != "0"

KIND = "kineto"
SUPPORTED = True

_READ_CHUNK = 1 << 22


# ----------------------------------------------------------------------------------------------------------------
# Reading and parsing


_CTRL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_NONSPACE = re.compile(rb"\S")


def _escape_ctrl(data: bytes) -> tuple[bytes, int]:
    """Escape raw control characters (strict parsers reject them inside strings; outside strings they are invalid
    anyway). Tab, newline and carriage return are left alone: Kineto only writes them as whitespace."""
    n = 0

    def esc(m):
        nonlocal n
        n += 1
        return b"\\u%04x" % m.group(0)[0]

    return _CTRL.sub(esc, data), n


# An event boundary in Kineto's layout ("  },\n  {"); also compact layouts ("},{").
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def _salvage(data: bytes) -> tuple[object, int] | None:
    """Parse a truncated trace by cutting back to the last complete event and closing the array and the object.

    Returns (parsed, cut_offset) or None. Tries the last boundaries first; a boundary inside an args object
    (pg_config lists) fails to parse and the next earlier one is tried.
    """
    start = data.find(b'"traceEvents"')
    top_is_list = data.lstrip()[:1] == b"["
    if start < 0 and not top_is_list:
        return None
    # Truncated after the event array closed (in the trailing keys): close the object right after the array.
    end_arr = data.rfind(b"]")
    if end_arr > start >= 0:
        try:
            return orjson.loads(data[: end_arr + 1] + b"}"), end_arr + 1
        except orjson.JSONDecodeError:
            pass
    tail = b"]" if top_is_list else b"]}"
    hits = [m.start() for m in _BOUNDARY.finditer(data, max(start, 0), len(data))][-64:]
    for pos in reversed(hits):
        try:
            return orjson.loads(data[: pos + 1] + tail), pos + 1
        except orjson.JSONDecodeError:
            continue
    # Damaged inside the array, not at its end: read it event by event, dropping the damaged ones.
    got = _resync(data, top_is_list)
    if got is not None:
        return got
    # Only the first event (or none) is complete: close the array right after it was opened.
    if start >= 0:
        open_br = data.find(b"[", start)
        if open_br > 0:
            try:
                return orjson.loads(data[: open_br + 1] + tail), open_br + 1
            except orjson.JSONDecodeError:
                pass
    return None


def _resync(data: bytes, top_is_list: bool) -> tuple[object, int, _Drops] | None:
    """The whole-document parser's reading of an event array damaged in the middle: cut at every event boundary,
    each piece parsed alone (joined to the next few where a boundary fell inside an event's args), the pieces that
    never parse dropped. The keys after the array are kept where they parse. None when no event parses."""
    if top_is_list:
        open_br = data.find(b"[")
    else:
        open_br = data.find(b"[", data.find(b'"traceEvents"'))
    close = data.rfind(b"]")
    if open_br < 0 or close <= open_br:
        return None
    body = data[open_br + 1 : close]
    bounds = [m.start() + 1 for m in _BOUNDARY.finditer(body)]
    pieces = list(zip([0] + [b + 1 for b in bounds], bounds + [len(body)]))  # each without its comma
    events: list = []
    drops = _Drops()
    base = open_br + 1
    i = 0
    while i < len(pieces):
        got = None
        for k in range(i, min(i + 8, len(pieces))):
            try:
                got = orjson.loads(body[pieces[i][0] : pieces[k][1]])
                break
            except orjson.JSONDecodeError:
                continue
        if got is not None:
            events.append(got)
            i = k + 1
            continue
        a, b = pieces[i]
        text = body[a:b]
        if text.strip():
            lost = max(1, text.count(b'"ph"'))
            if drops.spans and drops.spans[-1][1] + 1 >= base + a:
                a0, _, n = drops.spans.pop()
                drops.spans.append((a0, base + b, n + lost))
            else:
                drops.spans.append((base + a, base + b, lost))
        i += 1
    if not events:
        return None
    if top_is_list:
        return events, -1, drops
    try:
        doc = orjson.loads(data[: open_br + 1] + b"]" + data[close + 1 :])
    except orjson.JSONDecodeError:
        try:
            doc = orjson.loads(data[: open_br + 1] + b"]}")
        except orjson.JSONDecodeError:
            doc = {}
    if not isinstance(doc, dict):
        doc = {}
    doc["traceEvents"] = events
    return doc, -1, drops


def _parse(path: Path, source: Source) -> tuple[dict, list]:
    data, gz_note = _gz.read_all(path)
    notes = [gz_note] if gz_note else []
    if data[:2] in _UTF16_BOMS:
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeError as e:
            raise IngestError(f"{path.name}: UTF-16 text that does not decode ({e.reason} at byte {e.start}); "
                              "save the trace as UTF-8 (iconv -f UTF-16 -t UTF-8) and check it again") from None
        source.meta["encoding"] = "utf-16"
    data = data.removeprefix(_BOM)  # a UTF-8 byte order mark some editors add: JSON parsers refuse it
    if not _NONSPACE.search(data):
        if gz_note:
            raise IngestError(f"{path.name}: {gz_note} and nothing decompressed; re-copy the file")
        raise IngestError(f"{path.name}: empty file; re-export the trace (torch.profiler export_chrome_trace)")
    n_bytes = len(data)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        doc, first = None, e  # named past the handler: the messages below quote it (or the retry's error)
        if _CTRL.search(data):
            data, n = _escape_ctrl(data)
            source.meta["control_chars_escaped"] = n
            try:
                doc = orjson.loads(data)
            except orjson.JSONDecodeError as again:
                first = again
        if doc is None:
            got = _salvage(data)
            if got is None:
                raise IngestError(
                    f"{path.name}: not valid JSON ({first}) and no complete trace event could be salvaged; "
                    "check that this is a Chrome/Kineto trace"
                ) from None
            if len(got) == 3:  # damaged inside the array, read event by event
                doc, _, drops = got
                note = drops.note("decompressed byte" if gz_note else "byte")
                if note:
                    notes.append(note)
            else:
                doc, cut = got
                where = f"decompressed byte {cut}" if gz_note else f"byte {cut}"
                notes.append(f"truncated trace: JSON breaks at byte {getattr(first, 'pos', '?')} of {n_bytes}; "
                             f"kept the complete events up to {where}")
    if isinstance(doc, list):
        # Chrome's bare array form: the elements must look like trace events.
        probe = [e for e in doc[:200] if isinstance(e, dict)]
        if doc and not any(isinstance(e.get("ph"), str) for e in probe):
            raise IngestError(
                f"{path.name}: not a Chrome/Kineto trace: a JSON array whose elements have no \"ph\" field; "
                "export the trace with torch.profiler's export_chrome_trace"
            )
        header, events = {}, doc
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        header, events = doc, doc["traceEvents"]
    elif isinstance(doc, dict) and "nodes" in doc and "schema" in doc:
        raise IngestError(
            f"{path.name}: not a Chrome/Kineto trace: this is a PyTorch execution trace (ExecutionTraceObserver "
            "graph, keys schema/nodes); traceql reads the Kineto trace recorded beside it"
        )
    else:
        keys = list(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
        raise IngestError(
            f"{path.name}: not a Chrome/Kineto trace: top level has no traceEvents list (found {keys}); "
            "export it with torch.profiler's export_chrome_trace"
        )
    if notes:
        source.status = "partial"
        source.detail = "; ".join(notes)
    return header, events


# ----------------------------------------------------------------------------------------------------------------
# Classification

_KERNEL_CATS = {"kernel": "compute", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "mtia_runtime", "hip_runtime", "xpu_runtime", "privateuse1_runtime"}
_SYNC_CATS = {"cuda_sync"}
# Device-side or synthetic ranges that are neither kernels nor host ops.
_SKIP_CATS = {"gpu_user_annotation", "cuda_profiler_range", "mtia_ccp_events", "critical_path"}


_SYNC_KIND = [
    ("stream wait event", "stream_wait_event"),
    ("wait event", "stream_wait_event"),
    ("stream sync", "stream_sync"),
    ("event sync", "event_sync"),
    ("device sync", "device_sync"),
    ("context sync", "context_sync"),
]

# ----------------------------------------------------------------------------------------------------------------
# Column helpers


_US_LIMIT = 9_223_372_036_854_775  # integer microseconds whose nanoseconds fit int64 (the scanner's us_to_ns: the same)


def _ns(values: list) -> pl.Series:
    """Float (or int) microseconds -> int64 nanoseconds, once, in Rust. Non-numbers and out-of-range values -> null.

    Integer microseconds convert exactly; floats convert their whole and fractional parts apart, so that epoch-scale
    timestamps keep every nanosecond the float carried.
    """
    if _all_none(values):
        return _nulls(len(values), pl.Int64)
    s = pl.Series(values, strict=False)
    if s.dtype == pl.Object or s.dtype.is_nested():  # lists or objects among the numbers: those are not times
        s = pl.Series([v if type(v) in (int, float) else None for v in values], strict=False)
    if s.dtype == pl.String:
        s = s.cast(pl.Float64, strict=False)
    if s.dtype == pl.Null or s.dtype == pl.Boolean:
        return pl.Series(values=[None] * len(values), dtype=pl.Int64)
    if s.dtype.is_integer():
        s = s.cast(pl.Int64, strict=False)  # Int128 (beyond int64) -> null
        return s.set(~(s.abs() < _US_LIMIT).fill_null(True), None) * 1000
    s = s.cast(pl.Float64, strict=False)
    wide = bool((s.abs() >= 9_007_199_254_740_992.0).any())  # 2**53: a float column may have rounded an int
    s = s.set(~(s.abs() < 9.2e15).fill_null(True), None)  # beyond int64 ns, or NaN
    whole = s.floor()
    out = whole.cast(pl.Int64) * 1000 + ((s - whole) * 1000).round().cast(pl.Int64)
    if wide:  # the ints among floats, each exactly, as the scanner reads them (rare: epoch-scale ns beyond 2**53)
        exact = pl.Series([v * 1000 if type(v) is int and -_US_LIMIT < v < _US_LIMIT else None for v in values],
                          dtype=pl.Int64)
        out = exact.fill_null(out)
    return out


def _ints(values: list) -> pl.Series:
    """A column of int64 in Rust; the rare values it cannot take (strings, huge ints) are redone one by one."""
    if _all_none(values):  # common (args keys most events lack): polars would scan the list in Python
        return _nulls(len(values), pl.Int64)
    s = pl.Series(values, dtype=pl.Int64, strict=False)
    nulls = s.null_count()
    if nulls and nulls != values.count(None):
        bad = s.is_null().arg_true().to_list()
        s = s.scatter(bad, pl.Series([_int1(values[i]) for i in bad], dtype=pl.Int64)) if bad else s
    return s


def _id_cols(values: list) -> tuple[pl.Series, pl.Series | None]:
    """pid/tid values -> (int64 column, the names of the non-numeric ones or None). Numeric strings are numbers."""
    if _all_none(values):
        return _nulls(len(values), pl.Int64), None
    s = pl.Series(values, dtype=pl.Int64, strict=False)
    names = None
    if s.null_count():
        bad = [i for i in s.is_null().arg_true().to_list() if values[i] is not None]
        fix_i, fix_v = [], []
        for i in bad:
            v = values[i]
            if type(v) is int:  # beyond int64: null
                continue
            t = v if type(v) is str else str(v)
            if t.lstrip("-").isdigit():
                fix_i.append(i)
                fix_v.append(_int1(t))
            else:
                if names is None:
                    names = [None] * len(values)
                names[i] = t
        if fix_i:
            s = s.scatter(fix_i, pl.Series(fix_v, dtype=pl.Int64))
    return s, (None if names is None else pl.Series(names, dtype=pl.String))


class _Ids:
    """Names used as pid/tid ("Spans", "Traces", "stream 7") get stable negative ids, in the order the tables meet
    them (kernels, host ops, runtime, syncs, flows)."""

    def __init__(self):
        self.strings: dict[str, int] = {}

    def resolve(self, df: pl.DataFrame, col: str, dec) -> pl.Series:
        s = df[col]
        names = df[col + "_s"]
        if names.null_count() == names.len():
            return s
        keys = names.drop_nulls().unique(maintain_order=True)
        texts = pl.select(dec(pl.lit(keys))).to_series().to_list()
        for t in texts:
            self.strings.setdefault(t, -1 - len(self.strings))
        return s.fill_null(names.replace_strict(keys, [self.strings[t] for t in texts], default=None,
                                                return_dtype=pl.Int64))


def _plain(e: pl.Expr) -> pl.Expr:
    """Text columns that hold their strings (msgspec's parts)."""
    return e


class _Codes:
    """Text columns held as uint32 codes into the file's distinct strings (the scanner's parts): the builders work
    per distinct code and decode only what they keep."""

    def __init__(self, strings: list):
        self.none = len(strings)  # null codes gather the appended null
        # one chunk: polars gathers a one-chunk string column as views into its buffers; from two chunks (an
        # append) it copies every row's bytes (a 1 GB trace: the names of 2.5M rows, ~7% of its fresh pages)
        self.strs = pl.lit(pl.Series([*strings, None], dtype=pl.String))

    def __call__(self, e: pl.Expr) -> pl.Expr:
        return self.strs.gather(e.fill_null(self.none))


_NOARGS: dict = {}


def _nulls(n: int, dtype) -> pl.Series:
    return pl.repeat(None, n, dtype=dtype, eager=True)


def _all_none(values: list) -> bool:
    # list.count is cheap on None (identity) and dear on anything else: only scan when the ends are None.
    return not values or (values[0] is None and values[-1] is None and values.count(None) == len(values))


def _str_col(values: list) -> pl.Series:
    if _all_none(values):
        return _nulls(len(values), pl.String)
    s = pl.Series(values, dtype=pl.String, strict=False)
    nulls = s.null_count()
    if nulls and nulls != values.count(None):
        s = pl.Series([v if v is None or type(v) is str else str(v) for v in values], dtype=pl.String)
    return s




# ----------------------------------------------------------------------------------------------------------------
# Events -> columns, one chunk at a time
#
# Both parsers (msgspec over chunks of the event array, orjson over the whole document) hand their events to the
# same code as plain lists of field values; from there on everything is polars, so both give the same tables.

# args keys read from every event: attribute name -> JSON key. Collective keys are only present on
# record_param_comms and the nccl:/gloo: annotations, so decoding them costs nothing elsewhere.
_ARG_KEYS = {
    "device": "device", "stream": "stream", "correlation": "correlation",
    "ext": "External id", "ext2": "external id", "nbytes": "bytes",
    "sync_kind": "cuda_sync_kind", "wait_event": "wait_on_cuda_event_id", "event": "event",
    "coll_name": "Collective name", "pg_name": "Process Group Name", "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks", "group_size": "Group size", "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems", "dtype": "dtype", "seq_a": "Seq", "seq_b": "seq", "seq_c": "seq_num",
    "seq_d": "Seq num", "seq_e": "sequence_number",
    # shapes and dtypes of a gloo annotation's tensors (with record_shapes): its message size, where no
    # record_param_comms op gives one (the scanner keeps them for gloo annotations only)
    "in_dims": "Input Dims", "in_types": "Input type",
}
_COLL_ATTRS = list(_ARG_KEYS)[list(_ARG_KEYS).index("coll_name") :]

_HAS_MSGSPEC = importlib.util.find_spec("msgspec") is not None


@functools.cache
def _msgspec():
    """msgspec, its decoder into structs that hold only the fields the tables need, and the empty args: imported on
    the first slice that needs them (the compiled scanner takes most files whole); None where msgspec is absent."""
    try:
        import msgspec
    except ImportError:  # pragma: no cover - an optional dependency at runtime
        return None
    from typing import Any, Union

    # Fields the tables read are scalars: an event with a list or object there is not msgspec's (the chunk goes to
    # the dict reader, which nulls such values; deeply nested ones would take polars minutes to look at).
    _Scalar = Union[str, int, float, bool, None]
    args = msgspec.defstruct(
        "_Args", [(a, Any if a in _COLL_ATTRS else _Scalar, msgspec.field(default=None, name=k))
                  for a, k in _ARG_KEYS.items()], gc=False
    )
    event = msgspec.defstruct(
        "_Event",
        [("ph", _Scalar, None), ("cat", _Scalar, None), ("name", _Scalar, None), ("pid", _Scalar, None),
         ("tid", _Scalar, None), ("ts", _Scalar, None), ("dur", _Scalar, 0), ("id", _Scalar, None),
         ("args", Union[args, None], None)],
        gc=False,  # plain values only, no cycles: not tracked, cheaper to make and free
    )
    return msgspec, msgspec.json.Decoder(list[event]), args()

# Columns each table's bucket keeps from a chunk.
_BUCKET_COLS = {
    "k": ["id", "pid", "pid_s", "tid", "tid_s", "name", "cat", "ts", "dur", "device", "stream", "correlation",
          "external_id", "bytes"],
    "h": ["id", "pid", "pid_s", "tid", "tid_s", "name", "cat", "ts", "dur", "external_id"],
    "r": ["id", "pid", "pid_s", "tid", "tid_s", "name", "cat", "ts", "dur", "correlation", "external_id"],
    "s": ["id", "pid", "pid_s", "name", "ts", "dur", "device", "stream", "correlation", "sync_kind", "event"],
    "f": ["ph", "cat", "name", "flow_id", "pid", "pid_s", "tid", "tid_s", "ts"],
}


class _Capsules:
    """An Arrow struct array as the PyCapsule pair (schema, array) that _kscan.arrow makes, in the form polars takes
    (pl.DataFrame reads `__arrow_c_array__`): the scanner's columns become a frame without a copy and without pyarrow
    (whose import is ~150 ms of every command). The pair is handed out once: the array capsule is moved from."""

    __slots__ = ("pair",)

    def __init__(self, pair: tuple):
        self.pair = pair

    def __arrow_c_array__(self, requested_schema=None):
        pair, self.pair = self.pair, None
        if pair is None:
            raise ValueError("these Arrow capsules were already handed out")
        return pair


def _frame(n: int, cols: list) -> pl.DataFrame:
    """cols: [(name, Arrow format, data MBuf, validity MBuf or None, null count)] of n rows, as one frame."""
    return pl.DataFrame(_Capsules(_kscan.arrow(n, cols)))


def _bucket_expr(ph: pl.Expr, cat: pl.Expr) -> pl.Expr:
    """The table an event goes to: k(ernels), r(untime), s(yncs), h(ost ops), f(lows), skip (categories not
    imported), i(nstant), be (B/E pairs), or null."""
    lc = cat.str.to_lowercase()
    return (
        pl.when(ph == "X")
        .then(
            pl.when(lc.is_in(list(_KERNEL_CATS))).then(pl.lit("k"))
            .when(lc.is_in(list(_RUNTIME_CATS))).then(pl.lit("r"))
            .when(lc.is_in(list(_SYNC_CATS))).then(pl.lit("s"))
            .when(lc.is_in(list(_SKIP_CATS))).then(pl.lit("skip"))
            .otherwise(pl.lit("h"))
        )
        .when(ph.is_in(["s", "f"])).then(pl.lit("f"))  # flow steps (ph t) pair nothing: not kept
        .when(ph.is_in(["B", "E"])).then(pl.lit("be"))
        .when(ph.is_in(["i", "I"])).then(pl.lit("i"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )


# The compiled scanner's buckets: (table, the fields it keeps), in the order _classify numbers them.
_SCAN_BUCKETS = [("", []), *((b, list(cols)) for b, cols in _BUCKET_COLS.items()), ("skip", ["cat"]), ("i", []),
                 ("be", [])]
_SCAN_INDEX = {b: i for i, (b, _) in enumerate(_SCAN_BUCKETS)}
_TEXT_FIELDS = frozenset({"ph", "cat", "name", "pid_s", "tid_s", "sync_kind"})
# Scanner rows per flush into table parts: about 2.4 GB of JSON. Each flush briefly holds its rows twice (the scanner's
# columns and the built table part), and the parts of several flushes are copied into one at the end (_frame_of),
# which holds every row twice as well: so fewer flushes cost little more memory and save that copy. 1 GB (4.3M
# events) in one flush instead of five: `check` 3.31 / 3.48 -> 2.74 / 3.10 CPU s, peak 1003 -> 1039 MB (4
# interleaved pairs; in the eighth round, before _Codes gathered from one chunk, it did not pay).
_FLUSH_ROWS = 1 << 23


@functools.lru_cache(maxsize=4096)
def _classify(ph: str | None, cat: str | None) -> int:
    """The scanner's bucket of an event, once per distinct (ph, cat) of a process. An ASCII category is looked up
    here (what _bucket_expr does, without a polars query: each costs ~1 ms the first time, and every spawned worker
    starts afresh); any other goes through _bucket_expr itself, whose Unicode lowercasing str.lower need not share.
    tests/test_kscan.py holds the two to the same answer."""
    if cat is None or cat.isascii():
        return _SCAN_INDEX[_bucket_of(ph, None if cat is None else cat.lower())]
    b = pl.select(_bucket_expr(pl.lit(ph, dtype=pl.String), pl.lit(cat, dtype=pl.String))).item()
    return _SCAN_INDEX[b or ""]


def _bucket_of(ph: str | None, lc: str | None) -> str:
    """_bucket_expr for one event, given its lowercased category."""
    if ph == "X":
        if lc in _KERNEL_CATS:
            return "k"
        if lc in _RUNTIME_CATS:
            return "r"
        if lc in _SYNC_CATS:
            return "s"
        return "skip" if lc in _SKIP_CATS else "h"
    return {"s": "f", "f": "f", "B": "be", "E": "be", "i": "i", "I": "i"}.get(ph, "")


class _Acc:
    """Accumulates the per-table columns of each chunk of events, plus the few facts read per event."""

    def __init__(self):
        self.ids = _Ids()
        self.parts: dict[str, list[pl.DataFrame]] = {b: [] for b in _BUCKET_COLS}
        self.coll_args: dict[int, dict] = {}  # host op id -> args, for collective calls only
        self.skipped: dict[str, int] = {}
        self.n_events = 0
        self.n_instant = 0
        self.mtia = False
        self.ctrl = 0  # raw control characters escaped
        self.be: list = []  # B/E events (orjson path only)
        self.scanner = None  # the compiled scanner's rows since the last flush
        self.drops = _Drops()  # damaged events left out (chunked paths)
        self.defer_flows = False  # keep the scanner's flow rows as they are until the flows are read (_lazy_flows)

    # One chunk: lists of field values, in file order, starting at event index i0.
    def add_columns(self, i0: int, c: dict, args_of, idx: list | None = None) -> None:
        n = len(c["ph"])
        pid, pid_s = _id_cols(c["pid"])
        tid, tid_s = _id_cols(c["tid"])
        df = pl.DataFrame(
            {
                "id": pl.int_range(i0, i0 + n, dtype=pl.Int64, eager=True) if idx is None else pl.Series(idx, dtype=pl.Int64),
                "ph": _str_col(c["ph"]),
                "cat": _str_col(c["cat"]),
                "name": _str_col(c["name"]),
                "pid": pid,
                "pid_s": pid_s,
                "tid": tid,
                "tid_s": tid_s,
                "ts": _ns(c["ts"]),
                "dur": _ns(c["dur"]),
                "flow_id": _ints(c["id"]),
                "device": _ints(c["device"]),
                "stream": _ints(c["stream"]),
                "correlation": _ints(c["correlation"]),
                "external_id": _ints(c["ext"]).fill_null(_ints(c["ext2"])),
                "bytes": _ints(c["nbytes"]),
                "sync_kind": _str_col(c["sync_kind"]),
                "event": _ints(c["wait_event"]).fill_null(_ints(c["event"])),
            },
            schema_overrides={"ph": pl.String, "cat": pl.String, "name": pl.String, "sync_kind": pl.String,
                              "pid_s": pl.String, "tid_s": pl.String},
        )
        self.n_events += n if idx is None else 0
        self._route(df, args_of)

    def _route(self, df: pl.DataFrame, args_of) -> None:
        b = _bucket_expr(pl.col("ph"), pl.col("cat"))
        parts = df.with_row_index("_pos").with_columns(_b=b).partition_by("_b", as_dict=True, include_key=False)
        self._take({b: part for (b,), part in parts.items()}, args_of)

    def _take(self, parts: dict, args_of, dec=_plain) -> None:
        """One chunk's events, split by table (bucket -> rows, with their position in the chunk, _pos, when they
        come from msgspec's path); dec gives a text column's strings (the scanner's parts hold codes)."""
        for b, part in parts.items():
            if b == "skip":
                cats = part.select(dec(pl.col("cat")).str.to_lowercase()).to_series()
                for c, k in cats.value_counts().iter_rows():
                    self.skipped[c] = self.skipped.get(c, 0) + k
            elif b == "i":
                self.n_instant += part.height
            elif b == "be":  # only the msgspec path sees them: the orjson path pairs them first
                raise _Fallback("B/E events")
        h = parts.get("h")
        if h is not None:
            text = dec(pl.col("name"))
            names = h.select(pl.col("name").unique()).filter(
                (text == "record_param_comms") | text.str.contains("(?i)" + _ANNOT.pattern).fill_null(False)
            )["name"]
            calls = h.filter(pl.col("name").is_in(names.implode()))
            if "_pos" in h.columns:  # msgspec's chunks: args by position in the chunk
                for i, pos in calls.select("id", "_pos").iter_rows():
                    self.coll_args[i] = args_of(pos)
            else:  # the scanner's rows: args by event id, all of the chunk's at once (args_of takes the list)
                ids = calls["id"].to_list()
                self.coll_args.update(zip(ids, args_of(ids)))
        r = parts.get("r")
        if r is not None and not self.mtia:
            self.mtia = bool(r.select(pl.col("cat").unique()).select((dec(pl.col("cat")) == "mtia_runtime").any()).item())
        # Each table's rows of this chunk, in their final form (all but the host-op nesting and the flow pairing
        # are per row); string pids get their ids in this fixed order.
        for b, build in (("k", _kernel_rows), ("h", _host_rows), ("r", _runtime_rows), ("s", _syncs), ("f", _flow_rows)):
            part = parts.get(b)
            if part is not None:
                part = part.select(_BUCKET_COLS[b])
                if b == "f" and self.defer_flows and dec is not _plain and \
                        part["pid_s"].null_count() == part["tid_s"].null_count() == part.height:
                    self.parts[b].append((part, dec))  # built if the flows are read (no pid names to number)
                else:
                    self.parts[b].append(build(part, self.ids, dec))
                watch_point()

    def add_structs(self, i0: int, evs: list) -> None:
        no_args = _msgspec()[2]
        a = [e.args or no_args for e in evs]
        c = {
            "ph": [e.ph for e in evs], "cat": [e.cat for e in evs], "name": [e.name for e in evs],
            "pid": [e.pid for e in evs], "tid": [e.tid for e in evs], "ts": [e.ts for e in evs],
            "dur": [e.dur for e in evs], "id": [e.id for e in evs],
            "device": [x.device for x in a], "stream": [x.stream for x in a], "correlation": [x.correlation for x in a],
            "ext": [x.ext for x in a], "ext2": [x.ext2 for x in a], "nbytes": [x.nbytes for x in a],
            "sync_kind": [x.sync_kind for x in a], "wait_event": [x.wait_event for x in a], "event": [x.event for x in a],
        }

        def args_of(j):
            x = a[j]
            return {_ARG_KEYS[k]: v for k in _COLL_ATTRS if (v := getattr(x, k)) is not None}

        self.add_columns(i0, c, args_of)

    def feed(self, buf, end: int, start: int = 0, bare: bool = False, i0: int = 0) -> int | None:
        """Events buf[start:end] through the compiled scanner, straight into their tables' columns; None when the
        scanner declines them (nothing is kept then, and msgspec's path takes them)."""
        if self.scanner is None:
            self.scanner = _kscan.Scanner(_classify, _SCAN_BUCKETS)
        got = self.scanner.feed(buf, end, start, bare, i0)
        if got is not None:
            self.n_events += got
            if self.scanner.pending >= _FLUSH_ROWS:
                self.flush()
        return got

    def flush(self) -> None:
        """The scanner's rows since the last flush become table parts. Strings arrive as codes into the file's
        distinct values and numbers as Arrow buffers, each table with only its own columns; only the collective
        calls' args are parsed again, in full, from their bytes."""
        if self.scanner is None or not self.scanner.pending:
            return
        strings, buckets, colls = self.scanner.take()
        parts = {}
        for b, (n, cols) in buckets.items():
            if not n:
                continue
            if b == "i":
                self.n_instant += n
            elif b == "be":
                raise _Fallback("B/E events")
            elif b:
                parts[b] = _frame(n, [(name, "I" if name in _TEXT_FIELDS else "l", data, valid, nulls)
                                      for name, (data, valid, nulls) in cols.items()])
        args = dict(colls)

        def args_of(ids: list) -> list:
            return _coll_args([args.get(i) for i in ids])

        self._take(parts, args_of, _Codes(strings))

    def add_dicts(self, i0: int, events: list, idx: list | None = None) -> None:
        evs = []
        for j, e in enumerate(events):
            if type(e) is not dict:
                e = _NOARGS
            else:
                ph = e.get("ph")
                if ph == "B" or ph == "E":
                    self.be.append((i0 + j, e))
                    e = _NOARGS  # counted, routed later as paired X events
                elif type(e.get("cat")) not in (str, type(None)):
                    try:
                        hash(e["cat"])
                    except TypeError:  # an unhashable cat: not a Kineto event
                        e = _NOARGS
            evs.append(e)
        a = [x if type(x := e.get("args")) is dict else _NOARGS for e in evs]
        g = dict.get
        c = {
            "ph": [g(e, "ph") for e in evs], "cat": [g(e, "cat") for e in evs], "name": [g(e, "name") for e in evs],
            "pid": [g(e, "pid") for e in evs], "tid": [g(e, "tid") for e in evs], "ts": [g(e, "ts") for e in evs],
            "dur": [g(e, "dur", 0) for e in evs], "id": [g(e, "id") for e in evs],
        }
        for attr in ("device", "stream", "correlation", "ext", "ext2", "nbytes", "sync_kind", "wait_event", "event"):
            key = _ARG_KEYS[attr]
            c[attr] = [g(x, key) for x in a]
        for k, col in c.items():  # a list or object where a scalar belongs: null, as msgspec's path has it
            if any(type(v) in (list, dict) for v in col):
                c[k] = [None if type(v) in (list, dict) else v for v in col]
        self.add_columns(i0, c, lambda j: a[j], idx)

    def finish_be(self) -> None:
        """B/E pairs (orjson path) become host ops with the index of their B event."""
        if not self.be:
            return
        pairs = _pair_be(self.be)
        self.be = []
        if pairs:
            self.add_dicts(0, [x for _, x in pairs], idx=[i for i, _ in pairs])

    def frame(self, b: str) -> pl.DataFrame | None:
        return _frame_of(self.parts[b], self.ids)


def _frame_of(parts: list, ids: _Ids) -> pl.DataFrame | None:
    """One table's parts as one frame; flow parts kept as the scanner's rows (_Acc.defer_flows) are built first."""
    parts = [_flow_rows(p[0], ids, p[1]) if type(p) is tuple else p for p in parts]
    parts = [p for p in parts if p.height]
    if not parts:
        return None
    # One chunk per column: the rules' queries would otherwise meet (and some copy) a chunk per flush, each time. On the
    # 1 GB trace (5 flushes) the whole check's peak RSS fell 1.29 -> 1.20 GB and its CPU min / median 5.64 / 6.25 ->
    # 5.17 / 6.01 s (3 interleaved pairs) and 5.09 / 5.83 -> 5.02 / 5.37 (4 more); a trace of one flush (most traces:
    # a million rows) has one part and is not copied.
    return pl.concat(parts, how="vertical", rechunk=True) if len(parts) > 1 else parts[0]


_COLL_KEYS = frozenset(_ARG_KEYS[k] for k in _COLL_ATTRS)


def _coll_args(raws: list) -> list:
    """The collective fields (non-null) of each args object's bytes ({} for None). One orjson call over them all as a
    JSON list; where that fails, one by one. (A 1 GB trace's 121k candidate calls, most without args: 0.01 CPU s,
    against ~0.5 s for a Python call per id and a parse per object.)"""
    given = [r for r in raws if r is not None]
    try:
        parsed = iter(orjson.loads(b"[" + b",".join(given) + b"]"))
    except orjson.JSONDecodeError:  # one of them holds bytes that are no UTF-8 (in a value the scanner skipped)
        parsed = map(_one_args, given)
    keys = _COLL_KEYS
    return [{} if r is None else {k: v for k, v in next(parsed).items() if k in keys and v is not None} for r in raws]


def _one_args(raw: bytes) -> dict:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # an int beyond 64 bits (the stdlib keeps it), or bytes that are no UTF-8
        return json.loads(raw.decode("utf-8", "replace"))  # in a value the scanner skipped: replaced, not fatal


class _Fallback(Exception):
    """The fast path cannot read this input; the whole-document parser will."""


# ----------------------------------------------------------------------------------------------------------------
# Tables


def _kernel_rows(df: pl.DataFrame, ids: _Ids, dec=_plain) -> pl.DataFrame:
    """One chunk's kernels. Kind, collective and memcpy details are worked out once per distinct (cat, name) of the
    chunk (codes, for the scanner's parts) and joined back."""
    df = df.with_columns(pid=ids.resolve(df, "pid", dec), tid=ids.resolve(df, "tid", dec))
    df = df.select(
        "id", device=pl.col("device").fill_null(pl.col("pid")), stream=pl.col("stream").fill_null(pl.col("tid")),
        name="name", cat="cat", ts="ts", dur="dur", end=pl.col("ts") + pl.col("dur"),
        correlation="correlation", external_id="external_id", bytes="bytes",
    )
    name = pl.col("_name")
    cat = pl.col("_cat")
    is_comm = (cat == "kernel") & comm_kernel_expr(name)
    # ASCII word classes: CUPTI's copy names are ASCII, and polars compiles a Unicode \w class into a large automaton
    # on first use (2 ms for this pattern, 1.3 for the Memset one, once per thread: ~4% of a small check's CPU)
    mem = name.str.extract_groups(r"^Memcpy ([0-9A-Za-z_]+)(?: \(([0-9A-Za-z_]+) -> ([0-9A-Za-z_]+)\))?")
    u = df.select("cat", "name").unique().with_columns(
        _cat=dec(pl.col("cat")).str.to_lowercase(), _name=dec(pl.col("name"))
    ).select(
        "cat", "name",
        kind=pl.when(cat == "gpu_memcpy")
        .then(pl.lit("memcpy"))
        .when(cat == "gpu_memset")
        .then(pl.lit("memset"))
        .when(is_comm)
        .then(pl.lit("comm"))
        .when(name.str.starts_with("Memcpy"))
        .then(pl.lit("memcpy"))
        .when(name.str.starts_with("Memset"))
        .then(pl.lit("memset"))
        .otherwise(pl.lit("compute")),
        collective=pl.when(is_comm).then(kernel_collective_expr(name)),
        copy_kind=mem.struct.field("1"),
        src_memory=mem.struct.field("2").str.to_lowercase().replace({"host": None}),
        # "Memcpy DtoH (Device -> Pageable)", "Memset (Pinned)": the memory written, as nsys names it
        dst_memory=pl.coalesce(mem.struct.field("3"), name.str.extract(r"^Memset \(([0-9A-Za-z_]+)\)", 1))
        .str.to_lowercase().replace({"host": None}),
    )
    df = df.join(u, on=["cat", "name"], how="left", nulls_equal=True, maintain_order="left").drop("cat")
    return df if dec is _plain else df.with_columns(name=dec(pl.col("name")))


def _host_rows(df: pl.DataFrame, ids: _Ids, dec=_plain) -> pl.DataFrame:
    df = df.with_columns(pid=ids.resolve(df, "pid", dec), tid=ids.resolve(df, "tid", dec))
    return df.select("id", "pid", "tid", name=dec(pl.col("name")), cat=dec(pl.col("cat")), ts="ts",
                     end=pl.col("ts") + pl.col("dur"), dur="dur", external_id="external_id")


def _host_ops(df: pl.DataFrame | None) -> pl.DataFrame | None:
    if df is None:
        return None
    parent, depth = _nest(df)
    return df.with_columns(parent=parent, depth=depth)


def _runtime_rows(df: pl.DataFrame, ids: _Ids, dec=_plain) -> pl.DataFrame:
    """One chunk's runtime calls: names without their _vNNNN suffix and the kind of call, worked out once per
    distinct name of the chunk."""
    df = df.with_columns(pid=ids.resolve(df, "pid", dec), tid=ids.resolve(df, "tid", dec))
    df = df.select(
        "id", "pid", "tid", "name", ts="ts", end=pl.col("ts") + pl.col("dur"), dur="dur",
        correlation="correlation", external_id="external_id",
    )
    bare = dec(pl.col("name")).str.replace(r"_v\d+$", "")
    u = df.select(pl.col("name").unique()).with_columns(bare=bare).with_columns(kind=runtime_kind_expr(pl.col("bare")))
    df = df.join(u, on="name", how="left", nulls_equal=True, maintain_order="left")
    return df.with_columns(name=pl.col("bare")).drop("bare")


def _sync_kind_expr(text: pl.Expr) -> pl.Expr:
    s = text.str.to_lowercase()
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.String))
    for pat, kind in _SYNC_KIND:
        expr = expr.when(s.str.contains(pat, literal=True)).then(pl.lit(kind))
    return expr.otherwise(pl.lit(None, dtype=pl.String))


def _syncs(df: pl.DataFrame | None, ids: _Ids, dec=_plain) -> pl.DataFrame | None:
    if df is None:
        return None
    df = df.with_columns(pid=ids.resolve(df, "pid", dec))
    given = dec(pl.col("sync_kind")).fill_null("")
    kind = (
        pl.when(given != "")
        .then(_sync_kind_expr(given).fill_null(pl.lit("other")))
        .otherwise(_sync_kind_expr(dec(pl.col("name")).fill_null("")).fill_null(pl.lit("other")))
    )
    return df.select(
        "id", device=pl.col("device").fill_null(pl.col("pid")), stream="stream", kind=kind, ts="ts",
        end=pl.col("ts") + pl.col("dur"), dur="dur", correlation="correlation", event="event",
    )


def _flow_kinds(u: pl.DataFrame, dec=_plain) -> pl.DataFrame:
    """Distinct (ph, cat, name) of flow rows -> whether a start, and the kind (the category, else the name)."""
    ph, cat = dec(pl.col("ph")), dec(pl.col("cat"))
    return u.filter(ph.is_in(["s", "f"])).select(
        "ph", "cat", "name",
        start=ph == "s",
        kind=pl.when(cat.is_null() | (cat == "")).then(dec(pl.col("name"))).otherwise(cat).cast(pl.Categorical),
    )


def _flow_rows(df: pl.DataFrame, ids: _Ids, dec=_plain) -> pl.DataFrame:
    df = df.with_columns(pid=ids.resolve(df, "pid", dec), tid=ids.resolve(df, "tid", dec))
    # Starts and ends pair up; a few distinct kinds: categorical keeps the join small. Worked out once per distinct
    # (ph, cat, name), then joined back.
    u = _flow_kinds(df.select("ph", "cat", "name").unique(), dec)
    return df.join(u, on=["ph", "cat", "name"], how="inner", nulls_equal=True, maintain_order="left").select(
        "start", "kind", "flow_id", "pid", "tid", "ts"
    )


def _flow_count(parts: list) -> int | None:
    """The rows _flows(frame of `parts`) will have, without building it, where that is cheap to tell: every part the
    scanner's rows as they are ((rows, decoder): _Acc.defer_flows), every row's kind its category (never empty), one
    category code per kind, every id present and within the packed key's range. Then each distinct (category, id) is
    one row of the pairing's full join (each side keeps the first row of a key). None otherwise: build the flows."""
    if not parts or any(type(p) is not tuple for p in parts):
        return None
    code_of: dict[str, int] = {}
    for df, dec in parts:
        trio = df.select("ph", "cat", "name").unique()
        u = _flow_kinds(trio, dec).with_columns(_cat=dec(pl.col("cat")))
        if u.height < trio.height or u["_cat"].null_count() or (u["_cat"] == "").any():
            return None  # rows the pairing drops, or kinds named by the event name
        for kind, code in u.select(pl.col("kind").cast(pl.String), "cat").unique().iter_rows():
            if code_of.setdefault(kind, code) != code:
                return None  # one kind under two codes (an escaped spelling): the codes do not tell the kind
    keys = pl.concat([df.select("cat", "flow_id") for df, _ in parts], rechunk=False)
    ok = keys.select((pl.col("cat").max() < _KIND_CODES) & pl.col("flow_id").is_not_null().all()
                     & (pl.col("flow_id") >= 0).all() & (pl.col("flow_id") < _FLOW_IDS).all()).item()
    if not ok:
        return None
    return keys.select((pl.col("cat").cast(pl.Int64) * _FLOW_IDS + pl.col("flow_id")).n_unique()).item()


def _flows(df: pl.DataFrame | None) -> pl.DataFrame | None:
    """Flow starts (ph s) joined to their ends (ph f) by (kind, id)."""
    if df is None:
        return None
    # the first of each (kind, id), in file order: is_first_distinct keeps the rows unique(keep="first",
    # maintain_order=True) keeps, at about a third of its CPU (0.35 -> 0.14 s on 850k flow starts)
    code, fid = pl.col("kind").to_physical(), pl.col("flow_id")
    packs = df.select((code.max() < _KIND_CODES) & ((fid >= 0) & (fid < _FLOW_IDS)).all(ignore_nulls=False)
                      & code.is_not_null().all()).item()
    if not packs:  # ids beyond 40 bits, below 0 or missing: the two columns as the key (a join on a struct, ~1.6 x
        # the CPU; a null in one column keeps the other apart, where one packed null would lump such rows together)
        first = pl.struct("kind", "flow_id").is_first_distinct()
        src = df.filter("start").filter(first).select("kind", "flow_id", src_pid="pid", src_tid="tid", src_ts="ts")
        dst = df.filter(~pl.col("start")).filter(first).select("kind", "flow_id", dst_pid="pid", dst_tid="tid",
                                                                dst_ts="ts")
        out = src.join(dst, on=["kind", "flow_id"], how="full", coalesce=True, nulls_equal=False)
        return out.with_columns(pl.col("kind").cast(pl.String))
    # (kind, id) packed into one int64: a one-column hash join and no row encoding
    d = df.with_columns(_k=code.cast(pl.Int64) * _FLOW_IDS + fid)
    first = pl.col("_k").is_first_distinct()
    src = d.filter("start").filter(first).select("_k", "kind", "flow_id", src_pid="pid", src_tid="tid", src_ts="ts")
    dst = d.filter(~pl.col("start")).filter(first).select("_k", _kind="kind", _fid="flow_id", dst_pid="pid",
                                                           dst_tid="tid", dst_ts="ts")
    out = src.join(dst, on="_k", how="full", coalesce=True, nulls_equal=False)
    return out.select(pl.coalesce("kind", "_kind").cast(pl.String).alias("kind"),
                      pl.coalesce("flow_id", "_fid").alias("flow_id"), *_FLOW_SIDES)


_KIND_CODES = 1 << 22  # flow kinds (categories) and ids that pack into one int64 key: code * _FLOW_IDS + id
_FLOW_IDS = 1 << 40
_FLOW_SIDES = ("src_pid", "src_tid", "src_ts", "dst_pid", "dst_tid", "dst_ts")


def _nest(df: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """Parent id and depth of each interval by a per-thread stack sweep over intervals sorted by (start, -end)."""
    s = (
        df.select("pid", "tid", "ts", end=pl.col("end").fill_null(pl.col("ts")))
        .with_row_index("i")
        .sort(["pid", "tid", "ts", "end"], descending=[False, False, False, True], nulls_last=True, maintain_order=True)
    )
    s = s.select("ts", "end", "i", first=s["pid"].ne_missing(s["pid"].shift()) | s["tid"].ne_missing(s["tid"].shift()))
    pos, depth = _nest_compiled(s) if _USE_KSCAN else _nest_sweep(s)
    return df["id"].gather(pos.set(pos < 0, None).cast(pl.UInt32)), depth


def _nest_compiled(s: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """The sweep in C (_kscan.nest), over the sorted columns where polars holds them (one chunk each, read through
    the Arrow C stream interface) and back as one frame without a copy."""
    flags = (s["first"].cast(pl.UInt8) | (s["ts"].is_null().cast(pl.UInt8) * 2)).fill_null(1)
    n = s.height
    parent, depth = _kscan.nest(s["ts"].fill_null(0).rechunk(), s["end"].fill_null(0).rechunk(), flags.rechunk(),
                                s["i"].cast(pl.UInt32).rechunk(), n)
    out = _frame(n, [("parent", "l", parent, None, 0), ("depth", "i", depth, None, 0)])
    return out["parent"], out["depth"]


def _nest_sweep(s: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """The sweep in Python, where the extension is not built."""
    n = s.height
    parent = array("q", [-1]) * n  # positions; 8 bytes each rather than a Python int each
    depth = array("i", [0]) * n
    stack: list = []  # (end, start, row) of the open intervals of this thread
    # Slice by slice, so that only one slice's Python ints exist at a time (the stack carries over).
    for piece in s.iter_slices(1 << 16):
        for t, e, i, first in zip(*[c.to_list() for c in piece.get_columns()]):
            if first:  # the next thread
                stack.clear()
            if t is None:
                continue
            # The top ended before this starts: a finished sibling. A top that starts at the same time sorted first
            # because it is at least as long, so it encloses this one even when both are zero-length.
            while stack and stack[-1][0] <= t and stack[-1][1] != t:
                stack.pop()
            # Children that stick out past their parent's end (clock rounding) still nest under it.
            if stack:
                parent[i] = stack[-1][2]
                depth[i] = len(stack)
            stack.append((e, t, i))
    return pl.Series(parent, dtype=pl.Int64), pl.Series(depth, dtype=pl.Int32)


def _pair_be(evs: list) -> list:
    """B/E duration events -> X-shaped dicts, paired per (pid, tid) stack. Unclosed B events are dropped."""
    out = []
    stacks: dict = {}
    for i, e in sorted(evs, key=lambda p: (p[1].get("ts") or 0)):
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            stacks.setdefault(key, []).append((i, e))
        else:
            st = stacks.get(key)
            if not st:
                continue
            bi, b = st.pop()
            x = dict(b)
            x["ph"] = "X"
            try:
                x["dur"] = e["ts"] - b["ts"]
            except (KeyError, TypeError):
                continue
            if e.get("args"):
                x["args"] = {**(b.get("args") or {}), **e["args"]}
            out.append((bi, x))
    return out


# ----------------------------------------------------------------------------------------------------------------
# The fast path: the event array in chunks, cut at event boundaries
#
# Kineto writes one event per group of lines at two spaces of indentation: "  {\n ... \n  },\n  {\n". A line
# "  }," followed by "  {" can only be the end of one top-level event and the start of the next (strings cannot hold
# raw newlines, nested values are indented deeper), so the array is cut there into chunks of a few MB, each decoded
# on its own as a JSON list (msgspec, into structs that keep only the fields the tables need). Other indentations work
# the same way; one-line files are cut at "}, {" (see _layout). Memory holds one chunk's objects at a time plus the
# columns built so far; gzip is decompressed block by block. Anything the chunks cannot take (B/E events, values of
# unexpected types, a damaged header, a wrong cut) goes to the whole-document parser below.

# Bytes of JSON per slice for msgspec (about 30k events: each slice costs some fifty polars calls). The compiled
# scanner takes a sixteenth of that between two looks at the file (a gzip block inflated, a mapped range let go
# of): its per-slice cost is one call, and smaller slices keep less of the file in memory (the gzip path holds about
# three blocks). Peak growth of trace_diff (109k events, gzipped) on one core: 8 MB slices 32 MB, 2 MB 21.3 MB,
# 512 KB 19.9 MB; 98 MB and 1 GB plain files read as fast with 512 KB slices as with 2 MB ones.
_BLOCK = 8 << 20


def _slice_bytes() -> int:
    return _BLOCK // 16 if _USE_KSCAN else _BLOCK

_ARR_HEAD = re.compile(rb'"traceEvents"\s*:\s*\[(\s*)\{')


def _layout(ws: bytes, sample: bytes) -> tuple[bytes, re.Pattern] | None:
    """The separator between two top-level events and the pattern of the array's end, from the whitespace between
    "[" and the first event and a sample of the array. Indented layouts (Kineto's "  },\n  {", json.dump(indent=N))
    close each event at the array's own indentation, which nothing nested inside an event shares; one-line layouts
    separate events with "}, {" or "},{", which a list of objects inside args could also hold: a cut there leaves
    both halves unbalanced, they fail to decode and the whole-document parser takes the file."""
    if b"\n" in ws:
        indent = ws[ws.rindex(b"\n") :]  # "\n" + spaces
        # torch's CPU-only traces open the array with a blank line ("[\n    \n  {") that no later event repeats:
        # their events are apart by the indent alone; a separator that never occurs leaves the whole file one slice
        # (a gzipped one inflated whole into memory before it is read)
        seps = [indent + b"}," + indent + b"{", indent + b"}," + ws + b"{"]
        sep = next((x for x in seps if x in sample), seps[0])
        return sep, re.compile(re.escape(indent) + rb"\}\s*\]")
    for sep in (b"}, {", b"},{"):
        if sep in sample:
            return sep, re.compile(rb"\}\s*\]")
    return None


_gzipped = _gz.gzipped


def _blocks(path: Path, notes: list, size: int | None = None):
    """The file's (gunzipped) bytes, block by block. Gzip is inflated one block ahead in a thread (zlib lets go of
    the GIL while it works), so that decompression overlaps parsing instead of adding to it."""
    size = size or _BLOCK
    with open(path, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        if magic != b"\x1f\x8b":
            while block := f.read(size):
                yield block
            return
        gen = _gz.inflate(f, notes, size, report_progress)
        with ThreadPoolExecutor(1) as ex:
            ahead = ex.submit(next, gen, None)
            while (block := ahead.result()) is not None:
                ahead = ex.submit(next, gen, None)
                yield block


def _decode_chunk(buf: bytearray, end: int, acc: _Acc, i0: int) -> int | None:
    """Decode buf[:end], a JSON list of whole events, into acc; returns the number of events, or None when the bytes
    are not valid JSON (nothing is kept then: _decode_region cuts them smaller). No copy of the text is made unless
    it holds raw control characters or values msgspec's structs do not take."""
    if _USE_KSCAN:
        got = acc.feed(buf, end, 0, False, i0)
        if got is not None:  # else a value or form the scanner leaves to msgspec
            return got
        acc.flush()  # the scanner's rows so far go first: tables stay in file order
    msgspec, decoder, _ = _msgspec()
    mv = memoryview(buf)
    part = mv[:end]
    try:
        evs = decoder.decode(part)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nesting deeper than msgspec goes
        evs = None
    finally:
        part.release()
        mv.release()
    if evs is None:
        chunk = bytes(buf[:end])
        n_ctrl = 0
        if _CTRL.search(chunk):
            chunk, n_ctrl = _escape_ctrl(chunk)
            try:
                evs = decoder.decode(chunk)
            except (msgspec.DecodeError, RecursionError):
                pass
        if evs is None:
            # Valid JSON that msgspec's structs refuse (args a list or a string, a field an object): read as dicts,
            # as the whole-document parser would.
            try:
                dicts = orjson.loads(chunk)
            except orjson.JSONDecodeError:
                return None
            if not isinstance(dicts, list):
                return None
            if any(type(e) is dict and e.get("ph") in ("B", "E") for e in dicts):
                raise _Fallback("B/E events")
            acc.ctrl += n_ctrl
            acc.add_dicts(i0, dicts)
            return len(dicts)
        acc.ctrl += n_ctrl
    acc.add_structs(i0, evs)
    return len(evs)


_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lenient(piece: bytes, acc: _Acc) -> list | None:
    """One damaged event's bytes, read the forgiving way: bytes that are no UTF-8 replaced, integers beyond 64 bits
    and NaN taken (the standard library's parser). None when it still is not JSON."""
    piece, n_ctrl = _escape_ctrl(piece)
    # Lone surrogate escapes (\ud800 without its pair) would make strings that cannot be stored: U+FFFD instead.
    piece = _SURROGATE.sub(lambda m: m.group(0) if len(m.group(0)) == 12 else b"\\ufffd", piece)
    try:
        got = json.loads(b"[" + piece.decode("utf-8", "replace").encode() + b"]")
    except (ValueError, RecursionError):
        return None
    if any(type(e) is dict and e.get("ph") in ("B", "E") for e in got):
        raise _Fallback("B/E events")
    acc.ctrl += n_ctrl
    return got


class _Drops:
    """Damaged stretches of the event array left out: (first byte, end byte, events in them, JSON error)."""

    def __init__(self):
        self.spans: list[tuple[int, int, int]] = []

    def note(self, where: str) -> str | None:
        if not self.spans:
            return None
        n = sum(k for _, _, k in self.spans)
        shown = ", ".join(f"{a}-{b}" for a, b, _ in self.spans[:5])
        more = f" and {len(self.spans) - 5} more" if len(self.spans) > 5 else ""
        regions = f"{len(self.spans)} damaged region{'s' if len(self.spans) > 1 else ''}"
        return (f"damaged trace: dropped {n} event{'s that do' if n > 1 else ' that does'} not parse, in {regions} at "
                f"{where} {shown}{more}; every other event kept")


def _decode_region(region, base: int, acc: _Acc, i0: int, sep: bytes, comma: int, tried: bool = False) -> int:
    """The events of region (whole events and the commas between them, no brackets; its first byte at offset base of
    the decompressed file), into acc from event index i0; returns how many were kept. Region by region at once where
    it decodes; else it is cut at the event separators and halved until each damaged event stands alone, and only
    those are dropped (noted in drops), so that one bad byte costs the events around it, not the file."""
    if not tried:
        buf = bytearray(b"[") + region + b"]"
        got = _decode_chunk(buf, len(buf), acc, i0)
        if got is not None:
            return got
    data = bytes(region)
    drops = acc.drops
    starts = [0]
    ends = []
    pos = data.find(sep)
    while pos >= 0:
        ends.append(pos + comma)
        starts.append(pos + comma + 1)
        pos = data.find(sep, pos + comma + 1)
    ends.append(len(data))
    n = 0

    def one(i: int, j: int, tried: bool) -> None:
        nonlocal n
        if not tried:
            b = bytearray(b"[") + data[starts[i] : ends[j - 1]] + b"]"
            got = _decode_chunk(b, len(b), acc, i0 + n)
            if got is not None:
                n += got
                return
        if j - i > 1:
            mid = (i + j) // 2
            one(i, mid, False)
            one(mid, j, False)
            return
        piece = data[starts[i] : ends[i]]
        evs = _lenient(piece, acc)
        if evs is not None:
            acc.add_dicts(i0 + n, evs)
            n += len(evs)
            return
        if not piece.strip():
            return
        lost = max(1, piece.count(b'"ph"'))
        a, b = base + starts[i], base + ends[i]
        if drops.spans and drops.spans[-1][1] + 1 >= a:  # the next event along: one region
            a0, _, k = drops.spans.pop()
            drops.spans.append((a0, b, k + lost))
        else:
            drops.spans.append((a, b, lost))

    one(0, len(starts), True)
    return n


def _salvage_header(prefix: bytes, suffix: bytes) -> dict:
    """The header of a file truncated after its event array: the keys that precede the break."""
    for closer in (b"}", b"}}", b"]}", b"\"}", b"\"}}"):  # only the closing brackets are missing
        try:
            return orjson.loads(prefix + b"]" + suffix.rstrip() + closer)
        except orjson.JSONDecodeError:
            continue
    ends = [m.start() for m in re.finditer(rb',\s*\n  "', suffix)][-64:]  # a top-level key starts
    for i in reversed(ends):
        try:
            return orjson.loads(prefix + b"]" + suffix[:i] + b"}")
        except orjson.JSONDecodeError:
            continue
    try:
        return orjson.loads(prefix + b"]}")
    except orjson.JSONDecodeError:
        raise _Fallback("header does not parse") from None


def _parse_chunked(path: Path, source: Source, lazy: bool = False) -> tuple[dict, _Acc]:
    if not _HAS_MSGSPEC:
        raise _Fallback("msgspec not installed")
    notes: list[str] = []
    blocks = _blocks(path, notes, _slice_bytes())
    buf = bytearray()
    m = None
    for block in blocks:
        buf += block
        m = _ARR_HEAD.search(buf)
        if m or len(buf) > 4 * _BLOCK:
            break
    if m is None:
        raise _Fallback("no traceEvents array near the start")
    layout = _layout(m.group(1), bytes(buf[m.end() : m.end() + (1 << 20)]))
    if layout is None:
        raise _Fallback("one event, or an unknown layout")
    sep, arr_end = layout
    comma = sep.index(b",")
    start = m.start(1) - 1  # the "[" of the array
    prefix = bytes(buf[: start + 1]).removeprefix(_BOM)  # the header up to and including "["
    del buf[:start]  # buf now starts at "[" (a bytearray drops its front without copying)
    offset = start  # decompressed byte offset of buf[0]
    acc = _Acc()
    acc.defer_flows = lazy
    n = 0
    clean = 0  # buf[:clean] holds no separator: only what came after it is searched (a file without separators
    # would be rescanned from its start on every block, quadratic: minutes for 256 MB of zeros)
    while True:
        cut = buf.rfind(sep, max(0, clean - len(sep) + 1))
        clean = len(buf)
        if cut > 0:
            # buf[:cut + comma + 1] becomes a JSON list in place: "]" over the comma after the last event; then the
            # comma's place, now at the front, becomes the next chunk's "[".
            end = cut + comma
            buf[end] = 0x5D
            got = _decode_chunk(buf, end + 1, acc, n)
            n += got if got is not None else _decode_region(buf[1:end], offset + 1, acc, n, sep, comma, True)
            offset += end
            del buf[:end]
            buf[0] = 0x5B
            clean = len(buf)
        block = next(blocks, None)
        if block is None:
            break
        buf += block
    carry = buf
    m = arr_end.search(carry)
    if m:
        close = m.end() - 1  # the array's "]"
        got = _decode_chunk(carry, close + 1, acc, n)
        n += got if got is not None else _decode_region(carry[1:close], offset + 1, acc, n, sep, comma, True)
        header = _header(prefix, bytes(carry[m.end() :]), offset + len(carry), None, notes)
    else:
        if n == 0 and not acc.drops.spans:  # not one separator nor the array's end: a layout other than guessed
            raise _Fallback("layout not as guessed")
        header = _header(prefix, None, offset + len(carry), offset, notes)
    return _finish(header, acc, notes, source, "decompressed byte" if _gzipped(path) else "byte")


def _header(prefix: bytes, suffix: bytes | None, size: int, kept_to: int | None, notes: list) -> dict:
    """The document without its events: prefix + "]" + suffix (what follows the array), or, when the array broke
    off (suffix None), the prefix closed by hand; notes say what was kept."""
    if suffix is not None:
        try:
            return orjson.loads(prefix + b"]" + suffix)
        except orjson.JSONDecodeError:
            notes.append(f"truncated trace: breaks off after the event array (byte {size}); "
                         "kept every event and the header keys before the break")
            return _salvage_header(prefix, suffix)
    try:
        header = orjson.loads(prefix + b"]}")
    except orjson.JSONDecodeError:
        raise _Fallback("header does not parse") from None
    where = "decompressed byte" if notes else "byte"
    notes.append(f"truncated trace: the event array breaks off at {where} {size}; "
                 f"kept the complete events up to {where} {kept_to}")
    return header


def _finish(header, acc: _Acc, notes: list, source: Source, where: str = "byte") -> tuple[dict, _Acc]:
    if not isinstance(header, dict):
        raise _Fallback("header is not an object")
    acc.flush()
    dropped = acc.drops.note(where)
    if dropped:
        notes.insert(0, dropped)
    header.pop("traceEvents", None)
    if acc.ctrl:
        source.meta["control_chars_escaped"] = acc.ctrl
    if notes:
        source.status = "partial"
        source.detail = "; ".join(notes)
    return header, acc


def _parse_mapped(path: Path, source: Source, lazy: bool = False) -> tuple[dict, _Acc]:
    """A plain (not gzipped) file through the compiled scanner, memory-mapped: each chunk is scanned where it lies
    in the page cache (no read into Python memory, no copy), then its pages are let go of, so that the mapping
    never holds more than a chunk of the file in this process's memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise _Fallback("empty file")
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system that cannot map: read it block by block instead
            return _parse_chunked(path, source, lazy)
        with mm:
            return _scan_mapped(mm, size, source, lazy)


def _scan_mapped(mm, size: int, source: Source, lazy: bool = False) -> tuple[dict, _Acc]:
    chunk = _slice_bytes()
    m = _ARR_HEAD.search(mm, 0, min(size, 4 * _BLOCK))
    if m is None:
        raise _Fallback("no traceEvents array near the start")
    layout = _layout(m.group(1), mm[m.end() : m.end() + (1 << 20)])
    if layout is None:
        raise _Fallback("one event, or an unknown layout")
    sep, arr_end = layout
    comma = sep.index(b",")
    prefix = mm[: m.start(1)].removeprefix(_BOM)  # the header up to and including "["
    pos = m.start(1)  # the first event (after whitespace)
    acc = _Acc()
    acc.defer_flows = lazy
    notes: list[str] = []
    n = 0
    page = mmap.PAGESIZE

    def take(lo: int, hi: int) -> int:
        """The events in mm[lo:hi] (whole events and the commas between them)."""
        report_progress(hi, size)
        got = acc.feed(mm, hi, lo, True, n)
        if got is None:  # declined: msgspec's path, on a copy made a JSON list
            buf = bytearray(b"[") + mm[lo:hi] + b"]"
            got = _decode_chunk(buf, len(buf), acc, n)
            return got if got is not None else _decode_region(mm[lo:hi], lo, acc, n, sep, comma, True)
        first, last = lo - lo % page, hi - hi % page  # whole pages only
        if hasattr(mm, "madvise") and last > first:  # let go of the pages scanned (the file keeps them)
            mm.madvise(mmap.MADV_DONTNEED, first, last - first)
        return got

    while size - pos > chunk:
        cut = mm.rfind(sep, pos, pos + chunk)
        if cut < 0:  # one event longer than a chunk
            cut = mm.find(sep, pos + chunk)
            if cut < 0:
                break
        n += take(pos, cut + comma)
        pos = cut + comma + 1
    # The events up to the last separator first, as the block-by-block reader takes them: the array's end is then
    # looked for only after it (a damaged file can hold a stray copy of it earlier).
    cut = mm.rfind(sep, pos)
    if cut >= 0:
        n += take(pos, cut + comma)
        pos = cut + comma + 1
    m = arr_end.search(mm, pos)
    if m:
        n += take(pos, m.end() - 1)
        header = _header(prefix, mm[m.end() :], size, None, notes)
    else:  # broken off: the complete events up to the last separator
        cut = mm.rfind(sep, pos)
        kept = pos - 1
        if cut < 0 and n == 0 and not acc.drops.spans:  # not one separator nor the array's end: another layout
            raise _Fallback("layout not as guessed")
        if cut >= 0:
            n += take(pos, cut + comma)
            kept = cut + comma
        header = _header(prefix, None, size, kept, notes)
    return _finish(header, acc, notes, source)


def _parse_whole(path: Path, source: Source) -> tuple[dict, _Acc]:
    """Any other layout, and damaged input: orjson over the whole document (salvaging what it can)."""
    header, events = _parse(path, source)
    acc = _Acc()
    step = 1 << 16
    for i0 in range(0, len(events), step):
        acc.add_dicts(i0, events[i0 : i0 + step])
    acc.finish_be()
    return header, acc


# ----------------------------------------------------------------------------------------------------------------
# Steps, from host ops (the collectives table is built by ingest/_kineto_coll.py)


def _steps(host: pl.DataFrame | None) -> pl.DataFrame | None:
    if host is None or host.height == 0:
        return None
    df = host.filter(pl.col("name").str.starts_with("ProfilerStep#")).select(
        step=pl.col("name").str.extract(r"^ProfilerStep#(\d+)", 1).cast(pl.Int64, strict=False),
        ts="ts",
        end="end",
        dur="dur",
        origin=pl.lit("profiler_step"),
    )
    df = df.filter(pl.col("step").is_not_null())
    # Some exports carry a step twice (CPU and GPU-side copies); keep the widest.
    return df.sort("dur", descending=True).unique("step", keep="first").sort("ts") if df.height else None


# ----------------------------------------------------------------------------------------------------------------
# Header facts and rank


def _header_meta(header: dict, source: Source, span: tuple) -> tuple[str | None, dict]:
    meta = source.meta
    for k in ("schemaVersion", "baseTimeNanoseconds", "displayTimeUnit", "cuda_runtime_version", "cuda_driver_version",
              "cupti_version"):
        if k in header and isinstance(header[k], (int, float, str)):
            meta[k] = header[k]
    di = header.get("distributedInfo")
    backend = None
    pg_backend: dict = {}
    if isinstance(di, dict):
        for k in ("world_size", "backend", "nccl_version", "pg_count"):
            if k in di:
                meta[k] = di[k]
        backend = di.get("backend") if isinstance(di.get("backend"), str) else None
        pgc = di.get("pg_config")
        if isinstance(pgc, list):
            meta["pg_config"] = pgc
            for pg in pgc:
                if isinstance(pg, dict) and pg.get("pg_name") is not None:
                    be = str(pg.get("backend_config") or "")
                    # "cuda:nccl" or "cpu:gloo,cuda:nccl": the GPU backend where there is one.
                    parts = dict(p.split(":", 1) for p in be.split(",") if ":" in p)
                    pg_backend[str(pg["pg_name"])] = parts.get("cuda") or (next(iter(parts.values()), None))
        if backend and ("," in backend or ":" in backend):
            parts = dict(p.split(":", 1) for p in backend.split(",") if ":" in p)
            backend = parts.get("cuda") or next(iter(parts.values()), backend)
    devs = header.get("deviceProperties")
    if isinstance(devs, list):
        meta["devices"] = sorted({str(d.get("name")) for d in devs if isinstance(d, dict) and d.get("name")})
    if span[0] is not None:
        meta["trace_span_ns"] = [span[0], span[1]]
    # Rank: distributedInfo wins over the file name.
    rank = di.get("rank") if isinstance(di, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool):
        if source.rank is not None and source.rank != rank:
            meta["rank_in_file_name"] = source.rank
            note = f"distributedInfo says rank {rank}, the file name rank {source.rank}: distributedInfo is trusted"
            source.detail = f"{source.detail}; {note}" if source.detail else note
        source.rank = rank
        source.rank_origin = "distributedInfo"
    elif source.rank is not None:
        source.rank_origin = source.rank_origin or "file name"
    else:
        msg = "rank unknown: no distributedInfo and no rank in the file name"
        source.detail = f"{source.detail}; {msg}" if source.detail else msg
    if source.rank is not None:
        source.ranks = [source.rank]
    return backend, pg_backend


# ----------------------------------------------------------------------------------------------------------------


def read(path: Path, source: Source, lazy: bool = False) -> dict[str, pl.DataFrame]:
    """The source's tables. lazy: the flows table (which no rule reads) may be a model.run.Pending, built from the
    scanner's rows only if it is read (a 1 GB trace: ~0.5 CPU s of pairing 850k launches with their kernels)."""
    # Parsing allocates millions of small objects (the fallback keeps them all until the end): the cyclic GC would
    # rescan them over and over (measured: about half of the orjson parse time). Nothing here makes cycles.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read(Path(path), source, lazy)
    finally:
        if was_enabled:
            gc.enable()


def _read(path: Path, source: Source, lazy: bool = False) -> dict[str, pl.DataFrame]:
    try:
        header, acc = (_parse_mapped if _USE_KSCAN and not _gzipped(path) else _parse_chunked)(path, source, lazy)
        source.meta["parser"] = "chunks"
    except _Fallback:
        header, acc = _parse_whole(path, source)
        source.meta["parser"] = "whole"

    ids = acc.ids
    watch_point()
    kernels = acc.frame("k")
    host = _host_ops(acc.frame("h"))
    watch_point()
    runtime = acc.frame("r")
    syncs = acc.frame("s")
    flow_rows = _flow_count(acc.parts["f"]) if lazy else None
    if flow_rows is None:
        flows = _flows(acc.frame("f"))
    else:  # read only if a reader asks for it; the ids of named pids are all given by now (no flow part has one)
        flows = functools.partial(lambda parts, ids: _flows(_frame_of(parts, ids)), acc.parts["f"], ids)
    acc.parts.clear()
    watch_point()

    spans = [(df["ts"].min(), df["end"].max()) for df in (kernels, host, runtime) if df is not None and df.height]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans and all(s[0] is not None for s in spans) else (None, None)
    backend, pg_backend = _header_meta(header, source, span)
    collectives = _kineto_coll.collectives(host, acc.coll_args, runtime, kernels, backend, pg_backend)
    watch_point()
    steps = _steps(host)

    meta = source.meta
    meta["events"] = acc.n_events
    if acc.skipped:
        meta["events_not_imported"] = acc.skipped
    if acc.n_instant:
        meta["instant_events_ignored"] = acc.n_instant
    if ids.strings:
        meta["string_ids"] = ids.strings
    if acc.mtia or acc.skipped.get("mtia_ccp_events"):
        note = "MTIA trace: runtime calls imported; device events (mtia_ccp_events) are not imported as kernels"
        source.detail = f"{source.detail}; {note}" if source.detail else note
    if kernels is None and host is None and runtime is None:
        if source.status == "partial" and acc.n_events == 0 and acc.drops.spans:
            raise IngestError(
                f"{path.name}: no trace event parses ({source.detail}); re-export the trace, or copy it again if the "
                "file was damaged in transfer"
            )
        if source.status == "partial" and acc.n_events == 0:
            # cut off before its first complete event: nothing was salvaged, so nothing can be analysed
            raise IngestError(
                f"{path.name}: truncated before its first complete event ({path.stat().st_size} bytes); re-export "
                "the trace, or copy it again if the transfer was cut short"
            )
        note = "no host ops, runtime calls or kernels in the trace"
        source.detail = f"{source.detail}; {note}" if source.detail else note

    rank = source.rank
    out = {}

    def stamped(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.lit(source.id, dtype=pl.Int32).alias("source"))

    for name, df in (("kernels", kernels), ("host_ops", host), ("runtime", runtime), ("syncs", syncs),
                     ("flows", flows), ("collectives", collectives), ("steps", steps)):
        if callable(df):  # the flows, not built yet
            if flow_rows:
                out[name] = Pending(flow_rows, lambda build=df: stamped(build()))
            continue
        if df is None or df.height == 0:
            continue
        out[name] = stamped(df)
    return out

