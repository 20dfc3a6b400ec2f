"""One rank of a capture scenario: a small real training loop under torch.profiler, with one planted pathology.

Run by traceql.capture.runner as `python -m traceql.capture.worker ...`, one process per rank, with the
usual torch.distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). This is the only module
of traceql that imports torch at module level.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from traceql.capture.scenarios import get

MICRO_BATCHES = 4  # grad-accum-without-no_sync
STRAGGLER_SLEEP_S = 0.05


# What each scenario's loop does; the demo combines several pathologies in one run.
TRAITS = {
    "ddp-eager": {"ddp"},
    "ddp-compiled": {"ddp"},
    "exposed-allreduce": {"flat_allreduce_after_backward"},
    "recompile-storm": {"static", "new_shape_every_step"},
    "graph-break-hot-loop": {"graph_break"},
    "host-sync-per-step": {"ddp", "host_sync", "log_loss_item"},
    "divergent-compile": {"ddp", "static", "rank_shape"},
    "straggler": {"ddp", "straggler"},
    "desync": {"ddp", "desync"},
    "fp32-leak": {"ddp", "autocast", "fp32_head"},
    "small-allreduce-storm": {"allreduce_per_param"},
    "grad-accum-without-no_sync": {"ddp", "grad_accum"},
    "demo": {"allreduce_per_param", "straggler", "log_loss_item"},
    "launch-bound": {"tiny"},
    "duplicate-gpu": {"ddp", "force_nccl"},
    "pageable-copy": {"pageable"},
    "sync-memcpy": {"cudart_sync"},
}

CUDA_MEMCPY_DEVICE_TO_HOST = 2  # cudaMemcpyKind
PINNED_STAGING_BYTES = 1 << 16  # sync-memcpy: the pinned host buffer cudaMemset clears every step
DEVICE_SCRATCH_BYTES = 4 << 20  # sync-memcpy: the device scratch buffer cudaMemset clears every step


def _load_cudart():
    """libcudart through ctypes, as a custom extension or a ctypes/cffi library would call it.

    The copy torch already loaded comes first (same runtime, same context), then torch's bundled nvidia wheels,
    then the system's. Returns (library, path); raises RuntimeError naming what was tried.
    """
    import ctypes
    import ctypes.util
    import glob

    tried = []
    try:
        with open("/proc/self/maps") as f:
            mapped = {line.split()[-1] for line in f if "libcudart.so" in line}
        tried += sorted(p for p in mapped if p.startswith("/"))
    except OSError:
        pass
    site = Path(torch.__file__).resolve().parents[1]
    tried += sorted(glob.glob(str(site / "nvidia" / "*" / "lib" / "libcudart.so*")))
    tried += sorted(glob.glob(str(Path(torch.__file__).resolve().parent / "lib" / "libcudart*.so*")))
    found = ctypes.util.find_library("cudart")
    if found:
        tried.append(found)
    errors = []
    for path in dict.fromkeys(tried):
        try:
            lib = ctypes.CDLL(path)
            lib.cudaMemcpy
        except (OSError, AttributeError) as e:
            errors.append(f"{path}: {e}")
            continue
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaMemcpy.restype = ctypes.c_int
        lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        lib.cudaMemset.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib, path
    raise RuntimeError(
        "sync-memcpy: cannot load libcudart through ctypes (looked in this process's loaded libraries, "
        f"{site}/nvidia/*/lib, torch/lib and ctypes.util.find_library('cudart')); tried: {errors or 'nothing found'}. "
        "Install the nvidia-cuda-runtime wheel torch was built with, or put libcudart.so on LD_LIBRARY_PATH."
    )


def _cuda_check(lib, rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: error {rc} ({lib.cudaGetErrorString(rc).decode(errors='replace')})")



class MLP(nn.Module):
    """A stack of Linear+ReLU blocks, a LayerNorm and a head: many parameter tensors, real GEMMs."""

    def __init__(self, width: int, depth: int, n_out: int, *, graph_break=False, host_sync=False, fp32_head=False):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, n_out)
        self.graph_break = graph_break
        self.host_sync = host_sync
        self.fp32_head = fp32_head

    def _run(self, blocks, x):
        for block in blocks:
            x = torch.relu(block(x))
        return x

    def forward(self, x):
        half = len(self.blocks) // 2
        x = self._run(self.blocks[:half], x)
        if self.graph_break:
            # Outside any loop, so dynamo splits the frame in two graphs (inside a loop it would skip the frame).
            torch._dynamo.graph_break()
        if self.host_sync:
            # A data-dependent branch on a device value: the host waits for the GPU here.
            if x.abs().max().item() > 1e4:
                x = x * 0.5
        x = self._run(self.blocks[half:], x)
        x = self.norm(x)
        if self.fp32_head:
            with torch.autocast(device_type=x.device.type, enabled=False):
                return self.head(x.float())
        return self.head(x)


def _env_info(device: torch.device, pg_backend: str) -> dict:
    cuda = torch.cuda.is_available() and device.type == "cuda"
    nccl = None
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            nccl = None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "python": platform.python_version(),
        "process_group": pg_backend,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3, help="profiled (active) steps")
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--pg-timeout", type=float, default=60.0)
    args = ap.parse_args(argv)

    sc = get(args.scenario)
    traits = TRAITS[sc.name]
    out = Path(args.out)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))

    if args.backend == "cuda":
        n_gpu = torch.cuda.device_count()
        if n_gpu == 0:
            print("error: --backend cuda but no CUDA device is visible", file=sys.stderr)
            return 2
        device = torch.device("cuda", rank % n_gpu)
        torch.cuda.set_device(device)
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): share a GPU through gloo instead.
        pg_backend = "nccl" if world <= n_gpu or "force_nccl" in traits else "gloo"
        # Big enough that the clean baselines keep the GPU busy (not launch-bound) even in fp32.
        width, depth, batch = 2048, 8, 2048
        if "tiny" in traits:
            width, depth, batch = 64, 24, 16  # microsecond kernels: the host's launch rate bounds the step
    else:
        device = torch.device("cpu")
        pg_backend = "gloo"
        width, depth, batch = 128, 6, 32
    n_out = 16
    if "cudart_sync" in traits and device.type != "cuda":
        print(f"error: scenario {sc.name} calls libcudart directly: pass --backend cuda", file=sys.stderr)
        return 2

    kw = {"device_id": device} if pg_backend == "nccl" else {}
    dist.init_process_group(pg_backend, timeout=datetime.timedelta(seconds=args.pg_timeout), **kw)
    if rank == 0:
        (out / ".env.json").write_text(json.dumps(_env_info(device, pg_backend)))

    torch.manual_seed(0)  # same weights on every rank
    model = MLP(
        width,
        depth,
        n_out,
        graph_break="graph_break" in traits,
        host_sync="host_sync" in traits,
        fp32_head="fp32_head" in traits,
    ).to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)

    uses_ddp = "ddp" in traits
    step_model = model
    if uses_ddp:
        # CPU models are small (well under one default 25 MB bucket): smaller buckets let DDP start all-reducing
        # during backward, as it does for real models, instead of once after it.
        ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {"bucket_cap_mb": 0.1}
        step_model = nn.parallel.DistributedDataParallel(model, **ddp_kw)
    if sc.compiled:
        step_model = torch.compile(step_model, dynamic=False if "static" in traits else None)

    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)

    if "cudart_sync" in traits:
        try:
            cudart, cudart_path = _load_cudart()
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        print(f"[rank{rank}] sync-memcpy: libcudart from {cudart_path}", flush=True)
        loss_host = torch.empty(1, dtype=torch.float32)  # pageable: what a C library's own buffer would be
        staging = torch.empty(PINNED_STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
        scratch = torch.empty(DEVICE_SCRATCH_BYTES, dtype=torch.uint8, device=device)

    def cudart_sync_calls(loss):
        # What an extension does between forward and backward: read a value back and clear its buffers, through the
        # synchronous runtime API. cudaMemcpy waits for the forward to finish; cudaMemset of pinned host memory is
        # synchronous too; the device memset is not (kept as the rule's negative case).
        _cuda_check(cudart, cudart.cudaMemcpy(loss_host.data_ptr(), loss.data_ptr(), 4, CUDA_MEMCPY_DEVICE_TO_HOST),
                    "cudaMemcpy DtoH")
        _cuda_check(cudart, cudart.cudaMemset(staging.data_ptr(), 0, PINNED_STAGING_BYTES), "cudaMemset (pinned)")
        _cuda_check(cudart, cudart.cudaMemset(scratch.data_ptr(), 0, DEVICE_SCRATCH_BYTES), "cudaMemset (device)")

    def make_batch(step: int):
        n = batch
        if "new_shape_every_step" in traits:
            n = batch + 8 * step  # a new static shape every step
        elif "rank_shape" in traits and rank == world - 1:
            n = batch + 8  # the odd rank's shape differs, so its FX graph cache keys do
        x = torch.randn(n, width, generator=gen)
        y = torch.randint(0, n_out, (n,), generator=gen)
        if device.type == "cuda" and "pageable" not in traits:  # pinned, as DataLoader(pin_memory=True) gives
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    # Batches are made before the loop, as a prefetching data loader would: the step itself only copies them in.
    micro = MICRO_BATCHES if "grad_accum" in traits else 1
    pool = {(s, m): make_batch(s) for s in range(sc.warm_steps + 2 + args.steps) for m in range(micro)}

    def batch_for(step: int, m: int = 0):
        x, y = pool[(step, m)]
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def forward_loss(x, y):
        if "autocast" in traits:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return F.cross_entropy(step_model(x).float(), y)
        return F.cross_entropy(step_model(x), y)

    def train_step(step: int):
        opt.zero_grad(set_to_none=True)
        if "grad_accum" in traits:
            for m in range(MICRO_BATCHES):  # every backward all-reduces: no_sync() is missing
                x, y = batch_for(step, m)
                (forward_loss(x, y) / MICRO_BATCHES).backward()
            opt.step()
            return None
        x, y = batch_for(step)
        if "straggler" in traits and rank == world - 1:
            time.sleep(STRAGGLER_SLEEP_S)  # the slow rank: everyone else waits in its all_reduce
        loss = forward_loss(x, y)
        if "cudart_sync" in traits:
            cudart_sync_calls(loss.detach().float().contiguous())
        loss.backward()
        if "flat_allreduce_after_backward" in traits:
            # One flat all_reduce after the whole backward: nothing left to overlap it with.
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for g in grads:
                g.copy_(flat[off : off + g.numel()].view_as(g))
                off += g.numel()
        elif "allreduce_per_param" in traits:
            for p in params:  # one tiny collective per parameter tensor
                dist.all_reduce(p.grad)
                p.grad /= world
        elif "desync" in traits and step == desync_step:
            t = torch.ones(4, device=device)
            print(f"[rank{rank}] step {step}: issuing {'all_gather' if rank == world - 1 else 'all_reduce'} "
                  f"(planted desync)", flush=True)
            if rank == world - 1:
                dist.all_gather([torch.empty_like(t) for _ in range(world)], t)
            else:
                dist.all_reduce(t)
        opt.step()
        return loss

    warm = sc.warm_steps
    total = warm + 2 + args.steps
    desync_step = warm + 3 if args.steps >= 2 else warm + 2  # inside the active window
    trace_path = out / f"rank{rank}.pt.trace.json.gz"
    activities = [torch.profiler.ProfilerActivity.CPU]
    # Under nsys, nsys holds CUPTI and Kineto would get no GPU events anyway: record host events only.
    if device.type == "cuda" and not os.environ.get("TRACEQL_CAPTURE_UNDER_NSYS"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def on_ready(prof):
        prof.export_chrome_trace(str(trace_path))

    status = 0
    done = 0
    t0 = time.perf_counter()
    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(skip_first=warm, wait=1, warmup=1, active=args.steps, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=False,
        with_stack=False,
    ) as prof:
        try:
            for step in range(total):
                # an NVTX range per step, so Nsight Systems exports carry the steps too ("step N")
                nvtx = device.type == "cuda"
                if nvtx:
                    torch.cuda.nvtx.range_push(f"step {step}")
                loss = train_step(step)
                if "log_loss_item" in traits and loss is not None:
                    print(f"[rank{rank}] step {step} loss {loss.item():.4f}", flush=True)  # a sync every step
                if nvtx:
                    torch.cuda.nvtx.range_pop()
                prof.step()
                done += 1
        except Exception:
            traceback.print_exc()
            print(f"[rank{rank}] ERROR: step {step} failed after {time.perf_counter() - t0:.1f}s", file=sys.stderr,
                  flush=True)
            status = 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    print(f"[rank{rank}] done: {done} of {total} steps, status {status}, {time.perf_counter() - t0:.1f}s", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if status:
        os._exit(status)  # a broken group can hang in destroy_process_group
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
