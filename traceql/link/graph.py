"""The dependency graph of a run: a networkx DiGraph over the structural skeleton.

Nodes (ids; bulk attributes stay in the polars tables and join back by id):
  "r{rank}:s{step}"  step            "r{rank}:h{id}"  host op that launches work (and its callers)
  "r{rank}:rt{id}"   runtime call    "r{rank}:k{id}"  kernel (GPU activity)
  "r{rank}:c{id}"    collective call "m{match_id}"    one collective matched across the ranks of its group
Where one rank has several sources (a Kineto trace and an nsys export), the prefix is "r{rank}s{source}".

Edges carry `kind`:
  calls     host op -> child host op; host op -> runtime call (by external id); host op -> collective call
  launches  runtime call -> kernel (by correlation, within one process)
  stream    kernel -> next kernel on its stream
  sync      kernel -> the synchronising runtime call it unblocked (stream/device/event synchronize: the last
            kernel of the stream, or of the device when the stream is unknown, that ended before the call returned)
  peer      collective call -> its match node; match node -> the collective's kernel on every rank (a collective
            kernel completes only once every rank has arrived)
  step      step -> its top-level host ops and its kernels

Edge lists are built as polars frames (joins, shifts, as-of joins: near-linear) and handed to add_edges_from.
Not modelled yet: event record -> stream wait (the canonical tables carry no event record id for waits).
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

_E = {"src": pl.Utf8, "dst": pl.Utf8, "kind": pl.Utf8}


def _prefixes(run: Run) -> pl.DataFrame:
    """(rank, source) -> node id prefix."""
    frames = [run.table(t).select("rank", "source") for t in ("kernels", "host_ops", "runtime", "collectives", "steps")
              if run.table(t).height]
    if not frames:
        return pl.DataFrame(schema={"rank": pl.Int32, "source": pl.Int32, "_p": pl.Utf8})
    rs = pl.concat([f.with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32)) for f in frames]).unique()
    rs = rs.filter(pl.col("rank").is_not_null())
    multi = pl.col("source").n_unique().over("rank") > 1
    return rs.with_columns(
        pl.when(multi).then(pl.format("r{}s{}", "rank", "source")).otherwise(pl.format("r{}", "rank")).alias("_p")
    )


def _with_prefix(df: pl.DataFrame, pre: pl.DataFrame) -> pl.DataFrame:
    df = df.with_columns(pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32))
    return df.join(pre, on=["rank", "source"], how="inner", maintain_order="left")


def _node(prefix: str, tag: str, col: str) -> pl.Expr:
    return pl.concat_str([pl.col(prefix), pl.lit(f":{tag}"), pl.col(col).cast(pl.Utf8)])


def _launching_op(rt: pl.DataFrame, h: pl.DataFrame) -> pl.DataFrame:
    """Per runtime call, the host op that made it (_hid): the innermost op with its external id, else the innermost
    op of its thread whose span holds the call's start."""
    if rt.height == 0 or h.height == 0:
        return rt.with_columns(pl.lit(None, pl.Int64).alias("_hid")).head(0)
    inner = h.filter(pl.col("external_id").is_not_null()).sort("depth", descending=True).unique(
        ["rank", "source", "external_id"], keep="first").select("rank", "source", "external_id", pl.col("id").alias("_hid"))
    by_ext = rt.filter(pl.col("external_id").is_not_null()).join(inner, on=["rank", "source", "external_id"], how="inner")
    rest = rt.join(by_ext.select("rank", "source", "id"), on=["rank", "source", "id"], how="anti").filter(
        pl.col("ts").is_not_null() & pl.col("tid").is_not_null())
    if rest.height == 0:
        return by_ext
    ops = h.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null()).select(
        "rank", "source", "pid", "tid", pl.col("ts").alias("_hts"), pl.col("id").alias("_hid"))
    span = h.select("rank", "source", pl.col("id").alias("_hid"), pl.col("end").alias("_hend"), pl.col("parent").alias("_par"))
    j = rest.sort("ts").join_asof(ops.sort("_hts"), left_on="ts", right_on="_hts", by=["rank", "source", "pid", "tid"],
                                  strategy="backward", check_sortedness=False)
    # the latest op started before the call may have ended already: climb to the first ancestor that spans it
    for _ in range(16):
        j = j.join(span, on=["rank", "source", "_hid"], how="left")
        bad = pl.col("_hid").is_not_null() & (pl.col("_hend") < pl.col("ts"))
        if not j.select(bad.any()).item():
            j = j.drop("_hend", "_par")
            break
        j = j.with_columns(pl.when(bad).then(pl.col("_par")).otherwise(pl.col("_hid")).alias("_hid")).drop("_hend", "_par")
    j = j.drop([c for c in ("_hts", "_hend", "_par") if c in j.columns])
    return pl.concat([by_ext, j.filter(pl.col("_hid").is_not_null()).select(by_ext.columns)])


def edge_lists(run: Run) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(nodes: id, kind, rank; edges: src, dst, kind) as polars frames."""
    from traceql.link import ensure

    pre = _prefixes(run)
    nodes: list[pl.DataFrame] = []
    edges: list[pl.DataFrame] = []
    k = _with_prefix(run.table("kernels"), pre)
    rt = _with_prefix(run.table("runtime"), pre)
    h = _with_prefix(run.table("host_ops"), pre)
    c = _with_prefix(run.table("collectives"), pre)
    st = _with_prefix(run.table("steps"), pre)

    k = k.with_columns(_node("_p", "k", "id").alias("_n"))
    rt = rt.with_columns(_node("_p", "rt", "id").alias("_n"))
    nodes += [k.select(pl.col("_n").alias("id"), pl.lit("kernel").alias("kind"), "rank"),
              rt.select(pl.col("_n").alias("id"), pl.lit("runtime").alias("kind"), "rank")]

    # launches: runtime -> kernel by correlation (and process, where the kernel records its process)
    if k.height and rt.height:
        r_one = rt.filter(pl.col("correlation").is_not_null()).unique(["rank", "source", "correlation", "pid"], keep="first")
        with_pid = k.filter(pl.col("pid").is_not_null() & pl.col("correlation").is_not_null())
        no_pid = k.filter(pl.col("pid").is_null() & pl.col("correlation").is_not_null())
        j1 = with_pid.join(r_one.select("rank", "source", "pid", "correlation", pl.col("_n").alias("_r")),
                           on=["rank", "source", "pid", "correlation"], how="inner")
        j2 = no_pid.join(r_one.unique(["rank", "source", "correlation"], keep="first").select(
            "rank", "source", "correlation", pl.col("_n").alias("_r")), on=["rank", "source", "correlation"], how="inner")
        for j in (j1, j2):
            edges.append(j.select(pl.col("_r").alias("src"), pl.col("_n").alias("dst"), pl.lit("launches").alias("kind")))

    # stream order
    if k.height:
        ks = k.filter(pl.col("ts").is_not_null()).sort(["rank", "source", "device", "stream", "ts"])
        nxt = pl.col("_n").shift(-1).over(["rank", "source", "device", "stream"])
        edges.append(ks.select(pl.col("_n").alias("src"), nxt.alias("dst"), pl.lit("stream").alias("kind")).drop_nulls("dst"))

    # sync: the last kernel (of the synced stream where the syncs table names it, else of the rank's source)
    if k.height and rt.height:
        calls = rt.filter(pl.col("kind") == "sync").filter(~pl.col("name").str.contains("Query")).filter(pl.col("end").is_not_null())
        if calls.height:
            sy = run.table("syncs")
            if sy.height:
                sy = sy.filter(pl.col("correlation").is_not_null()).select(
                    pl.col("rank").cast(pl.Int32), pl.col("source").cast(pl.Int32), "correlation", pl.col("stream").alias("_sstream")
                ).unique(["rank", "source", "correlation"], keep="first")
                calls = calls.join(sy, on=["rank", "source", "correlation"], how="left")
            else:
                calls = calls.with_columns(pl.lit(None, pl.Int64).alias("_sstream"))
            kend = k.filter(pl.col("end").is_not_null()).select("rank", "source", "stream", "end", pl.col("_n").alias("_k")).sort("end")
            by_stream = calls.filter(pl.col("_sstream").is_not_null()).sort("end").join_asof(
                kend, left_on="end", right_on="end", by_left=["rank", "source", "_sstream"], by_right=["rank", "source", "stream"],
                strategy="backward", check_sortedness=False)
            any_stream = calls.filter(pl.col("_sstream").is_null()).sort("end").join_asof(
                kend.drop("stream"), on="end", by=["rank", "source"], strategy="backward", check_sortedness=False)
            for j in (by_stream, any_stream):
                edges.append(j.select(pl.col("_k").alias("src"), pl.col("_n").alias("dst"), pl.lit("sync").alias("kind")).drop_nulls("src"))

    # host ops: those whose external id launches work, those that call collectives, and their callers
    if h.height:
        rt_host = _launching_op(rt, h)
        keep_ids = pl.concat([rt_host.select("rank", "source", pl.col("_hid").alias("id")),
                              c.filter(pl.col("host_op_id").is_not_null()).select("rank", "source", pl.col("host_op_id").alias("id"))])
        parent = h.select("rank", "source", "id", "parent")
        frontier = keep_ids.unique()
        allk = frontier
        for _ in range(128):  # walk up the call stack, one level per round
            up = frontier.join(parent, on=["rank", "source", "id"], how="inner").select("rank", "source", pl.col("parent").alias("id")).drop_nulls("id").unique()
            up = up.join(allk, on=["rank", "source", "id"], how="anti")
            if up.height == 0:
                break
            allk = pl.concat([allk, up])
            frontier = up
        hk = h.join(allk, on=["rank", "source", "id"], how="semi").with_columns(_node("_p", "h", "id").alias("_n"))
        nodes.append(hk.select(pl.col("_n").alias("id"), pl.lit("host_op").alias("kind"), "rank"))
        pe = hk.filter(pl.col("parent").is_not_null()).select("_p", "_n", "parent").with_columns(_node("_p", "h", "parent").alias("src"))
        edges.append(pe.select("src", pl.col("_n").alias("dst"), pl.lit("calls").alias("kind")))
        if rt_host.height:
            edges.append(rt_host.select(_node("_p", "h", "_hid").alias("src"), pl.col("_n").alias("dst"), pl.lit("calls").alias("kind")))
        # step membership: top-level host ops kept in the graph
        if st.height:
            top = hk.filter(pl.col("parent").is_null() & pl.col("step").is_not_null())
            edges.append(top.select(pl.format("{}:s{}", "_p", "step").alias("src"), pl.col("_n").alias("dst"), pl.lit("step").alias("kind")))

    # collectives, their host op, and the peer edges through one node per match
    if c.height:
        c = c.with_columns(_node("_p", "c", "id").alias("_n"))
        nodes.append(c.select(pl.col("_n").alias("id"), pl.lit("collective").alias("kind"), "rank"))
        edges.append(c.filter(pl.col("host_op_id").is_not_null()).select(
            _node("_p", "h", "host_op_id").alias("src"), pl.col("_n").alias("dst"), pl.lit("calls").alias("kind")))
        m = ensure(run, "collective_matches").select("rank", "source", "id", "match_id")
        cm = c.join(m, on=["rank", "source", "id"], how="inner")
        multi = cm.filter(pl.len().over("match_id") >= 2)
        nodes.append(multi.select(pl.format("m{}", "match_id").alias("id"), pl.lit("collective_match").alias("kind"),
                                  pl.lit(None, pl.Int32).alias("rank")).unique("id"))
        edges.append(multi.select(pl.col("_n").alias("src"), pl.format("m{}", "match_id").alias("dst"), pl.lit("peer").alias("kind")))
        if k.height:
            ck = multi.filter(pl.col("kernel_ts").is_not_null()).join(
                k.filter(pl.col("kind") == "comm").select("rank", "source", pl.col("ts").alias("kernel_ts"), pl.col("_n").alias("_k")),
                on=["rank", "source", "kernel_ts"], how="inner").unique(["rank", "source", "id"], keep="first")
            edges.append(ck.select(pl.format("m{}", "match_id").alias("src"), pl.col("_k").alias("dst"), pl.lit("peer").alias("kind")))

    if st.height:
        nodes.append(st.select(pl.format("{}:s{}", "_p", "step").alias("id"), pl.lit("step").alias("kind"), "rank"))
        if k.height:
            edges.append(k.filter(pl.col("step").is_not_null()).select(
                pl.format("{}:s{}", "_p", "step").alias("src"), pl.col("_n").alias("dst"), pl.lit("step").alias("kind")))

    ns = pl.concat([n.select(pl.col("id").cast(pl.Utf8), pl.col("kind").cast(pl.Utf8), pl.col("rank").cast(pl.Int32)) for n in nodes]).unique("id", keep="first") \
        if nodes else pl.DataFrame(schema={"id": pl.Utf8, "kind": pl.Utf8, "rank": pl.Int32})
    es = pl.concat([e.select([pl.col(a).cast(t) for a, t in _E.items()]) for e in edges]) if edges else pl.DataFrame(schema=_E)
    # an edge's ends must be nodes (a parent outside the kept set, a host op of a collective not imported)
    es = es.join(ns.select(pl.col("id").alias("src")), on="src", how="semi").join(ns.select(pl.col("id").alias("dst")), on="dst", how="semi")
    return ns, es


def build_graph(run: Run) -> "nx.DiGraph":  # noqa: F821 - networkx is imported on use (0.2 s at start-up)
    """The run's dependency graph (also stored as run.graph)."""
    import networkx as nx

    if isinstance(run.graph, nx.DiGraph):
        return run.graph
    nodes, edges = edge_lists(run)
    g = nx.DiGraph()
    # one call per (kind, rank) with shared keyword attributes: no per-row Python dicts built here
    for (kind, rank), part in nodes.group_by("kind", "rank"):
        attrs = {"kind": kind} if rank is None else {"kind": kind, "rank": rank}
        g.add_nodes_from(part["id"].to_list(), **attrs)
    for (kind,), part in edges.group_by("kind"):
        g.add_edges_from(zip(part["src"].to_list(), part["dst"].to_list()), kind=kind)
    run.graph = g
    return g


def write_graph(g, path, graphml: bool = False) -> None:
    import networkx as nx

    if graphml:
        nx.write_graphml(g, path)
        return
    import orjson

    data = nx.node_link_data(g, edges="edges")
    with open(path, "wb") as f:
        f.write(orjson.dumps(data))
