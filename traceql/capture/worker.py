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
CPU_BUCKET_MB = 0.1  # DDP bucket cap on CPU runs, whose models are far below one default 25 MB bucket
# FSDP2 on CPU: wide enough that each block's all-gather (width*width fp32, 1 MiB) and reduce-scatter take real time
# over gloo, deep enough that there is a next block to prefetch behind the current one's compute.
FSDP_CPU_SHAPE = (512, 8, 64)  # width, depth, batch


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
    "fsdp2-eager": {"fsdp", "prefetch"},
    "fsdp2-compiled": {"fsdp", "prefetch"},
    "fsdp2-prefetch-off": {"fsdp", "reshard_after_forward"},
    "demo": {"allreduce_per_param", "straggler", "log_loss_item"},
    "launch-bound": {"tiny"},
    "duplicate-gpu": {"ddp", "force_nccl"},
    "pageable-copy": {"pageable"},
    "sync-memcpy": {"cudart_sync"},
    # No torch.distributed: one process, traced by tensorboard_trace_handler (see plain_main).
    "plain-loop": {"no_dist", "premade_batches"},
    "loader-bound": {"no_dist", "loader"},
    "loader-fixed": {"no_dist", "loader", "loader_fixed"},
    "loader-starved-workers": {"no_dist", "loader", "loader_fixed", "few_workers"},
    "cold-start": {"no_dist", "premade_batches", "cold"},
}

# Loader scenarios: image-like samples made on the CPU in Dataset.__getitem__, a model that reads each image as
# IMAGE_TOKENS tokens so compute grows with the batch without a huge weight matrix.
IMAGE = (3, 64, 64)
IMAGE_TOKENS = 64  # 3*64*64 = 64 tokens of 192 values
LOADER_COST_RATIO = 2.5  # one process's loader time per batch, over the compute of one step (loader-bound)
FEW_WORKERS = 2  # loader-starved-workers: two workers deliver a batch in about 1.25x the step's compute
FIXED_LOADER = {"num_workers": 4, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4}

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


class TokenMLP(nn.Module):
    """Each image as IMAGE_TOKENS tokens through Linear+ReLU blocks, mean-pooled into a head."""

    def __init__(self, width: int, depth: int, n_out: int):
        super().__init__()
        d_in = IMAGE[0] * IMAGE[1] * IMAGE[2] // IMAGE_TOKENS
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, n_out)

    def forward(self, x):
        x = torch.relu(self.inp(x.reshape(x.shape[0], IMAGE_TOKENS, -1)))
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x.mean(1))


class AugmentedImages(torch.utils.data.Dataset):
    """What an image pipeline does per sample on the CPU: decode, random flip, convert and normalise.

    The decode is a busy loop of a fixed cost (it stands in for JPEG decoding, which torch's profiler does not see
    either): the loader's cost is then the same on any CPU and set from the measured compute (calibrate_cost).
    """

    def __init__(self, n: int, cost_s: float, n_out: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.raw = [torch.randint(0, 256, IMAGE, dtype=torch.uint8, generator=g) for _ in range(8)]
        self.n, self.cost_s, self.n_out = n, cost_s, n_out

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:  # "decode"
            pass
        img = self.raw[i % len(self.raw)]
        if i % 2:
            img = img.flip(-1)
        return img.float().div_(255.0).sub_(0.5), i % self.n_out


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


def plain_main(args, sc, traits) -> int:
    """A single-process loop without torch.distributed, as most single-GPU scripts are written.

    The trace goes through torch.profiler.tensorboard_trace_handler, so its name is the handler's default
    (HOST_PID.TIMESTAMP.pt.trace.json) and its header has no distributedInfo.
    """
    out = Path(args.out)
    cuda = args.backend == "cuda"
    if cuda and torch.cuda.device_count() == 0:
        print("error: --backend cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    n_out = 16
    torch.manual_seed(0)
    loader_run = "loader" in traits
    cold = "cold" in traits
    if loader_run:
        width, depth, batch = (2048, 3, 128) if cuda else (256, 2, 16)
        model = TokenMLP(width, depth, n_out)
    else:
        width, depth, batch = (2048, 8, 2048) if cuda else (128, 6, 32)
        model = MLP(width, depth, n_out)
    state = {}

    def to_device():
        # model.to(device) copies the weights from pageable memory; a cold start does it inside the first step
        state["model"] = model.to(device)
        state["opt"] = torch.optim.SGD(state["model"].parameters(), lr=1e-3)

    if not cold:
        to_device()

    def train_step(x, y):
        opt = state["opt"]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(state["model"](x), y)
        loss.backward()
        opt.step()
        return loss

    warm = sc.warm_steps
    # a cold start profiles from the very first step (no schedule): CUDA modules load lazily and cuBLAS initialises
    # inside it, with the weights' copies to the device
    total = args.steps if cold else warm + 2 + args.steps
    info = _env_info(device, None)
    workload = {"model": type(model).__name__, "width": width, "depth": depth, "batch": batch}
    gen = torch.Generator().manual_seed(1234)
    if loader_run:
        # Calibrate: the compute of one step on a batch already on the device, then a per-sample CPU cost that makes
        # one process's loader LOADER_COST_RATIO times slower than that compute (the fixed twin uses the same cost).
        xb = torch.randn(batch, *IMAGE, device=device)
        yb = torch.randint(0, n_out, (batch,), device=device)
        times = []
        for i in range(8):
            if cuda:
                torch.cuda.synchronize(device)
            t = time.perf_counter()
            train_step(xb, yb)
            if cuda:
                torch.cuda.synchronize(device)
            if i >= 3:
                times.append(time.perf_counter() - t)
        compute_s = sorted(times)[len(times) // 2]
        cost_s = LOADER_COST_RATIO * compute_s / batch
        del xb, yb
        loader_kw = dict(FIXED_LOADER) if "loader_fixed" in traits else {"num_workers": 0}
        if "few_workers" in traits:
            loader_kw["num_workers"] = FEW_WORKERS
        if not cuda:
            loader_kw.pop("pin_memory", None)  # nothing to pin for on a CPU run
        ds = AugmentedImages(batch * total, cost_s, n_out, seed=1234)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=False, drop_last=True, **loader_kw)
        non_blocking = bool(loader_kw.get("pin_memory"))
        workload.update(compute_ms_per_step=round(compute_s * 1e3, 3), sample_cost_us=round(cost_s * 1e6, 1),
                        loader_ms_per_batch_one_process=round(cost_s * batch * 1e3, 3),
                        loader=loader_kw, non_blocking_copies=non_blocking)
        batches = iter(enumerate(loader))
    else:
        def make_batch():
            x = torch.randn(batch, width, generator=gen)
            y = torch.randint(0, n_out, (batch,), generator=gen)
            return (x.pin_memory(), y.pin_memory()) if cuda else (x, y)

        # Made before the loop, as a prefetching loader would: the step only copies them in.
        pool = [make_batch() for _ in range(total)]
        non_blocking = cuda
        batches = iter(enumerate(pool))
    info["workload"] = workload
    (out / ".env.json").write_text(json.dumps(info))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda and not os.environ.get("TRACEQL_CAPTURE_UNDER_NSYS"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # The handler's own default name (HOST_PID.TIMESTAMP.pt.trace.json.gz with use_gzip) and folder layout.
    handler = torch.profiler.tensorboard_trace_handler(str(out), use_gzip=True)
    status = 0
    done = 0
    t0 = time.perf_counter()
    # A cold start records from the first step on: a schedule without wait or warm-up (with no schedule at all the
    # profiler records no ProfilerStep ranges).
    schedule = (torch.profiler.schedule(wait=0, warmup=0, active=args.steps, repeat=1) if cold else
                torch.profiler.schedule(skip_first=warm, wait=1, warmup=1, active=args.steps, repeat=1))
    with torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        on_trace_ready=handler,
        record_shapes=False,
        with_stack=False,
    ) as prof:
        try:
            if cold:
                to_device()
            # As training scripts write it: the batch is fetched by the for statement, before the step's NVTX range
            # opens, so in an nsys export the loader's wait falls between the step ranges.
            for step, (x, y) in batches:
                if cuda:
                    torch.cuda.nvtx.range_push(f"step {step}")
                x = x.to(device, non_blocking=non_blocking)
                y = y.to(device, non_blocking=non_blocking)
                train_step(x, y)
                if cuda:
                    torch.cuda.nvtx.range_pop()
                prof.step()
                done += 1
        except Exception:
            traceback.print_exc()
            status = 1
    if cuda:
        torch.cuda.synchronize(device)
    print(f"done: {done} of {total} steps, status {status}, {time.perf_counter() - t0:.1f}s; {workload}", flush=True)
    return status


# Python bindings that dump the Flight Recorder's ring buffer, newest first; which exist depends on the torch build.
FR_DUMPERS = ("_dump_fr_trace", "_dump_nccl_trace")


def _dump_flight_recorder(out: Path, rank: int) -> None:
    """After a gloo collective timed out: dump the Flight Recorder (TORCH_FR_BUFFER_SIZE) where the build offers it.

    ProcessGroupNCCL dumps by itself on a watchdog timeout; gloo has no watchdog, so the rank asks for the dump. The
    file takes the name ProcessGroupNCCL's own dumps have (nccl_trace_rank_N), which traceql reads.
    """
    if not int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0):
        return
    c10d = torch._C._distributed_c10d
    for name in FR_DUMPERS:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            blob = fn()
        except Exception as e:  # a binding that exists but has nothing to dump for gloo
            print(f"[rank{rank}] flight recorder: {name}() failed: {e}", file=sys.stderr, flush=True)
            continue
        (out / f"nccl_trace_rank_{rank}").write_bytes(blob if isinstance(blob, bytes) else str(blob).encode())
        print(f"[rank{rank}] flight recorder: dumped {len(blob)} bytes with {name}()", flush=True)
        return
    print(f"[rank{rank}] flight recorder: this torch has none of {', '.join(FR_DUMPERS)}: no dump", flush=True)


def _fully_shard(model: MLP, device, world: int, traits: set):
    """FSDP2: fully_shard each block, then the root (norm and head); returns the sharded params and a new optimizer.

    "prefetch": each block's all-gather is issued one block ahead, in forward and in backward, so it runs behind the
    current block's compute. "reshard_after_forward" (prefetch off): parameters are freed after forward and gathered
    again in backward, with no explicit prefetch, so every block waits for its own all-gather.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    reshard = "reshard_after_forward" in traits
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    blocks = list(model.blocks)
    if "prefetch" in traits:
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                block.set_modules_to_backward_prefetch([blocks[i - 1]])
    params = list(model.parameters())  # DTensors now: the optimizer must see these, not the originals
    return params, torch.optim.SGD(params, lr=1e-3)


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
    if "no_dist" in traits:
        return plain_main(args, sc, traits)
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
        if "fsdp" in traits:
            width, depth, batch = FSDP_CPU_SHAPE
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
        ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {"bucket_cap_mb": CPU_BUCKET_MB}
        if device.type != "cuda":
            # DDP's first bucket (1 MiB by default) must not exceed the others: torch.compile's DDPOptimizer asserts
            # it ("First bucket should be smaller/equal to other buckets"), so compiled CPU DDP failed at step 0.
            # Eager and compiled twins both take the small first bucket, so they keep the same buckets.
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(CPU_BUCKET_MB * 1024 * 1024)
        step_model = nn.parallel.DistributedDataParallel(model, **ddp_kw)
    if "fsdp" in traits:
        params, opt = _fully_shard(model, device, world, traits)
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
            if "desync" in traits and pg_backend == "gloo":
                _dump_flight_recorder(out, rank)
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
