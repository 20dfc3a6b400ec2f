"""Nsight Systems SQLite exports (`nsys export --type sqlite`), nsys 2022.1 to 2026.x.

One process with GPU activity is one rank; a file can hold several. What the export holds and how it changed:

- Tables exist only when they have rows, and carry no indexes. Names are ids into StringIds.
- Kernel names: demangledName / shortName / mangledName (all ids). Which are communication (NCCL, RCCL, MSCCL,
  NVSHMEM, DeepEP, custom all-reduce) is decided by ingest/kernel_names.py, as for Kineto.
- globalTid / globalPid pack the process: pid = (g >> 24) & 0xFFFFFF, tid = g & 0xFFFFFF. Correlation ids repeat
  across processes, so a kernel joins its launch on correlation AND pid.
- Runtime API names carry a version suffix (cudaLaunchKernel_v7000); it is dropped.
- ENUM_* tables (memcpy kinds, memory kinds, sync types) appear in newer exports; the CUPTI enum values are the
  fallback for older ones (2022.1 has none).
- META_DATA_EXPORT was EXPORT_META_DATA in 2022. TARGET_INFO_GPU may be missing (time-sliced exports).
- Time base: from 2026.1 event timestamps count from the start of the session (DIAGNOSTIC_EVENT "Profiling has
  started." sits at 0, ANALYSIS_DETAILS.startTime holds the target clock at that moment). Such times are shifted
  by startTime so that every export of one host lands on that host's clock, as older exports already do.
- Exports carry hostnames, user names, command lines and environment variables: none of it lands in a table,
  detail or meta unless TRACEQL_SHOW_SENSITIVE=1.

Reading is column-wise SQL plus polars joins: no Python work per row beyond the sqlite3 cursor.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from traceql.ingest import IngestError
from traceql.ingest.kernel_names import comm_kernel_expr, kernel_collective_expr, runtime_kind_expr
from traceql.ingest.sniff import nsys as sniff  # noqa: F401  (discovery's test, kept in one place)


def _adbc():
    """The optional ADBC driver (reads SQLite straight into Arrow, about 3x faster than sqlite3's tuples on big
    exports), imported on first use: it pulls in pyarrow.dataset, which a run without nsys exports never needs."""
    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:  # pragma: no cover - depends on the install
        return None
    return adbc

KIND = "nsys"
SUPPORTED = True

# Step ranges among NVTX ranges: torch.profiler's ProfilerStep#N, or user ranges "step 3", "step_3", "Step#3".
STEP_PATTERN = r"(?i)^(?:ProfilerStep#(\d+)|step[ _#]?(\d+))$"
STEP_PATTERN_ENV = "TRACEQL_NSYS_STEP_PATTERN"
SENSITIVE_ENV = "TRACEQL_SHOW_SENSITIVE"
READER_ENV = "TRACEQL_NSYS_READER"  # "sqlite3" forces the standard-library reader even where ADBC is installed

# Environment variables (in the launched process's recorded environment) that name the global rank, best first.
_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
# the world size the launcher gave the process (torchrun, Open MPI, PMI, Slurm): which ranks the run dir should hold
_WORLD_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_RANK_ARG = re.compile(r"^--(?:rank|global[-_]rank)(?:=(\d+))?$")

# CUPTI enum values, for exports without ENUM_* tables (nsys 2022.x).
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
_MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed", 5: "device", 6: "managed"}
_SYNC_KIND = {1: "event_sync", 2: "stream_wait_event", 3: "stream_sync", 4: "context_sync"}
# NVTX_EVENTS.eventType of ranges: push/pop and start/end, plain and NVTXT variants.
_NVTX_RANGE_TYPES = (59, 60, 70, 71)

# Suffixes that torch's emit_nvtx / record_function NVTX adds to op names ("aten::add, op_id = 12, sizes = [...]").
_NVTX_OP_SUFFIX = r", (?:seq|op_id|sizes|input_op_ids) = .*$"
# NCCL's own NVTX API ranges that are collective calls (not group/communicator management).
_NCCL_API = r"^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AllToAll|AlltoAll|Gather|Scatter)$"


class _Db:
    """A read-only connection plus what the export holds: table names, their columns, strings, enums."""

    def __init__(self, path: Path):
        self.path = path
        uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
        try:
            self.con = sqlite3.connect(uri, uri=True, timeout=0.5, check_same_thread=False)
            # Text that is not UTF-8 (a damaged or hand-edited export) reads with U+FFFD, not as an exception.
            self.con.text_factory = lambda b: b.decode("utf-8", "replace")
            self.con.execute("PRAGMA query_only = 1")
            self.tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise IngestError(_db_error(path, e)) from None
        except UnicodeDecodeError:  # SQLite's own message quoted bytes of a damaged schema that are not UTF-8
            raise IngestError(_db_error(path, sqlite3.DatabaseError("database disk image is malformed"))) from None
        self._cols: dict[str, set[str]] = {}
        self.fast = None
        adbc = _adbc() if os.environ.get(READER_ENV, "") != "sqlite3" else None
        if adbc is not None:
            try:
                self.fast = adbc.connect(uri)
            except Exception:  # any trouble: the sqlite3 reader does the job, only slower
                self.fast = None

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')}
        return self._cols[table]

    def has(self, table: str) -> bool:
        return table in self.tables

    def frame(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        if self.fast is not None:
            try:
                cur = self.fast.cursor()
                try:
                    cur.execute(sql)
                    df = pl.from_arrow(cur.fetch_arrow_table())
                finally:
                    cur.close()
                df = df.rename(dict(zip(df.columns, schema)))
                # strict: a column typed from its first rows that does not fit fails here, and sqlite3 reads it
                return df.select(pl.col(c).cast(t, strict=True) for c, t in schema.items())
            except Exception:
                self.close_fast()
        try:
            cur = self.con.execute(sql)
            out = []
            while True:  # in slices, so that a big table never holds all its Python tuples at once
                rows = cur.fetchmany(500_000)
                if not rows:
                    break
                out.append(_rows_frame(rows, schema))
        except sqlite3.DatabaseError as e:
            raise IngestError(_db_error(self.path, e)) from None
        return pl.concat(out) if out else pl.DataFrame(schema=schema)

    def close_fast(self) -> None:
        if self.fast is not None:
            try:
                self.fast.close()
            except Exception:
                pass
            self.fast = None

    def close(self) -> None:
        self.close_fast()
        self.con.close()

    def enum(self, table: str) -> dict[int, str]:
        if not self.has(table) or not {"id", "name"} <= self.cols(table):
            return {}
        return {i: str(n) for i, n in self.con.execute(f'SELECT id, name FROM "{table}"')
                if n is not None and type(i) is int}


def _rows_frame(rows: list[tuple], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """sqlite3's rows as a frame. SQLite columns hold any type in any row: a value that does not fit its column (text
    or a blob where an id belongs, an integer beyond int64, a float with a fraction) reads as null."""
    try:
        return pl.DataFrame(rows, schema=schema, orient="row")
    except (pl.exceptions.PolarsError, TypeError, OverflowError, ValueError):
        pass
    cols = list(zip(*rows)) if rows else [() for _ in schema]
    out = {}
    for (name, dtype), vals in zip(schema.items(), cols):
        if dtype == pl.Utf8:
            vals = [v if v is None or type(v) is str else None for v in vals]
        else:
            vals = [v if type(v) is int and -(1 << 63) <= v < (1 << 63)
                    else int(v) if type(v) is float and v.is_integer() and abs(v) < 9e18 else None for v in vals]
        out[name] = pl.Series(name, vals, dtype=dtype, strict=False)
    return pl.DataFrame(out)


def _db_error(path: Path, e: Exception) -> str:
    msg = " ".join(str(e).split())  # one line, whatever SQLite says
    low = msg.lower()
    if "not a database" in low or "file is encrypted" in low:
        return f"{path.name}: not an SQLite database (SQLite says: {msg}); export the report with nsys export --type sqlite"
    if "malformed" in low or "disk i/o" in low:
        return (f"{path.name}: truncated or corrupt export (SQLite says: {msg}); "
                "re-run nsys export --type sqlite on the .nsys-rep and copy the file again")
    if "locked" in low or "busy" in low:
        return f"{path.name}: export is locked by another process (SQLite says: {msg}); wait for nsys export to finish and retry"
    return f"{path.name}: cannot read the SQLite export (SQLite says: {msg}); re-export it with nsys export --type sqlite"


def step_pattern() -> str:
    return os.environ.get(STEP_PATTERN_ENV) or STEP_PATTERN


def _show_sensitive() -> bool:
    return os.environ.get(SENSITIVE_ENV, "") == "1"


# ---------------------------------------------------------------------------------------------------------------
# Small vectorised helpers


def _pid(col: str) -> pl.Expr:
    return ((pl.col(col) // (1 << 24)) % (1 << 24)).cast(pl.Int64)


def _tid(col: str) -> pl.Expr:
    return (pl.col(col) % (1 << 24)).cast(pl.Int64)


def _map(col: str, mapping: dict[int, str], alias: str) -> pl.Expr:
    if not mapping:
        return pl.lit(None, dtype=pl.Utf8).alias(alias)
    return pl.col(col).replace_strict(mapping, default=None, return_dtype=pl.Utf8).alias(alias)


def _enum_or(db: _Db, table: str, fallback: dict[int, str], convert) -> dict[int, str]:
    names = db.enum(table)
    if not names:
        return fallback
    out = {}
    for i, n in names.items():
        v = convert(n)
        if v is not None:
            out[i] = v
    return out


def _copy_kind_name(enum_name: str) -> str | None:
    m = re.search(r"(HTOD|DTOH|HTOA|ATOH|ATOA|ATOD|DTOA|DTOD|HTOH|PTOP)$", enum_name)
    if not m:
        return None
    s = m.group(1)
    return s[0] + "to" + s[3]


def _mem_kind_name(enum_name: str) -> str | None:
    for key, val in (("PAGEABLE", "pageable"), ("PINNED", "pinned"), ("DEVICE", "device"), ("ARRAY", "array"),
                     ("MANAGED", "managed")):
        if key in enum_name:
            return val
    return None


def _sync_kind_name(enum_name: str) -> str | None:
    for key, val in (("STREAM_WAIT_EVENT", "stream_wait_event"), ("EVENT_SYNCHRONIZE", "event_sync"),
                     ("STREAM_SYNCHRONIZE", "stream_sync"), ("CONTEXT_SYNCHRONIZE", "context_sync")):
        if key in enum_name:
            return val
    return None


def _camel_to_snake(e: pl.Expr) -> pl.Expr:
    return e.str.replace_all(r"([a-z0-9])([A-Z])", "${1}_${2}").str.to_lowercase()


# ---------------------------------------------------------------------------------------------------------------
# Tables


def _strings(db: _Db) -> pl.DataFrame:
    if not db.has("StringIds"):
        return pl.DataFrame(schema={"sid": pl.Int64, "value": pl.Utf8})
    return db.frame("SELECT id, value FROM StringIds", {"sid": pl.Int64, "value": pl.Utf8})


def _name(df: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
    return (df.join(strings.rename({"sid": id_col, "value": out}), on=id_col, how="left", maintain_order="left")
            .drop(id_col))


def _kernels(db: _Db, strings: pl.DataFrame) -> pl.DataFrame:
    frames = []
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if db.has(t):
        cols = db.cols(t)
        name_col = next((c for c in ("demangledName", "shortName", "mangledName", "name") if c in cols), None)
        if name_col is None:
            return pl.DataFrame()
        k = db.frame(
            f'SELECT start, "end", deviceId, streamId, correlationId, globalPid, "{name_col}" FROM {t}',
            {"ts": pl.Int64, "end": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64,
             "gpid": pl.Int64, "name_id": pl.Int64})
        k = _name(k, strings, "name_id", "name")
        # classified once per distinct name (the shared classifier, as for Kineto), then joined back
        u = k.select(pl.col("name").unique()).with_columns(_comm=comm_kernel_expr(pl.col("name")))
        u = u.select("name", pl.when(pl.col("_comm")).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("kind"),
                     pl.when(pl.col("_comm")).then(kernel_collective_expr(pl.col("name"))).alias("collective"))
        k = k.join(u, on="name", how="left", nulls_equal=True, maintain_order="left")
        frames.append(k)
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if db.has(t):
        cols = db.cols(t)
        src = "srcKind" if "srcKind" in cols else "NULL"
        dst = "dstKind" if "dstKind" in cols else "NULL"
        m = db.frame(
            f'SELECT start, "end", deviceId, streamId, correlationId, globalPid, bytes, copyKind, {src}, {dst} FROM {t}',
            {"ts": pl.Int64, "end": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64,
             "gpid": pl.Int64, "bytes": pl.Int64, "ck": pl.Int64, "sk": pl.Int64, "dk": pl.Int64})
        copy_kind = _enum_or(db, "ENUM_CUDA_MEMCPY_OPER", _COPY_KIND, _copy_kind_name)
        mem_kind = _enum_or(db, "ENUM_CUDA_MEM_KIND", _MEM_KIND, _mem_kind_name)
        m = m.with_columns(
            _map("ck", copy_kind, "copy_kind"), _map("sk", mem_kind, "src_memory"), _map("dk", mem_kind, "dst_memory"),
        ).drop("ck", "sk", "dk")
        # The name Kineto gives the same activity, so that rules and reports read one vocabulary.
        m = m.with_columns(
            pl.format("Memcpy {} ({} -> {})", pl.col("copy_kind").fill_null("of unknown kind"),
                      pl.col("src_memory").fill_null("unknown").str.to_titlecase(),
                      pl.col("dst_memory").fill_null("unknown").str.to_titlecase()).alias("name"),
            pl.lit("memcpy").alias("kind"),
        )
        frames.append(m)
    t = "CUPTI_ACTIVITY_KIND_MEMSET"
    if db.has(t):
        mk = "memKind" if "memKind" in db.cols(t) else "NULL"
        s = db.frame(
            f'SELECT start, "end", deviceId, streamId, correlationId, globalPid, bytes, {mk} FROM {t}',
            {"ts": pl.Int64, "end": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64,
             "gpid": pl.Int64, "bytes": pl.Int64, "mk": pl.Int64})
        mem_kind = _enum_or(db, "ENUM_CUDA_MEM_KIND", _MEM_KIND, _mem_kind_name)
        s = s.with_columns(_map("mk", mem_kind, "dst_memory")).drop("mk")
        s = s.with_columns(
            pl.format("Memset ({})", pl.col("dst_memory").fill_null("unknown").str.to_titlecase()).alias("name"),
            pl.lit("memset").alias("kind"),
        )
        frames.append(s)
    if not frames:
        return pl.DataFrame()
    k = pl.concat(frames, how="diagonal_relaxed")
    return k.with_columns(_pid("gpid").alias("pid"), (pl.col("end") - pl.col("ts")).alias("dur")).drop("gpid")


def _runtime(db: _Db, strings: pl.DataFrame) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has(t):
        return pl.DataFrame()
    r = db.frame(f'SELECT start, "end", globalTid, correlationId, nameId FROM {t}',
                 {"ts": pl.Int64, "end": pl.Int64, "gtid": pl.Int64, "correlation": pl.Int64, "name_id": pl.Int64})
    # Names are few (one per API): clean and classify the distinct names, then join.
    names = r.select(pl.col("name_id").unique()).join(strings.rename({"sid": "name_id"}), on="name_id", how="left")
    # the version suffix has 4+ digits (cudaLaunchKernel_v7000); cuGetProcAddress_v2 is the API's own name
    names = names.with_columns(pl.col("value").str.replace(r"_v\d{4,}$", "").alias("name"))
    names = names.with_columns(runtime_kind_expr(pl.col("name")).alias("kind")).drop("value")
    r = r.join(names, on="name_id", how="left", maintain_order="left").drop("name_id")
    return r.with_columns(_pid("gtid").alias("pid"), _tid("gtid").alias("tid"),
                          (pl.col("end") - pl.col("ts")).alias("dur")).drop("gtid")


def _syncs(db: _Db, runtime: pl.DataFrame) -> pl.DataFrame:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not db.has(t):
        return pl.DataFrame()
    cols = db.cols(t)
    st = "syncType" if "syncType" in cols else ("deprecatedSyncType" if "deprecatedSyncType" in cols else "NULL")
    ev = "eventSyncId" if "eventSyncId" in cols else ("eventId" if "eventId" in cols else "NULL")
    s = db.frame(f'SELECT start, "end", deviceId, streamId, correlationId, globalPid, {st}, {ev} FROM {t}',
                 {"ts": pl.Int64, "end": pl.Int64, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64,
                  "gpid": pl.Int64, "st": pl.Int64, "event": pl.Int64})
    sync_kind = _enum_or(db, "ENUM_CUPTI_SYNC_TYPE", _SYNC_KIND, _sync_kind_name)
    s = s.with_columns(_map("st", sync_kind, "kind"), _pid("gpid").alias("pid"),
                       (pl.col("end") - pl.col("ts")).alias("dur")).drop("st", "gpid")
    # CUPTI reports cudaDeviceSynchronize as a context synchronisation: the API call that caused it tells them apart.
    if runtime.height:
        dev = (runtime.filter(pl.col("name").str.contains(r"^cu(da)?(DeviceSynchronize|ThreadSynchronize)$"))
               .select("correlation", "pid", pl.lit(True).alias("_dev")))
        s = s.join(dev, on=["correlation", "pid"], how="left", maintain_order="left")
        s = s.with_columns(pl.when(pl.col("_dev")).then(pl.lit("device_sync")).otherwise(pl.col("kind")).alias("kind"))
        s = s.drop("_dev")
    return s


def _nvtx(db: _Db, strings: pl.DataFrame) -> pl.DataFrame:
    t = "NVTX_EVENTS"
    if not db.has(t):
        return pl.DataFrame()
    cols = db.cols(t)
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    types = ", ".join(str(x) for x in _NVTX_RANGE_TYPES)
    n = db.frame(
        f'SELECT start, "end", globalTid, {text}, {text_id} FROM {t} '
        f'WHERE "end" IS NOT NULL AND eventType IN ({types})',
        {"ts": pl.Int64, "end": pl.Int64, "gtid": pl.Int64, "text": pl.Utf8, "text_id": pl.Int64})
    n = _name(n, strings, "text_id", "registered")
    n = n.with_columns(
        pl.coalesce("text", "registered").str.replace(_NVTX_OP_SUFFIX, "").alias("name"),
        _pid("gtid").alias("pid"), _tid("gtid").alias("tid"), (pl.col("end") - pl.col("ts")).alias("dur"),
        pl.lit("nvtx").alias("cat"),
    ).drop("text", "registered", "gtid")
    return _nest(n)


def _nvtx_own_connection(path: Path, strings: pl.DataFrame) -> pl.DataFrame:
    db = _Db(path)
    try:
        return _nvtx(db, strings)
    finally:
        db.close()


def _nest(ops: pl.DataFrame) -> pl.DataFrame:
    """id, depth and parent of ranges on each thread (ranges on one thread nest properly).

    Ranges are sorted by thread, start, longest first. With every thread's times laid end to end on one axis
    (thread index in the high bits), a range's depth is the number of ranges started before it minus the number
    ended at or before its start: two sorted arrays and a binary search, no per-row loop.
    """
    ops = ops.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())  # a range without times: no place
    if not ops.height:
        return ops.with_columns(pl.lit(None, dtype=pl.Int64).alias(c) for c in ("id", "parent")).with_columns(
            pl.lit(None, dtype=pl.Int32).alias("depth"))
    t0 = min(ops["ts"].min(), ops["end"].min())
    ops = ops.sort(["pid", "tid", "ts", "end"], descending=[False, False, False, True])
    thread = (pl.col("pid") * (1 << 24) + pl.col("tid")).rank("dense").cast(pl.Int64)
    ops = ops.with_row_index("id").with_columns(pl.col("id").cast(pl.Int64), thread.alias("_t"))
    ends = ops.select((pl.col("_t") * (1 << 50) + (pl.col("end") - t0)).alias("k")).sort("k")["k"]
    starts = ops.select((pl.col("_t") * (1 << 50) + (pl.col("ts") - t0)).alias("k"))["k"]
    ops = ops.with_columns((pl.col("id") - ends.search_sorted(starts, side="right")).cast(pl.Int32).alias("depth"))
    # Parent: the latest range one level up on the thread that started at or before this one. Each (thread, depth)
    # gets its own stretch of one axis, so one as-of join over plain integers finds it.
    lvl = pl.col("_t") * 4096 + pl.col("depth")
    cand = ops.select((lvl * (1 << 50) + (pl.col("ts") - t0)).alias("_k"), pl.col("id").alias("parent"),
                      lvl.alias("_pl")).sort("_k")
    ops = ops.with_columns(((lvl - 1) * (1 << 50) + (pl.col("ts") - t0)).alias("_k"), (lvl - 1).alias("_want"))
    ops = ops.sort("_k").join_asof(cand, on="_k", strategy="backward", check_sortedness=False)
    ok = (pl.col("_pl") == pl.col("_want")) & (pl.col("depth") > 0)
    ops = ops.with_columns(pl.when(ok).then(pl.col("parent")).otherwise(None).alias("parent"))
    return ops.drop("_t", "_k", "_want", "_pl").sort("id")


def _steps(host_ops: pl.DataFrame) -> pl.DataFrame:
    if not host_ops.height:
        return pl.DataFrame()
    rx = step_pattern()
    m = host_ops.with_columns(pl.col("name").str.extract_groups(rx).alias("_g")).filter(
        pl.col("name").str.contains(rx))
    if not m.height:
        return pl.DataFrame()
    groups = m["_g"].struct.fields
    num = pl.coalesce([pl.col("_g").struct.field(g) for g in groups]).cast(pl.Int64, strict=False)
    out = m.select("pid", num.alias("step"), "ts", "end", "dur", pl.lit("nvtx").alias("origin"))
    return out.filter(pl.col("step").is_not_null()).unique(["pid", "step"], keep="first").sort("pid", "ts")


def _collectives(host_ops: pl.DataFrame, runtime: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """One row per collective NVTX range, linked to the NCCL kernel(s) launched inside it on its thread.

    PyTorch's own ranges (nccl:all_reduce) are preferred; NCCL's API ranges (ncclAllReduce) are used for processes
    without them, since both describe the same call.
    """
    if not host_ops.height:
        return pl.DataFrame()
    torch_op = pl.col("name").str.extract(r"^nccl:([a-z_0-9]+)$", 1)
    nccl_op = _camel_to_snake(pl.col("name").str.extract(_NCCL_API, 1))
    c = host_ops.with_columns(torch_op.alias("_t"), nccl_op.alias("_n")).filter(
        pl.col("_t").is_not_null() | pl.col("_n").is_not_null())
    if not c.height:
        return pl.DataFrame()
    torch_pids = c.filter(pl.col("_t").is_not_null()).select("pid").unique()
    c = pl.concat([
        c.filter(pl.col("_t").is_not_null()).with_columns(pl.col("_t").alias("op")),
        c.join(torch_pids, on="pid", how="anti").filter(pl.col("_n").is_not_null())
        .with_columns(pl.col("_n").replace({"bcast": "broadcast", "allto_all": "all_to_all"}).alias("op")),
    ])
    c = c.select(pl.col("id").alias("host_op_id"), "pid", "tid", "ts", "end", "dur", "op",
                 pl.lit("nccl").alias("backend"))
    if runtime.height and kernels.height:
        comm = kernels.filter(pl.col("kind") == "comm").select("pid", "correlation", pl.col("ts").alias("k_ts"),
                                                                pl.col("end").alias("k_end"))
        launches = (runtime.filter(pl.col("kind") == "launch").select("pid", "tid", pl.col("ts").alias("l_ts"),
                                                                       "correlation")
                    .join(comm, on=["pid", "correlation"], how="inner"))
        if launches.height:
            # Each NCCL launch belongs to the latest collective range that opened before it on its thread.
            ranges = c.select("host_op_id", "pid", "tid", pl.col("ts").alias("l_ts"), pl.col("end").alias("r_end"))
            hit = (launches.sort("l_ts").join_asof(ranges.sort("l_ts"), on="l_ts", by=["pid", "tid"],
                                                  strategy="backward", check_sortedness=False)
                   .filter(pl.col("host_op_id").is_not_null() & (pl.col("l_ts") <= pl.col("r_end"))))
            agg = hit.group_by("host_op_id").agg(pl.col("k_ts").min().alias("kernel_ts"),
                                                 pl.col("k_end").max().alias("kernel_end"))
            c = c.join(agg, on="host_op_id", how="left", maintain_order="left")
    c = c.sort("pid", "ts").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
    return c.drop("tid")


# ---------------------------------------------------------------------------------------------------------------
# Metadata, ranks, time base


def _meta_rows(db: _Db, table: str) -> list[tuple[str, str]]:
    """(name, value) rows of a metadata table, both as text; a table without those columns holds none."""
    if not db.has(table) or not {"name", "value"} <= db.cols(table):
        return []
    return [(str(n), None if v is None else str(v))
            for n, v in db.con.execute(f'SELECT name, value FROM "{table}"') if n is not None]


def _versions(db: _Db) -> dict:
    rows = dict(_meta_rows(db, "META_DATA_EXPORT") or _meta_rows(db, "EXPORT_META_DATA"))
    out = {}
    for key, name in (("EXPORT_PRODUCT_VERSION", "nsys_version"), ("EXPORT_SCHEMA_VERSION", "schema_version")):
        if rows.get(key):
            out[name] = rows[key]
    return out


def _version_tuple(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (v or "").split(".")[:2])
    except ValueError:
        return ()


def _time_shift(db: _Db, meta: dict, kernels: pl.DataFrame, runtime: pl.DataFrame) -> int:
    """ns to add to every timestamp so that it reads on the target's clock (see the module doc)."""
    if not db.has("ANALYSIS_DETAILS"):
        meta["time_base"] = "as exported (no ANALYSIS_DETAILS)"
        return 0
    if not {"startTime", "duration"} <= db.cols("ANALYSIS_DETAILS"):
        meta["time_base"] = "as exported (ANALYSIS_DETAILS without startTime)"
        return 0
    row = db.con.execute("SELECT startTime, duration FROM ANALYSIS_DETAILS LIMIT 1").fetchone()
    if not row or type(row[0]) is not int:  # missing, or not a time (a damaged export)
        meta["time_base"] = "as exported"
        return 0
    start, duration = row
    duration = duration if type(duration) is int else None
    busy = [f for f in (kernels, runtime) if f.height]
    lows = [v for f in busy if (v := f["ts"].min()) is not None]
    highs = [v for f in busy if (v := f["end"].max()) is not None]
    lo = min(lows) if lows else None
    hi = max(highs) if highs else None
    relative = lo is not None and lo < start  # impossible on the target clock: events before the session began
    if not relative and lo is not None and hi is not None and _version_tuple(meta.get("nsys_version")) >= (2026, 1):
        relative = hi <= (duration or 0)
    if relative:
        meta["time_base"] = "session-relative (nsys 2026.1+); shifted by ANALYSIS_DETAILS.startTime"
        return int(start)
    meta["time_base"] = "target clock"
    return 0


def _capture_env(db: _Db) -> tuple[dict[str, str], list[str]]:
    """The launched process's recorded environment (only rank-related keys kept) and its arguments."""
    env: dict[str, str] = {}
    args: list[str] = []
    for name, value in _meta_rows(db, "META_DATA_CAPTURE"):
        if not name.startswith("PROCESS_0:") or value is None:
            continue
        if name.endswith(":ENVIRONMENT_VARIABLE") and "=" in value:
            k, v = value.split("=", 1)
            if k in _RANK_ENV or k in _WORLD_ENV or k == "LOCAL_RANK":
                env[k] = v.strip().strip('"')
        elif re.search(r":ARGUMENT_\d+$", name):
            args.append(value)
    return env, args


def _assign_ranks(db: _Db, source, pids: pl.DataFrame) -> tuple[pl.DataFrame, str, str]:
    """pid -> rank for the GPU processes of the file, the origin of the ranks, and a note for source.detail."""
    pids = pids.sort("first_device", "pid")
    n = pids.height
    if n == 1:
        env, args = _capture_env(db)
        for key in _WORLD_ENV:
            if env.get(key, "").isdigit():
                source.meta["world_size"] = int(env[key])  # link.ranks names the ranks no source holds (TQL002)
                break
        for key in _RANK_ENV:
            if env.get(key, "").isdigit():
                return pids.with_columns(pl.lit(int(env[key])).alias("rank")), f"env {key}", ""
        for i, a in enumerate(args):
            m = _RANK_ARG.match(a)
            if m:
                v = m.group(1) or (args[i + 1] if i + 1 < len(args) else "")
                if v.isdigit():
                    return pids.with_columns(pl.lit(int(v)).alias("rank")), "command line --rank", ""
        if source.rank is not None and source.rank_origin:
            return pids.with_columns(pl.lit(source.rank).alias("rank")), source.rank_origin, ""
    ranks = pids.with_columns(pl.int_range(0, n).alias("rank"))
    note = (f"rank{'s' if n > 1 else ''} by process order (GPU, then pid) of {n} GPU process"
            f"{'es' if n > 1 else ''}: no RANK in the recorded environment")
    return ranks, "process order", note


# ---------------------------------------------------------------------------------------------------------------


def _captured_values(path: Path) -> list[str]:
    """The values an export recorded about its environment (environment variables, target system facts, host names):
    what no message may repeat. Longest first, so that a value inside another is not half-redacted."""
    out: set[str] = set()
    try:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True, timeout=0.5)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for t in tables:
                up = t.upper()
                if "ENV" not in up and "META_DATA" not in up and "EXPORT_META" not in up:
                    continue
                try:
                    rows = con.execute(f'SELECT * FROM "{t}"').fetchall()
                except (sqlite3.Error, ValueError):  # a damaged table: the others are still read
                    continue
                for row in rows:
                    for v in row:
                        if isinstance(v, str):
                            out.add(v)
                            if "=" in v:
                                out.add(v.split("=", 1)[1].strip().strip('"'))
        finally:
            con.close()
    except (sqlite3.Error, OSError, ValueError):
        pass
    return sorted((v for v in out if len(v) >= 3), key=len, reverse=True)


def _redact(msg: str, path: Path) -> str:
    for v in _captured_values(path):
        if v in msg:
            msg = msg.replace(v, "<redacted>")
    # polars quotes the value it could not take: it came from the export, so it is not repeated either
    return re.sub(r"could not append value: .*? of type", "could not append value: <value> of type", msg)


def read(path: Path, source) -> dict[str, pl.DataFrame]:
    """The export's tables. Messages never repeat what the export recorded about its environment (see _redact)."""
    path = Path(path)
    try:
        return _read(path, source)
    except IngestError as e:
        raise IngestError(_redact(str(e), path)) from None
    except sqlite3.DatabaseError as e:  # damage SQLite finds only when a page is read
        raise IngestError(_redact(_db_error(path, e), path)) from None
    except Exception as e:  # an importer bug: reported as one, without the values it may quote
        raise RuntimeError(f"{type(e).__name__}: {_redact(str(e), path)}").with_traceback(e.__traceback__) from None


def _read(path: Path, source) -> dict[str, pl.DataFrame]:
    db = _Db(path)
    try:
        if not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in db.tables) and not db.has("StringIds"):
            raise IngestError(
                f"{path.name}: SQLite database but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_* or "
                "StringIds tables); export with nsys export --type sqlite")
        meta = _versions(db)
        strings = _strings(db)
        # NVTX ranges are usually the biggest table: read them on a second connection in a second thread while
        # this one reads the GPU side (sqlite3 and polars release the GIL for most of their work).
        with ThreadPoolExecutor(max_workers=1) as pool:
            nvtx = pool.submit(_nvtx_own_connection, path, strings) if db.has("NVTX_EVENTS") else None
            kernels = _kernels(db, strings)
            runtime = _runtime(db, strings)
            syncs = _syncs(db, runtime)
            host_ops = nvtx.result() if nvtx is not None else pl.DataFrame()
        if db.has("TARGET_INFO_GPU") and "name" in db.cols("TARGET_INFO_GPU"):
            meta["gpus"] = sorted({r[0] for r in db.con.execute("SELECT name FROM TARGET_INFO_GPU") if r[0]})
        shift = _time_shift(db, meta, kernels, runtime)
        env_host = None
        if _show_sensitive() and db.has("TARGET_INFO_SYSTEM_ENV"):
            row = db.con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
            env_host = row[0] if row else None
        gpu_pids = (kernels.group_by("pid").agg(pl.col("device").min().alias("first_device"))
                    if kernels.height else pl.DataFrame(schema={"pid": pl.Int64, "first_device": pl.Int32}))
        if not gpu_pids.height:
            # No GPU activity at all: nothing is a rank. Still report host-side facts for the processes seen.
            source.status = "partial"
            source.detail = "no GPU activity recorded (no kernel, memcpy or memset rows); was CUDA traced (-t cuda)?"
            source.meta.update(meta)
            return {}
        meta["reader"] = "adbc" if db.fast is not None else "sqlite3"
        rank_map, origin, note = _assign_ranks(db, source, gpu_pids)
        rank_map = rank_map.select("pid", pl.col("rank").cast(pl.Int32))
    finally:
        db.close()

    collectives = _collectives(host_ops, runtime, kernels)
    steps = _steps(host_ops)

    def own(df: pl.DataFrame, sort: bool = True) -> pl.DataFrame:
        """Rows of the rank processes only, with their rank, on the target clock, with ids."""
        if not df.height:
            return df
        df = df.join(rank_map, on="pid", how="inner")
        if shift:
            df = df.with_columns(pl.col(c) + shift for c in ("ts", "end", "kernel_ts", "kernel_end") if c in df.columns)
        if sort and "id" not in df.columns:
            df = df.sort("rank", "ts").with_row_index("id").with_columns(pl.col("id").cast(pl.Int64))
        return df

    runtime_all = runtime.height
    kernels, runtime, syncs = own(kernels), own(runtime), own(syncs)
    host_ops, collectives = own(host_ops), own(collectives)
    steps = own(steps, sort=False)
    if steps.height:
        steps = steps.drop("pid")
    if collectives.height:
        collectives = collectives.drop("pid")

    ranks = sorted(rank_map["rank"].to_list())
    source.ranks = ranks
    source.rank = ranks[0] if len(ranks) == 1 else None
    source.rank_origin = origin
    dropped = runtime_all - runtime.height
    notes = [note] if note else []
    if dropped:
        notes.append(f"{dropped} runtime calls of processes without GPU activity left out")
    if origin.startswith("env "):
        notes.append(f"rank from {origin}")
    source.detail = "; ".join(notes)
    meta["processes"] = len(ranks)
    source.meta.update(meta)
    if env_host:
        source.host = env_host
    return {"kernels": kernels, "runtime": runtime, "syncs": syncs, "host_ops": host_ops, "steps": steps,
            "collectives": collectives}


