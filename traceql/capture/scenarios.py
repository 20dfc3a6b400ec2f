"""The capture scenarios: what each one plants and which findings its run must produce. No torch here.

The workloads themselves live in worker.py (imported only inside the rank processes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    # Rule ids the run must produce, with the ranks: "all", "last" (the planted odd rank is the last one).
    expected: tuple[tuple[str, str], ...] = ()
    compiled: bool = False
    default_ranks: int = 2
    min_ranks: int = 1
    # Compile debug output (TORCH_COMPILE_DEBUG) is kept only where it stays small.
    compile_debug: bool = False
    # Steps run before the profiler's schedule starts (compile warm-up, a storm's early shapes).
    warm_steps: int = 0
    # Rules whose evidence exists only on GPUs (kernel names): left out of `expected` on CPU.
    cuda_only: tuple[str, ...] = ()
    # The run is meant to end in an error (the desync's collective timeout).
    fails: bool = False
    # False: a plain single-process loop without torch.distributed (no process group, no distributedInfo in the
    # trace), written by torch.profiler.tensorboard_trace_handler under its default file name.
    distributed: bool = True
    notes: str = ""

    def expected_for(self, ranks: int, backend: str) -> list[dict]:
        out = []
        for rule, who in self.expected:
            if backend != "cuda" and rule in self.cuda_only:
                continue
            out.append({"rule": rule, "ranks": list(range(ranks)) if who == "all" else [ranks - 1]})
        return out

    @property
    def clean(self) -> bool:
        return not self.expected


_LIST = [
    Scenario(
        "ddp-eager",
        "Clean baseline: DDP training loop in eager mode (twin of ddp-compiled: same model and batch).",
    ),
    Scenario(
        "ddp-compiled",
        "Clean baseline: the same DDP loop under torch.compile.",
        compiled=True,
        compile_debug=True,
        warm_steps=1,
    ),
    Scenario(
        "exposed-allreduce",
        "Gradients flattened and all-reduced in one call after the whole backward: nothing hides the communication.",
        expected=(("TQL101", "all"),),
    ),
    Scenario(
        "recompile-storm",
        "torch.compile(dynamic=False) fed a new batch size every step: one recompile per step.",
        expected=(("TQL401", "all"),),
        compiled=True,
        default_ranks=1,
        warm_steps=2,
    ),
    Scenario(
        "graph-break-hot-loop",
        "torch._dynamo.graph_break() inside the compiled model's forward, hit every step.",
        expected=(("TQL402", "all"),),
        compiled=True,
        default_ranks=1,
        compile_debug=True,
        warm_steps=1,
    ),
    Scenario(
        "host-sync-per-step",
        ".item() on a device tensor inside the forward and when logging the loss, every step.",
        expected=(("TQL201", "all"),),
        default_ranks=1,
    ),
    Scenario(
        "divergent-compile",
        "DDP under torch.compile where the last rank's batch shape differs: its FX graph cache keys differ.",
        expected=(("TQL403", "last"),),
        compiled=True,
        min_ranks=2,
        compile_debug=True,
        warm_steps=1,
    ),
    Scenario(
        "straggler",
        "DDP where the last rank sleeps before each step's forward: the others wait in all_reduce.",
        expected=(("TQL301", "last"), ("TQL302", "last")),
        min_ranks=2,
    ),
    Scenario(
        "desync",
        "The last rank issues all_gather where the others issue all_reduce; the group times out (short timeout).",
        expected=(("TQL303", "last"),),
        min_ranks=2,
        fails=True,
    ),
    Scenario(
        "fp32-leak",
        "bf16 autocast with the output head under autocast(enabled=False) on float inputs: an fp32 GEMM.",
        expected=(("TQL209", "all"),),
        default_ranks=1,
        cuda_only=("TQL209",),
        notes="only GPU kernel names show the fp32 GEMM; on CPU the run is recorded without an expectation",
    ),
    Scenario(
        "small-allreduce-storm",
        "No DDP: one tiny all_reduce per parameter tensor after backward, unbucketed.",
        expected=(("TQL102", "all"),),
    ),
    Scenario(
        "demo",
        "README demo, several pathologies at once: the last rank straggles, one tiny all_reduce per parameter, "
        "and the loss is printed with .item() every step.",
        expected=(("TQL102", "all"), ("TQL201", "all"), ("TQL301", "last"), ("TQL302", "last")),
        min_ranks=2,
    ),
    Scenario(
        "launch-bound",
        "A narrow, deep model on small batches: each step is hundreds of microsecond kernels the host launches one by "
        "one, so the GPU waits on the host.",
        expected=(("TQL203", "all"),),
        default_ranks=1,
        cuda_only=("TQL203",),
        notes="launch-bound means GPU kernels waiting on the host: only a GPU run shows it",
    ),
    Scenario(
        "pageable-copy",
        "Input batches copied to the GPU from pageable (not pinned) host memory every step.",
        expected=(("TQL205", "all"),),
        default_ranks=1,
        cuda_only=("TQL205",),
        notes="host-to-device copies exist only on a GPU run",
    ),
    Scenario(
        "duplicate-gpu",
        "Two NCCL ranks bound to the same GPU: NCCL refuses to build the communicator (Duplicate GPU detected).",
        expected=(("TQL507", "all"),),
        default_ranks=2,
        min_ranks=2,
        cuda_only=("TQL507",),
        fails=True,
        notes="needs a GPU: NCCL; on CPU there is nothing to duplicate",
    ),
    Scenario(
        "sync-memcpy",
        "A ctypes call into libcudart inside every step, as custom extensions and C libraries do: a synchronous "
        "cudaMemcpy of the loss to a pageable host buffer, and synchronous cudaMemsets of a pinned host staging buffer "
        "and a device scratch buffer.",
        expected=(("TQL204", "all"), ("TQL206", "all")),
        default_ranks=1,
        cuda_only=("TQL204", "TQL206"),
        notes="needs --backend cuda: libcudart's synchronous cudaMemcpy/cudaMemset exist only on a GPU run; the "
        "device memset is not host-synchronous (CUDA API sync behaviour), so only the pinned one is expected",
    ),
    Scenario(
        "fsdp2-eager",
        "Clean baseline: FSDP2 (fully_shard per block and at the root) in eager mode, each block's all-gather "
        "prefetched one block ahead in forward and backward (twin of fsdp2-compiled: same model and batch).",
        min_ranks=2,
        notes="a wider, deeper MLP than the DDP scenarios on CPU, so the all-gathers and reduce-scatters take time",
    ),
    Scenario(
        "fsdp2-compiled",
        "Clean baseline: the same FSDP2 loop with the model under torch.compile.",
        compiled=True,
        min_ranks=2,
        warm_steps=1,
        notes="TORCH_COMPILE_DEBUG left off: FSDP2's hooks split the graph and the debug dirs grow per rank",
    ),
    Scenario(
        "fsdp2-prefetch-off",
        "FSDP2 with prefetching turned off: no forward or backward prefetch and parameters resharded after forward, "
        "so every block waits for its own all-gather (exposed communication).",
        expected=(("TQL101", "all"),),
        min_ranks=2,
    ),
    Scenario(
        "grad-accum-without-no_sync",
        "DDP with 4 micro-batches per optimizer step and no no_sync(): every micro-batch all-reduces.",
        expected=(("TQL103", "all"),),
    ),
]

_LIST += [
    Scenario(
        "plain-loop",
        "Clean baseline without torch.distributed: one process, a plain training loop over pinned, prefetched "
        "batches, traced by tensorboard_trace_handler under its default host_pid.timestamp.pt.trace.json name.",
        default_ranks=1,
        distributed=False,
    ),
    Scenario(
        "loader-bound",
        "A plain loop fed by DataLoader(num_workers=0): every batch is decoded and augmented in the training "
        "process (a fixed CPU cost per sample, about 2.5x the GPU's step), collated and copied from pageable memory, "
        "so the GPU waits for data each step.",
        # the stall, the GPU idle it causes and the batch copied from pageable memory (pin_memory=False)
        expected=(("TQL210", "all"), ("TQL202", "all"), ("TQL205", "all")),
        default_ranks=1,
        distributed=False,
        warm_steps=2,
        cuda_only=("TQL202", "TQL205"),
        notes="the per-sample CPU cost is calibrated at start to 2.5x the measured compute of one step (see "
        "workload in the manifest); on CPU the loader's share of each step is the finding",
    ),
    Scenario(
        "loader-fixed",
        "Twin of loader-bound with the loader fixed: num_workers=4, pin_memory=True, persistent_workers=True, "
        "prefetch_factor=4 and non_blocking copies: the same per-sample cost is hidden behind compute.",
        default_ranks=1,
        distributed=False,
        warm_steps=4,
        notes="same dataset cost as loader-bound; four workers deliver a batch in about 0.6x the step's compute",
    ),
    Scenario(
        "loader-starved-workers",
        "Twin of loader-fixed with only two workers: each batch still costs 2.5x the step's compute, so two workers "
        "fall behind and the loop waits for them every step.",
        expected=(("TQL210", "all"),),
        default_ranks=1,
        distributed=False,
        warm_steps=4,
        notes="the stall is the wait in _MultiProcessingDataLoaderIter.__next__ (about 20% of each step)",
    ),
    Scenario(
        "cold-start",
        "The plain loop profiled from its very first step (a schedule without wait or warm-up) with model.to(device) inside it: CUDA modules "
        "load lazily, cuBLAS initialises and the weights are copied from pageable memory in step 0 alone.",
        default_ranks=1,
        distributed=False,
        notes="clean: a first step's warm-up is not the run's pattern, so per-step rules must stay quiet",
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _LIST}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}") from None
