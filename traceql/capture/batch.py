"""Record many scenarios in one go (one device-machine call), in parallel lanes, and pack the run dirs.

    python -m traceql.capture.batch --plan h200 --out /tmp/runs --pack $OUT
    python -m traceql.capture.batch --plan cpu --out /tmp/runs          # CI-sized CPU twin, also a dry run

Lanes run side by side (eager lane, compile lane); runs inside a lane run one after the other. A run that would
start after --deadline seconds is skipped, so the whole call ends in time. No torch import here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from traceql.capture.runner import CaptureError, capture, find_nsys

# (run dir name, scenario, ranks, nsys, lane[, steps]). On one GPU: ranks=1 runs NCCL (which launches no NCCL kernels at
# world size 1), ranks=2 runs gloo on the shared GPU (real cross-rank communication, through host copies).
PLANS = {
    "h200": [
        ("h200-host-sync-per-step", "host-sync-per-step", 1, False, "a"),
        ("h200-host-sync-per-step-nsys", "host-sync-per-step", 1, True, "a"),
        ("h200-exposed-allreduce", "exposed-allreduce", 2, False, "a"),
        ("h200-exposed-allreduce-nsys", "exposed-allreduce", 2, True, "a"),
        ("h200-fp32-leak", "fp32-leak", 1, False, "a"),
        ("h200-ddp-eager", "ddp-eager", 1, False, "a"),
        ("h200-small-allreduce-storm", "small-allreduce-storm", 2, False, "a"),
        ("h200-grad-accum-without-no_sync", "grad-accum-without-no_sync", 2, False, "a"),
        ("h200-straggler", "straggler", 2, False, "a"),
        ("h200-demo", "demo", 2, False, "a"),
        ("h200-ddp-compiled", "ddp-compiled", 1, False, "b"),
        ("h200-graph-break-hot-loop", "graph-break-hot-loop", 1, False, "b"),
        ("h200-recompile-storm", "recompile-storm", 1, False, "b", 2),
        ("h200-divergent-compile", "divergent-compile", 2, False, "b"),
    ],
    # A second, small call: the graph break moved out of the loop, a shorter storm, the README demo.
    "h200-extra": [
        ("h200-demo", "demo", 2, False, "a"),
        ("h200-graph-break-hot-loop", "graph-break-hot-loop", 1, False, "b"),
        ("h200-recompile-storm", "recompile-storm", 1, False, "b", 2),
    ],
    # Third call: nsys runs again with NVTX step ranges, and the GPU-only pathologies that had no fixture.
    "h200-more": [
        ("h200-host-sync-per-step-nsys", "host-sync-per-step", 1, True, "a"),
        ("h200-exposed-allreduce-nsys", "exposed-allreduce", 2, True, "a"),
        ("h200-launch-bound", "launch-bound", 1, False, "b"),
        ("h200-pageable-copy", "pageable-copy", 1, False, "b"),
        ("h200-straggler", "straggler", 2, False, "b"),
    ],
    # Fourth call: a real NCCL failure one GPU can show.
    "h200-nccl": [
        ("h200-duplicate-gpu", "duplicate-gpu", 2, False, "a"),
    ],
    # Fifth call: synchronous cudaMemcpy/cudaMemset through ctypes (TQL204, TQL206), in Kineto and nsys form.
    "h200-sync-memcpy": [
        ("h200-sync-memcpy", "sync-memcpy", 1, False, "a", 2),
        ("h200-sync-memcpy-nsys", "sync-memcpy", 1, True, "a", 2),
    ],
    # Two H200s (nvidia-h200-x2): real NCCL between GPUs. Eager and compiled DDP of the same model and batch, the
    # planted exposed all_reduce, straggler and desync (a real ProcessGroupNCCL watchdog timeout with Flight Recorder
    # dumps), with nsys twins of the eager, exposed and straggler runs.
    "h200x2": [
        ("h200x2-ddp-eager", "ddp-eager", 2, False, "a"),
        ("h200x2-exposed-allreduce", "exposed-allreduce", 2, False, "a"),
        ("h200x2-straggler", "straggler", 2, False, "a"),
        ("h200x2-desync", "desync", 2, False, "a"),
        ("h200x2-ddp-eager-nsys", "ddp-eager", 2, True, "a"),
        ("h200x2-exposed-allreduce-nsys", "exposed-allreduce", 2, True, "a"),
        ("h200x2-straggler-nsys", "straggler", 2, True, "a"),
        ("h200x2-ddp-compiled", "ddp-compiled", 2, False, "b"),
        ("h200x2-divergent-compile", "divergent-compile", 2, False, "b"),
    ],
    # Sixth call: single-process runs without torch.distributed (tensorboard_trace_handler names the trace), a
    # DataLoader that starves the GPU, its fixed twin, an nsys twin, and CPU twins (cpu-* runs use --backend cpu).
    # One lane: the loader runs time the host, so nothing else runs beside them.
    "h200-stall": [
        ("h200-plain-loop", "plain-loop", 1, False, "a", 4),
        ("h200-loader-bound", "loader-bound", 1, False, "a", 4),
        ("h200-loader-fixed", "loader-fixed", 1, False, "a", 4),
        ("h200-loader-bound-nsys", "loader-bound", 1, True, "a", 4),
        ("h200-plain-loop-nsys", "plain-loop", 1, True, "a", 4),
        ("cpu-loader-bound", "loader-bound", 1, False, "a", 4),
        ("cpu-loader-fixed", "loader-fixed", 1, False, "a", 4),
        ("cpu-plain-loop", "plain-loop", 1, False, "a", 4),
    ],
    # Seventh call: workers that do not keep up, a cold start profiled from step 0, the fixed loader under nsys.
    "h200-stall-2": [
        ("h200-loader-starved-workers", "loader-starved-workers", 1, False, "a", 4),
        ("h200-cold-start", "cold-start", 1, False, "a", 4),
        ("h200-loader-fixed-nsys", "loader-fixed", 1, True, "a", 4),
    ],
    # Eighth call: the cold start again, with ProfilerStep ranges (a schedule without wait or warm-up).
    "h200-stall-3": [
        ("h200-cold-start", "cold-start", 1, False, "a", 4),
    ],
    # Eight gloo ranks on the CPUs of the one-GPU machine (16 cores; multi-GPU kinds were not lent): DDP and FSDP2,
    # eager and compiled, and the planted straggler, desync, exposed all_reduce and FSDP2 without prefetch. One lane:
    # the clean twins are timed with nothing else running; eager runs first so the compiled ones get what is left.
    "cpu8": [
        ("cpu8-ddp-eager", "ddp-eager", 8, False, "a"),
        ("cpu8-fsdp2-eager", "fsdp2-eager", 8, False, "a"),
        ("cpu8-straggler", "straggler", 8, False, "a"),
        ("cpu8-desync", "desync", 8, False, "a"),
        ("cpu8-exposed-allreduce", "exposed-allreduce", 8, False, "a"),
        ("cpu8-fsdp2-prefetch-off", "fsdp2-prefetch-off", 8, False, "a"),
        ("cpu8-ddp-compiled", "ddp-compiled", 8, False, "a"),
        ("cpu8-fsdp2-compiled", "fsdp2-compiled", 8, False, "a"),
    ],
    "cpu": [
        ("cpu-demo", "demo", 2, False, "a"),
        ("cpu-straggler", "straggler", 2, False, "a"),
        ("cpu-desync", "desync", 2, False, "a"),
        ("cpu-small-allreduce-storm", "small-allreduce-storm", 2, False, "a"),
        ("cpu-ddp-eager", "ddp-eager", 2, False, "a"),
        ("cpu-exposed-allreduce", "exposed-allreduce", 2, False, "a"),
        ("cpu-grad-accum-without-no_sync", "grad-accum-without-no_sync", 2, False, "a"),
        ("cpu-host-sync-per-step", "host-sync-per-step", 1, False, "a"),
        ("cpu-divergent-compile", "divergent-compile", 2, False, "b"),
        ("cpu-ddp-compiled", "ddp-compiled", 2, False, "b"),
        ("cpu-graph-break-hot-loop", "graph-break-hot-loop", 1, False, "b"),
        ("cpu-recompile-storm", "recompile-storm", 1, False, "b"),
    ],
}
STATS_RUNS = ("host-sync-per-step", "loader-bound")  # the nsys exports that also get `nsys stats` beside them
PACK_LIMIT = 15 << 20  # the device tool brings back 8 files of 16 MiB


def _nsys_stats(run: Path, log) -> None:
    nsys = find_nsys()
    db = run / "rank0.nsys.sqlite"
    if not nsys or not db.exists():
        log(f"{run.name}: no nsys export to summarise")
        return
    p = subprocess.run([nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--output", "-", str(db)],
                       capture_output=True, text=True, timeout=180)
    (run / "nsys_stats_cuda_gpu_kern_sum.csv").write_text(p.stdout)
    if p.returncode != 0:
        log(f"{run.name}: nsys stats exit {p.returncode}: {p.stderr.strip()[-300:]}")


def run_plan(plan, out: Path, backend: str, steps: int, deadline_s: float, timeout_s: float, only=None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: list[dict] = []
    lock = threading.Lock()

    def log(msg):
        with lock:
            print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    def lane(runs):
        for name, scenario, ranks, nsys, _, *rest in runs:
            left = deadline_s - (time.time() - t0)
            if left < 30:
                log(f"{name}: skipped, {left:.0f}s left before the deadline")
                results.append({"run": name, "status": "skipped"})
                continue
            log(f"{name}: start")
            # A cpu-* run in a GPU plan is a CPU twin: it runs with --backend cpu (no GPU visible to it).
            run_backend = "cpu" if name.startswith("cpu-") else backend
            try:
                res = capture(scenario, out / name, ranks=ranks, steps=rest[0] if rest else steps, backend=run_backend,
                              nsys=nsys,
                              timeout_s=min(timeout_s, left - 10), force=True, log=lambda m, n=name: log(f"{n}: {m}"))
                if nsys and scenario in STATS_RUNS:
                    _nsys_stats(out / name, log)
                status = "ok" if res.ok else "failed"
                log(f"{name}: {status}, exit codes {res.exit_codes}, {res.manifest['duration_s']}s")
                results.append({"run": name, "status": status, "exit_codes": res.exit_codes})
            except (CaptureError, OSError, subprocess.SubprocessError) as e:
                log(f"{name}: error: {e}")
                results.append({"run": name, "status": "error", "error": str(e)})

    lanes: dict[str, list] = {}
    for entry in plan:
        if only and entry[0] not in only and entry[1] not in only:
            continue
        lanes.setdefault(entry[4], []).append(entry)
    threads = [threading.Thread(target=lane, args=(runs,)) for runs in lanes.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (out / "batch.json").write_text(json.dumps(results, indent=2))
    return results


def pack(out: Path, dest: Path, prefix: str) -> list[Path]:
    """tar.gz the run dirs into at most a few files under PACK_LIMIT each (one run dir never splits)."""
    dest.mkdir(parents=True, exist_ok=True)
    singles = []
    for run in sorted(p for p in out.iterdir() if p.is_dir()):
        f = out / f".{run.name}.tar.gz"
        with tarfile.open(f, "w:gz") as tf:
            tf.add(run, arcname=run.name)
        singles.append(f)
    bundles: list[list[Path]] = [[]]
    size = 0
    for f in sorted(singles, key=lambda p: p.stat().st_size):
        n = f.stat().st_size
        if n > PACK_LIMIT:
            print(f"{f.name}: {n >> 20} MiB, over the limit: left out")
            continue
        if size + n > PACK_LIMIT:
            bundles.append([])
            size = 0
        bundles[-1].append(f)
        size += n
    written = []
    for i, b in enumerate(bundles):
        if not b:
            continue
        path = dest / f"{prefix}-{i}.tar"
        with tarfile.open(path, "w") as tf:
            for f in b:
                tf.add(f, arcname=f.name.lstrip("."))
        written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", choices=sorted(PLANS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: cuda for h200, else cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=480.0, help="seconds; later runs are skipped")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--only", nargs="*", help="run names or scenarios to keep from the plan")
    ap.add_argument("--pack", type=Path, default=None, help="folder for the packed tar files")
    args = ap.parse_args(argv)
    backend = args.backend or ("cuda" if args.plan.startswith("h200") else "cpu")  # h200x2 too
    results = run_plan(PLANS[args.plan], args.out, backend, args.steps, args.deadline, args.timeout, args.only)
    if args.pack:
        for p in pack(args.out, args.pack, args.plan):
            print(f"packed {p} ({p.stat().st_size >> 10} KiB)")
    bad = [r for r in results if r["status"] != "ok"]
    print(f"{len(results) - len(bad)} of {len(results)} runs ok" + (f"; not ok: {bad}" if bad else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
