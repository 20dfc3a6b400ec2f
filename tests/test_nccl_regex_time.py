"""Issue 16: every regex that reads NCCL and TORCH_LOGS lines runs in time linear in the line's length.

A 132-byte ring line (`Channel 00/02 :` and thirty `10 ` tokens, no match at its end) made the old ring-list
pattern backtrack exponentially: `check` hung (time doubled every two tokens). Each pattern below gets an input built
to make a backtracking engine retry (repeated separator tokens, long digit runs, long blank runs, repeats of the
pattern's own head without its tail). We time it at 10..160 repetitions and assert growth well under quadratic
(linear: x8 from 20 to 160; quadratic: x64; the bound is 40, generous for a loaded machine), and that a line of
100 KB takes under a second. The only timing assertions of the suite: the brief asks for a linear-time proof.
"""

from __future__ import annotations

import re
import time

import pytest

from traceql.ingest import nccl_log as N
from traceql.ingest import sniff as S
from traceql.ingest import torch_logs as T

SIZES = (10, 20, 40, 80, 160)
RATIO = 40.0  # time(160) / time(20): 8 when linear, 64 when quadratic
FLOOR_S = 50e-6
CAP_S = 1.0  # one 100 KB line, whole classification included
BIG = 100_000


def _search(p):
    return lambda s: p.search(s)


def _findall(p):
    return lambda s: p.findall(s)


# name -> (what runs, head, repeated token, tail). The line is head + token * n + tail.
CASES = {
    # the line of issue 16 and its neighbours
    "_RING_LIST": (_search(N._RING_LIST), "Channel 00/02 :", " 10", " x"),
    "_RING_LIST/blanks": (_search(N._RING_LIST), "Channel 00/02 :", "1      ", "x"),
    "_VIA": (_search(N._VIA), "Channel 00/0 : ", "10 ", "x"),
    "_VIA/via": (_search(N._VIA), "Channel 00/0 : ", " via", " "),
    "_CHANNELS": (_search(N._CHANNELS), "", "1", "x"),
    # the core grammar and what finds it
    "_CORE": (N._core, "x", "aaaaa", " [x] NCCL INFO t"),
    "_CORE/heads": (N._core, "", "a:1:2 [", "] NCCL INFO x"),
    "_CORE/digits": (N._core, "h:", "11111", " [0] NCCL INFO x"),
    "_CORE_TAIL": (_search(N._CORE_TAIL), "", "] a.b/c", " NCCL INFO"),
    "_BARE": (_search(N._BARE), " ", "a.", "cx:1 NCCL INFO x"),
    "_TAG_PREFIX": (_search(N._TAG_PREFIX), "[1] ", "aaaaa", "x"),
    "_RANK_PREFIX": (_search(N._RANK_PREFIX), "[rank", "11111", "x"),
    "_MPI_PREFIX": (_search(N._MPI_PREFIX), "[1,", "11111", "x"),
    "_TS_ISO": (_search(N._TS_ISO), "", "2025-01-01 ", "x"),
    "_TS_GLOG": (_search(N._TS_GLOG), "E1201 ", "12:", "x"),
    "_GLOG_SRC": (_search(N._GLOG_SRC), "", "EEEEE", ".cpp:x"),
    "_GLOG_SRC/time": (_search(N._GLOG_SRC), "[E1201 ", "1:.", " x.cpp:x"),
    "_MARKS_RE": (_search(N._MARKS_RE), "", "NCC", ""),
    "_NCCL": (lambda s: S._NCCL.search(s.encode()), "", "NCCL versio", ""),
    # rejoining wrapped lines
    "_RECORD_START": (lambda s: N._RECORD_START.match(s), "", "[[[[", ""),  # used anchored (match) only
    "_RECORD_START/host": (lambda s: N._RECORD_START.match(s), "", "aaaaa", ":1:2 x"),
    "_CORE_HEAD_END": (_search(N._CORE_HEAD_END), "", "h:1:2 [", "0]"),
    "rejoin_wrapped": (lambda s: N.rejoin_wrapped(s.split("\n")), "h:1:2 [0] NCCL WARN x" + "y" * 60 + "\n",
                       "z" * 79 + "\n", ""),
    # NCCL INFO texts
    "_VERSION": (_search(N._VERSION), "", "NCCL version 1.", "x"),
    "_ENV": (_search(N._ENV), "NCCL_X set by environment to a", "          ", "b"),
    "_BOOTSTRAP": (_search(N._BOOTSTRAP), "Bootstrap : Using [0]", "aaaaa", ""),
    "_NET_SOCKET_IFS": (_search(N._NET_SOCKET_IFS), "NET/Socket : Using ", "[0]lo:", ""),
    "_SOCKET_IF": (_findall(N._SOCKET_IF), "", "[0][0]", "eth0"),
    "_NET_IB_USING": (_search(N._NET_IB_USING), "NET/IB : Using ", "[0]mlx5_0:1/IB OOB ", "a b"),
    "_IB_DEV": (_findall(N._IB_DEV), "", "[0][0]", "mlx5"),
    "_NET_IB_NONE": (_search(N._NET_IB_NONE), "NET/IB : ", "No device ", ""),
    "_USING_NETWORK": (_search(N._USING_NETWORK), "Using network ", "     ", ""),
    "_NET_PLUGIN": (_search(N._NET_PLUGIN), "NET/Plugin : ", "aaaaa", ""),
    "_NO_IBVERBS": (_search(N._NO_IBVERBS), "", "Failed to open ", ""),
    "_GDR_HCA": (_search(N._GDR_HCA), "NET/IB : GPU Direct RDMA Disabled for HCA 0 'x' (", "((((", ""),
    "_GDR_GPU": (_search(N._GDR_GPU), "GPU Direct RDMA Disabled for GPU 1 / HCA 0 (", "((((", ""),
    "_COMM_INIT": (_search(N._COMM_INIT), "comm 0x1 rank 1 nranks ", "11111", "x"),
    "_COMM_NODES": (_search(N._COMM_NODES), "comm 0x1 rank 1 nRanks ", "11111", "x"),
    "_INIT_TIMINGS": (_search(N._INIT_TIMINGS), "Init timings - x: rank 0 nranks 1 total 1 (", "a 1.0,", "x"),
    "_TIMING_PART": (_findall(N._TIMING_PART), "", "aaaaa", " x"),
    "_TREES": (_search(N._TREES), "Trees ", " [0] ", ""),
    "_P2P_DISABLED": (_search(N._P2P_DISABLED), "P2P is disabled between connected GPUs ", "11111", "x"),
    "_COLL": (_search(N._COLL), "AllReduce: opCount 1 sendbuff ", "aaaaa", " x"),
    "_COLL_HEAD": (_search(N._COLL_HEAD), "", "aaaaa", ":"),
    "_TRAIL": (_search(N._TRAIL), "", "a/b.c", ":1 x"),
    # NCCL WARN texts
    "_DUP_GPU": (_search(N._DUP_GPU), "", "Duplicate GPU detected : rank 1 and rank ", "x"),
    "_IB_COMPLETION": (_search(N._IB_COMPLETION), "", "NET/IB : Got completion from peer x with error 1 ", ""),
    "_IB_OTHER": (_search(N._IB_OTHER), "ibv_", "aaaaa", ""),
    "_SOCKET_ERR": (_search(N._SOCKET_ERR), "", "sock", ""),
    "_MISMATCH_NCCL": (_search(N._MISMATCH_NCCL), "", "Mismatched collective ", ""),
    # ProcessGroupNCCL
    "_PG_PREFIX": (_search(N._PG_PREFIX), "", "[PG 1 PG GUID 0(", "x"),
    "_PG_PREFIX/guid": (_search(N._PG_PREFIX), "[PG 1 PG GUID ", "aaaaa", "x"),
    "_WORK": (_search(N._WORK), "", "WorkNCCL(SeqNum=1, OpType=", "x"),
    "_WATCHDOG": (lambda s, p=N._WATCHDOG: N._first(p, s), "", "Watchdog caught collective operation timeout: WorkNCCL(", "x"),
    "_BLOCKING": (lambda s, p=N._BLOCKING: N._first(p, s), "", "Work WorkNCCL(", "x"),
    "_ASYNC_EXC": (lambda s, p=N._ASYNC_EXC: N._first(p, s), "", "Collective WorkNCCL(", "x"),
    "_PG_STATUS": (_search(N._PG_STATUS), "", "Timeout at NCCL work: 1 ", "x"),
    "_DUMP_SIGNAL": (_search(N._DUMP_SIGNAL), "", "Received a dump signal from rank 1 ", "x"),
    "_DUMP_OBSERVED": (_search(N._DUMP_OBSERVED), "", "Observed flight recorder ", ""),
    "_DUMP_FIRST": (_search(N._DUMP_FIRST), "", "First PG on this rank ", ""),
    "_DUMP_PREP": (_search(N._DUMP_PREP), "", "preparing to dump ", ""),
    "_HEARTBEAT": (_search(N._HEARTBEAT), "", "Heartbeat monitor ", ""),
    "_WATCHDOG_STUCK": (_search(N._WATCHDOG_STUCK), "", "watchdog got stuck for 1", "x"),
    "_ABORT": (_search(N._ABORT), "", "abort comm ", ""),
    "_PG_ENV": (_search(N._PG_ENV), "ProcessGroupNCCL environments: ", "A: b, ", ""),
    "_DEPRECATED_ENV": (_search(N._DEPRECATED_ENV), "", "aaaaa", " is x deprecated"),
    "_CUDA_FAILURE": (_search(N._CUDA_FAILURE), "", "Cuda failure '", ""),
    "_NCCL_ERROR": (_search(N._NCCL_ERROR), "", "NCCL error in: ", "x"),
    "_NCCL_ERR_NAME": (_search(N._NCCL_ERR_NAME), "", "ncclSystemError", ":x"),
    "_FINGERPRINT": (_search(N._FINGERPRINT), "", "Detected mismatch between collectives on ranks. Rank 0 is running "
                     "collective: CollectiveFingerPrint(SequenceNumber=", "x"),
    "_FINGERPRINT_OTHER": (_search(N._FINGERPRINT_OTHER), "", "but Rank 1 is running collective: ", "x"),
    "parse_line/fingerprint": (N.parse_line, "", "Detected mismatch between collectives on ranks. Rank 0 is running "
                               "collective: CollectiveFingerPrint(SequenceNumber=1, OpType=X ", ""),
    "_DESYNC_MISSING": (_search(N._DESYNC_MISSING), "ranks [", "1, ", "x"),
    "_DESYNC_JOINED": (_search(N._DESYNC_JOINED), "[", "1, ", "x"),
    "_DESYNC_FINISHED": (_search(N._DESYNC_FINISHED), "[", "1, ", "] finished collective #1, but x"),
    "_DESYNC_TIMEOUT": (_search(N._DESYNC_TIMEOUT), "", "[1] Timeout at collective: ", "x"),
    "_FR_DISABLED": (_search(N._FR_DISABLED), "", "FlightRecorder is ", ""),
    "VIRTUAL_IF": (_search(N.VIRTUAL_IF), "br-", "aaaaa", " "),
    # TORCH_LOGS
    "T._MARK": (lambda s: S._TORCH_LOGS_MARK.search(s.encode()), "", "V1234 12:00:00.1 1 torch/", ""),
    "T._MARK/lines": (lambda s: S._TORCH_LOGS_MARK.search(s.encode()), "", "V1234 12:00:00.1 1 torch/a\n", ""),
    "T._LINE": (_search(T._LINE), "V1234 12:00:00.1 1 ", "aaaaa", ""),
    "T._LINE/blanks": (_search(T._LINE), "V1234 12:00:00.1", "     ", "1"),
    "T._RECOMPILING": (lambda s: T._first(T._RECOMPILING, "Recompiling function ", s), "", "Recompiling function f in ", "x"),
    "T._LIMIT": (_search(T._LIMIT), "", "torch._dynamo hit config.", "x"),
    "T._FILE": (_search(T._FILE), "", 'File "', ""),
    "T._FAILURE": (_search(T._FAILURE), "", "     ", "x"),
    "T._LINE_OLD": (_search(T._LINE_OLD), "[2024-01-01 00:00:00,1] torch.", "a.__b", "x"),
    "T._LINE_OLD/dots": (_search(T._LINE_OLD), "[2024-01-01 00:00:00,1] [0/0] torch.", "a.", ": [x"),
    "T._OLD_FAILURE": (lambda s: T._first(T._OLD_FAILURE, "triggered by the following guard failure: ", s), "",
                       "triggered by the following guard failure: '", "x"),
    "T._IN_FN": (_search(T._IN_FN), "", 'File "a", line 1, in ', "x"),
    "T._LIMIT_FN": (lambda s: T._first(T._LIMIT_FN, "function: '", s), "", "function: 'f' (a:", "x"),
}
# Per-line extras of the whole classifier, which runs many of the patterns above in a row.
CASES["parse_line/ring"] = (N.parse_line, "node01:1234:5678 [0] NCCL INFO Channel 00/02 :", " 10", " x")
CASES["parse_line/pg"] = (N.parse_line, "[rank1]:[E1129 13:48:26.5 ProcessGroupNCCL.cpp:689] ",
                          "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: ", "x")
CASES["parse_line/warn"] = (N.parse_line, "h:1:2 [0] NCCL WARN ", "NET/IB : Got completion from peer ", "x")


def _patterns(mod) -> set[str]:
    return {k for k, v in vars(mod).items() if isinstance(v, re.Pattern)}


def test_every_pattern_has_an_adversarial_case():
    covered = {k.split("/")[0] for k in CASES}
    missing = sorted(_patterns(N) - covered) + sorted(f"T.{k}" for k in _patterns(T) if f"T.{k}" not in covered)
    assert not missing, f"patterns without an adversarial case in CASES: {missing}"


def _time(fn, s: str) -> float:
    """Best of 5 of the mean time per call, each measured over at least 2 ms (a call of a few µs is noise alone)."""
    best = float("inf")
    for _ in range(5):
        k, t0 = 0, time.perf_counter()
        while True:
            fn(s)
            k += 1
            el = time.perf_counter() - t0
            if el > 0.002:
                break
        best = min(best, el / k)
    return best


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_time_grows_linearly(name):
    fn, head, tok, tail = CASES[name]
    # Below FLOOR_S at 160 tokens nothing blew up (a quadratic pattern takes milliseconds there); above it, the ratio.
    # Measured up to three times: on a shared box one measurement can be descheduled, a real blow-up fails all three.
    for _ in range(3):
        t = {n: _time(fn, head + tok * n + tail) for n in SIZES}
        if t[160] < FLOOR_S or t[160] / t[20] < RATIO:
            break
    assert t[160] < FLOOR_S or t[160] / t[20] < RATIO, f"{name}: time(160)/time(20) = {t[160] / t[20]:.1f}: {t}"
    big = head + tok * (BIG // len(tok) + 1) + tail
    t0 = time.perf_counter()
    fn(big)
    N.parse_line(big)  # and the whole classification of that line
    el = time.perf_counter() - t0
    assert el < CAP_S, f"{name}: a {len(big)}-byte line took {el:.2f} s"


def test_issue16_line_reads_in_a_blink(tmp_path):
    """The 132-byte line of the issue, in a log `check` reads, next to a version line."""
    from traceql.ingest.nccl_log import read
    from traceql.model import Source

    line = "node01:1234:5678 [0] NCCL INFO Channel 00/02 : " + "10 " * 30 + "x"
    p = tmp_path / "rank0.log"
    p.write_text("node01:1234:5678 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + line + "\n")
    t0 = time.perf_counter()
    tables = read(p, Source(p, "nccl_log"))
    assert time.perf_counter() - t0 < CAP_S
    assert tables["nccl_comms"]["version"].to_list() == ["2.21.5"]
    # a genuine ring line still reads as one
    assert N.parse_line("h:1:2 [0] NCCL INFO Channel 00/02 :    0   1   2   3").fields["order"] == ["0", "1", "2", "3"]
