"""The whole rule pack at scale: 8 ranks x ~1M events each, synthesised directly as canonical polars tables.

Per rank and step (all vectorised, no per-row Python): `kernels_per_step` compute kernels on one stream (bf16 GEMMs
with a few fp32 ones), one NCCL comm kernel per collective, a pageable HtoD cudaMemcpyAsync and a synchronous DtoH
cudaMemcpy with their memcpy "kernels"; a launch call per kernel (runtime, with correlation and external id), one
cudaStreamSynchronize per step under an aten::item op; host ops nested ProfilerStep#N > DistributedDataParallel.forward
(two micro-batches) > one aten op per launch (parent, depth, external_id); one collective row per call with seq
numbers; steps. Rank clocks are offset by a planted amount, the last rank arrives late at every collective, and a
few steps carry a launch-bound stretch (the host falls behind), so several rules really fire.

    python benchmarks/rules.py [--ranks 8] [--events 1000000] [--profile OUT.prof] [--top 10]

Prints seconds and events/s for: link_run, each derived table (in dependency order, so each line is that table's
own cost), each rule evaluated over the cached tables (the slowest `--top`), and the whole `run_rules` on a freshly
linked run (derived tables built on demand: what `traceql check` does once the canonical tables come from cache).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import time
from pathlib import Path

import polars as pl

from traceql import link
from traceql.model import Run, Source, conform
from traceql.rules.engine import evaluate, run_rules
from traceql.rules.loader import load_rules

K_DUR, K_GAP = 20_000, 5_000  # 20 us kernels, 5 us apart


def synth_rank(r: int, ranks: int, steps: int, kps: int, cps: int) -> dict[str, pl.DataFrame]:
    offset = r * 1_000_003  # planted clock offset
    late = 300_000 if r == ranks - 1 else 0  # the last rank arrives 0.3 ms late at every collective
    n_per = kps + cps  # launched kernels per step (compute + comm)
    step_ns = n_per * (K_DUR + K_GAP) + 3_000_000
    t0 = 1_000_000_000 + offset
    n = steps * n_per
    idx = pl.int_range(0, n, eager=True, dtype=pl.Int64)
    k = pl.DataFrame({"_i": idx}).with_columns((pl.col("_i") // n_per).alias("_step"), (pl.col("_i") % n_per).alias("_pos"))
    k = k.with_columns(((pl.col("_pos") % (n_per // cps)) == (n_per // cps - 1)).alias("_comm"),
                       # every 16th step, the second half's kernels wait on a slow host: launch-bound gaps
                       (((pl.col("_step") % 16) == 5) & (pl.col("_pos") > n_per // 2)).alias("_slow"))
    step0 = t0 + pl.col("_step") * step_ns
    # host side: one launch per kernel every 15 us, 60 us in slow stretches; the host runs ahead of the GPU except there
    k = k.with_columns(
        (step0 + 200_000 + pl.col("_pos") * 15_000 + pl.when(pl.col("_slow")).then((pl.col("_pos") - n_per // 2) * 45_000).otherwise(0)).alias("_lts"),
    )
    k = k.with_columns(
        pl.max_horizontal(step0 + 400_000 + pl.col("_pos") * (K_DUR + K_GAP), pl.col("_lts") + 8_000).alias("ts"),
    )
    k = k.with_columns(pl.col("ts") + pl.when(pl.col("_comm")).then(late).otherwise(0))
    # a slow stretch shifts later kernels; keep one stream ordered
    k = k.with_columns(pl.col("ts").cum_max().over("_step"))
    k = k.with_columns(
        (pl.col("ts") + pl.when(pl.col("_comm")).then(K_DUR + 400_000 - late).otherwise(K_DUR)).alias("end"),
        pl.when(pl.col("_comm")).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("kind"),
        pl.when(pl.col("_comm")).then(pl.lit("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"))
        .when(pl.col("_pos") % 97 == 3).then(pl.lit("ampere_sgemm_128x64_nn"))
        .when(pl.col("_pos") % 3 == 0).then(pl.lit("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"))
        .otherwise(pl.lit("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16>>(int, T1, T2)")).alias("name"),
        pl.lit(0, pl.Int32).alias("device"), pl.lit(7, pl.Int64).alias("stream"),
    )
    n_k = k.height
    kern = k.select(
        pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.col("_i").alias("id"), "device", "stream",
        "name", "kind", "ts", "end", (pl.col("end") - pl.col("ts")).alias("dur"), pl.col("_i").alias("correlation"),
        pl.col("_i").alias("external_id"),
        pl.when(pl.col("_comm")).then(pl.lit("all_reduce")).alias("collective"),
    )
    launches = k.select(
        pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.col("_i").alias("id"),
        pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"), pl.lit("cudaLaunchKernel").alias("name"),
        pl.lit("launch").alias("kind"), pl.col("_lts").alias("ts"), (pl.col("_lts") + 5_000).alias("end"),
        pl.lit(5_000, pl.Int64).alias("dur"), pl.col("_i").alias("correlation"), pl.col("_i").alias("external_id"),
    )
    # one aten op per launch, inside a micro-batch forward, inside ProfilerStep#N
    st_ids = pl.int_range(0, steps, eager=True, dtype=pl.Int64)
    st = pl.DataFrame({"step": st_ids}).with_columns((t0 + pl.col("step") * step_ns).alias("ts"))
    st = st.with_columns((pl.col("ts") + step_ns - 10_000).alias("end"))
    base = 10 * n  # id ranges: aten ops [0, n), profiler steps [base, base+steps), forwards [2 base, ...)
    prof = st.select(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), (base + pl.col("step")).alias("id"),
                     pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"),
                     pl.concat_str([pl.lit("ProfilerStep#"), pl.col("step").cast(pl.Utf8)]).alias("name"),
                     pl.lit("user_annotation").alias("cat"), "ts", "end", pl.lit(None, pl.Int64).alias("parent"), pl.lit(0, pl.Int32).alias("depth"))
    half = n_per // 2
    fw = pl.concat([
        st.select("step", pl.lit(0, pl.Int64).alias("mb"), (pl.col("ts") + 100_000).alias("ts"), (pl.col("ts") + 100_000 + half * 15_000 + 80_000).alias("end")),
        st.select("step", pl.lit(1, pl.Int64).alias("mb"), (pl.col("ts") + 100_000 + half * 15_000 + 90_000).alias("ts"), (pl.col("end") - 2_500_000).alias("end")),
    ])
    fwd = fw.select(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), (2 * base + 2 * pl.col("step") + pl.col("mb")).alias("id"),
                    pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"), pl.lit("DistributedDataParallel.forward").alias("name"),
                    pl.lit("python_function").alias("cat"), "ts", "end", (base + pl.col("step")).alias("parent"), pl.lit(1, pl.Int32).alias("depth"))
    aten = k.select(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.col("_i").alias("id"),
                    pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"),
                    pl.when(pl.col("_comm")).then(pl.lit("record_param_comms")).otherwise(pl.lit("aten::mm")).alias("name"),
                    pl.lit("cpu_op").alias("cat"), (pl.col("_lts") - 2_000).alias("ts"), (pl.col("_lts") + 6_000).alias("end"),
                    (2 * base + 2 * pl.col("_step") + (pl.col("_pos") > half).cast(pl.Int64)).alias("parent"), pl.lit(2, pl.Int32).alias("depth"),
                    pl.col("_i").alias("external_id"))
    # per step: an aten::item that syncs the stream, an async pageable HtoD copy and a synchronous DtoH copy
    extra = st.with_columns((pl.col("end") - 2_000_000).alias("_t"), (n + 3 * pl.col("step")).alias("_id"))
    item = extra.select(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.col("_id").alias("id"),
                        pl.lit(1, pl.Int64).alias("pid"), pl.lit(1, pl.Int64).alias("tid"), pl.lit("aten::item").alias("name"),
                        pl.lit("cpu_op").alias("cat"), pl.col("_t").alias("ts"), (pl.col("_t") + 1_500_000).alias("end"),
                        (base + pl.col("step")).alias("parent"), pl.lit(1, pl.Int32).alias("depth"), pl.col("_id").alias("external_id"))
    calls = pl.concat([
        extra.select(pl.col("_id").alias("id"), pl.col("_id").alias("external_id"), pl.lit(None, pl.Int64).alias("correlation"),
                     pl.lit("cudaStreamSynchronize").alias("name"), pl.lit("sync").alias("kind"),
                     (pl.col("_t") + 10_000).alias("ts"), (pl.col("_t") + 1_400_000).alias("end")),
        extra.select((pl.col("_id") + 1).alias("id"), pl.lit(None, pl.Int64).alias("external_id"), (pl.col("_id") + 1).alias("correlation"),
                     pl.lit("cudaMemcpyAsync").alias("name"), pl.lit("memcpy").alias("kind"),
                     (pl.col("_t") + 1_600_000).alias("ts"), (pl.col("_t") + 1_650_000).alias("end")),
        extra.select((pl.col("_id") + 2).alias("id"), pl.lit(None, pl.Int64).alias("external_id"), (pl.col("_id") + 2).alias("correlation"),
                     pl.lit("cudaMemcpy").alias("name"), pl.lit("memcpy").alias("kind"),
                     (pl.col("_t") + 1_700_000).alias("ts"), (pl.col("_t") + 1_900_000).alias("end")),
    ]).with_columns(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.lit(1, pl.Int64).alias("pid"),
                    pl.lit(1, pl.Int64).alias("tid"), (pl.col("end") - pl.col("ts")).alias("dur"))
    copies = calls.filter(pl.col("kind") == "memcpy").select(
        "rank", "source", pl.col("id"), pl.lit(0, pl.Int32).alias("device"), pl.lit(7, pl.Int64).alias("stream"),
        pl.concat_str([pl.lit("Memcpy "), pl.when(pl.col("name") == "cudaMemcpy").then(pl.lit("DtoH")).otherwise(pl.lit("HtoD"))]).alias("name"),
        pl.lit("memcpy").alias("kind"), (pl.col("ts") + 20_000).alias("ts"), (pl.col("end") - 5_000).alias("end"),
        "correlation", pl.lit(1 << 22, pl.Int64).alias("bytes"),
        pl.when(pl.col("name") == "cudaMemcpy").then(pl.lit("DtoH")).otherwise(pl.lit("HtoD")).alias("copy_kind"),
        pl.when(pl.col("name") == "cudaMemcpy").then(pl.lit("device")).otherwise(pl.lit("pageable")).alias("src_memory"),
        pl.when(pl.col("name") == "cudaMemcpy").then(pl.lit("pageable")).otherwise(pl.lit("device")).alias("dst_memory"),
    ).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
    coll = k.filter(pl.col("_comm")).with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("seq")).select(
        pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), pl.col("_i").alias("id"), "seq",
        pl.lit("all_reduce").alias("op"), pl.lit("nccl").alias("backend"), pl.lit("0").alias("pg_name"),
        pl.lit(f"{list(range(ranks))}").alias("pg_ranks"), pl.lit(ranks, pl.Int32).alias("group_size"),
        pl.lit(1 << 21, pl.Int64).alias("in_nelems"), pl.lit(1 << 21, pl.Int64).alias("out_nelems"), pl.lit("c10::BFloat16").alias("dtype"),
        pl.lit(1 << 22, pl.Int64).alias("bytes"), (pl.col("_lts") - 2_000).alias("ts"), (pl.col("_lts") + 6_000).alias("end"),
        pl.col("_i").alias("host_op_id"), pl.col("ts").alias("kernel_ts"), pl.col("end").alias("kernel_end"),
    ).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
    host = pl.concat([conform("host_ops", f) for f in (prof, fwd, aten, item)]).with_columns((pl.col("end") - pl.col("ts")).alias("dur"))
    steps_df = st.select(pl.lit(r, pl.Int32).alias("rank"), pl.lit(r, pl.Int32).alias("source"), "step", "ts", "end",
                         (pl.col("end") - pl.col("ts")).alias("dur"), pl.lit("profiler_step").alias("origin"))
    assert n_k == n
    return {
        "kernels": conform("kernels", pl.concat([conform("kernels", kern), conform("kernels", copies)]).sort("ts")),
        "runtime": conform("runtime", pl.concat([conform("runtime", launches), conform("runtime", calls)]).sort("ts")),
        "host_ops": conform("host_ops", host.sort("ts")),
        "collectives": conform("collectives", coll),
        "steps": conform("steps", steps_df),
    }


def synth(ranks: int, events: int, kps: int = 1000, cps: int = 20) -> Run:
    per_step = 3 * (kps + cps) + cps + 8  # kernels + launches + aten ops + collectives + per-step extras
    steps = max(1, events // per_step)
    parts: dict[str, list[pl.DataFrame]] = {}
    for r in range(ranks):
        for name, df in synth_rank(r, ranks, steps, kps, cps).items():
            parts.setdefault(name, []).append(df)
    srcs = [Source(Path(f"rank{r}.json"), "kineto", id=r, rank=r, ranks=[r], meta={"world_size": ranks}) for r in range(ranks)]
    return Run(path=Path("synthetic"), sources=srcs, tables={n: pl.concat(f) for n, f in parts.items()})


def _derived_order() -> list[str]:
    # dependencies first, so each timing is the table's own cost
    first = ["collective_matches", "clock_offsets", "collective_instances", "step_breakdown", "activity"]
    rest = sorted(n for n in link.derived_tables() if n not in first)
    return first + rest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=1_000_000, help="events per rank")
    ap.add_argument("--top", type=int, default=10, help="how many of the slowest rules to print")
    ap.add_argument("--profile", help="write a cProfile of the whole run_rules here")
    ap.add_argument("--only", choices=["all", "derived", "rules", "pack"], default="all")
    a = ap.parse_args()
    t = time.perf_counter()
    base = synth(a.ranks, a.events)
    n = sum(base.tables[t_].height for t_ in ("kernels", "runtime", "host_ops", "collectives"))
    print(f"synthesised {a.ranks} ranks, {n:,} events ({n // a.ranks:,} per rank; "
          + ", ".join(f"{k} {v.height:,}" for k, v in base.tables.items()) + f") in {time.perf_counter() - t:.1f} s")
    print(f"polars {pl.__version__}, {pl.thread_pool_size()} threads")
    rules = load_rules()

    def fresh() -> Run:
        return Run(path=base.path, sources=base.sources, tables=dict(base.tables))

    def timed(label, fn):
        gc.collect()
        t0 = time.perf_counter()
        c0 = time.process_time()
        out = fn()
        dt, ct = time.perf_counter() - t0, time.process_time() - c0
        print(f"{label:<44} {dt:7.2f} s  (CPU {ct:6.2f})  {n / dt:12,.0f} events/s")
        return out, dt

    run = fresh()
    timed("link_run (steps for every row)", lambda: link.link_run(run))
    linked = dict(run.tables)
    if a.only in ("all", "derived"):
        print("-- derived tables, each over the ones before it")
        for name in _derived_order():
            df, _ = timed(f"  {name}", lambda name=name: link.ensure(run, name))
        cp = run.tables.get("critical_path")
        if cp is not None and cp.height:
            print(f"  check: critical_path {cp.height} steps, {cp['path_kernels'].sum():,} kernels walked")
        lb = run.tables.get("launch_bound")
        if lb is not None:
            print(f"  check: launch_bound {lb.filter(pl.col('launch_gap_pct') >= 10).height} rank-steps >= 10% launch gaps")
    if a.only in ("all", "rules"):
        print("-- each rule over the cached tables (evaluate)")
        times = []
        for rule in rules:
            res, dt = None, 0.0
            gc.collect()
            t0 = time.perf_counter()
            res = evaluate(run, rule)
            dt = time.perf_counter() - t0
            times.append((dt, rule.id, res.status, len(res.findings), res.reason))
        for dt, rid, status, nf, reason in sorted(times, reverse=True)[: a.top]:
            print(f"  {rid} {status:<8} {nf:5d} findings  {dt:7.3f} s  {reason[:60]}")
        print(f"  sum over {len(times)} rules: {sum(x[0] for x in times):.2f} s; "
              f"fired: {', '.join(sorted(x[1] for x in times if x[3]))}")
    if a.only in ("all", "pack"):
        print("-- the whole pack on a freshly linked run (derived tables on demand)")
        run2 = Run(path=base.path, sources=base.sources, tables=dict(linked))
        prof = cProfile.Profile() if a.profile else None
        if prof:
            prof.enable()
        res, dt = timed("run_rules (all rules)", lambda: run_rules(run2, rules))
        if prof:
            prof.disable()
            prof.dump_stats(a.profile)
        print(f"  {sum(len(r.findings) for r in res)} findings, {sum(r.status == 'error' for r in res)} errors: "
              + "; ".join(f"{r.rule.id} {r.reason}" for r in res if r.status == "error"))


if __name__ == "__main__":
    main()
