"""General facts from NCCL logs, ProcessGroupNCCL messages and Flight Recorder dumps, as tables rules select from.

Only facts live here: what the logs and dumps state, parsed out of their JSON detail columns, and the few facts
about the whole run that no single row holds (a communicator's node count, the job's world size, the earliest
error, where each rank's watchdog fired). What makes a finding (which transport is wrong, which rank is odd, which
timeout is a hang) is in the rules' YAML (rules/TQL5*.yaml, rules/TQL6*.yaml): the vocabulary over the view
nccl_comm_settings, else SQL over these tables and the views under rules/views/ (nccl_detectors, nccl_world_size,
fr_collective_entries, fr_majorities). Declared with their columns in model/derived.py.

Tables (DERIVED):
- nccl_comm_info: one row per nccl_comms row (comm_row numbers them): its columns without the JSON detail, parsed:
  process_only (a process's NCCL version line, no communicator), nodes (nNodes or the hosts seen for the comm id),
  n_ib_devices, bootstrap_if, plugin, gdr_off_why (NCCL's reason on the first NIC without GPUDirect RDMA),
  p2p_disabled_pairs, timing_<part>_s (NCCL >= 2.22 Init timings).
- nccl_comm_env: per comm_row, each NCCL_* variable NCCL echoed: var, value.
- nccl_comm_ifs: per comm_row, each network interface NCCL named: role (socket, bootstrap), pos, interface.
- nccl_pg_env: per ProcessGroupNCCL environment or options line: var, value (TIMEOUT(ms), size, PG Name, ...).
- nccl_event_info: nccl_events with their detail parsed (trail, retcode, role, stuck_s, and the ranks, host and
  bus id an event names), detector (the rank signalled the dump after detecting a timeout) and root_cause (the
  earliest error across ranks of a rank that did not merely detect the timeout).
- nccl_watchdog: per process group and rank, its first watchdog timeout (seq, op), with the group's majority: the
  collective most reporting ranks time out in (majority_seq, majority_op, majority_ranks), n_variants, n_reporting.
- nccl_world: the job's world size as the run states it (world_size, origin), one row per world_rank, and whether
  that rank left any line in the logs here (logged); no rows where nothing states it.
- nccl_desync_reports: what PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG) says of which ranks, deduplicated.
- fr_entries: Flight Recorder entries per rank and group (collectives rows from dumps, one per entry).
- fr_group_members: per Flight Recorder group, the ranks it holds (its pg_ranks; the default group: 0..size-1).
- nccl_comm_collectives: communicators tied to the collectives of the same rank and group size.
"""

from __future__ import annotations

import orjson
import polars as pl

from traceql.model import Run

_GDR = pl.List(pl.Struct({"enabled": pl.Boolean, "why": pl.Utf8, "hca": pl.Utf8, "gpu": pl.Utf8, "net": pl.Utf8}))
_TIMING_PARTS = ("kernels", "alloc", "bootstrap", "allgathers", "topo", "graphs", "connections", "rest")
_TIMING = pl.Struct({k: pl.Float64 for k in _TIMING_PARTS})
_DETAIL = pl.Struct({
    "plugin": pl.Utf8, "bootstrap_if": pl.Utf8, "socket_ifs": pl.List(pl.Utf8), "ib_devices": pl.List(pl.Utf8),
    "gdr": _GDR, "timing": _TIMING, "p2p_disabled": pl.List(pl.List(pl.Int64)), "process_only": pl.Boolean,
})
# What counts as an error of a rank (the root-cause candidates); timeouts and dump signals are what others detect.
_ERROR_KINDS = ["error", "ib_error", "net_error", "duplicate_gpu", "collective_mismatch"]


def _comms(run: Run) -> pl.DataFrame:
    c = run.table("nccl_comms")
    if c.height == 0:
        return c.with_columns(pl.lit(None, dtype=_DETAIL).alias("d"))
    return c.with_columns(pl.col("detail").str.json_decode(_DETAIL).alias("d"))


def nccl_comm_info(run: Run) -> pl.DataFrame:
    # Every column is built on zero rows too (a log of one "NCCL version" line has only a process row): a rule reading
    # a column must find it whatever the log held (issue 16).
    c = _comms(run).with_row_index("comm_row").with_columns(pl.col("comm_row").cast(pl.Int64))
    d = pl.col("d")
    c = c.with_columns(d.struct.field("process_only").fill_null(False).alias("process_only"))
    # Node count per communicator: nNodes where NCCL printed it, else the distinct hosts seen for the comm id.
    hosts = (c.filter(~pl.col("process_only")).group_by("comm_id")
             .agg(pl.col("host").n_unique().alias("n_hosts"), pl.col("nnodes").max().alias("_nn")))
    t = d.struct.field("timing")
    return (
        c.join(hosts, on="comm_id", how="left")
        .with_columns(
            pl.max_horizontal(pl.col("_nn").fill_null(1), pl.col("n_hosts").fill_null(1)).alias("nodes"),
            d.struct.field("ib_devices").list.len().fill_null(0).alias("n_ib_devices"),
            d.struct.field("bootstrap_if").alias("bootstrap_if"),
            d.struct.field("plugin").alias("plugin"),
            d.struct.field("gdr").list.eval(pl.element().filter(~pl.element().struct.field("enabled"))
                                            .struct.field("why").fill_null("disabled")).list.first().alias("gdr_off_why"),
            d.struct.field("p2p_disabled").list.len().fill_null(0).alias("p2p_disabled_pairs"),
            *[t.struct.field(p).alias(f"timing_{p}_s") for p in _TIMING_PARTS],
        )
        .drop("d", "_nn", "detail")
    )


def nccl_comm_env(run: Run) -> pl.DataFrame:
    schema = {"comm_row": pl.Int64, "rank": pl.Int32, "comm_id": pl.Utf8, "var": pl.Utf8, "value": pl.Utf8}
    from traceql.link import ensure

    c = ensure(run, "nccl_comm_info")
    rows: dict[str, list] = {k: [] for k in schema}
    for row, rank, comm, env in c.filter(pl.col("env").is_not_null()).select("comm_row", "rank", "comm_id", "env").iter_rows():
        try:
            obj = orjson.loads(env)
        except orjson.JSONDecodeError:
            continue
        for var, value in obj.items() if isinstance(obj, dict) else ():
            if value is None:
                continue  # an unset echo reads as no echo
            for k, v in zip(schema, (row, rank, comm, var, value if isinstance(value, str) else orjson.dumps(value).decode())):
                rows[k].append(v)
    return pl.DataFrame(rows, schema=schema)


def nccl_comm_ifs(run: Run) -> pl.DataFrame:
    schema = {"comm_row": pl.Int64, "rank": pl.Int32, "comm_id": pl.Utf8, "role": pl.Utf8, "pos": pl.Int64,
              "interface": pl.Utf8}
    c = _comms(run).with_row_index("comm_row").with_columns(pl.col("comm_row").cast(pl.Int64))
    sock = (c.select("comm_row", "rank", "comm_id", pl.lit("socket").alias("role"),
                     pl.col("d").struct.field("socket_ifs").alias("interface"))
            .filter(pl.col("interface").list.len() > 0)
            .with_columns(pl.int_ranges(pl.col("interface").list.len()).alias("pos")).explode("interface", "pos"))
    boot = c.select("comm_row", "rank", "comm_id", pl.lit("bootstrap").alias("role"), pl.lit(0).alias("pos"),
                    pl.col("d").struct.field("bootstrap_if").alias("interface")).filter(pl.col("interface").is_not_null())
    return pl.concat([sock.select(list(schema)).cast(schema), boot.select(list(schema)).cast(schema)])


def nccl_pg_env(run: Run) -> pl.DataFrame:
    schema = {"rank": pl.Int32, "source": pl.Int32, "line": pl.Int64, "ts": pl.Int64, "what": pl.Utf8,
              "pg_name": pl.Utf8, "var": pl.Utf8, "value": pl.Utf8}
    ev = run.table("nccl_events").filter(pl.col("kind") == "pg_env")
    rows: dict[str, list] = {k: [] for k in schema}
    for rank, src, line, ts, pg, detail in ev.select("rank", "source", "line", "ts", "pg_name", "detail").iter_rows():
        try:
            d = orjson.loads(detail) if detail else {}
        except orjson.JSONDecodeError:
            continue
        env = d.get("env") if isinstance(d, dict) else None
        for var, value in env.items() if isinstance(env, dict) else ():
            if value is None:
                continue
            for k, v in zip(schema, (rank, src, line, ts, d.get("what"), pg, var,
                                     value if isinstance(value, str) else orjson.dumps(value).decode())):
                rows[k].append(v)
    return pl.DataFrame(rows, schema={**schema, "source": run.table("nccl_events").schema["source"]})


def nccl_event_info(run: Run) -> pl.DataFrame:
    ev = run.table("nccl_events")
    det = pl.col("detail")
    ev = ev.with_columns(
        det.str.json_path_match("$.trail").alias("trail"),
        det.str.json_path_match("$.retcode").cast(pl.Int64, strict=False).alias("retcode"),
        det.str.json_path_match("$.role").alias("role"),
        det.str.json_path_match("$.stuck_s").alias("stuck_s"),
        det.str.json_path_match("$.ranks").str.json_decode(pl.List(pl.Int32)).list.sort().alias("ranks"),
        det.str.json_path_match("$.host").alias("host"),
        det.str.json_path_match("$.bus_id").alias("bus_id"),
    )
    detectors = ev.filter((pl.col("kind") == "dump_signal") & (pl.col("role") == "detector"))["rank"].unique()
    ev = ev.with_columns(pl.col("rank").is_in(detectors.implode()).fill_null(False).alias("detector"))
    # Root-cause candidate: the earliest timestamped error of a rank that did not merely detect the timeout; where no
    # line carries a time, the only rank with errors (if there is one).
    cand = ev.filter(pl.col("kind").is_in(_ERROR_KINDS) & ~pl.col("detector"))
    stamped = cand.filter(pl.col("ts").is_not_null())
    first = None
    if stamped.height:
        first = stamped.sort("ts", "rank", "line").row(0, named=True)
    elif cand["rank"].drop_nulls().n_unique() == 1:
        first = cand.sort("line").row(0, named=True)
    if first is None or first["rank"] is None:  # no candidate (or one without a rank): nothing is named the cause
        is_root = pl.lit(False)
    else:
        is_root = ((pl.col("rank") == first["rank"]) & (pl.col("source") == first["source"])
                   & (pl.col("line") == first["line"]) & pl.col("kind").is_in(_ERROR_KINDS)).fill_null(False)
    return ev.with_columns(is_root.alias("root_cause"))


def nccl_watchdog(run: Run) -> pl.DataFrame:
    ev = run.table("nccl_events")
    wd = (ev.filter((pl.col("kind") == "watchdog_timeout") & pl.col("rank").is_not_null())
          .with_columns(pl.col("pg_name").fill_null("0")))
    first = (wd.sort("ts", "line", nulls_last=True).group_by("pg_name", "rank", maintain_order=True).first()
             .select("pg_name", "rank", "source", "ts", "line", "seq", "op", "timeout_ms", "ran_ms"))
    votes = (first.group_by("pg_name", "seq", "op").agg(pl.len().alias("k"), pl.col("rank").sort().alias("ranks"))
             .sort(["pg_name", "k", "seq"], descending=[False, True, False]))
    major = votes.group_by("pg_name", maintain_order=True).agg(
        pl.col("seq").first().alias("majority_seq"), pl.col("op").first().alias("majority_op"),
        pl.col("ranks").first().cast(pl.List(pl.Utf8)).list.join(",").alias("majority_ranks"),
        pl.len().cast(pl.Int64).alias("n_variants"), pl.col("k").sum().cast(pl.Int64).alias("n_reporting"))
    return first.join(major, on="pg_name")


def _world_size(run: Run) -> tuple[int | None, str | None]:
    """The job's world size as the run itself states it, and where from: ProcessGroupNCCL's "initialization options:
    size: N" of the default group, NCCL's own "nranks N", a traced collective's group size. Never the highest rank
    seen: an excerpt of two ranks' lines says nothing about how many ranks the job had."""
    cands: list[tuple[int, str]] = []
    ev = run.table("nccl_events")
    opts = ev.filter((pl.col("kind") == "pg_env")
                     & (pl.col("detail").str.json_path_match("$.what") == "ProcessGroupNCCL initialization options"))
    if opts.height:
        opts = opts.with_columns(
            pl.col("detail").str.json_path_match("$.env.size").cast(pl.Int64, strict=False).alias("_size"),
            pl.coalesce(pl.col("detail").str.json_path_match("$.env['PG Name']"), pl.col("pg_name")).alias("_pg"))
        n = opts.filter(pl.col("_pg").is_null() | (pl.col("_pg") == "0"))["_size"].max()
        if n is not None:
            cands.append((int(n), "ProcessGroupNCCL size"))
    n = run.table("nccl_comms")["nranks"].max()
    if n is not None:
        cands.append((int(n), "NCCL nranks"))
    c = run.table("collectives")["group_size"].max()
    if c is not None:
        cands.append((int(c), "collective group size"))
    if not cands:
        return None, None
    return max(cands)


def nccl_world(run: Run) -> pl.DataFrame:
    n, origin = _world_size(run)
    ranks = list(range(n)) if n and n > 0 else []
    # which ranks left any line in the logs here: a rank with none may have died before logging, or its log was not
    # collected (an issue paste of one rank's lines); only one that logged can be said to be silent
    seen: set[int] = set()
    for t in ("nccl_events", "nccl_comms"):
        seen.update(run.table(t)["rank"].drop_nulls().unique().to_list())
    return pl.DataFrame({"world_rank": ranks, "world_size": [n] * len(ranks), "origin": [origin] * len(ranks),
                         "logged": [r in seen for r in ranks]},
                        schema={"world_rank": pl.Int32, "world_size": pl.Int64, "origin": pl.Utf8,
                                "logged": pl.Boolean})


def nccl_desync_reports(run: Run) -> pl.DataFrame:
    """TORCH_NCCL_DESYNC_DEBUG report lines: the ranks PyTorch itself names (rank, a list), with what it says of them."""
    schema = {"what": pl.Utf8, "rank": pl.List(pl.Int32), "seq": pl.Int64, "pg_name": pl.Utf8, "text": pl.Utf8,
              "detail": pl.Utf8}
    rep = run.table("nccl_events").filter(pl.col("kind") == "desync_report")
    if rep.height == 0:
        return pl.DataFrame(schema=schema)
    d = pl.col("detail")
    out = []
    for key, what in (("missing_ranks", "never joined any collective"), ("stuck_ranks", "joined but did not finish"),
                      ("lagging_ranks", "finished but did not join the next")):
        out.append(rep.select(pl.lit(what).alias("what"),
                              d.str.json_path_match(f"$.{key}").str.json_decode(pl.List(pl.Int32)).alias("rank"),
                              d.str.json_path_match("$.seq").cast(pl.Int64, strict=False).alias("seq"),
                              pl.lit("0").alias("pg_name"), pl.col("text")).filter(pl.col("rank").list.len() > 0))
    rep = pl.concat(out).unique(["what", "rank", "seq"], keep="first", maintain_order=True)
    return rep.with_columns(
        (pl.col("what") + pl.lit(" collective #") + pl.col("seq").cast(pl.Utf8).fill_null("?")).alias("detail")
    ).select(list(schema)).cast(schema)


def fr_entries(run: Run) -> pl.DataFrame:
    fr_ids = [s.id for s in run.sources if s.kind == "flight_recorder"]
    c = run.table("collectives").filter(pl.col("source").is_in(fr_ids))
    # a dump may be present in both pickle and JSON form: keep one row per entry
    return c.unique(["rank", "pg_name", "id", "seq", "op"], keep="first")


def fr_group_members(run: Run) -> pl.DataFrame:
    """The ranks each Flight Recorder group holds, as a dump states them: its pg_ranks, else (the default group) the
    ranks below its size. A group no dump states the members of has no rows."""
    from traceql.link import ensure

    schema = {"pg_name": pl.Utf8, "rank": pl.Int32}
    c = ensure(run, "fr_entries")
    groups = c.group_by("pg_name").agg(pl.col("pg_ranks").drop_nulls().first(), pl.col("group_size").max())
    rows: dict[str, list] = {"pg_name": [], "rank": []}
    for pg, pg_ranks, size in groups.iter_rows():
        expect: list[int] = []
        if pg_ranks:
            try:
                expect = [int(x) for x in orjson.loads(pg_ranks)]
            except (ValueError, TypeError):
                expect = []
        if not expect and size and pg in ("0", ""):
            expect = list(range(int(size)))
        for r in sorted(set(expect)):
            rows["pg_name"].append(pg)
            rows["rank"].append(r)
    return pl.DataFrame(rows, schema=schema)


def nccl_comm_collectives(run: Run) -> pl.DataFrame:
    """Communicators tied to the collectives of the same rank whose group size equals the comm's nranks."""
    comms = run.table("nccl_comms").filter(pl.col("nranks").is_not_null() & pl.col("rank").is_not_null())
    coll = run.table("collectives").filter(pl.col("group_size").is_not_null())
    schema = {"rank": pl.Int32, "comm_id": pl.Utf8, "nranks": pl.Int32, "pg_name": pl.Utf8, "pg_desc": pl.Utf8,
              "n_collectives": pl.UInt32, "bytes": pl.Int64, "transports": pl.Utf8, "channels": pl.Int32}
    if comms.height == 0 or coll.height == 0:
        return pl.DataFrame(schema=schema)
    per_pg = coll.group_by("rank", "pg_name", "group_size").agg(pl.col("pg_desc").first(), pl.len().alias("n_collectives"),
                                                               pl.col("bytes").sum())
    return (comms.select("rank", "comm_id", "nranks", "transports", "channels")
            .join(per_pg, left_on=["rank", "nranks"], right_on=["rank", "group_size"], how="inner")
            .select(list(schema)).cast(schema))


DERIVED = {
    "nccl_comm_info": nccl_comm_info,
    "nccl_comm_env": nccl_comm_env,
    "nccl_comm_ifs": nccl_comm_ifs,
    "nccl_pg_env": nccl_pg_env,
    "nccl_event_info": nccl_event_info,
    "nccl_watchdog": nccl_watchdog,
    "nccl_world": nccl_world,
    "nccl_desync_reports": nccl_desync_reports,
    "fr_entries": fr_entries,
    "fr_group_members": fr_group_members,
    "nccl_comm_collectives": nccl_comm_collectives,
}
