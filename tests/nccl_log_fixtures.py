"""Writes the hand-made NCCL log fixtures (fixtures/nccl-log-*): no GPU was available to capture real ones.

Run: python tests/nccl_log_fixtures.py (not a test). Line shapes follow real NCCL 2.19-2.23 / PyTorch 2.x output."""
import json
from pathlib import Path
F = Path(__file__).resolve().parents[1] / "fixtures"

def man(d, scenario, why, expect):
    (d / "manifest.json").write_text(json.dumps({"scenario": scenario, "hand_made": True, "why": why,
        "shapes_from": "line shapes of /work/shared/corpus/nccl/real_lines.txt (public issue logs), hosts and addresses invented",
        "expect": expect}, indent=1) + "\n")

def init_block(host, pid, dev, rank, nranks, bus, comm, commid, version="2.21.5", net="IB", ifs="[0]ib0:10.0.0.{h}<0>",
               ib=True, transports=(), channels=16, env=(), nnodes=2, timing=None, gdr_off=False, p2p_off_pair=None):
    t = f"{host}:{pid}:{pid+40}"
    L = []
    L.append(f"{t} [{dev}] NCCL INFO Bootstrap : Using {ifs.split()[0]}")
    for k, v in env:
        L.append(f"{t} [{dev}] NCCL INFO {k} set by environment to {v}.")
    L.append(f"{t} [{dev}] NCCL INFO NCCL version {version}+cuda12.4")
    L.append(f"{t} [{dev}] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation")
    if ib:
        L.append(f"{t} [{dev}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.1<0>")
    else:
        L.append(f"{t} [{dev}] NCCL INFO NET/IB : No device found.")
    if net == "Socket":
        L.append(f"{t} [{dev}] NCCL INFO NET/Socket : Using {ifs}")
    L.append(f"{t} [{dev}] NCCL INFO Using network {net}")
    if gdr_off:
        L.append(f"{t} [{dev}] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)")
    L.append(f"{t} [{dev}] NCCL INFO comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {bus} commId {commid} - Init START")
    L.append(f"{t} [{dev}] NCCL INFO comm {comm} rank {rank} nRanks {nranks} nNodes {nnodes} localRanks {nranks // nnodes} localRank {rank % (nranks // nnodes)} MNNVL 0")
    if p2p_off_pair:
        L.append(f"{t} [{dev}] NCCL INFO P2P is disabled between connected GPUs {p2p_off_pair[0]} and {p2p_off_pair[1]}. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.")
    for i, (peer, via) in enumerate(transports):
        L.append(f"{t} [{dev}] NCCL INFO Channel {i:02d}/0 : {rank}[{dev}] -> {peer}[0] via {via}")
    L.append(f"{t} [{dev}] NCCL INFO {channels} coll channels, 0 collnet channels, 0 nvls channels, {channels} p2p channels, 2 p2p channels per peer")
    L.append(f"{t} [{dev}] NCCL INFO ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {bus} commId {commid} - Init COMPLETE")
    if timing:  # NCCL >= 2.23 prints the timings right after Init COMPLETE
        L.append(f"{t} [{dev}] NCCL INFO Init timings - ncclCommInitRank: rank {rank} nranks {nranks} total {timing[0]:.2f} ({timing[1]})")
    return L

def write(d, name, lines, prefix=""):
    (d / name).write_text("".join(prefix + l + "\n" for l in lines))

# ---- good: 2 nodes x 2 GPUs over IB with GDR, P2P inside a node; quiet for every TQL5 rule
d = F / "nccl-log-healthy"; d.mkdir(exist_ok=True)
for r in range(4):
    host = f"node{r//2}"; dev = r % 2
    tr = [((r + 1) % 4, "P2P/CUMEM/read" if r % 2 == 0 else "NET/IB/0/GDRDMA")]
    L = init_block(host, 1000 + r, dev, r, 4, f"{dev+1}8000", f"0x55d0{r}0", "0x9ad9b5e4ab2566da", transports=tr,
                   timing=(0.61, "kernels 0.20, alloc 0.01, bootstrap 0.10, allgathers 0.02, topo 0.20, graphs 0.02, connections 0.05, rest 0.01"),
                   env=[("NCCL_IB_TIMEOUT", "22")])
    L.append(f"I0820 14:27:21.482718 {1000+r} ProcessGroupNCCL.cpp:980] [PG ID 0 PG GUID 0(default_pg) Rank {r}] ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3, TORCH_NCCL_ENABLE_TIMING: 0, TORCH_NCCL_BLOCKING_WAIT: 0, TORCH_DISTRIBUTED_DEBUG: OFF, TORCH_NCCL_TRACE_BUFFER_SIZE: 2000")
    write(d, f"rank{r}.log", ["training step 1 loss 2.31", ""] + L + ["", "training step 2 loss 2.10"])
man(d, "nccl-healthy", "no GPU machine for this helper: a healthy 2-node IB log in NCCL 2.21 wording", {"fire": []})

# ---- misconfigured: socket over docker0 across 2 nodes with IB present, P2P off, GDR off, channel and version
# mismatch, forced algo, slow init dominated by bootstrap, async error handling off
d = F / "nccl-log-misconfigured"; d.mkdir(exist_ok=True)
for r in range(4):
    host = f"node{r//2}"; dev = r % 2
    tr = [((r + 1) % 4, "SHM/direct/direct" if r % 2 == 0 else "NET/Socket/0")]
    env = [("NCCL_P2P_DISABLE", "1"), ("NCCL_ALGO", "Tree")] if r != 3 else [("NCCL_P2P_DISABLE", "1")]
    L = init_block(host, 2000 + r, dev, r, 4, f"{dev+1}8000", f"0x66d0{r}0", "0x1bd7790311d5eb49", net="Socket",
                   ifs="[0]docker0:172.17.0.2<0>", transports=tr, channels=2 if r != 2 else 4, env=env,
                   version="2.21.5" if r != 1 else "2.19.3", gdr_off=True,
                   timing=(48.3, "kernels 0.20, alloc 0.01, bootstrap 46.90, allgathers 0.02, topo 1.00, graphs 0.02, connections 0.14, rest 0.01"))
    L.append(f"I0820 14:27:21.482718 {2000+r} ProcessGroupNCCL.cpp:980] [PG ID 0 PG GUID 0(default_pg) Rank {r}] ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 0, TORCH_NCCL_ENABLE_TIMING: 0, TORCH_NCCL_BLOCKING_WAIT: 0, TORCH_DISTRIBUTED_DEBUG: OFF, TORCH_NCCL_TRACE_BUFFER_SIZE: 0")
    write(d, f"rank{r}.log", L, prefix=f"[rank{r}]:")
man(d, "nccl-misconfigured", "no GPU machine for this helper: socket transport over docker0 across 2 nodes with IB present, NCCL_P2P_DISABLE, GDR off, channel/version mismatch, NCCL_ALGO forced, slow bootstrap, async error handling off",
    {"fire": ["TQL501", "TQL502", "TQL503", "TQL504", "TQL505", "TQL506", "TQL508", "TQL509", "TQL510"]})

# ---- duplicate GPU (mpirun tagged, one interleaved file)
d = F / "nccl-log-duplicate-gpu"; d.mkdir(exist_ok=True)
L = []
for r in range(2):
    L += [f"[1,{r}]<stdout>:" + x for x in init_block("smc-gpu-03", 3000 + r, 0, r, 2, "1000", f"0x77{r}", "0x5eb49bd7790311d1", nnodes=1, ib=False, net="Socket", ifs="[0]eth0:10.1.0.3<0>")[:-1]]
L.append("[1,1]<stdout>:smc-gpu-03:3001:3041 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000")
L.append("[1,1]<stdout>:smc-gpu-03:3001:3041 [0] NCCL INFO init.cc:867 -> 5")
write(d, "mpirun.log", L)
man(d, "nccl-duplicate-gpu", "no GPU machine: two ranks bound to one GPU (mpirun --tag-output, one interleaved file)", {"fire": ["TQL507"]})

# ---- hang: every rank stuck in the same collective; rank 2 detected first (dump signal)
def wd(r, seq, op, numel, ts, pg="[PG ID 0 PG GUID 0(default_pg) Rank {r}]"):
    return (f"[rank{r}]:[E1206 18:{ts}.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.")
d = F / "nccl-log-timeout-hang"; d.mkdir(exist_ok=True)
L = []
for r in range(4):
    L.append(wd(r, 7753, "ALLREDUCE", 544997376, f"44:1{r}"))
    L.append(f"[rank{r}]:[E1206 18:44:1{r}.994932383 ProcessGroupNCCL.cpp:1709] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.")
L.insert(1, "[rank2]:[E1206 18:44:12.9 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 7755, last completed NCCL work: 7752.")
write(d, "torchrun.log", L)
man(d, "nccl-timeout-hang", "no GPU machine: 4 ranks time out in the same all_reduce (torchrun --tee, one interleaved file)", {"fire": ["TQL513"]})

# ---- desync: ranks at different SeqNum/OpType, rank 3 never reports; rank 1 had an IB error first
d = F / "nccl-log-timeout-desync"; d.mkdir(exist_ok=True)
L = [wd(0, 120049, "ALLREDUCE", 1024, "44:10"), wd(1, 120049, "ALLREDUCE", 1024, "44:11"), wd(2, 120048, "_ALLGATHER_BASE", 4096, "44:12"),
     "[rank1]:2025-12-06T18:30:00.000000000Z node0:4001:4090 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<53249> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGid ::ffff:10.0.0.2",
     "[rank1]:2025-12-06T18:30:00.000100000Z node0:4001:4090 [1] NCCL INFO transport/net.cc:1302 -> 6",
     "[rank1]:2025-12-06T18:30:00.000200000Z node0:4001:4090 [1] NCCL INFO proxy.cc:878 -> 6 [Progress Thread]",
     "[rank0]:2025-12-06T18:44:10.100000000Z [E1206 18:44:10.1 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 120051, last completed NCCL work: 120048.",
     "[rank0]:2025-12-06T18:44:10.200000000Z torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2025, remote process exited or there was a network error, NCCL version 2.21.5",
     ]
# rank 3 needs to exist in the job: its init lines are there, then nothing
L += ["[rank3]:" + x for x in init_block("node1", 4003, 1, 3, 4, "28000", "0x88d03", "0x2cd7790311d5eb49")]
write(d, "torchrun.log", L)
man(d, "nccl-timeout-desync", "no GPU machine: ranks 0,1 time out in all_reduce #120049, rank 2 in all_gather #120048, rank 3 never reports; rank 1 had an IB retry-exceeded error first",
    {"fire": ["TQL511", "TQL512", "TQL514", "TQL515"]})

# ---- stuck watchdog
d = F / "nccl-log-heartbeat"; d.mkdir(exist_ok=True)
L = ["[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=103",
     "[rank1]:[E ProcessGroupNCCL.cpp:1153] [PG 0 Rank 1] ProcessGroupNCCL preparing to dump debug info.",
     "[rank1]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 1] [PG 0 Rank 1] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives."]
write(d, "rank1.log", L)
man(d, "nccl-heartbeat", "no GPU machine: the heartbeat monitor kills rank 1 (watchdog stuck)", {"fire": ["TQL516"]})

# ---- excerpt of one rank: the three lines a user pastes from rank 1's stderr of the real 2-GPU capture
# fixtures/h200x2-desync (NCCL 2.28.9, torch 2.11), cut by hand; nothing in it states the world size
d = F / "nccl-log-excerpt-one-rank"; d.mkdir(exist_ok=True)
src = (F / "h200x2-desync" / "rank1.stderr.log").read_text().splitlines()
keep = [l for l in src if "Watchdog caught collective operation timeout" in l and l.startswith("[rank1]:")][:1]
keep += [l for l in src if "failure detected by watchdog" in l][:1]
keep += [l for l in src if l.startswith("terminate called")][:1] + [l for l in src if l.startswith("  what():")][:1]
write(d, "pasted.log", keep)
man(d, "nccl-excerpt-one-rank", "an issue paste: rank 1's watchdog lines only, cut by hand from the real capture "
    "fixtures/h200x2-desync/rank1.stderr.log (its lines are verbatim)", {"fire": ["TQL517"]})

# ---- a paste of two ranks' lines from a 4-rank job: both state the job's size and time out in the same all_reduce;
# ranks 2 and 3 left no line here (not collected), which must not make them dead ranks (TQL515), only unknown (TQL517)
d = F / "nccl-log-paste-two-of-four"; d.mkdir(exist_ok=True)
L = []
for r in range(2):
    L.append(f"[rank{r}]:I1206 18:30:0{r}.100000000 1000{r} ProcessGroupNCCL.cpp:905] [PG ID 0 PG GUID 0 Rank {r}] ProcessGroupNCCL initialization options: size: 4, global rank: {r}, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0")
for r in range(2):
    L.append(wd(r, 3311, "ALLREDUCE", 1024, f"44:1{r}"))
write(d, "pasted.log", L)
man(d, "nccl-paste-two-of-four", "an issue paste: ranks 0 and 1 of a 4-rank job (both say size: 4) time out in the "
    "same all_reduce; ranks 2 and 3 left no line in what was pasted", {"fire": ["TQL517"]})

# ---- TORCH_NCCL_DESYNC_DEBUG report (TraceUtils.h retrieveDesyncReport wording): 8 ranks, rank 7 stuck in
# all_reduce #2130 while the others wait in #2131
d = F / "nccl-log-desync-report"; d.mkdir(exist_ok=True)
L = []
for r in range(8):
    L.append(f"[rank{r}]:I1206 18:30:0{r}.100000000 1000{r} ProcessGroupNCCL.cpp:905] [PG ID 0 PG GUID 0 Rank {r}] ProcessGroupNCCL initialization options: size: 8, global rank: {r}, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0")
for r in range(8):
    seq = 2130 if r == 7 else 2131
    L.append(wd(r, seq, "ALLREDUCE", 1024, f"44:1{r}"))
L += ["[rank0]:[E1206 18:44:10.815298746 ProcessGroupNCCL.cpp:1688] Rank 0",
      "[rank0]:\t - [0] Timeout at collective: ALLREDUCE, #2131",
      "[rank0]:\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
      "[rank0]:\t   - [7] joined but didn't finish collective #2130 (count from 1)",
      "[rank0]:\t - Snapshot of ranks' latest states:",
      "[rank0]:\t   #2130 started ranks:",
      "[rank0]:\t     [7] started ALLREDUCE",
      "[rank0]:\t   #2131 started ranks:",
      "[rank0]:\t     [0, 1, 2, 3, 4, 5, 6] started ALLREDUCE"]
write(d, "torchrun.log", L)
man(d, "nccl-desync-report", "no GPU capture with TORCH_NCCL_DESYNC_DEBUG=1: the report in TraceUtils.h's wording, "
    "rank 7 stuck in all_reduce #2130 while ranks 0-6 wait in #2131", {"fire": ["TQL514", "TQL518"]})
