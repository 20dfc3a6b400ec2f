"""What NCCL logs, ProcessGroupNCCL messages and Flight Recorder dumps say about a run, as tables rules select from.

The classification lives here (vectorised polars over nccl_comms, nccl_events and collectives); the rules under
rules/TQL5*.yaml and rules/TQL6*.yaml only select rows and compare thresholds.

Tables (DERIVED):
- nccl_comm_checks: per communicator and rank: transport facts and flags (socket or virtual interface across
  nodes, P2P off / SHM inside a host, GPUDirect RDMA off, channel count against the comm's majority, forced
  NCCL_ALGO/NCCL_PROTO, duplicate GPU).
- nccl_config_diff: per setting (NCCL version, net plugin, network, each NCCL_* variable) and odd rank: its value
  against the majority of the ranks.
- nccl_init: per communicator with "Init timings" (NCCL >= 2.22): total and the dominant component.
- nccl_error_handling: per rank, risky settings: async error handling off, huge collective timeouts.
- nccl_errors: NCCL/ProcessGroupNCCL errors with their return-code trail; the earliest across ranks is marked as
  the root-cause candidate (ranks that only detected a timeout and signalled the dump are not candidates).
- nccl_timeouts: watchdog timeouts classified across ranks: hang (every rank in the same collective), desync
  (ranks at different SeqNum/OpType), dead_rank (expected ranks that never report), stuck_watchdog (heartbeat).
- fr_mismatches: Flight Recorder entries compared across the ranks of each group at each sequence number:
  op_mismatch, size_mismatch, missing_rank (ranks that never reached it), no_dump (group ranks without a dump).
- nccl_comm_collectives: communicators tied to the collectives of the same rank and group size.
"""

from __future__ import annotations

import orjson
import polars as pl

from traceql.model import Run

_GDR = pl.List(pl.Struct({"enabled": pl.Boolean, "why": pl.Utf8, "hca": pl.Utf8, "gpu": pl.Utf8, "net": pl.Utf8}))
_TIMING = pl.Struct({k: pl.Float64 for k in ("kernels", "alloc", "bootstrap", "allgathers", "topo", "graphs", "connections", "rest")})
_DETAIL = pl.Struct({
    "plugin": pl.Utf8, "bootstrap_if": pl.Utf8, "socket_ifs": pl.List(pl.Utf8), "ib_devices": pl.List(pl.Utf8),
    "gdr": _GDR, "timing": _TIMING, "p2p_disabled": pl.List(pl.List(pl.Int64)), "process_only": pl.Boolean,
})
_VIRTUAL_IF = (r"^(lo|docker\d*|veth\w*|virbr\d*|br-\w+|cni\d*|flannel\S*|cali\w+|tun\d*|tap\d*|wg\d*|tailscale\d*"
               r"|zt\w+|CloudflareWARP|utun\d*|kube\S*)$")
_ERROR_KINDS = ["error", "ib_error", "net_error", "duplicate_gpu", "collective_mismatch"]


def _env(var: str) -> pl.Expr:
    return pl.col("env").str.json_path_match(f"$.{var}")


def _comms(run: Run) -> pl.DataFrame:
    c = run.table("nccl_comms")
    if c.height == 0:
        return c.with_columns(pl.lit(None, dtype=_DETAIL).alias("d"))
    return c.with_columns(pl.col("detail").str.json_decode(_DETAIL).alias("d"))


def nccl_comm_checks(run: Run) -> pl.DataFrame:
    c = _comms(run)
    # Every column is built on zero rows too (a log of one "NCCL version" line has only a process row): a rule reading
    # a column must find it whatever the log held (issue 16).
    c = c.filter(pl.col("d").struct.field("process_only").is_null() | ~pl.col("d").struct.field("process_only"))
    d = pl.col("d")
    # Hosts and node count per communicator: nNodes where NCCL printed it, else distinct hosts seen for the comm id.
    hosts = c.group_by("comm_id").agg(pl.col("host").n_unique().alias("n_hosts"), pl.col("nnodes").max().alias("nn"))
    chan = (
        c.filter(pl.col("channels").is_not_null())
        .group_by("comm_id", "channels").agg(pl.len().alias("k"))
        .sort(["comm_id", "k", "channels"], descending=[False, True, True])
        .group_by("comm_id", maintain_order=True).agg(pl.col("channels").first().alias("channels_majority"),
                                                      pl.col("channels").n_unique().alias("n_channel_values"))
    )
    dup = (
        c.filter(pl.col("bus_id").is_not_null() & pl.col("comm_id").is_not_null())
        .group_by("comm_id", "host", "bus_id").agg(pl.col("rank").unique().sort().alias("dup_ranks"))
        .filter(pl.col("dup_ranks").list.len() > 1)
    )
    out = (
        c.join(hosts, on="comm_id", how="left").join(chan, on="comm_id", how="left")
        .join(dup, on=["comm_id", "host", "bus_id"], how="left")
        .with_columns(
            pl.max_horizontal(pl.col("nn").fill_null(1), pl.col("n_hosts").fill_null(1)).alias("nodes"),
            (d.struct.field("ib_devices").list.len().fill_null(0) > 0).alias("ib_present"),
            (pl.col("network").is_in(["Socket"]) | pl.col("transports").str.contains("NET/Socket")).alias("uses_socket"),
            d.struct.field("socket_ifs").list.eval(pl.element().filter(pl.element().str.contains(_VIRTUAL_IF)))
            .list.join(",").alias("virtual_socket_ifs"),
            d.struct.field("bootstrap_if").alias("bootstrap_if"),
            d.struct.field("plugin").alias("plugin"),
            _env("NCCL_P2P_DISABLE").alias("env_p2p_disable"),
            _env("NCCL_SHM_DISABLE").alias("env_shm_disable"),
            _env("NCCL_ALGO").alias("nccl_algo"),
            _env("NCCL_PROTO").alias("nccl_proto"),
            _env("NCCL_NET_GDR_LEVEL").alias("gdr_level"),
            d.struct.field("gdr").list.eval(pl.element().filter(~pl.element().struct.field("enabled"))
                                            .struct.field("why").fill_null("disabled")).list.first().alias("gdr_off_why"),
            d.struct.field("p2p_disabled").list.len().fill_null(0).alias("p2p_disabled_pairs"),
        )
        .with_columns(
            (pl.col("uses_socket") & ((pl.col("nodes") > 1) | pl.col("ib_present"))).alias("socket_where_ib_or_nodes"),
            pl.when(pl.col("virtual_socket_ifs") != "").then(pl.col("virtual_socket_ifs"))
            .when(pl.col("bootstrap_if").str.contains(_VIRTUAL_IF)).then(pl.col("bootstrap_if"))
            .otherwise(None).alias("virtual_if"),
            pl.when(pl.col("env_p2p_disable").is_in(["1"])).then(pl.lit("NCCL_P2P_DISABLE=1"))
            .when(pl.col("p2p_disabled_pairs") > 0).then(pl.lit("P2P is disabled between connected GPUs"))
            .when(pl.col("transports").str.contains('"SHM"') & ~pl.col("transports").str.contains("P2P"))
            .then(pl.lit("GPUs of one host talk over SHM (host memory), not P2P"))
            .otherwise(None).alias("p2p_issue"),
            pl.when(pl.col("gdr_off_why").is_not_null() & pl.col("ib_present")).then(pl.col("gdr_off_why"))
            .when(pl.col("transports").str.contains('"NET/IB"') & ~pl.col("transports").str.contains("GDRDMA"))
            .then(pl.lit("NET/IB channels without /GDRDMA"))
            .when(pl.col("gdr_level").is_in(["LOC", "0"])).then(pl.lit("NCCL_NET_GDR_LEVEL=") + pl.col("gdr_level"))
            .otherwise(None).alias("gdr_disabled"),
            ((pl.col("n_channel_values").fill_null(1) > 1) & (pl.col("channels") != pl.col("channels_majority")))
            .fill_null(False).alias("channels_odd"),
            pl.concat_str([pl.lit("NCCL_ALGO=") + pl.col("nccl_algo"), pl.lit("NCCL_PROTO=") + pl.col("nccl_proto")],
                          separator=" ", ignore_nulls=True).alias("forced"),
        )
    )
    return out.with_columns(
        pl.when(pl.col("forced") == "").then(None).otherwise(pl.col("forced")).alias("forced"),
        (pl.col("virtual_if").is_not_null() & (pl.col("nodes") > 1)).alias("virtual_if_multinode"),
    ).drop("d", "nn", "detail")


def nccl_duplicate_gpu(run: Run) -> pl.DataFrame:
    """Ranks sharing one GPU: NCCL's own "Duplicate GPU detected" WARN, or two ranks of one comm on one host+busId."""
    schema = {"rank": pl.List(pl.Int32), "host": pl.Utf8, "bus_id": pl.Utf8, "origin": pl.Utf8}
    ev = run.table("nccl_events").filter(pl.col("kind") == "duplicate_gpu")
    out = [ev.select(pl.col("detail").str.json_decode(pl.Struct({"ranks": pl.List(pl.Int32), "bus_id": pl.Utf8,
                                                                 "host": pl.Utf8})).alias("d"))
           .select(pl.col("d").struct.field("ranks").list.sort().alias("rank"), pl.col("d").struct.field("host").alias("host"),
                   pl.col("d").struct.field("bus_id").alias("bus_id"), pl.lit("NCCL WARN").alias("origin"))]
    from traceql.link import ensure

    cc = ensure(run, "nccl_comm_checks")  # built once per run
    if "dup_ranks" in cc.columns:
        out.append(cc.filter(pl.col("dup_ranks").is_not_null())
                   .select(pl.col("dup_ranks").alias("rank"), "host", "bus_id", pl.lit("comm init lines").alias("origin")))
    df = pl.concat([o.cast(schema) for o in out])
    # the same report seen twice (the WARN line, and PyTorch's "Last error:" echo without a host) is one finding
    df = df.with_columns(pl.col("host").is_null().alias("_nohost")).sort("_nohost", maintain_order=True)
    return df.unique(["rank", "bus_id"], keep="first", maintain_order=True).drop("_nohost")


def nccl_config_diff(run: Run) -> pl.DataFrame:
    schema = {"setting": pl.Utf8, "rank": pl.Int32, "value": pl.Utf8, "majority": pl.Utf8,
              "majority_ranks": pl.Utf8, "odd_ranks": pl.Utf8, "n_ranks": pl.UInt32}
    c = _comms(run).filter(pl.col("rank").is_not_null())
    if c.height == 0:
        return pl.DataFrame(schema=schema)
    per_rank = c.group_by("rank").agg(
        pl.col("version").drop_nulls().first(), pl.col("network").drop_nulls().first(),
        pl.col("d").struct.field("plugin").drop_nulls().first().alias("plugin"),
        pl.col("env").drop_nulls().first(),
    )
    long = [per_rank.select("rank", pl.lit(k).alias("setting"), pl.col(k).alias("value")) for k in ("version", "network", "plugin")]
    env = per_rank.filter(pl.col("env").is_not_null() & (pl.col("env") != "{}"))
    if env.height:
        keys = sorted({k for s in env["env"].to_list() for k in orjson.loads(s)})
        for k in keys:
            long.append(per_rank.select("rank", pl.lit(k).alias("setting"),
                                        _env(k).fill_null("<unset>").alias("value")))
    df = pl.concat(long).with_columns(pl.col("value").fill_null("<unknown>"))
    # "<unknown>" (not printed under the default subsystem mask) is not a difference.
    known = df.filter(pl.col("value") != "<unknown>")
    counts = known.group_by("setting", "value").agg(pl.len().alias("k"), pl.col("rank").sort().alias("ranks"))
    major = (counts.sort(["setting", "k", "value"], descending=[False, True, False])
             .group_by("setting", maintain_order=True)
             .agg(pl.col("value").first().alias("majority"), pl.col("ranks").first().alias("mranks"),
                  pl.col("value").n_unique().alias("n_values"), pl.col("k").sum().alias("n_ranks")))
    odd = (known.join(major.filter(pl.col("n_values") > 1), on="setting")
           .filter(pl.col("value") != pl.col("majority")))
    odd_by = odd.group_by("setting").agg(pl.col("rank").sort().cast(pl.Utf8).str.join(",").alias("odd_ranks"))
    return (odd.join(odd_by, on="setting")
            .with_columns(pl.col("mranks").cast(pl.List(pl.Utf8)).list.join(",").alias("majority_ranks"))
            .select(list(schema)).cast(schema).sort("setting", "rank"))


def nccl_init(run: Run) -> pl.DataFrame:
    c = _comms(run).filter(pl.col("init_ms").is_not_null())
    if c.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "comm_id": pl.Utf8, "host": pl.Utf8, "nranks": pl.Int32,
                                    "version": pl.Utf8, "init_ms": pl.Float64, "dominant": pl.Utf8,
                                    "dominant_ms": pl.Float64})
    parts = [f.name for f in _TIMING.fields]
    t = pl.col("d").struct.field("timing")
    vals = [t.struct.field(p).fill_null(-1.0) for p in parts]
    return c.with_columns(
        pl.concat_list(vals).list.arg_max().alias("_i"),
        (pl.max_horizontal(vals) * 1000.0).alias("dominant_ms"),
    ).with_columns(
        pl.col("_i").replace_strict(list(range(len(parts))), parts, return_dtype=pl.Utf8).alias("dominant")
    ).select("rank", "comm_id", "host", "nranks", "version", "init_ms", "dominant", "dominant_ms")


def nccl_error_handling(run: Run) -> pl.DataFrame:
    schema = {"rank": pl.Int32, "setting": pl.Utf8, "value": pl.Utf8, "async_error_handling": pl.Int64,
              "timeout_ms": pl.Int64}
    ev = run.table("nccl_events")
    env = ev.filter(pl.col("kind") == "pg_env")
    rows = []
    if env.height:
        e = env.with_columns(
            pl.coalesce(pl.col("detail").str.json_path_match("$.env.TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                        pl.col("detail").str.json_path_match("$.env.NCCL_ASYNC_ERROR_HANDLING")).cast(pl.Int64, strict=False)
            .alias("async_error_handling"),
            pl.col("detail").str.json_path_match("$.env['TIMEOUT(ms)']").cast(pl.Int64, strict=False).alias("timeout_ms"),
        )
        rows.append(e.filter(pl.col("async_error_handling").is_not_null()).select(
            "rank", pl.lit("TORCH_NCCL_ASYNC_ERROR_HANDLING").alias("setting"),
            pl.col("async_error_handling").cast(pl.Utf8).alias("value"), "async_error_handling",
            pl.lit(None, dtype=pl.Int64).alias("timeout_ms")))
        rows.append(e.filter(pl.col("timeout_ms").is_not_null()).select(
            "rank", pl.lit("timeout").alias("setting"), pl.col("timeout_ms").cast(pl.Utf8).alias("value"),
            pl.lit(None, dtype=pl.Int64).alias("async_error_handling"), "timeout_ms"))
    t = ev.filter(pl.col("timeout_ms").is_not_null() & pl.col("kind").is_in(["watchdog_timeout", "fr_timeout", "error"]))
    if t.height:
        rows.append(t.group_by("rank").agg(pl.col("timeout_ms").max()).select(
            "rank", pl.lit("timeout").alias("setting"), pl.col("timeout_ms").cast(pl.Utf8).alias("value"),
            pl.lit(None, dtype=pl.Int64).alias("async_error_handling"), "timeout_ms"))
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.concat([r.cast(schema) for r in rows]).unique(["rank", "setting", "value"]).sort("rank", "setting")


def _detectors(ev: pl.DataFrame) -> pl.DataFrame:
    return (ev.filter((pl.col("kind") == "dump_signal")
                      & (pl.col("detail").str.json_path_match("$.role") == "detector"))
            .select("rank").unique())


def nccl_errors(run: Run) -> pl.DataFrame:
    ev = run.table("nccl_events")
    err = ev.filter(pl.col("kind").is_in(_ERROR_KINDS))
    if err.height == 0:
        return err.with_columns(pl.lit(None, dtype=pl.Utf8).alias("trail"), pl.lit(None, dtype=pl.Int64).alias("retcode"),
                                pl.lit(False).alias("root_cause"), pl.lit(False).alias("detector"))
    det = _detectors(ev).with_columns(pl.lit(True).alias("detector"))
    err = (err.join(det, on="rank", how="left").with_columns(pl.col("detector").fill_null(False))
           .with_columns(
               pl.col("detail").str.json_path_match("$.trail").alias("trail"),
               pl.col("detail").str.json_path_match("$.retcode").cast(pl.Int64, strict=False).alias("retcode")))
    # Root-cause candidate: the earliest timestamped error of a rank that did not merely detect the timeout; where no
    # line carries a time, the only rank with errors (if there is one).
    cand = err.filter(~pl.col("detector"))
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
                   & (pl.col("line") == first["line"])).fill_null(False)
    return err.with_columns(is_root.alias("root_cause")).sort("rank", "line")


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


def _expected_ranks(run: Run) -> int | None:
    return _world_size(run)[0]


def _desync_reports(ev: pl.DataFrame) -> pl.DataFrame:
    """TORCH_NCCL_DESYNC_DEBUG report lines: the ranks PyTorch itself names, with what it says of them."""
    rep = ev.filter(pl.col("kind") == "desync_report")
    if rep.height == 0:
        return pl.DataFrame(schema={"what": pl.Utf8, "ranks": pl.List(pl.Int32), "seq": pl.Int64, "text": pl.Utf8})
    d = pl.col("detail")
    out = []
    for key, what in (("missing_ranks", "never joined any collective"), ("stuck_ranks", "joined but did not finish"),
                      ("lagging_ranks", "finished but did not join the next")):
        out.append(rep.select(pl.lit(what).alias("what"),
                              d.str.json_path_match(f"$.{key}").str.json_decode(pl.List(pl.Int32)).alias("ranks"),
                              d.str.json_path_match("$.seq").cast(pl.Int64, strict=False).alias("seq"),
                              pl.col("text")).filter(pl.col("ranks").list.len() > 0))
    return pl.concat(out).unique(["what", "ranks", "seq"], keep="first", maintain_order=True)


def nccl_timeouts(run: Run) -> pl.DataFrame:
    schema = {"kind": pl.Utf8, "pg_name": pl.Utf8, "rank": pl.List(pl.Int32), "seq": pl.Int64, "op": pl.Utf8,
              "majority_seq": pl.Int64, "majority_op": pl.Utf8, "majority_ranks": pl.Utf8, "n_reporting": pl.Int64,
              "n_expected": pl.Int64, "detectors": pl.Utf8, "root_rank": pl.Int32, "detail": pl.Utf8}
    ev = run.table("nccl_events")
    wd = ev.filter((pl.col("kind") == "watchdog_timeout") & pl.col("rank").is_not_null())
    rows: list[pl.DataFrame] = []
    det = _detectors(ev)["rank"].sort().cast(pl.Utf8).str.join(",").item() if ev.height else ""
    from traceql.link import ensure

    errs = ensure(run, "nccl_errors")  # built once per run
    root = errs.filter(pl.col("root_cause"))["rank"].first() if errs.height else None
    reported = _desync_reports(ev)
    if wd.height:
        wd = wd.with_columns(pl.col("pg_name").fill_null("0"))
        first = wd.sort("ts", "line", nulls_last=True).group_by("pg_name", "rank", maintain_order=True).first()
        votes = (first.group_by("pg_name", "seq", "op").agg(pl.len().alias("k"), pl.col("rank").sort().alias("ranks"))
                 .sort(["pg_name", "k", "seq"], descending=[False, True, False]))
        major = votes.group_by("pg_name", maintain_order=True).agg(
            pl.col("seq").first().alias("majority_seq"), pl.col("op").first().alias("majority_op"),
            pl.col("ranks").first().cast(pl.List(pl.Utf8)).list.join(",").alias("majority_ranks"),
            pl.len().alias("n_variants"), pl.col("k").sum().alias("n_reporting"))
        first = first.join(major, on="pg_name")
        n_exp, n_origin = _world_size(run)
        # One rank's timeout alone cannot tell a hang from a desync or a dead peer: it is "timeout" (TQL517), which
        # says what is missing, unless the world is that one rank.
        one = (pl.col("n_reporting") < 2) & pl.lit(n_exp != 1)
        lone = (first.filter((pl.col("n_variants") == 1) & one)
                .select("pg_name", pl.concat_list("rank").alias("rank"), "seq", "op", "majority_seq", "majority_op",
                        "majority_ranks", "n_reporting")
                .with_columns(pl.lit("timeout").alias("kind"),
                              pl.lit("only this rank's log reports it" + (
                                  f"; the job has {n_exp} ranks ({n_origin})" if n_exp else
                                  "; the log states no world size (no NCCL 'nranks', no ProcessGroupNCCL 'size')"))
                              .alias("detail")))
        first = first.filter(~((pl.col("n_variants") == 1) & one))
        rows.append(lone)
        hang = (first.filter(pl.col("n_variants") == 1).group_by("pg_name")
                .agg(pl.col("rank").sort(), pl.col("seq").first(), pl.col("op").first(), pl.col("majority_seq").first(),
                     pl.col("majority_op").first(), pl.col("majority_ranks").first(), pl.col("n_reporting").first())
                .with_columns(pl.lit("hang").alias("kind")))
        odd = (first.filter((pl.col("n_variants") > 1) & ((pl.col("seq") != pl.col("majority_seq")) | (pl.col("op") != pl.col("majority_op"))))
               .with_columns(pl.concat_list("rank").alias("rank"), pl.lit("desync").alias("kind"))
               .select("pg_name", "rank", "seq", "op", "majority_seq", "majority_op", "majority_ranks", "n_reporting", "kind"))
        rows += [hang, odd]
        # Dead ranks: members of the default group (of the world size the log states) that never report a timeout
        # while others do, and the ranks PyTorch's desync report says never joined.
        wd_all = ev.filter((pl.col("kind") == "watchdog_timeout") & pl.col("rank").is_not_null())
        all_first = wd_all.with_columns(pl.col("pg_name").fill_null("0"))
        reporting = (set(all_first.filter(pl.col("pg_name") == "0")["rank"].to_list())
                     or set(all_first["rank"].to_list()))
        missing = set(range(n_exp)) - reporting if n_exp else set()
        named = {r for rs in reported.filter(pl.col("what") == "never joined any collective")["ranks"].to_list()
                 for r in rs} - reporting
        if missing or named:
            origin = ", ".join(x for x, on in ((f"world size {n_exp} ({n_origin})", missing),
                                               ("PyTorch's desync report", named)) if on)
            rows.append(pl.DataFrame({"kind": ["dead_rank"], "pg_name": ["0"], "rank": [sorted(missing | named)],
                                      "n_reporting": [len(reporting)], "detail": [origin]}))
        rows = [r.with_columns(pl.lit(n_exp, dtype=pl.Int64).alias("n_expected")) for r in rows]
    rep = reported.filter(pl.col("what") != "never joined any collective")
    if rep.height:  # PyTorch's own word on who is out of step (TQL518)
        rows.append(rep.select(pl.lit("desync_report").alias("kind"), pl.lit("0").alias("pg_name"),
                               pl.col("ranks").alias("rank"), "seq",
                               (pl.col("what") + pl.lit(" collective #") + pl.col("seq").cast(pl.Utf8).fill_null("?"))
                               .alias("detail")))
    hb = ev.filter(pl.col("kind") == "heartbeat_timeout")
    if hb.height:
        rows.append(hb.group_by("rank").agg(pl.col("detail").str.json_path_match("$.stuck_s").drop_nulls().first().alias("detail"),
                                            pl.col("pg_name").first())
                    .with_columns(pl.concat_list(pl.col("rank")).alias("rank"), pl.lit("stuck_watchdog").alias("kind")))
    if not rows:
        return pl.DataFrame(schema=schema)
    out = pl.concat([r.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in schema.items() if c not in r.columns])
                     .select(list(schema)).cast(schema) for r in rows])
    return out.with_columns(pl.lit(det or None, dtype=pl.Utf8).alias("detectors"),
                            pl.lit(root, dtype=pl.Int32).alias("root_rank"))


def _fr_collectives(run: Run) -> pl.DataFrame:
    fr_ids = [s.id for s in run.sources if s.kind == "flight_recorder"]
    c = run.table("collectives").filter(pl.col("source").is_in(fr_ids))
    # a dump may be present in both pickle and JSON form: keep one row per entry
    return c.unique(["rank", "pg_name", "id", "seq", "op"], keep="first")


def fr_mismatches(run: Run) -> pl.DataFrame:
    schema = {"kind": pl.Utf8, "pg_name": pl.Utf8, "pg_desc": pl.Utf8, "seq": pl.Int64, "rank": pl.Int32,
              "value": pl.Utf8, "majority": pl.Utf8, "majority_ranks": pl.Utf8, "n_ranks": pl.Int64}
    c = _fr_collectives(run).filter(pl.col("op").is_not_null() & ~pl.col("op").is_in(["send", "recv"]))
    if c.height == 0:
        return pl.DataFrame(schema=schema)
    c = c.with_columns(
        pl.col("op").alias("op_v"),
        (pl.col("op") + pl.lit(" in=") + pl.col("in_nelems").cast(pl.Utf8).fill_null("unknown") + pl.lit(" out=")
         + pl.col("out_nelems").cast(pl.Utf8).fill_null("unknown")).alias("size_v"),
    )
    out = []
    for kind, col in (("op_mismatch", "op_v"), ("size_mismatch", "size_v")):
        votes = (c.group_by("pg_name", "seq", col).agg(pl.len().alias("k"), pl.col("rank").sort().alias("rs"))
                 .sort(["pg_name", "seq", "k", col], descending=[False, False, True, False]))
        major = votes.group_by("pg_name", "seq", maintain_order=True).agg(
            pl.col(col).first().alias("majority"), pl.col("rs").first().cast(pl.List(pl.Utf8)).list.join(",").alias("majority_ranks"),
            pl.col(col).n_unique().alias("nv"), pl.col("k").sum().alias("n_ranks"))
        odd = c.join(major.filter(pl.col("nv") > 1), on=["pg_name", "seq"]).filter(pl.col(col) != pl.col("majority"))
        if kind == "size_mismatch":  # an op mismatch is reported as such, not again as a size mismatch
            odd = odd.filter(pl.col("op_v") == pl.col("majority").str.split(" ").list.first())
        out.append(odd.select(pl.lit(kind).alias("kind"), "pg_name", "pg_desc", "seq", "rank",
                              pl.col(col).alias("value"), "majority", "majority_ranks", "n_ranks"))
    # Ranks that never reached a sequence number their group reached: the group's furthest seq against theirs.
    last = c.group_by("pg_name", "rank").agg(pl.col("seq").max().alias("last_seq"), pl.col("pg_desc").first(),
                                             pl.col("pg_ranks").first(), pl.col("group_size").first())
    top = last.group_by("pg_name").agg(pl.col("last_seq").max().alias("top"),
                                       pl.col("rank").filter(pl.col("last_seq") == pl.col("last_seq").max()).sort()
                                       .cast(pl.Utf8).str.join(",").alias("majority_ranks"),
                                       pl.len().alias("n_ranks"))
    lag = last.join(top, on="pg_name").filter(pl.col("last_seq") < pl.col("top"))
    out.append(lag.select(pl.lit("missing_rank").alias("kind"), "pg_name", "pg_desc", pl.col("top").alias("seq"), "rank",
                          ("last seq " + pl.col("last_seq").cast(pl.Utf8)).alias("value"),
                          ("seq " + pl.col("top").cast(pl.Utf8)).alias("majority"), "majority_ranks", "n_ranks"))
    # Group members without any dump.
    members = last.group_by("pg_name").agg(pl.col("pg_ranks").drop_nulls().first(), pl.col("group_size").max(),
                                          pl.col("rank").alias("have"), pl.col("pg_desc").first(),
                                          pl.col("last_seq").max().alias("top"))
    for row in members.iter_rows(named=True):
        expect: list[int] = []
        if row["pg_ranks"]:
            try:
                expect = [int(x) for x in orjson.loads(row["pg_ranks"])]
            except (ValueError, TypeError):
                expect = []
        if not expect and row["group_size"] and row["pg_name"] in ("0", ""):
            expect = list(range(int(row["group_size"])))
        gone = sorted(set(expect) - set(row["have"]))
        if gone:
            out.append(pl.DataFrame({
                "kind": "no_dump", "pg_name": row["pg_name"], "pg_desc": row["pg_desc"], "seq": row["top"], "rank": gone,
                "value": "no Flight Recorder dump", "majority": "dumped",
                "majority_ranks": ",".join(map(str, sorted(row["have"]))), "n_ranks": len(row["have"]),
            }))
    return pl.concat([o.cast(schema) for o in out]).sort("kind", "pg_name", "seq", "rank")


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
    "nccl_comm_checks": nccl_comm_checks,
    "nccl_config_diff": nccl_config_diff,
    "nccl_duplicate_gpu": nccl_duplicate_gpu,
    "nccl_init": nccl_init,
    "nccl_error_handling": nccl_error_handling,
    "nccl_errors": nccl_errors,
    "nccl_timeouts": nccl_timeouts,
    "fr_mismatches": fr_mismatches,
    "nccl_comm_collectives": nccl_comm_collectives,
}
