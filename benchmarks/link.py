"""Linking cost at scale: 8 ranks x ~1M events each, synthesised directly as canonical polars tables.

Per rank and step: `kernels_per_step` compute kernels on one stream with their launches (runtime rows sharing
the correlation), one comm kernel per collective, one collective row per call (seq numbers), steps. Rank clocks
are offset by a planted amount and one rank arrives late, so the benchmark also checks what it times.

    python benchmarks/link.py [--ranks 8] [--events 1000000] [--graph]

Prints seconds and events/s for: collective matching + clock offsets + collective instances + straggler summary,
launch_bound, critical_path, and (with --graph) the networkx graph.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl

from traceql import link
from traceql.link.graph import build_graph
from traceql.link.steps import assign_steps
from traceql.model import Run, Source, conform


def synth(ranks: int, events: int, kernels_per_step: int = 2000, colls_per_step: int = 20) -> Run:
    # events per rank = kernels + runtime rows (2 per kernel) + collectives
    per_step = 3 * (kernels_per_step + colls_per_step) + colls_per_step
    steps = max(1, events // per_step)
    k_dur, gap = 20_000, 5_000  # 20 us kernels, 5 us apart
    step_ns = (kernels_per_step + colls_per_step) * (k_dur + gap) + 1_000_000
    tables: dict[str, list[pl.DataFrame]] = {"kernels": [], "runtime": [], "collectives": [], "steps": []}
    for r in range(ranks):
        offset = r * 1_000_003  # planted clock offset
        late = 300_000 if r == ranks - 1 else 0  # the last rank arrives 0.3 ms late
        n_per = kernels_per_step + colls_per_step
        n = steps * n_per
        idx = pl.int_range(0, n, eager=True, dtype=pl.Int64)
        step = idx // n_per
        pos = idx % n_per
        is_comm = (pos % (n_per // colls_per_step)) == (n_per // colls_per_step - 1)
        k = pl.DataFrame({"id": idx, "correlation": idx, "_step": step, "_comm": is_comm, "_pos": pos})
        k = k.with_columns(
            (1_000_000_000 + pl.col("_step") * step_ns + pl.col("_pos") * (k_dur + gap) + offset
             + pl.when(pl.col("_comm")).then(late).otherwise(0)).alias("ts"))
        # a collective's kernel ends at the same true time on every rank: the late rank's kernel is shorter
        k = k.with_columns(
            (pl.col("ts") + pl.when(pl.col("_comm")).then(k_dur + 400_000 - late).otherwise(k_dur)).alias("end"),
            pl.when(pl.col("_comm")).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("kind"),
            pl.when(pl.col("_comm")).then(pl.lit("ncclDevKernel_AllReduce_Sum_f32_RING_LL")).otherwise(pl.lit("gemm")).alias("name"),
            pl.lit(0, pl.Int32).alias("device"), pl.lit(7, pl.Int64).alias("stream"),
            pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"),
        ).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
        rt = k.select("rank", "source", pl.col("id"), "correlation", (pl.col("ts") - 10_000).alias("ts"),
                      (pl.col("ts") - 6_000).alias("end"), pl.lit("cudaLaunchKernel").alias("name"), pl.lit("launch").alias("kind"),
                      pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"))
        # a second runtime row per kernel (e.g. cudaStreamGetCaptureInfo-like bookkeeping) to reach the event count
        rt2 = rt.with_columns((pl.col("id") + n).alias("id"), pl.lit(None, pl.Int64).alias("correlation"), pl.lit("other").alias("kind"),
                              pl.lit("cudaGetLastError").alias("name"))
        c = k.filter(pl.col("_comm")).with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("seq")).select(
            "rank", "source", "id", "seq", pl.lit("all_reduce").alias("op"), pl.lit("nccl").alias("backend"),
            pl.lit("0").alias("pg_name"), pl.lit(f"{list(range(ranks))}").alias("pg_ranks"), (pl.col("ts") - 20_000).alias("ts"),
            (pl.col("ts") - 15_000).alias("end"), pl.col("ts").alias("kernel_ts"), pl.col("end").alias("kernel_end"),
            pl.lit(1 << 20).alias("bytes"))
        st = pl.DataFrame({"step": pl.int_range(0, steps, eager=True, dtype=pl.Int64)}).with_columns(
            (1_000_000_000 + pl.col("step") * step_ns + offset - 50_000).alias("ts"),
            pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.lit("profiler_step").alias("origin"),
        ).with_columns((pl.col("ts") + step_ns).alias("end"), pl.lit(step_ns, pl.Int64).alias("dur"))
        tables["kernels"].append(conform("kernels", k.drop("_step", "_comm", "_pos")))
        tables["runtime"].append(conform("runtime", pl.concat([rt, rt2])))
        tables["collectives"].append(conform("collectives", c))
        tables["steps"].append(conform("steps", st))
    srcs = [Source(Path(f"rank{r}.json"), "kineto", id=r, rank=r, ranks=[r], meta={"world_size": ranks}) for r in range(ranks)]
    run = Run(path=Path("synthetic"), sources=srcs, tables={n: pl.concat(f) for n, f in tables.items()})
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000, help="events per rank")
    ap.add_argument("--graph", action="store_true", help="also build the networkx graph (slow: Python objects per node)")
    a = ap.parse_args()
    t = time.perf_counter()
    run = synth(a.ranks, a.events)
    n = sum(run.tables[t_].height for t_ in ("kernels", "runtime", "collectives"))
    print(f"synthesised {a.ranks} ranks, {n:,} events ({n // a.ranks:,} per rank) in {time.perf_counter() - t:.1f} s")

    def timed(label, fn):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        print(f"{label:<48} {dt:7.2f} s  {n / dt:12,.0f} events/s")
        return out

    timed("assign steps (link_run, the lead's steps.py)", lambda: assign_steps(run))
    timed("match + clock + instances + stragglers", lambda: [link.ensure(run, x) for x in ("collective_matches", "clock_offsets",
                                                                                            "collective_instances", "collective_waits",
                                                                                            "collective_gaps")])
    off = run.tables["clock_offsets"].sort("rank")
    err = max(abs(o - r * 1_000_003) for r, o in off.select("rank", "offset_ns").iter_rows())
    waits = run.tables["collective_waits"].group_by("waited_for").agg(pl.col("wait_ms").sum())
    last = waits.sort("wait_ms", descending=True)["waited_for"][0]
    print(f"  check: planted clock offsets recovered within {err} ns; straggler found: rank {last} (planted {a.ranks - 1})")
    timed("launch_bound", lambda: link.ensure(run, "launch_bound"))
    cp = timed("critical_path", lambda: link.ensure(run, "critical_path"))
    print(f"  check: {cp.height} steps on the critical path, {cp['path_kernels'].sum():,} kernels walked")
    if a.graph:
        g = timed("graph (edge lists + networkx)", lambda: build_graph(run))
        print(f"  {g.number_of_nodes():,} nodes, {g.number_of_edges():,} edges")


if __name__ == "__main__":
    main()
