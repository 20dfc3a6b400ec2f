"""Collective bandwidth: per matched collective, its algorithm and bus bandwidth (nccl-tests' definitions) against the
link its communicator used.

nccl-tests (doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
- algbw = S / t, with S the operation's size in bytes and t its time;
- busbw = algbw x a factor that makes it comparable with the hardware's per-rank bandwidth whatever the rank count n:
  all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce (and point-to-point send /
  recv) 1. S is the whole array: for all_gather the output (n x the per-rank input), for reduce_scatter the input.

Here t is the collective's time on its last-arriving rank (its own kernel, or host call for backends without one):
the others' time includes waiting for that rank, which is not transfer (collective_instances' wait_ms).

The link: ranks of the group on more than one host (nccl_comms' host, else the sources' host) communicate inter-node
over the communicator's network (IB, Socket); on one host over its intra-node transports (P2P: NVLink or PCIe
peer-to-peer; SHM: through host memory). NCCL logs name them (nccl_comms network and transports); without NCCL logs
the link is unknown and no nominal speed is given. Nominal speeds (GB/s per direction per rank) are the LOWEST
common generation of each link, so that "far below the link" is never an artefact of assuming a faster link than the
machine has:
- P2P: PCIe 4.0 x16, 31.5 GB/s (PCI-SIG: 16 GT/s x 16 lanes, 128b/130b). NVLink is far faster (H100/H200 NVLink 4:
  450 GB/s per direction, NVIDIA datasheets), and NCCL logs do not always say which one P2P runs over.
- SHM: 10 GB/s (a copy through host memory on each side; NCCL's SHM transport, typically PCIe 3/4 bound).
- NET/IB: 12.5 GB/s (InfiniBand EDR, 100 Gb/s; HDR 200 Gb/s and NDR 400 Gb/s are faster).
- NET/Socket: 1.25 GB/s (10 Gb Ethernet).
"""

from __future__ import annotations

import polars as pl

from traceql.model import Run

# op -> bus bandwidth factor as a function of the rank count n (nccl-tests PERFORMANCE.md "Summary")
BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
# link -> nominal GB/s per direction per rank (see the module doc for the sources)
NOMINAL_GBPS = {"p2p": 31.5, "shm": 10.0, "ib": 12.5, "socket": 1.25}

SCHEMA = {
    "group": pl.Utf8, "match_id": pl.Int64, "step": pl.Int64, "op": pl.Utf8, "backend": pl.Utf8, "n_ranks": pl.Int32,
    "ranks": pl.List(pl.Int32), "bytes": pl.Int64, "size_bytes": pl.Int64, "time_ms": pl.Float64,
    "algbw_gbps": pl.Float64, "bus_factor": pl.Float64, "busbw_gbps": pl.Float64, "n_hosts": pl.Int32,
    "inter_node": pl.Boolean, "link": pl.Utf8, "nominal_gbps": pl.Float64, "pct_of_link": pl.Float64,
}


def bus_factor(op: str | None, n: int | None) -> float | None:
    f = BUS_FACTOR.get(op or "")
    if f is None or not n or n < 1:
        return None
    return f(n)


def size_bytes(op: str | None, nbytes: int | None, in_nelems: int | None, out_nelems: int | None, n: int | None) -> int | None:
    """S of nccl-tests: the whole array (all_gather: its output; the others: the per-rank input, as recorded)."""
    if nbytes is None:
        return None
    if op == "all_gather":
        if in_nelems and out_nelems:
            return int(nbytes * out_nelems // in_nelems)
        return int(nbytes * n) if n else None
    return int(nbytes)


def _links(run: Run) -> dict[int, tuple[str | None, set[str]]]:
    """rank -> (host, links its communicators used: 'p2p', 'shm', 'ib', 'socket') from the NCCL logs."""
    out: dict[int, tuple[str | None, set[str]]] = {}
    for s in run.sources:
        host = getattr(s, "host", None)
        if s.rank is not None and host:
            out.setdefault(int(s.rank), (host, set()))
    nc = run.table("nccl_comms")
    for rank, host, network, transports in nc.select("rank", "host", "network", "transports").iter_rows():
        if rank is None:
            continue
        h, links = out.get(int(rank), (None, set()))
        tr = (transports or "").lower()  # e.g. ["P2P/CUMEM", "SHM", "NET/IB/0", "NET/Socket/0"]
        links = links | {link for word, link in (("p2p", "p2p"), ("shm", "shm"), ("net/ib", "ib"), ("socket", "socket"))
                         if word in tr}
        net = (network or "").lower()  # the inter-node network the communicator chose: IB or Socket
        links |= {"net:ib"} if net.startswith("ib") else ({"net:socket"} if "socket" in net else set())
        out[int(rank)] = (host or h, links)
    return out


def _pick(inter: bool, links: set[str]) -> str | None:
    if inter:
        return "ib" if "net:ib" in links or "ib" in links else ("socket" if "net:socket" in links or "socket" in links else None)
    for link in ("p2p", "shm"):
        if link in links:
            return link
    return None


def collective_bandwidth(run: Run) -> pl.DataFrame:
    from traceql.link import ensure

    ci = ensure(run, "collective_instances").filter((pl.col("n_ranks") >= 2) & pl.col("dur_ms").is_not_null())
    if ci.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    per = ci.group_by("group", "match_id").agg(
        pl.col("step").drop_nulls().first(), pl.col("op").first(), pl.col("backend").first(),
        pl.col("n_ranks").first(), pl.col("rank").sort().alias("ranks"),
        pl.col("bytes").drop_nulls().first(), pl.col("in_nelems").drop_nulls().first(), pl.col("out_nelems").drop_nulls().first(),
        # the last arriver's own time: the others' includes waiting for it
        pl.col("dur_ms").sort_by("arrival", descending=True, nulls_last=True).first().alias("time_ms"),
    ).sort("group", "match_id")
    links = _links(run)
    rows = []
    for r in per.iter_rows(named=True):
        n = int(r["n_ranks"])
        s = size_bytes(r["op"], r["bytes"], r["in_nelems"], r["out_nelems"], n)
        f = bus_factor(r["op"], n)
        t = r["time_ms"]
        alg = s / (t * 1e-3) / 1e9 if s and t and t > 0 else None
        hosts = {links[k][0] for k in r["ranks"] if k in links and links[k][0]}
        seen = set().union(*(links[k][1] for k in r["ranks"] if k in links)) if links else set()
        inter = len(hosts) > 1
        link = _pick(inter, seen) if r["backend"] in (None, "nccl") else None
        nominal = NOMINAL_GBPS.get(link) if link else None
        bus = alg * f if alg is not None and f is not None else None
        rows.append({
            "group": r["group"], "match_id": r["match_id"], "step": r["step"], "op": r["op"], "backend": r["backend"],
            "n_ranks": n, "ranks": r["ranks"], "bytes": r["bytes"], "size_bytes": s, "time_ms": t, "algbw_gbps": alg,
            "bus_factor": f, "busbw_gbps": bus, "n_hosts": len(hosts) or None, "inter_node": inter if hosts else None,
            "link": link, "nominal_gbps": nominal,
            "pct_of_link": 100.0 * bus / nominal if bus is not None and nominal else None,
        })
    return pl.DataFrame(rows, schema=SCHEMA)


DERIVED = {"collective_bandwidth": collective_bandwidth}
NEEDS = {"collective_bandwidth": ["collectives"]}
