"""NCCL_DEBUG / ProcessGroupNCCL logs: line grammar per wording variant, streaming reader, derived tables, TQL5xx.

Real lines come from the reference corpus (public issue logs, skipped when absent); the run-dir fixtures under
fixtures/nccl-log-* are hand-made (no GPU was available to this work; see their manifest.json).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import polars as pl
import pytest

from tests.conftest import FIXTURES, REPO, corpus_path
from traceql import link
from traceql.discover import discover
from traceql.ingest import IngestError
from traceql.ingest.loader import ingest
from traceql.ingest.nccl_log import parse_line, read
from traceql.model import Source

REAL = corpus_path("nccl", "real_lines.txt")

# Per block of real_lines.txt (in file order): the kind each of its lines must parse into (None: not an NCCL fact
# on its own, e.g. "Last error:" and the free text after it, which the reader classifies in context).
EXPECTED_BLOCKS = [
    ('laekov/fastmoe/issues/126', ['bootstrap', 'plugin', 'net_ib', 'network', 'version']),
    ('NVIDIA/nccl/issues/1038', ['plugin', 'info', 'version', 'net_ib', 'comm_init']),
    ('NVIDIA/nccl/issues/1053', ['env', 'net_socket', 'network', 'info', 'gdr', 'info']),
    ('NVIDIA/nccl/issues/1817', ['version', 'net_ib', 'net_socket', 'plugin', 'network']),
    ('NVIDIA/nccl/issues/1637', ['bootstrap', 'version', 'info', 'net_ib', 'net_socket', 'info', 'network']),
    ('NVIDIA/nccl/issues/1029', ['plugin', 'plugin', 'net_ib', 'network', 'comm_init']),
    ('NVIDIA/nccl/issues/1537', ['net_ib', 'plugin', 'network', 'comm_init', 'gdr', 'gdr']),
    ('NVIDIA/nccl/issues/899', ['gdr', 'transport']),
    ('NVIDIA/DeepLearningExamples/issues/383', ['env', 'gdr', 'gdr']),
    ('NVIDIA/nccl/issues/1814', ['env', 'env']),
    ('NVIDIA/nccl/issues/1027', ['ring', 'trees', 'info', 'transport', 'transport']),
    ('NVIDIA/nccl/issues/1189', ['info', 'info', 'env', 'info', 'trees', 'comm_nodes', 'info', 'transport', 'transport']),
    ('aws/aws-ofi-nccl/issues/715', ['transport']),
    ('NVIDIA/nccl/issues/952', ['transport', 'transport']),
    ('NVIDIA/nccl/issues/687', ['transport', 'info']),
    ('NVIDIA/nccl/issues/671', ['transport']),
    ('NVIDIA/nccl/issues/226', ['transport', 'trees', 'comm_init', 'info']),
    ('Lightning-AI/pytorch-lightning/issues/8139', ['transport', 'channels', 'comm_init', 'info']),
    ('NVIDIA/nccl/issues/1232', ['transport', 'transport', 'info', 'channels']),
    ('NVIDIA/nccl/issues/697', ['transport']),
    ('NVIDIA/nccl/issues/1609', ['info', 'info', 'channels']),
    ('NVIDIA/nccl/issues/1646', ['info', 'info', 'channels']),
    ('pytorch/pytorch/issues/105287', ['info', 'channels']),
    ('NVIDIA/nccl/issues/1519', ['info', 'info', 'info']),
    ('NVIDIA/nccl/issues/601', ['info']),
    ('NVIDIA/nccl/issues/1499', ['comm_init', 'info']),
    ('NVIDIA/TensorRT-LLM/issues/2225', ['p2p_disabled']),
    ('NVIDIA/nccl/issues/629', ['comm_init', 'info']),
    ('NVIDIA/nccl/issues/1412', ['init_timing', 'comm_init']),
    ('NVIDIA/nccl/issues/1154', ['env', 'info']),
    ('NVIDIA/nccl-tests/issues/89', ['info']),
    ('NVIDIA/nccl/issues/1453', ['info']),
    ('NVIDIA/nccl/issues/203', ['coll']),
    ('NVIDIA/nccl/issues/1193', ['coll']),
    ('pytorch/torchtitan/issues/1369', ['coll', 'coll']),
    ('NVIDIA/nccl/issues/584', ['coll', 'coll']),
    ('horovod/horovod/issues/3929', ['duplicate_gpu', 'trail']),
    ('NVIDIA/Megatron-LM/issues/661', ['error', 'error', None, None]),
    ('NVIDIA/nccl/issues/1405', ['ib_error', 'trail', 'trail', 'trail']),
    ('NVIDIA/nccl/issues/928', ['ib_error', 'trail']),
    ('NVIDIA/nccl-tests/issues/252', ['ib_error', 'info', 'transport']),
    ('NVIDIA/nccl/issues/795', ['net_error', 'trail', 'error']),
    ('NVIDIA/nccl-tests/issues/166', ['net_error', 'net_error', 'net_error', 'trail', 'error']),
    ('NVIDIA/nccl/issues/1920', ['net_error', 'trail']),
    ('NVIDIA/nccl/issues/1610', ['trail']),
    ('NVIDIA/nccl/issues/1235', ['error', 'error']),
    ('NVIDIA/nccl/issues/296', ['collective_mismatch']),
    ('NVIDIA/nccl/issues/2076', ['error', 'error', None, None]),
    ('pytorch/pytorch/issues/149984', ['error', 'error']),
    ('NVIDIA/nccl/issues/1928', ['error', 'net_error']),
    ('NVIDIA/nccl/issues/1029', ['error', 'error', 'error']),
    ('NVIDIA/nccl/issues/411', ['error']),
    ('hiyouga/LlamaFactory/issues/7396', ['watchdog_timeout', 'pg_status']),
    ('hiyouga/LlamaFactory/issues/6269', ['watchdog_timeout', 'pg_status', 'abort', 'abort']),
    ('XPixelGroup/BasicSR/issues/737', ['pg_status']),
    ('NVIDIA/nccl/issues/1610', ['watchdog_timeout', 'pg_status']),
    ('OFA-Sys/OFA/issues/271', ['watchdog_timeout']),
    ('pytorch/pytorch/issues/118369', ['watchdog_timeout', 'watchdog_timeout']),
    ('huggingface/diffusers/issues/12422', ['watchdog_timeout']),
    ('huggingface/accelerate/issues/2174', ['watchdog_timeout', 'abort']),
    ('snowflakedb/ArcticTraining/issues/219', ['info', 'pg_status', 'dump']),
    ('Intellindust-AI-Lab/DEIM/issues/105', ['heartbeat_timeout', 'dump', 'heartbeat_timeout']),
    ('meta-pytorch/torchforge/pull/55', ['pg_env', 'warn', 'pg_env', 'pg_env']),
    ('ray-project/ray/pull/47292', ['warn']),
    ('modelscope/ms-swift/pull/9443', ['collective_mismatch']),
    ('pytorch/pytorch/issues/148976', ['collective_mismatch']),
]


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("# source:"):
            cur = (line.split("|")[0].split("source:")[1].strip(), [])
            blocks.append(cur)
        elif cur is not None and line.strip() and not line.startswith("#"):
            cur[1].append(line)
    return blocks


def _read_text(tmp_path: Path, text: str, name: str = "x.log", rank: int | None = None) -> dict[str, pl.DataFrame]:
    p = tmp_path / name
    p.write_text(text)
    return read(p, Source(p, "nccl_log", rank=rank))


@pytest.mark.skipif(not REAL.is_file(), reason="reference corpus absent")
def test_every_real_line_parses_into_its_kind():
    blocks = _blocks(REAL.read_text())
    assert len(blocks) == len(EXPECTED_BLOCKS)
    n = 0
    for (url, lines), (short, kinds) in zip(blocks, EXPECTED_BLOCKS):
        assert url.endswith(short)
        got = [(f.kind if (f := parse_line(line)) else None) for line in lines]
        assert got == kinds, url
        n += len(lines)
    assert n >= 170


@pytest.mark.skipif(not REAL.is_file(), reason="reference corpus absent")
def test_real_blocks_read_as_files(tmp_path):
    """Each block as a log file of its own: the reader never fails, and context lines ("Last error:") classify."""
    kinds = {}
    for i, (url, lines) in enumerate(_blocks(REAL.read_text())):
        tables = _read_text(tmp_path, "\n".join(lines) + "\n", f"b{i}.log")
        kinds[url] = kinds.get(url, []) + tables["nccl_events"]["kind"].to_list()
    # after "Last error:", NCCL's own message names the cause
    assert "duplicate_gpu" in kinds["https://github.com/NVIDIA/Megatron-LM/issues/661"]
    assert "net_error" in kinds["https://github.com/NVIDIA/nccl/issues/2076"]


def test_core_grammar_behind_launcher_prefixes():
    core = "host-a:123:456 [3] NCCL INFO comm 0x1 rank 3 nranks 8 cudaDev 3 busId 3b000 - Init COMPLETE"
    for prefix, rank in [("", None), ("[rank5]:", 5), ("[1,6]<stdout>:", 6), ("[7] ", 7),
                         ("2025-01-02T03:04:05.123Z ", None), ("pod-x-7f9: ", None), ("  | 2024-12-04T05:27:44.079Z | ", None)]:
        f = parse_line(prefix + core)
        assert f is not None and f.kind == "comm_init", prefix
        assert (f.host, f.pid, f.tid, f.cuda_dev, f.rank) == ("host-a", 123, 456, 3, rank), prefix
        assert f.fields["comm_rank"] == 3 and f.fields["nranks"] == 8


@pytest.mark.parametrize("line,kind,fields", [
    # Bootstrap: "Bootstrap : Using [0]ib0:..." (< 2.25) and "Bootstrap: Using eno1:..." (>= 2.25)
    ("h:1:1 [0] NCCL INFO Bootstrap : Using [0]ib0:10.0.0.11<0>", "bootstrap", {"iface": "ib0"}),
    ("h:1:1 [0] NCCL INFO Bootstrap: Using eno1:10.0.0.1<0>", "bootstrap", {"iface": "eno1"}),
    # version: bare stdout line (<= 2.17) and INFO line (>= 2.18)
    ("NCCL version 2.7.8+cuda10.2", "version", {"version": "2.7.8"}),
    ("h:1:1 [0] NCCL INFO NCCL version 2.18.3+cuda12.2", "version", {"version": "2.18.3", "cuda": "12.2"}),
    # comm init: 2.4 (no busId), 2.1x (busId), 2.18 (nvmlDev, commId, Init START), 2.22 (ncclCommInitRank prefix)
    ("h:1:1 [0] NCCL INFO comm 0x7f rank 17 nranks 64 cudaDev 0 nvmlDev 0 - Init COMPLETE", "comm_init", {"comm_rank": 17, "bus_id": None}),
    ("h:1:1 [7] NCCL INFO comm 0x7f rank 15 nranks 16 cudaDev 7 busId e7000 - Init COMPLETE", "comm_init", {"bus_id": "e7000"}),
    ("h:1:1 [0] NCCL INFO comm 0x12 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 65000 commId 0xbd10 - Init START", "comm_init", {"comm_id": "0xbd10", "phase": "START"}),
    ("h:1:1 [6] NCCL INFO ncclCommInitRank comm 0x8e rank 6 nranks 16 cudaDev 6 nvmlDev 6 busId c8000 commId 0x49 - Init COMPLETE", "comm_init", {"comm_id": "0x49"}),
    ("h:1:1 [1] NCCL INFO comm 0x5b rank 3 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0", "comm_nodes", {"nnodes": 2}),
    # Init timings: 2.22 "Init timings:" and 2.23+ "Init timings - ncclCommInitRank:"
    ("h:1:1 [2] NCCL INFO Init timings: rank 2 nranks 16 total 1.08 (kernels 0.51, bootstrap 0.22, topo 0.28)", "init_timing", {"total_s": 1.08}),
    ("h:1:1 [0] NCCL INFO Init timings - ncclCommInitRank: rank 0 nranks 8 total 0.58 (kernels 0.12, alloc 0.01, bootstrap 0.05)", "init_timing", {"total_s": 0.58}),
    # transports: 2.4 Ring lines, 2.7-2.11 Channel, 2.12+ Channel xx/y, old SHM wording, CUMEM
    ("h:1:1 [0] NCCL INFO Ring 00 : 34 -> 33 [send] via NET/Socket/0", "transport", {"via": "NET/Socket"}),
    ("h:1:1 [3] NCCL INFO Channel 00 : 3[4a000] -> 6[44000] [send] via NET/IB/0/GDRDMA", "transport", {"via": "NET/IB/GDRDMA"}),
    ("h:1:1 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/direct pointer/read", "transport", {"via": "P2P/direct"}),
    ("h:1:1 [0] NCCL INFO Channel 01 : 0[100000] -> 1[200000] via direct shared memory", "transport", {"via": "SHM"}),
    ("h:1:1 [1] NCCL INFO Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM", "transport", {"via": "P2P/CUMEM"}),
    # channel counts: without and with nvls/collnet fields
    ("h:1:1 [0] NCCL INFO 2 coll channels, 2 p2p channels, 2 p2p channels per peer", "channels", {"channels": 2}),
    ("h:1:1 [1] NCCL INFO 32 coll channels, 32 collnet channels, 32 nvls channels, 32 p2p channels, 32 p2p channels per peer", "channels", {"channels": 32}),
    # GPUDirect RDMA: per HCA (2.1x-2.2x) and per GPU by distance (older)
    ("h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)", "gdr", {"enabled": False, "why": "no module"}),
    ("h:1:1 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 18000 / HCA 0 (distance 5 > 4)", "gdr", {"enabled": False}),
    # IB completion errors: 2.1x "with error 4, ..." and 2.2x "with status=12 ..."
    ("h:1:2 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 1.2.3.4<5> with error 4, opcode 1, len 1, vendor err 81 (Send)", "ib_error", {"status": 4, "vendor_err": 81}),
    ("h:1:2 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 1.2.3.4<5> with status=12 opcode=0 len=0 vendor err 129 (Recv)", "ib_error", {"status": 12, "vendor_err": 129}),
    # NCCL >= 2.26 WARN with "[date time] host [dev]" and no pid:tid
    ("[2025-11-24 11:20:21] gpu-7 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 1.2.3.4<5> failed : Connection reset by peer", "net_error", {}),
    ("h:1:2 [0] NCCL INFO init.cc:867 -> 5", "trail", {"at": "init.cc:867", "code": 5}),
    ("h:1:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.", "env", {"name": "NCCL_IB_DISABLE", "value": "1"}),
    # watchdog timeouts: torch <= 1.13 (no Numel), 2.x (Numel), blocking wait
    ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.", "watchdog_timeout", {"seq": 9, "op": "all_reduce", "numel_in": None, "ran_ms": 1802212}),
    ("[rank0]:[E1206 18:44:12.7 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=_REDUCE_SCATTER_BASE, NumelIn=8, NumelOut=1, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.", "watchdog_timeout", {"op": "reduce_scatter", "numel_in": 8, "numel_out": 1, "timeout_ms": 600000}),
    ("[rank1]:[E1002 18:16:40.6 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) timed out in blocking wait.", "watchdog_timeout", {"mode": "blocking_wait"}),
    # PG status: 2.0-2.5 two wordings, 2.6+ wording
    ("[E ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.", "pg_status", {"seq": 1580, "last_completed": 1579, "pg_name": "1"}),
    ("[E ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.", "pg_status", {"seq": 7753}),
    ("[E ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 120049 PG status: last enqueued work: 120051, last completed work: 120048", "pg_status", {"seq": 120049, "pg_desc": "default_pg"}),
    # dump signals: detector vs notified, three wordings
    ("[E ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 0] Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 20589, last completed NCCL work: 20584.", "dump_signal", {"role": "detector", "last_completed": 20584}),
    ("[E ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] Received a dump signal due to a collective timeout from  rank 7 and we will try our best", "dump_signal", {"role": "notified", "detector_rank": 7}),
    ("[E ProcessGroupNCCL.cpp:1400] [PG 0 Rank 2] Received a dump signal from this local rank and will start to dump the debug info. Last enqueued NCCL work: 5, last completed NCCL work: 4.", "dump_signal", {"role": "detector"}),
    ("[E ProcessGroupNCCL.cpp:1922] [PG ID 0 PG GUID 0(default_pg) Rank 3] Observed flight recorder dump signal from another rank via TCPStore.", "dump_signal", {"role": "notified"}),
    ("[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info.", "heartbeat_timeout", {}),
    # desync debug report lines (TORCH_NCCL_DESYNC_DEBUG=1)
    ("\t - To our best knowledge, ranks [3, 5] are the lagging ranks that caused this timeout. They never joined any collectives", "desync_report", {"missing_ranks": [3, 5]}),
    ("\t   - [1, 2] joined but didn't finish collective #41 (count from 1)", "desync_report", {"stuck_ranks": [1, 2], "seq": 41}),
    ("I0820 14:27:21.48 4030958 ProcessGroupNCCL.cpp:980] [PG ID 1 PG GUID 1 Rank 1] ProcessGroupNCCL environments: NCCL version: 2.25.1, TORCH_NCCL_ASYNC_ERROR_HANDLING: 3", "pg_env", {}),
])
def test_wording_variants(line, kind, fields):
    f = parse_line(line)
    assert f is not None and f.kind == kind
    for k, v in fields.items():
        assert f.fields.get(k) == v, k


def test_blank_and_foreign_lines_are_ignored():
    for line in ["", "\n", "epoch 1 loss 0.3", "Traceback (most recent call last):", "   File \"x.py\", line 3"]:
        assert parse_line(line) is None


def test_warn_with_trail_becomes_one_error_with_its_return_codes(tmp_path):
    text = ("h:1:9 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 1.2.3.4<5> with status=12 opcode=0 len=0 vendor err 129 (Recv)\n"
            "h:1:9 [4] NCCL INFO transport/net.cc:1302 -> 6\n"
            "h:1:8 [4] NCCL INFO some unrelated line\n"
            "h:1:9 [4] NCCL INFO proxy.cc:878 -> 6 [Progress Thread]\n")
    ev = _read_text(tmp_path, text, rank=4)["nccl_events"]
    assert ev["kind"].to_list() == ["ib_error"]
    d = orjson.loads(ev["detail"][0])
    assert d["trail"] == ["transport/net.cc:1302 -> 6", "proxy.cc:878 -> 6"] and d["retcode"] == 6
    assert ev["rank"].to_list() == [4]


def test_ranks_from_prefix_then_file_then_comm_init(tmp_path):
    init = "h:{pid}:1 [0] NCCL INFO comm 0x{pid} rank {r} nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
    warn = "h:{pid}:1 [0] misc/socket.cc:1 NCCL WARN Call to recv from 1.2.3.4<5> failed : Broken pipe\n"
    # one interleaved file, no prefixes: rank from each process's comm init
    t = _read_text(tmp_path, init.format(pid=11, r=0) + init.format(pid=12, r=1) + warn.format(pid=12))
    assert t["nccl_events"]["rank"].to_list() == [1]
    assert sorted(t["nccl_comms"]["rank"].to_list()) == [0, 1]
    # the [rankN]: prefix wins over everything
    t = _read_text(tmp_path, "[rank7]:" + warn.format(pid=12), "y.log")
    assert t["nccl_events"]["rank"].to_list() == [7]
    # else the file name (the Source's rank)
    t = _read_text(tmp_path, warn.format(pid=13), "rank3.log", rank=3)
    assert t["nccl_events"]["rank"].to_list() == [3]


def test_gzip_log_streams(tmp_path):
    p = tmp_path / "rank0.log.gz"
    with gzip.open(p, "wt") as f:
        for i in range(2000):
            f.write(f"step {i}\n")
        f.write("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
        f.write("h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n")
    t = read(p, Source(p, "nccl_log", rank=0))
    assert t["nccl_comms"]["version"].to_list() == ["2.21.5"]
    assert orjson.loads(t["nccl_comms"]["env"][0]) == {"NCCL_ALGO": "Ring"}


def test_log_without_nccl_lines_is_an_ingest_error(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(IngestError, match="NCCL_DEBUG=INFO"):
        read(p, Source(p, "nccl_log"))


def _run(name: str):
    d = FIXTURES / name
    return ingest(d, discover(d), use_cache=False)


def test_fixture_manifests_say_hand_made():
    for d in sorted(FIXTURES.glob("nccl-log-*")):
        m = json.loads((d / "manifest.json").read_text())
        assert m["hand_made"] is True and m["why"]


def _findings(name: str, rule: str):
    from traceql import pipeline

    return [f for f in pipeline.check(FIXTURES / name, use_cache=False).findings if f.rule == rule]


def test_comm_info_states_nodes_interfaces_and_env_per_communicator():
    run = _run("nccl-log-misconfigured")
    info = link.ensure(run, "nccl_comm_info")
    assert info.height == 4 and set(info["nodes"]) == {2} and (info["n_ib_devices"] == 2).all()
    assert not info["process_only"].any() and set(info["bootstrap_if"]) == {"docker0"}
    env = link.ensure(run, "nccl_comm_env")
    assert set(env.filter(pl.col("var") == "NCCL_ALGO")["value"]) == {"Tree"}
    assert set(env["comm_row"]) <= set(info["comm_row"])
    ifs = link.ensure(run, "nccl_comm_ifs")
    assert set(ifs.select("role", "interface").unique().rows()) == {("socket", "docker0"), ("bootstrap", "docker0")}


def test_misconfigured_fixture_flags_each_comm_problem():
    assert sorted(r for f in _findings("nccl-log-misconfigured", "TQL501") for r in f.ranks) == [0, 1, 2, 3]
    virtual = _findings("nccl-log-misconfigured", "TQL502")
    assert len(virtual) == 4 and {f.evidence["virtual_if"] for f in virtual} == {"docker0"}
    assert [f.ranks for f in _findings("nccl-log-misconfigured", "TQL505")] == [[2]]
    for rule in ("TQL501", "TQL503", "TQL504", "TQL505"):
        assert not _findings("nccl-log-healthy", rule), rule


def test_slow_init_names_the_dominant_component():
    init = _findings("nccl-log-misconfigured", "TQL509")
    assert len(init) == 4 and {f.evidence["dominant"] for f in init} == {"bootstrap"}
    assert all(f.evidence["init_ms"] > 40_000 for f in init)


def test_watchdog_states_each_ranks_first_timeout_and_the_groups_majority():
    wd = link.ensure(_run("nccl-log-timeout-desync"), "nccl_watchdog")
    assert set(wd["majority_seq"]) == {120049} and set(wd["n_variants"]) == {2}
    assert wd.filter(pl.col("seq") != pl.col("majority_seq"))["rank"].to_list() == [2]


def test_timeout_classes():
    [hang] = _findings("nccl-log-timeout-hang", "TQL513")
    assert hang.ranks == [0, 1, 2, 3]
    assert hang.evidence["detectors"] == "2"  # the rank that signalled the dump detected, it is not the culprit
    [desync] = _findings("nccl-log-timeout-desync", "TQL514")
    assert desync.ranks == [2] and desync.evidence["seq"] == 120048 and desync.evidence["majority_seq"] == 120049
    assert [f.ranks for f in _findings("nccl-log-timeout-desync", "TQL515")] == [[3]]
    # the IB error came before rank 0's (detector's) error
    assert [f.ranks for f in _findings("nccl-log-timeout-desync", "TQL512")] == [[1]]


def test_root_cause_skips_the_detector():
    ev = link.ensure(_run("nccl-log-timeout-desync"), "nccl_event_info")
    assert ev.filter(pl.col("root_cause"))["rank"].to_list() == [1]
    assert ev.filter(pl.col("rank") == 0)["detector"].all()


def test_tql5_rules_fire_and_stay_quiet_on_their_fixtures():
    from traceql.rules.loader import load_rules
    from traceql.rule_tests import test_rules

    rules = [r for r in load_rules([REPO / "rules"]) if r.id.startswith("TQL5")]
    assert len(rules) == 18
    outcomes = test_rules(rules, REPO, use_cache=False)
    bad = [f"{o.rule} {o.expect} {o.fixture}: {o.detail}" for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
    assert {o.rule for o in outcomes if o.expect == "fire"} == {r.id for r in rules}


def test_kineto_and_log_comms_tie_by_rank_and_group_size():
    from traceql.link.nccl import nccl_comm_collectives
    from traceql.model import Run, conform

    comms = conform("nccl_comms", pl.DataFrame({"rank": [0, 1], "comm_id": ["0xa", "0xa"], "nranks": [2, 2]}))
    coll = conform("collectives", pl.DataFrame({"rank": [0, 0, 1], "pg_name": ["0", "0", "0"], "group_size": [2, 2, 2],
                                                "op": ["all_reduce"] * 3, "bytes": [4, 4, 4]}))
    out = nccl_comm_collectives(Run(path=Path("."), tables={"nccl_comms": comms, "collectives": coll}))
    assert sorted(out.select("rank", "n_collectives").rows()) == [(0, 2), (1, 1)]


def _expects_tql5(d):
    m = d / "manifest.json"
    return m.exists() and any(e.get("rule", "").startswith("TQL5") for e in json.loads(m.read_text()).get("expected", []))


# healthy runs only: a capture that plants an NCCL failure (h200-duplicate-gpu) has its own test below
H200_LOGS = sorted(d for d in FIXTURES.glob("h200-*") if not _expects_tql5(d) and any(
    "NCCL INFO" in p.read_text(errors="replace") for p in d.glob("*.log")))


@pytest.mark.skipif(not H200_LOGS, reason="no captured H200 NCCL_DEBUG=INFO logs in fixtures/")
def test_real_h200_nccl_logs():
    """Real NCCL 2.28 single-GPU logs captured by `traceql capture`: one complete comm per process, Init timings
    (printed after Init COMPLETE) attached to it, and no TQL5 finding on a healthy run."""
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    rules = [r for r in load_rules([REPO / "rules"]) if r.id.startswith("TQL5")]
    for d in H200_LOGS:
        run = _run(d.name)
        comms = run.tables["nccl_comms"]
        assert comms.height >= 1, d.name
        full = comms.filter(pl.col("comm_id").is_not_null())
        assert full.height == 1 and full["init_ms"].is_not_null().all() and full["channels"][0] > 0, d.name
        assert full["version"][0].startswith("2.") and full["network"][0] in ("Socket", "IB")
        fired = [f.rule for r in rules for f in evaluate(run, r).findings]
        assert fired == [], (d.name, fired)


def test_real_duplicate_gpu_failure_on_the_h200():
    """Two NCCL ranks forced onto one H200 (traceql capture duplicate-gpu): NCCL 2.28's real refusal, one finding
    naming both ranks and the bus id, and rank 0 named as the first to fail."""
    from traceql.rules.engine import evaluate
    from traceql.rules.loader import load_rules

    d = FIXTURES / "h200-duplicate-gpu"
    if not d.is_dir():
        pytest.skip("fixtures/h200-duplicate-gpu not present")
    run = _run(d.name)
    ev = run.tables["nccl_events"].filter(pl.col("kind") == "duplicate_gpu")
    assert ev["rank"].unique().sort().to_list() == [0, 1]
    rules = {r.id: r for r in load_rules([REPO / "rules"])}
    dup = evaluate(run, rules["TQL507"]).findings
    assert len(dup) == 1 and dup[0].ranks == [0, 1] and dup[0].evidence["bus_id"] == "60"
    root = evaluate(run, rules["TQL512"]).findings
    assert root and "Duplicate GPU" in root[0].message


@pytest.mark.skipif(not REAL.is_file(), reason="reference corpus absent")
def test_pasted_multi_rank_excerpt_keeps_communicators_without_a_rank(tmp_path):
    """Real issue lines pasted into one file: communicator lines that name no rank are still judged (TQL503/504 select
    over the whole run, not per rank partition, which would drop them)."""
    from traceql import pipeline

    (tmp_path / "nccl.log").write_text(REAL.read_text())
    res = pipeline.check(tmp_path, use_cache=False, select=["TQL503", "TQL504"])
    rankless = {(f.rule, f.evidence.get("p2p_issue") or f.evidence.get("gdr_disabled")) for f in res.findings if not f.ranks}
    assert ("TQL503", "P2P is disabled between connected GPUs") in rankless
    assert ("TQL504", "NET/IB channels without /GDRDMA") in rankless
