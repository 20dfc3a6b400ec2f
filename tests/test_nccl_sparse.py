"""Issue 16: the whole rule pack runs without a rule error on empty and sparse NCCL tables.

A log holding one `NCCL version` line gave nccl_comms a process row and nccl_comm_checks no columns, so TQL501-506
failed with "unable to find column" while `check` said "No findings". Each minimal log below is one line of one kind
(shapes of real NCCL 2.18-2.28 / PyTorch 2.x lines), then all of them together; every rule must run or skip, none
may error.
"""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from traceql import pipeline

H = "node0:4001:4090 [1] NCCL INFO "
W = "node0:4001:4090 [1] NCCL WARN "
PG = "[rank1]:[E1129 13:48:26.576543231 ProcessGroupNCCL.cpp:689] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
ONE_LINE = {
    "version": H + "NCCL version 2.21.5+cuda12.4",
    "bare_version": "NCCL version 2.7.8+cuda10.2",
    "env": H + "NCCL_IB_DISABLE set by environment to 1.",
    "bootstrap": H + "Bootstrap : Using [0]lo:127.0.0.1<0>",
    "net_socket": H + "NET/Socket : Using [0]lo:127.0.0.1<0>",
    "net_ib": H + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.1<0>",
    "network": H + "Using network Socket",
    "plugin": H + "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
    "gdr": H + "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)",
    "comm_start": H + "comm 0x55d0 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 28000 commId 0x9ad9 - Init START",
    "comm_complete": H + "ncclCommInitRank comm 0x55d0 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 28000 commId 0x9ad9 - Init COMPLETE",
    "comm_nodes": H + "comm 0x55d0 rank 1 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0",
    "init_timing": H + "Init timings - ncclCommInitRank: rank 1 nranks 4 total 0.58 (kernels 0.12, alloc 0.01, bootstrap 0.30)",
    "transport": H + "Channel 00/0 : 1[1] -> 2[0] via NET/Socket/0",
    "channels": H + "16 coll channels, 0 collnet channels, 0 nvls channels, 16 p2p channels, 2 p2p channels per peer",
    "ring": H + "Channel 00/02 :    0   1   2   3",
    "trees": H + "Trees [0] 2/-1/-1->1->0 [1] 2/-1/-1->1->0",
    "p2p_disabled": H + "P2P is disabled between connected GPUs 1 and 0. You can repress this message with NCCL_IGNORE_DISABLED_P2P=1.",
    "coll": H + "AllReduce: opCount 1a sendbuff 0x7f recvbuff 0x7f count 1024 datatype 7 op 0 root 0 comm 0x55d0 [nranks=4] stream 0x1",
    "trail": H + "transport/net.cc:1302 -> 6",
    "duplicate_gpu": W + "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000",
    "ib_error": W + "NET/IB : Got completion from peer 10.0.0.2<53249> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    "net_error": W + "socketProgressOpt: Call to recv from 10.0.0.2<40394> failed : Connection reset by peer",
    "watchdog": PG + "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=22, OpType=ALLGATHER, NumelIn=4, "
                     "NumelOut=8, Timeout(ms)=10000) ran for 10096 milliseconds before timing out.",
    "pg_status": PG + " failure detected by watchdog at work sequence id: 22 PG status: last enqueued work: 27, last completed work: 21",
    "dump_signal": PG + "Received a dump signal due to a collective timeout from this local rank and we will try our best to "
                        "dump the debug info. Last enqueued NCCL work: 27, last completed NCCL work: 21.",
    "heartbeat": PG + "Heartbeat monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=1",
    "abort": PG + "To avoid data inconsistency, we are taking the entire process down.",
    "terminate": "terminate called after throwing an instance of 'c10::DistBackendError' what():  [PG ID 0 PG GUID "
                 "0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught "
                 "collective operation timeout: WorkNCCL(SeqNum=22, OpType=ALLGATHER, NumelIn=4, NumelOut=8, "
                 "Timeout(ms)=10000) ran for 10096 milliseconds before timing out.",
    "pg_env": PG + "ProcessGroupNCCL environments: NCCL version: 2.21.5, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3, TIMEOUT(ms): 600000",
    "desync_missing": "\t - To our best knowledge, ranks [3] are the lagging ranks that caused this timeout. They never joined any collectives",
    "desync_joined": "\t   - [7] joined but didn't finish collective #2130 (count from 1)",
    "fingerprint": "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
                   "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE), but Rank 1 is running collective: "
                   "CollectiveFingerPrint(SequenceNumber=1, OpType=BROADCAST).",
    "nccl_error": "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/"
                  "ProcessGroupNCCL.cpp:2025, remote process exited or there was a network error, NCCL version 2.21.5",
}


def _check(d):
    res = pipeline.check(d, rules_dirs=[REPO / "rules"], use_cache=False, jobs=1)
    errors = [f"{r.rule.id}: {r.reason}" for r in res.results if r.status == "error"]
    return res, errors


@pytest.mark.parametrize("kind", sorted(ONE_LINE))
def test_one_line_log_runs_every_rule(tmp_path, kind):
    (tmp_path / "rank1.log").write_text(ONE_LINE[kind] + "\n")
    res, errors = _check(tmp_path)
    assert not errors, errors
    rows = sum(res.run.table(t).height for t in ("nccl_comms", "nccl_events"))
    ran = [r.rule.id for r in res.results if r.status == "ran" and r.rule.id.startswith("TQL5")]
    assert bool(ran) == bool(rows), (rows, ran)  # a log with facts runs the NCCL rules; one without skips them


def test_every_kind_together_runs_every_rule(tmp_path):
    (tmp_path / "rank1.log").write_text("\n".join(ONE_LINE.values()) + "\n")
    _, errors = _check(tmp_path)
    assert not errors, errors


def test_version_line_alone_gives_complete_comm_checks(tmp_path):
    """The issue's log: the columns TQL501-506 read exist on zero rows."""
    from traceql import link

    (tmp_path / "rank0.log").write_text(ONE_LINE["version"] + "\n")
    res, errors = _check(tmp_path)
    assert not errors
    cc = link.ensure(res.run, "nccl_comm_info")
    for col in ("process_only", "nodes", "n_ib_devices", "bootstrap_if", "plugin", "gdr_off_why", "p2p_disabled_pairs",
                "timing_bootstrap_s"):
        assert col in cc.columns, col
    assert cc["process_only"].all()
    assert {r.rule.id: r.status for r in res.results if r.rule.id in ("TQL501", "TQL506")} == {"TQL501": "ran",
                                                                                              "TQL506": "ran"}


# --- world size, severity and the one-line forms people paste --------------------------------------------------

def _wd(rank: int, seq: int, op: str = "ALLREDUCE") -> str:
    return (f"[rank{rank}]:[E1206 18:44:1{rank}.715298746 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=8, NumelOut=8, "
            f"Timeout(ms)=600000) ran for 600061 milliseconds before timing out.")


def _size(rank: int, n: int) -> str:
    return (f"[rank{rank}]:I1206 18:30:00.1 100 ProcessGroupNCCL.cpp:905] [PG ID 0 PG GUID 0 Rank {rank}] "
            f"ProcessGroupNCCL initialization options: size: {n}, global rank: {rank}, TIMEOUT(ms): 600000, PG Name: 0")


def _fired(tmp_path, lines):
    (tmp_path / "torchrun.log").write_text("\n".join(lines) + "\n")
    res, errors = _check(tmp_path)
    assert not errors
    return {(f.rule, tuple(f.ranks or ()), f.severity) for f in res.findings if f.rule.startswith("TQL5")}


def test_dead_ranks_need_the_world_size_from_the_log(tmp_path):
    """Ranks 0 and 3 report: without a stated world size no rank is called dead (the highest rank seen says nothing
    of ranks 1 and 2 being in the job, or of ranks above 3); with ProcessGroupNCCL's "size: 6" ranks 1, 2, 4, 5 are
    in the job, and which of them is silent depends on whether their logs are here at all."""
    got = _fired(tmp_path, [_wd(0, 7), _wd(3, 7)])
    assert got == {("TQL513", (0, 3), "error")}
    # ranks 1 and 4 logged (their initialization line) but never time out: dead; 2 and 5 left no line at all
    got = _fired(tmp_path, [_size(0, 6), _size(1, 6), _size(4, 6), _wd(0, 7), _wd(3, 7)])
    assert ("TQL515", (1, 4), "error") in got
    assert ("TQL517", (0, 3), "warning") in got


def test_a_rank_with_no_line_is_not_called_dead(tmp_path):
    """An issue paste of rank 0's lines from a 2-rank job: rank 1's log was not collected, so nothing says it died;
    the lone timeout is a warning that names the rank whose log is missing (TQL515 fired here at error before)."""
    got = _fired(tmp_path, [_size(0, 2), _wd(0, 7)])
    assert got == {("TQL517", (0,), "warning")}
    res, _ = _check(tmp_path)
    [f] = [f for f in res.findings if f.rule == "TQL517"]
    assert "rank(s) 1 of the job's 2 (ProcessGroupNCCL size) left no line" in f.message
    # every rank of the job logged and all time out: a hang, with nothing left unclassified
    got = _fired(tmp_path, [_size(0, 2), _size(1, 2), _wd(0, 7), _wd(1, 7)])
    assert got == {("TQL513", (0, 1), "error")}


def test_one_rank_timeout_is_a_warning_that_says_what_is_missing(tmp_path):
    (tmp_path / "torchrun.log").write_text(_wd(1, 22, "ALLGATHER") + "\n")
    res, _ = _check(tmp_path)
    [f] = [f for f in res.findings if f.rule.startswith("TQL5")]
    assert (f.rule, f.ranks, f.severity) == ("TQL517", [1], "warning")
    assert "no world size" in f.message and "#22" in f.message
    # the world size known and the peer's log here, the silent peer is named (error) and nothing is unclassified
    got = _fired(tmp_path, [_size(1, 2), _size(0, 2), _wd(1, 22, "ALLGATHER")])
    assert got == {("TQL515", (0,), "error")}


def test_terminate_line_alone_is_the_watchdog_timeout():
    from traceql.ingest.nccl_log import parse_line

    f = parse_line(ONE_LINE["terminate"])
    assert f.kind == "watchdog_timeout" and f.fields["seq"] == 22 and f.fields["op"] == "all_gather"
    assert f.fields["pg_rank"] == 1 and f.fields["pg_name"] == "0"
    # "[PG 1 Rank 1]": rank 1 of group 1 is no global rank; only a launcher prefix would say which
    g = parse_line("terminate called after throwing an instance of 'c10::DistBackendError' what():  [PG 1 Rank 1] "
                   "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST, NumelIn=1, "
                   "NumelOut=1, Timeout(ms)=1000) ran for 1001 milliseconds before timing out.")
    assert g.kind == "watchdog_timeout" and g.fields["pg_name"] == "1" and g.rank is None


def test_desync_report_lines_in_torch_wording():
    """TraceUtils.h retrieveDesyncReport: each analysis line names ranks and a collective number."""
    from traceql.ingest.nccl_log import parse_line

    assert parse_line("\t - [0] Timeout at collective: ALLREDUCE, #2131").fields == {
        "timeout_rank": 0, "op": "all_reduce", "seq": 2131}
    assert parse_line(ONE_LINE["desync_missing"]).fields == {"missing_ranks": [3]}
    assert parse_line(ONE_LINE["desync_joined"]).fields == {"stuck_ranks": [7], "seq": 2130}
    f = parse_line("\t     [0, 1, 2] finished collective #2130, but didn't join collective #2131 (count from 1)")
    assert f.fields == {"lagging_ranks": [0, 1, 2], "seq": 2130}


def test_loopback_socket_is_flagged_only_across_nodes(tmp_path):
    """`NET/Socket : Using [0]lo:127.0.0.1<0>` is fine on one host, a misconfiguration across two."""
    def log(host, pid, rank, nnodes):
        t = f"{host}:{pid}:{pid + 1} [0] NCCL INFO "
        return [t + "NCCL version 2.21.5+cuda12.4", t + "NET/Socket : Using [0]lo:127.0.0.1<0>", t + "Using network Socket",
                t + f"comm 0x{pid:x} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xabc - Init START",
                t + f"comm 0x{pid:x} rank {rank} nRanks 2 nNodes {nnodes} localRanks {2 // nnodes} localRank 0 MNNVL 0",
                t + f"ncclCommInitRank comm 0x{pid:x} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xabc - Init COMPLETE"]
    one = tmp_path / "one"
    one.mkdir()
    (one / "rank0.log").write_text("\n".join(log("a", 10, 0, 1)) + "\n")
    (one / "rank1.log").write_text("\n".join(log("a", 11, 1, 1)) + "\n")
    assert not {r for r, _, _ in _fired(one, [])} & {"TQL501", "TQL502"}
    two = tmp_path / "two"
    two.mkdir()
    (two / "rank0.log").write_text("\n".join(log("a", 10, 0, 2)) + "\n")
    (two / "rank1.log").write_text("\n".join(log("b", 11, 1, 2)) + "\n")
    got = _fired(two, [])
    assert ("TQL502", (0,), "error") in got and ("TQL502", (1,), "error") in got
