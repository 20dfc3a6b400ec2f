"""The shared kernel/runtime-call classifier (ingest/kernel_names.py): a table of real names, and recorded runs whose
NCCL kernels are renamed to other communication libraries' kernels at test time."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import orjson
import polars as pl
import pytest

from traceql import link
from traceql.ingest.kernel_names import is_comm_kernel, kernel_collective, runtime_kind
from traceql.pipeline import load_run

REPO = Path(__file__).resolve().parents[1]

# Communication kernels, as profilers print them, with the op the name says (None: the name does not say).
COMM = [
    # NCCL, as recorded in fixtures/ and the reference corpus
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "all_gather"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "broadcast"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "send_recv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "send_recv"),
    # RCCL on ROCm and its MSCCL kernels (names from rocprof/Kineto tables of MI300 runs)
    ("ncclDevKernel_Generic_1", None),
    ("ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)", None),
    ("mscclKernel_Sum_hip_bfloat16_Simple_false", None),
    ("mscclKernel_Sum_half_Simple_false(ncclDevComm*, mscclAlgo*, mscclWork*)", None),
    # Meta's NCCLX ctran kernels
    ("void ncclKernelBroadcast<false>(int*, CtranAlgoDeviceState*, ctran::broadcast::KernelArgs)", "broadcast"),
    # MSCCL++ NCCL shim: the kernel is unqualified, its channel arguments name the library
    ("void allgather6<true>(void*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long, unsigned long)",
     "all_gather"),
    # custom all-reduce: vLLM custom_all_reduce.cuh (and aiter's copy), TensorRT-LLM, FlashInfer, PyTorch symm mem
    ("void vllm::cross_device_reduce_1stage<c10::BFloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
     "c10::BFloat16*, int, int)", "all_reduce"),
    ("void vllm::cross_device_reduce_2stage<__half, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __half*, int, int)",
     "all_reduce"),
    ("aiter::cross_device_reduce_2stage<bf16,8,false>", "all_reduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, false, false>(tensorrt_llm::kernels::AllReduceParams)",
     "all_reduce"),
    ("void tensorrt_llm::kernels::twoShotAllReduceKernel<float, 4, false>(tensorrt_llm::kernels::AllReduceParams)", "all_reduce"),
    ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<(tensorrt_llm::kernels::ar_fusion::"
     "AllReduceFusionPattern)1, __nv_bfloat16, 8, true, true>(tensorrt_llm::kernels::ar_fusion::AllReduceFusionParams)",
     "all_reduce"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_twoshot_sync<half, 8, true>(...)", "all_reduce"),
    ("void tensorrt_llm::kernels::ar_fusion::lamport_initialize_kernel<float>(float*, int)", "all_reduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16**, unsigned long, "
     "unsigned long, c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)", "all_reduce"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<16, c10::BFloat16>(c10::BFloat16*, unsigned long, "
     "unsigned int**, unsigned long, unsigned long)", "all_reduce"),
    ("void c10d::intra_node_comm::oneShotAllReduceKernel<8, true>(c10::BFloat16*, unsigned long, unsigned long, "
     "c10d::intra_node_comm::P2pState**, c10::BFloat16**, unsigned long, unsigned long)", "all_reduce"),
    ("userbuffers_fp16_sum_inplace_gpu_rw<8>(int, int, int, int, int, int, void**, int, unsigned long)", None),
    # DeepEP (expert-parallel dispatch/combine over NVLink and NVSHMEM/RDMA)
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*, "
     "float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, int, int, void**, "
     "int**, int, int, int)", "all_to_all"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, __nv_bfloat16 const*, "
     "float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, int const*, int const*, int const*, SourceMeta const*, "
     "int, int, int, int, int, void**, int**, int, int, int)", "all_to_all"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int const*, int*, int, bool const*, int*, int, int, "
     "int, int*, int*, int*, int*, void**, int**, int)", "all_to_all"),
    ("void deep_ep::internode_ll::dispatch<false, 9, 3, 7168>(void*, float*, int*, long*, int*, int*, int*, void*, "
     "long*, void*, long*, void*, int*, void const*, long const*, int*, int*, int, int, int, int, int, int, int, bool)",
     "all_to_all"),
    ("void deep_ep::internode::cached_notify<true, 2>(int, int, int, int, int, int, void*, int*, int*, int, void**, int**, "
     "int, void*, int, bool)", None),
    # NVSHMEM
    ("void nvshmemi_reduce_kernel<float, (rdxn_ops)0>(int, int, int, float*, float const*, unsigned long, float*)", None),
    ("nvshmemi_proxy_quiet_entrypoint()", None),
    ("void nvshmemi_alltoall_on_stream_kernel<int>(nvshmemi_team_t*, int*, int const*, unsigned long)", "all_to_all"),
]

# Not communication, though some say reduce, gather, scatter, dispatch or all-reduce: they are local kernels.
NOT_COMM = [
    "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
    "float, float>, unsigned int, float, (int)4>>(T3)",
    "void at::native::vectorized_gather_kernel<(int)16, long>(char *, char *, T2 *, int, long, long, long, long, bool)",
    "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel<"
    "true, float>::operator()(at::TensorIterator&, long, long, long, at::native::ReduceAdd const&)::{lambda(int)#1}>(int, {lambda(int)#1})",
    "void cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, float*, float*, int, cub::Sum>"
    "(float*, float*, int, cub::GridEvenShare<int>, cub::Sum)",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k_kernel__5x_cublas",
    "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>, "
    "float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, float*, int*)",
    "void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>(T2 *, const T1 *, int, int, "
    "int, const bool *, int, bool)",
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, (bool)0, "
    "cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>>(Flash_fwd_params)",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void deep_gemm::fp8_gemm_kernel<4096u, 7168u, 128u, 160u, 128u, 1u, 8u, 8u, 5u, 1u, (deep_gemm::GemmType)0>(__nv_bfloat16*, float*, int*, unsigned int, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap)",
    "void vllm::moe::topkGatingSoftmax<4, 8, 4, 16, int>(float const*, bool const*, float*, int, int*, int*, int, int, int)",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1, 16>(char*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<4u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
    "Memcpy DtoD (Device -> Device)",
    "",
]


@pytest.mark.parametrize("name,op", COMM)
def test_communication_kernels_are_comm_with_their_op(name, op):
    assert is_comm_kernel(name), name
    assert kernel_collective(name) == op


@pytest.mark.parametrize("name", NOT_COMM)
def test_local_kernels_are_not_comm(name):
    assert not is_comm_kernel(name), name


def test_polars_and_python_classifiers_agree():
    from traceql.ingest.kernel_names import comm_kernel_expr, kernel_collective_expr

    names = [n for n, _ in COMM] + NOT_COMM
    df = pl.DataFrame({"name": names}).with_columns(comm=comm_kernel_expr(pl.col("name")),
                                                    op=kernel_collective_expr(pl.col("name")))
    assert df["comm"].to_list() == [is_comm_kernel(n) for n in names]
    assert df["op"].to_list()[: len(COMM)] == [op for _, op in COMM]


@pytest.mark.parametrize("name,kind", [
    ("cudaLaunchKernel", "launch"), ("cuLaunchKernelEx", "launch"), ("cudaGraphLaunch", "launch"),
    ("hipModuleLaunchKernel", "launch"), ("hipExtLaunchKernel", "launch"), ("cudaLaunchKernelExC", "launch"),
    ("cudaStreamSynchronize", "sync"), ("cudaDeviceSynchronize", "sync"), ("cuCtxSynchronize", "sync"),
    ("cudaEventSynchronize", "sync"), ("hipStreamSynchronize", "sync"), ("cudaThreadSynchronize", "sync"),
    ("cudaStreamSynchronize_ptsz", "sync"),
    ("cudaStreamWaitEvent", "event_wait"), ("cuStreamWaitEvent", "event_wait"),
    ("cudaEventRecord", "event_record"), ("cudaEventRecordWithFlags", "event_record"),
    ("cudaMemcpyAsync", "memcpy"), ("cuMemcpyDtoH", "memcpy"), ("hipMemcpyWithStream", "memcpy"),
    ("cudaMemsetAsync", "memset"), ("cudaMalloc", "malloc"), ("cuMemAlloc", "malloc"), ("cudaHostAlloc", "malloc"),
    ("cudaFree", "free"), ("cudaFreeHost", "free"), ("cuMemRelease", "free"),
    ("cudaStreamQuery", "other"), ("cudaEventQuery", "other"), ("cudaGetDevice", "other"), ("cudaStreamIsCapturing", "other"),
])
def test_runtime_call_kinds(name, kind):
    from traceql.ingest.kernel_names import runtime_kind_expr

    assert runtime_kind(name) == kind
    assert pl.select(runtime_kind_expr(pl.lit(name))).item() == kind  # what the Kineto and nsys readers run


# ----------------------------------------------------------------------------------------------------------------
# Recorded runs with their NCCL kernels renamed: the same communication, whatever library's name it carries.

RENAMES = [
    "void vllm::cross_device_reduce_2stage<float, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, float*, int, int)",
    "void deep_ep::intranode::combine<__nv_bfloat16, 2, 768, 4096>(__nv_bfloat16*, float*, int, int, int)",
    "void tensorrt_llm::kernels::oneShotAllReduceKernel<float, 2, false, false>(tensorrt_llm::kernels::AllReduceParams)",
]


def _exposed(path: Path) -> pl.DataFrame:
    run = load_run(path, use_cache=False, jobs=1)
    kinds = run.table("kernels").group_by("rank", "kind").len().sort("rank", "kind")
    return link.ensure(run, "exposed_comm").sort("rank", "step"), kinds


def _rename_kineto(src: Path, dst: Path, new_name: str) -> int:
    shutil.copytree(src, dst)
    n = 0
    for f in dst.glob("*.pt.trace.json.gz"):
        doc = orjson.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower():
                e["name"] = new_name
                n += 1
        f.write_bytes(gzip.compress(orjson.dumps(doc)))
    return n


@pytest.mark.parametrize("new_name", RENAMES)
def test_kineto_run_with_renamed_nccl_kernels_gives_the_same_exposed_comm(tmp_path, new_name):
    src = REPO / "fixtures" / "h200x2-exposed-allreduce"
    before, kinds_before = _exposed(src)
    assert before["comm_ms"].sum() > 0 and before["exposed_comm_ms"].sum() > 0
    assert _rename_kineto(src, tmp_path / "run", new_name) > 0
    after, kinds_after = _exposed(tmp_path / "run")
    assert kinds_after.equals(kinds_before)
    assert after.equals(before)


def _rename_nsys(src: Path, dst: Path, new_name: str) -> int:
    shutil.copytree(src, dst)
    n = 0
    for f in dst.glob("*.sqlite"):
        con = sqlite3.connect(f)
        n += con.execute("UPDATE StringIds SET value = ? WHERE value LIKE 'ncclDevKernel%' OR value LIKE 'ncclKernel%'",
                         (new_name,)).rowcount
        con.commit()
        con.close()
    return n


@pytest.mark.parametrize("new_name", RENAMES[:2])
def test_nsys_run_with_renamed_nccl_kernels_gives_the_same_exposed_comm(tmp_path, new_name):
    src = REPO / "fixtures" / "h200x2-exposed-allreduce-nsys"
    before, kinds_before = _exposed(src)
    assert before["comm_ms"].sum() > 0
    assert _rename_nsys(src, tmp_path / "run", new_name) > 0
    after, kinds_after = _exposed(tmp_path / "run")
    assert kinds_after.equals(kinds_before)
    assert after.equals(before)
