"""GPU kernel and runtime-call names -> the kind traceql's tables give them: one classifier for every importer.

A kernel is communication (kind comm) when it moves data between GPUs: NCCL and RCCL (ncclKernel_*, ncclDevKernel_*,
on ROCm too), MSCCL and MSCCL++, NVSHMEM/rocSHMEM device code, DeepEP's expert-parallel dispatch and combine, and the
custom all-reduce kernels that inference and training stacks ship beside NCCL (vLLM/aiter/sglang
cross_device_reduce_1stage/2stage, TensorRT-LLM/FlashInfer one-shot and two-shot and Lamport all-reduce fusion,
PyTorch's symmetric-memory and IntraNodeComm kernels, userbuffers). Kineto and nsys both call `comm_kernel_expr`,
so the same kernel is communication whichever file it comes from.

The patterns name libraries, namespaces or kernel names, never a bare word: "reduce", "gather", "scatter",
"dispatch" or "all_reduce" alone also name local kernels (aten's reduce_kernel, cub's DeviceReduceKernel, gather
and scatter of index ops, a block-wide all-reduce inside a softmax), which must stay compute.
"""

from __future__ import annotations

import re

import polars as pl

# Each pattern is written for both Python's re and polars' (Rust) regex: no look-around, no backreferences, and
# case-insensitivity scoped to its group ((?i:...)), since the patterns are joined into one.
COMM_KERNEL_PATTERNS = (
    r"(?i:nccl)",  # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_Generic_1, RCCL's ncclDevKernel_*
    r"(?i:rccl)",  # RCCL builds that prefix their kernels with rccl
    r"(?i:msccl)",  # MSCCL (mscclKernel_Sum_half_Simple_false) and MSCCL++ (mscclpp::...)
    r"(?i:nvshmem|rocshmem)",  # nvshmemi_reduce_kernel, nvshmemi_proxy_rma_entrypoint, *_on_stream_kernel
    r"deep_ep::(intranode|internode|internode_ll)::",  # DeepEP dispatch/combine/notify (not deep_ep::layout::)
    r"(?i:cross_device_reduce_[12]stage)",  # vLLM custom_all_reduce.cuh, aiter, sglang, lmdeploy
    r"(?i:(one|two)_?shot_?all_?reduce)",  # oneShotAllReduceKernel, twoshot_allreduce_kernel, one_shot_all_reduce_kernel
    r"(?i:all_?reduce_?fusion_?kernel)",  # TensorRT-LLM / FlashInfer allreduce_fusion_kernel_oneshot_lamport
    r"(?i:lamport)",  # Lamport-flag all-reduce kernels (buffers exist only for cross-GPU exchange)
    r"(?i:multimem_(all_?reduce|all_?gather|reduce_scatter|one_shot|two_shot))",  # NVLS multimem kernels
    r"(?i:userbuff)",  # userbuffers (TensorRT-LLM, Transformer Engine comm-GEMM overlap)
    r"c10d::symmetric_memory::|intra_node_comm::|quickreduce::",  # PyTorch symmetric memory, IntraNodeComm, vLLM ROCm
)
COMM_KERNEL = "(?:" + ")|(?:".join(COMM_KERNEL_PATTERNS) + ")"

# The op of an NCCL/RCCL kernel follows its prefix: ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_SendRecv.
_NCCL_TOKEN = r"(?i)(?:nccl|rccl)\w*?Kernel_?([A-Za-z]+)"
_NCCL_OPS = (  # prefix of the token -> op; first match wins, so longer prefixes first
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("reduce", "reduce"),
    ("send", "send"), ("recv", "recv"), ("gather", "gather"), ("scatter", "scatter"),
)
# Other communication kernels: a word of the name that says the op (lowercased, checked in this order).
_NAME_OPS = (
    (r"cross_device_reduce|all_?reduce|lamport|quickreduce", "all_reduce"),
    (r"reduce_?scatter", "reduce_scatter"),
    (r"all_?gather|fcollect", "all_gather"),
    (r"all_?to_?all|deep_ep::.*(dispatch|combine)", "all_to_all"),
    (r"broadcast|bcast", "broadcast"),
)


def comm_kernel_expr(name: pl.Expr) -> pl.Expr:
    """True where the kernel name is a communication kernel (null names: false)."""
    return name.str.contains(COMM_KERNEL).fill_null(False)


def kernel_collective_expr(name: pl.Expr) -> pl.Expr:
    """The collective op a communication kernel carries, from its name; null where the name does not say (NCCL's
    ncclDevKernel_Generic, MSCCL's mscclKernel_Sum_*). Apply to communication kernels only."""
    tok = name.str.extract(_NCCL_TOKEN, 1).str.to_lowercase()
    low = name.str.to_lowercase()
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.Utf8))
    for key, op in _NCCL_OPS:
        expr = expr.when(tok.str.starts_with(key)).then(pl.lit(op))
    expr = expr.when(tok.is_not_null()).then(pl.lit(None, dtype=pl.Utf8))
    for rx, op in _NAME_OPS:
        expr = expr.when(low.str.contains(rx)).then(pl.lit(op))
    return expr.otherwise(pl.lit(None, dtype=pl.Utf8))


_COMM_RE = re.compile(COMM_KERNEL)


def is_comm_kernel(name: str | None) -> bool:
    """One name, in Python (tests, reports); the same patterns as comm_kernel_expr."""
    return bool(name) and _COMM_RE.search(name) is not None


def kernel_collective(name: str | None) -> str | None:
    """One communication kernel's op, in Python; the same rules as kernel_collective_expr."""
    if not name:
        return None
    m = re.search(_NCCL_TOKEN, name)
    if m:
        tok = m.group(1).lower()
        return next((op for key, op in _NCCL_OPS if tok.startswith(key)), None)
    low = name.lower()
    return next((op for rx, op in _NAME_OPS if re.search(rx, low)), None)


# ----------------------------------------------------------------------------------------------------------------
# Runtime and driver calls (CUDA, HIP), by their name without the _vNNNN version suffix; first match wins.

RUNTIME_KINDS = (
    ("launch", r"^(cuda|cu|hip|hipext|hipmodule)(ext)?(launch|graphlaunch)|graphlaunch|^launch"),
    ("event_wait", r"streamwaitevent"),
    ("sync", r"^(cuda|cu|hip)(device|stream|event|ctx|thread)synchronize"),
    ("event_record", r"eventrecord|^recordevent"),
    ("memcpy", r"^(cuda|cu|hip)memcpy"),
    ("memset", r"^(cuda|cu|hip)memset"),
    ("malloc", r"^(cuda|hip)(malloc|hostalloc)|^cu(memalloc|memcreate|memhostalloc)"),
    ("free", r"^(cuda|hip)(free|hostfree)|^cu(memfree|memrelease|memhostfree)"),
)


# Copies that block the host until the GPU has done them: the synchronous cudaMemcpy family (not *Async).
BLOCKING_COPY = r"^(cuda|hip)Memcpy(2D|3D)?$|^cuMemcpy(DtoH|HtoD|DtoD)(_v\d+)?$"


def runtime_kind_expr(name: pl.Expr) -> pl.Expr:
    """launch, sync, event_record, event_wait, memcpy, memset, malloc, free or other, from a suffix-free API name."""
    n = name.str.to_lowercase()
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.Utf8))
    for kind, rx in RUNTIME_KINDS:
        expr = expr.when(n.str.contains(rx)).then(pl.lit(kind))
    return expr.otherwise(pl.lit("other"))


def runtime_kind(name: str | None) -> str:
    """One API name's kind, in Python; the same rules as runtime_kind_expr."""
    n = (name or "").lower()
    return next((kind for kind, rx in RUNTIME_KINDS if re.search(rx, n)), "other")
