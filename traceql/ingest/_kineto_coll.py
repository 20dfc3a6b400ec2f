"""The collectives table of a Kineto trace, from its host ops, runtime calls and kernels.

The same table as kineto._collectives gives, without its Python loop per call: the ancestor walks that pair a
record_param_comms op with its nccl:/gloo: annotation climb one hop at a time for all the candidates at once, and
the comm kernels of each call (launched with its external id, or from inside it on its thread) are found for all
calls at once, by bisection over sorted keys. Only the args dicts, Python already, are read in Python, a column at
a time.

The tables are small (thousands of rows): what costs is polars' overhead per call, ~5 us for a Series method
that runs natively (indexing by a Series, filter, scatter, comparisons) and 100-200 us for one that goes through an
expression and a query (gather, is_in, rank, search_sorted, any DataFrame method). So the walks use the first kind
only, and the second kind is kept to a few calls per table; the one lazy query runs on the in-memory engine.
Measured (CPU, best of 3) on a 98 MB trace: 50-80 ms for the loop, 12-15 ms here; on 1 GB: 600 ms, 70-80 ms.
"""

from __future__ import annotations

from itertools import compress

import orjson
import polars as pl

from traceql.ingest.collective_names import ANNOTATION as _ANNOT
from traceql.ingest.collective_names import NOT_COLLECTIVE as _NOT_COLLECTIVE
from traceql.ingest.collective_names import arg_int as _int1
from traceql.ingest.collective_names import canonical_collective, dtype_bytes

_HOPS = 64  # how far up the nesting an annotation and its record_param_comms op may be apart
_SEQ_KEYS = ("Seq", "seq", "seq_num", "Seq num", "sequence_number")  # the first one present wins
_EMPTY: dict = {}
_I64 = 1 << 63
_INT_COLS = ("id", "seq", "in_nelems", "out_nelems", "bytes", "ts", "end", "dur", "host_op_id", "kernel_ts",
             "kernel_end")
# The table's types. Values that do not fit them (a group size beyond int32, bytes beyond int64, a description
# that is no string) are read as null or text, so one odd call cannot fail the whole file.
_SCHEMA = {k: pl.Int64 for k in _INT_COLS} | {"group_size": pl.Int32, "op": pl.Utf8, "backend": pl.Utf8,
                                             "pg_name": pl.Utf8, "pg_desc": pl.Utf8, "pg_ranks": pl.Utf8,
                                             "dtype": pl.Utf8}


def collectives(host: pl.DataFrame | None, coll_args: dict, runtime: pl.DataFrame | None,
                kernels: pl.DataFrame | None, header_backend: str | None, pg_backend: dict) -> pl.DataFrame | None:
    """One row per collective call, in host-op order: each record_param_comms op, and each nccl:/gloo: annotation
    with no record_param_comms op under or over it. None where there is none."""
    if host is None or host.height == 0:
        return None
    found = _HostOps(host).calls(pl.Series(list(coll_args), dtype=pl.Int64))
    if found is None:
        return None
    rows, rid, annot = found
    ids = host["id"][rows]
    # the args keys any call may have: the columns of the others are all null, without a look at each call
    try:
        present = set().union(*coll_args.values())
    except TypeError:  # a value that is no dict (None): the loop takes it as no args
        present = set().union(*(a for a in coll_args.values() if a))
    args = [coll_args.get(h) or _EMPTY for h in ids.to_list()] if present else None
    op, backend = _ops(ids, host["name"][rows], rid, annot, args, present)
    if op.null_count():  # calls that are not collectives
        if op.null_count() == len(op):
            return None
        keep = op == op  # x == x: null where x is
        rows, op, backend = rows.filter(keep), op.filter(keep), backend.filter(keep)
        if args is not None:
            args = list(compress(args, keep.to_list()))
    n = len(rows)
    cols = _from_args(args, present, n)
    pg_name = cols["pg_name"]
    if isinstance(pg_name, list):
        fallback = pl.Series([pg_backend.get(p) or header_backend for p in pg_name], dtype=pl.Utf8)
        backend = backend.fill_null(fallback)
    elif (fallback := pg_backend.get(None) or header_backend) is not None:
        backend = backend.fill_null(pl.Series([fallback], dtype=pl.Utf8).new_from_index(0, n))
    at = {c: host[c][rows] for c in ("id", "pid", "tid", "ts", "end", "dur", "external_id")}
    times = _kernel_times(at, runtime, kernels)
    if times is None:
        kts = kend = _full(None, n, pl.Int64)
    else:
        kts, kend = times
        # a call with comm kernels and no backend named anywhere ran on NCCL
        b = pl.lit(backend)
        nccl = pl.when(b.is_null() & pl.lit(kts).is_not_null()).then(pl.lit("nccl"))
        backend = pl.select(nccl.otherwise(b)).to_series()
    return pl.DataFrame(
        {"id": at["id"], "op": op, "backend": backend, **cols, "ts": at["ts"], "end": at["end"], "dur": at["dur"],
         "host_op_id": at["id"], "kernel_ts": kts, "kernel_end": kend},
        schema_overrides=_SCHEMA,
    )


# ----------------------------------------------------------------------------------------------------------------
# Host ops: candidates and ancestors


class _HostOps:
    """The host-op table's ids, names and nesting, for the candidate calls' lookups."""

    def __init__(self, host: pl.DataFrame):
        self.host = host
        self.n = host.height
        self.ids = host["id"]
        self.names = host["name"]
        self.parent = host["parent"]
        self.table = _id_table(self.ids)  # id -> row where the ids allow one
        self._parent_row = None

    def rows_of(self, keys: pl.Series) -> pl.Series:
        """The rows holding these ids, in host order."""
        if self.table is None:
            return pl.Series(range(self.n), dtype=pl.UInt32).filter(self.ids.is_in(keys.implode()))
        rows = self.table[keys.filter((keys >= 0) & (keys < len(self.table))).cast(pl.UInt32)]
        return rows.filter(rows == rows).sort()  # x == x: null where x is

    def parent_of(self, rows: pl.Series) -> pl.Series:
        """The rows of these rows' parents: null at the top, or where the parent id is not a host op's."""
        if self.table is not None:
            p = self.parent[rows]
            out = (p < 0) | (p >= len(self.table))
            # indices as UInt32: polars' own type for them, taken as they are
            return self.table[(p.set(out, None) if out.any() else p).cast(pl.UInt32)]
        if self._parent_row is None:
            self._parent_row = _parent_rows(self.host).cast(pl.UInt32)
        return self._parent_row[rows]

    def calls(self, keys: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series] | None:
        """The rows of the candidate calls, in host order, and the (op id, annotation name) pairs, an op's first
        pair first; None where there is no candidate."""
        # The candidates were picked per chunk (their args are in coll_args): record_param_comms ops and annotations.
        rows = self.rows_of(keys)
        is_rpc = self.names[rows] == "record_param_comms"
        rpc_rows = rows.filter(is_rpc)
        other = rows.filter(~is_rpc)
        annot_rows = other.filter(self.names[other].str.contains("(?i)" + _ANNOT.pattern))
        if rpc_rows.is_empty() and annot_rows.is_empty():
            return None
        ids = self.ids
        # Per host row, bit 1: a record_param_comms candidate's id, bit 2: an annotation's.
        if self.table is not None:  # distinct ids: the host ops holding a candidate's id are the candidates
            role = _full(0, self.n, pl.Int8).scatter(rpc_rows, 1).scatter(annot_rows, 2)
        else:
            rpc_mask = ids.is_in(ids[rpc_rows].implode()).fill_null(False)
            annot_mask = ids.is_in(ids[annot_rows].implode()).fill_null(False)
            role = rpc_mask.cast(pl.Int8) + annot_mask.cast(pl.Int8) * 2

        # An annotation and a record_param_comms op describe one call when one is the nearest such ancestor of the
        # other. The op takes the first annotation found: those under it (in host order), then the one over it.
        na, nr = len(annot_rows), len(rpc_rows)
        up = self.first_ancestor(pl.concat([annot_rows, rpc_rows]),
                                 pl.concat([_full(1, na, pl.Int8), _full(2, nr, pl.Int8)]), role)
        up_a, up_r = up.head(na), up.slice(na)
        found = up_a == up_a  # x == x: null where x is
        below_rpc, below_annot = up_a.filter(found), annot_rows.filter(found)
        found = up_r == up_r
        above_rpc, above_annot = rpc_rows.filter(found), up_r.filter(found)
        rid = pl.concat([ids[below_rpc], ids[above_rpc]])
        annot = pl.concat([self.names[below_annot], self.names[above_annot]])
        related = pl.concat([below_annot, above_annot])
        if self.table is not None:
            alone = ~_full(False, self.n, pl.Boolean).scatter(related, True)[annot_rows]
            calls = pl.concat([rpc_rows, annot_rows.filter(alone)]).sort()
        else:
            calls = rpc_mask | (annot_mask & ~ids.is_in(ids[related].implode()))
            calls = pl.Series(range(self.n), dtype=pl.UInt32).filter(calls)
        return calls, rid, annot

    def first_ancestor(self, starts: pl.Series, want: pl.Series, role: pl.Series) -> pl.Series:
        """For each start row, the first strict ancestor row (within _HOPS hops) whose role has a bit of the start's
        want, else null. All the starts climb together, one hop per step; those that hit or reach the top drop out."""
        out = _full(None, len(starts), pl.UInt32)
        pos = pl.Series(range(len(starts)), dtype=pl.UInt32)
        cur = self.parent_of(starts)
        for _ in range(_HOPS):
            if cur.null_count():  # at the top
                live = cur == cur
                pos, cur, want = pos.filter(live), cur.filter(live), want.filter(live)
                if cur.is_empty():
                    break
            hit = (role[cur] & want) != 0
            if hit.any():
                out.scatter(pos.filter(hit), cur.filter(hit))
                miss = ~hit
                pos, cur, want = pos.filter(miss), cur.filter(miss), want.filter(miss)
                if cur.is_empty():
                    break
            cur = self.parent_of(cur)
        return out


def _full(value, n: int, dtype) -> pl.Series:
    """n copies of value (~10 us, where a Series built from a list of 4000 costs ~100 us)."""
    return pl.Series([value], dtype=dtype).new_from_index(0, n)


def _id_table(ids: pl.Series) -> pl.Series | None:
    """id -> row, as a table indexed by id, where the ids are distinct, increasing, non-negative and not too sparse
    (Kineto's host ops: their event indices, 4 bytes per event of the file); None where they are not. One scatter,
    where a search over the ids would cost a pass over them per lookup."""
    n = len(ids)
    if ids.null_count() or not ids.is_sorted() or ids.n_unique() != n or ids[0] < 0 or ids[-1] >= 16 * n + (1 << 22):
        return None
    return _full(None, ids[-1] + 1, pl.UInt32).scatter(ids, pl.Series(range(n), dtype=pl.UInt32))


def _parent_rows(host: pl.DataFrame) -> pl.Series:
    """Every host op's parent row, as kineto._collectives finds it where the ids are not distinct and increasing."""
    ids = host["id"]
    if ids.is_sorted():  # the first of equal ids
        parent_row = ids.search_sorted(host["parent"].fill_null(-1), side="left").cast(pl.Int64)
        found = ids.gather(parent_row.clip(0, max(host.height - 1, 0))) == host["parent"]
        return parent_row.set(~found.fill_null(False), None)
    # B/E pairs appended out of order: a join instead
    return (
        host.select("parent")
        .join(host.select("id").with_row_index("r"), left_on="parent", right_on="id", how="left",
              maintain_order="left")["r"].cast(pl.Int64)
    )


# ----------------------------------------------------------------------------------------------------------------
# From the args


def _ops(ids: pl.Series, names: pl.Series, rid: pl.Series, annot: pl.Series, args: list | None,
         present: set) -> tuple[pl.Series, pl.Series]:
    """Per call: the collective (null where the call is not one) and the backend its annotation names, worked out
    once per distinct name. An annotation stands for itself; a record_param_comms op takes its collective name, else
    the name of its annotation (the first of its pairs)."""
    def collective(name):
        op = canonical_collective(name) if name else None
        return None if op in _NOT_COLLECTIVE else op

    is_rpc = names == "record_param_comms"  # else an annotation
    all_rpc = is_rpc.all()
    # (name, op, backend) of each distinct annotation an op takes, and of each annotation that is a call
    by_annot, by_name = {}, {}
    for a in annot.unique().to_list():
        by_annot[a] = (collective(a), a.split(":", 1)[0].lower())
    if not all_rpc:
        for name in names.filter(~is_rpc).unique().to_list():
            m = _ANNOT.match(name)
            by_name[name] = (collective(m.group(2)), m.group(1).lower())
    schema = {"name": pl.Utf8, "op": pl.Utf8, "backend": pl.Utf8}
    got = (
        pl.DataFrame({"id": ids, "name": names}).lazy()
        .join(pl.DataFrame({"id": rid, "annot": annot}).lazy().unique("id", keep="first", maintain_order=True),
              on="id", how="left", maintain_order="left")
        .join(pl.DataFrame([(k, *v) for k, v in by_annot.items()], schema=schema, orient="row").lazy()
              .rename({"name": "annot"}), on="annot", how="left", maintain_order="left")
        .join(pl.DataFrame([(k, *v) for k, v in by_name.items()], schema=schema, orient="row").lazy()
              .rename({"op": "op_a", "backend": "backend_a"}), on="name", how="left", maintain_order="left")
        .collect(engine="in-memory")  # small tables: the streaming engine (the default) costs 2-3x more here
    )
    op, backend = got["op"], got["backend"]
    if "Collective name" in present:
        # its own collective name first: Python values, of any type, as the loop took them
        key = [(r if r or not a else a) if p else None
               for p, r, a in zip(is_rpc.to_list(), (a.get("Collective name") for a in args), got["annot"].to_list())]
        op_of = {k: collective(k) for k in set(key)}
        op = pl.Series([op_of[k] for k in key], dtype=pl.Utf8)
    if not all_rpc:
        op, backend = op.zip_with(is_rpc, got["op_a"]), backend.zip_with(is_rpc, got["backend_a"])
    return op, backend


def _from_args(args: list | None, present: set, n: int) -> dict[str, list | pl.Series]:
    """The columns read from the n calls' args, as kineto._collectives reads them: lists where a call may have the
    key (present: the keys any call may have; args None where none has any), typed null Series where none has."""
    none = _full(None, n, pl.Int64)

    def col(key: str) -> list:
        return [a.get(key) for a in args]

    def ints(key: str) -> list | pl.Series:
        if key not in present:
            return none
        # plain ints in range as they are, the rest as arg_int reads them
        return [v if type(v) is int and -_I64 <= v < _I64 else (None if v is None else _int1(v)) for v in col(key)]

    def text(key: str, of) -> list | pl.Series:
        return [None if v is None else of(v) for v in col(key)] if key in present else none.cast(pl.Utf8)

    in_n = ints("In msg nelems")
    seq = none
    if present.intersection(_SEQ_KEYS):
        seq = []
        for a in args:
            for k in _SEQ_KEYS:
                v = a.get(k)
                if v is not None:
                    seq.append(_int1(v))
                    break
            else:
                seq.append(None)
    nbytes = none
    dtype = text("dtype", str)
    if "In msg nelems" in present and "dtype" in present:
        size = [dtype_bytes(d) for d in col("dtype")]
        nbytes = [k * s if k is not None and s and -_I64 <= k * s < _I64 else None for k, s in zip(in_n, size)]
    if "Input Dims" in present:
        # gloo calls have no record_param_comms op: their annotation (gloo:all_reduce) carries its tensors' shapes
        # and dtypes when the profiler recorded shapes; the message is the sum of its input tensors
        in_n, dtype, nbytes = (list(c) if not isinstance(c, list) else c for c in (in_n, dtype, nbytes))
        for i, a in enumerate(args):
            if in_n[i] is None and a.get("Input Dims") is not None:
                got = _input_size(a.get("Input Dims"), a.get("Input type"))
                if got is not None:
                    in_n[i], dtype[i], nbytes[i] = got
    return {
        "pg_name": text("Process Group Name", str),
        "pg_desc": text("Process Group Description", str),
        "pg_ranks": text("Process Group Ranks", lambda r: r if isinstance(r, str) else orjson.dumps(r).decode()),
        "group_size": ([v if v is not None and -(1 << 31) <= v < 1 << 31 else None for v in ints("Group size")]
                       if "Group size" in present else none.cast(pl.Int32)),
        "seq": seq,
        "in_nelems": in_n,
        "out_nelems": ints("Out msg nelems"),
        "dtype": dtype,
        "bytes": nbytes,
    }


def _input_size(dims, types) -> tuple[int, str, int] | None:
    """(elements, dtype, bytes) of a call's input tensors from its Input Dims and Input type args (a shape and a
    dtype name per input); None where no input is a tensor of a known dtype or the args are malformed."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    n = b = 0
    first = None
    for d, t in zip(dims, types):
        size = dtype_bytes(t) if isinstance(t, str) else None
        if size is None or not isinstance(d, list) or not all(type(x) is int and x >= 0 for x in d):
            continue  # not a tensor (a scalar, a list of tensors, an empty slot)
        k = 1
        for x in d:
            k *= x
        n += k
        b += k * size
        first = first or (t[5:] if t.startswith("c10::") else t)  # "c10::BFloat16": the name record_param_comms uses
    if first is None or not -_I64 <= b < _I64:
        return None
    return n, first, b


# ----------------------------------------------------------------------------------------------------------------
# Kernel times


def _kernel_times(calls: dict[str, pl.Series], runtime: pl.DataFrame | None,
                  kernels: pl.DataFrame | None) -> tuple[pl.Series, pl.Series] | None:
    """(kernel_ts, kernel_end) per call: the start of its first comm kernel and the end of its last, over the
    kernels launched with its external id and those launched from inside it ([ts, end], both ends included) on its
    thread. None where there are no comm kernels or no runtime calls."""
    if kernels is None or not kernels.height or runtime is None or not runtime.height:
        return None
    kc = kernels["correlation"]
    comm = (kernels["kind"] == "comm") & (kc == kc)  # x == x: null where x is
    kc, kts, kend = kc.filter(comm), kernels["ts"].filter(comm), kernels["end"].filter(comm)
    if kc.is_empty():
        return None
    if kc.n_unique() != len(kc):  # one span per correlation
        g = pl.DataFrame({"c": kc, "t": kts, "e": kend}).group_by("c", maintain_order=True).agg(
            pl.col("t").min(), pl.col("e").max()
        )
        kc, kts, kend = g["c"], g["t"], g["e"]
    rc = runtime["correlation"]
    launched = rc.is_in(kc.implode())
    if not launched.any():
        return None
    # Each launch's kernel span, by bisection over the sorted correlations.
    kc, (kts, kend) = _sorted(kc, kts, kend)
    at = kc.search_sorted(rc.filter(launched), side="left")
    lkts, lkend = kts[at], kend[at]
    lx, lpid, ltid, lts = (runtime[c].filter(launched) for c in ("external_id", "pid", "tid", "ts"))
    n = len(calls["ts"])
    index, lindex = pl.Series(range(n), dtype=pl.UInt32), pl.Series(range(len(lx)), dtype=pl.UInt32)
    pairs = []  # (call, launch) index pairs

    # Launches with the call's external id.
    x = calls["external_id"]
    have, lhave = x == x, lx == lx
    if have.any() and lhave.any():
        x = x.filter(have)
        pairs.append(_between(lx.filter(lhave), lindex.filter(lhave), index.filter(have), x, x))

    # Launches inside the call on its thread: keys ordered by (thread, time). Launches without a time are never
    # inside a call.
    ts, end = calls["ts"], calls["end"]
    timed, ltimed = (ts == ts) & (end == end), lts == lts
    if timed.any() and ltimed.any():
        lpid, ltid, lts = lpid.filter(ltimed), ltid.filter(ltimed), lts.filter(ltimed).cast(pl.Int64)
        pid, tid, ts, end = (calls[c].filter(timed) for c in ("pid", "tid", "ts", "end"))
        ts, end = ts.cast(pl.Int64), end.cast(pl.Int64)
        if not _one_value(lpid, pid) or not _one_value(ltid, tid):
            # several threads: one int64 key from dense ranks of the thread and of the time (each at most the
            # number of values), whatever the values
            nl, nc = len(lts), len(ts)
            pid = _rank(pl.concat([lpid.cast(pl.Int64), pid.cast(pl.Int64)]))
            tid = _rank(pl.concat([ltid.cast(pl.Int64), tid.cast(pl.Int64)]))
            thread = _rank(pid * (tid.max() + 1) + tid)
            t = _rank(pl.concat([lts, ts, end]))
            key = pl.concat([thread, thread.slice(nl)]) * (t.max() + 1) + t  # launches, call starts, call ends
            lts, ts, end = key.head(nl), key.slice(nl, nc), key.slice(nl + nc)
        pairs.append(_between(lts, lindex.filter(ltimed), index.filter(timed), ts, end))

    call_i = pl.concat([c for c, _ in pairs]) if pairs else index.clear()
    if call_i.is_empty():
        return _full(None, n, lkts.dtype), _full(None, n, lkend.dtype)
    launch_i = pl.concat([j for _, j in pairs])
    t0, t1 = lkts[launch_i], lkend[launch_i]
    if call_i.n_unique() != len(call_i):
        g = pl.DataFrame({"i": call_i, "t": t0, "e": t1}).group_by("i").agg(pl.col("t").min(), pl.col("e").max())
        call_i, t0, t1 = g["i"], g["t"], g["e"]
    return _full(None, n, t0.dtype).scatter(call_i, t0), _full(None, n, t1.dtype).scatter(call_i, t1)


def _one_value(a: pl.Series, b: pl.Series) -> bool:
    """Whether a and b hold one value between them, and no null."""
    return not a.null_count() and not b.null_count() and a.min() == a.max() == b.min() == b.max()


def _rank(values: pl.Series) -> pl.Series:
    """Dense ranks from 1, nulls ranked 0: equal values, equal ranks."""
    r = values.rank("dense").cast(pl.Int64)
    return r.fill_null(0) if r.null_count() else r


def _sorted(keys: pl.Series, *with_keys: pl.Series) -> tuple[pl.Series, list[pl.Series]]:
    """keys sorted, and the other series in the same order (often already sorted: a check is cheaper than a sort)."""
    if keys.is_sorted():
        return keys, list(with_keys)
    order = keys.arg_sort()
    return keys[order], [s[order] for s in with_keys]


def _between(keys: pl.Series, key_rows: pl.Series, rows: pl.Series, lo: pl.Series,
             hi: pl.Series) -> tuple[pl.Series, pl.Series]:
    """(row, key_row) pairs: for each of rows, the key_rows whose key is within its [lo, hi], by bisection on the
    sorted keys (bisect_left on lo, bisect_right on hi)."""
    keys, (key_rows,) = _sorted(keys, key_rows)
    found = pl.select(a=pl.lit(keys).search_sorted(lo, side="left"), b=pl.lit(keys).search_sorted(hi, side="right"))
    start = found["a"].cast(pl.Int64)
    n = found["b"].cast(pl.Int64) - start
    some = n > 0
    if not some.any():
        return rows.clear(), key_rows.clear()
    if n.max() == 1:
        return rows.filter(some), key_rows[start.filter(some).cast(pl.UInt32)]
    many = pl.DataFrame({"i": rows, "a": start, "b": start + n}).filter(some).select("i", j=pl.int_ranges("a", "b"))
    many = many.explode("j")
    return many["i"], key_rows[many["j"].cast(pl.UInt32)]
