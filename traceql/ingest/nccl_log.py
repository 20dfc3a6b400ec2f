"""NCCL_DEBUG=INFO logs and ProcessGroupNCCL messages -> nccl_comms and nccl_events.

The file is streamed in 1 MiB blocks, decoded and split into lines once per block (logs can be gigabytes): a cheap
substring test drops foreign lines, then one compiled pattern per wording variant classifies the rest. `parse_line` is
pure and is what the tests pin; `read` keeps the little state a log needs (which communicator an init line belongs to,
which WARN a return-code trail continues, which line follows "Last error:"). For the lines a big log is made of
(`... [dev] NCCL INFO text`: COLL lines, channels, rings, transports) `read` takes parse_line's result by a shorter
way: the part up to "] NCCL INFO " is parsed once per distinct prefix, the text's classification once per distinct
text, COLL lines are recognised by their head alone, and the launcher rank and timestamp are looked up only where an
event or a new communicator keeps them. benchmarks/nccl_log.py times it.

The NCCL core grammar is `host:pid:tid [cudaDev] [file:line] NCCL INFO|WARN text`, behind whatever prefix a
launcher adds (`[rank3]:`, mpirun `[1,3]<stdout>:`, `--tag-output` `[3] `, timestamps, pod names), so it is
searched anywhere in the line. NCCL >= 2.26 may print `[date time] host [dev]` without pid:tid on WARN lines.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError, _gz
from traceql.ingest.sniff import nccl_log as sniff  # noqa: F401  (discovery's test, kept in one place)
from traceql.model import SCHEMAS, Source

KIND = "nccl_log"
SUPPORTED = True


# ---------------------------------------------------------------------------------------------------------------
# Line grammar. One pattern per wording variant; the comment names the NCCL/PyTorch versions that print it.

# Launcher prefixes that carry the rank.
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")  # torchrun --tee / torch.distributed.elastic
_MPI_PREFIX = re.compile(r"\[1,(\d+)\]<std(?:out|err)>:")  # Open MPI --tag-output
_TAG_PREFIX = re.compile(r"^\s*\[(\d+)\] (?=\S+ \[\d+\] )")  # mpirun "[N] host:pid:tid [dev] ..."

# NCCL core: host:pid:tid [dev] (file:line )?NCCL LEVEL text. Host has no ':' '[' ']' or blanks.
_CORE = re.compile(
    r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]++)(?::(?P<pid>\d++):(?P<tid>\d++))? \[(?P<dev>\d++)\] "
    r"(?:(?P<src>[\w./-]++:\d++) )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?(?P<text>.*)"
)
# What every _CORE match holds from its "[dev]" on: a literal-led pattern the regex engine finds fast, so that lines
# without it skip _CORE, whose search is quadratic on long lines that do not match (PyTorch env dumps, tracebacks).
_CORE_TAIL = re.compile(r"\] (?:[\w./-]++:\d++ )?NCCL (?:INFO|WARN|TRACE|ABORT)")


def _core(line: str) -> re.Match | None:
    """_CORE.search(line), started where a match can begin: the head before "] " holds one blank (before "[dev]"),
    so no match starts before the second blank left of the first _CORE_TAIL."""
    t = _CORE_TAIL.search(line)
    if t is None:
        return None
    b = line.rfind(" ", 0, t.start())
    if b > 0:
        b = line.rfind(" ", 0, b) + 1
    return _CORE.search(line, max(b, 0))


# Core without host (a bare "init.cc:1247 NCCL WARN ..." as old releases or a stripped excerpt show it).
_BARE = re.compile(r"(?:^|(?<=\s))(?:(?P<src>[\w./-]{1,200}\.(?:cc|c|h|cpp|cu):\d++) )?NCCL (?P<level>INFO|WARN) (?P<text>.*)")

# Timestamps a line may carry: RFC 3339 (k8s, CloudWatch), "[2025-11-24 11:20:21]" (NCCL >= 2.26 WARN),
# "2025-02-18 12:54" (platform), glog "E1206 18:44:12.715298746" (no year).
_TS_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,9}))?)?")
_TS_GLOG = re.compile(r"\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9})")
_GLOG_YEAR = 2000  # glog omits the year; a fixed leap year keeps times of one run comparable with each other

# --- NCCL INFO/WARN texts -------------------------------------------------------------------------------------
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+\.\d+))?")  # bare (<=2.17) or INFO (>=2.18)
_ENV = re.compile(r"^(NCCL_[A-Z0-9_]++) set by environment to (.*)")  # value: trailing blanks and one "." cut in code
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?:\[\d++\])?([^\s:]++):(\S++)")  # "Bootstrap : " (<2.25), "Bootstrap: " (>=2.25)
_NET_SOCKET_IFS = re.compile(r"^NET/Socket ?: Using (.*)")
_NET_IB_USING = re.compile(r"^NET/IB ?: Using (.*)")  # devices, then "; OOB iface:addr" (split in code)
_NET_IB_NONE = re.compile(r"^NET/IB ?: No device found")
_USING_NETWORK = re.compile(r"^Using network (\S+)")
_NET_PLUGIN = re.compile(r"^(?:NET/Plugin ?: (.*)|Plugin Path : (\S+)|P2P plugin (\S+)|Using non-device net plugin)")
_NO_IBVERBS = re.compile(r"^Failed to open libibverbs")
# GPU Direct RDMA: "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)" (2.1x-2.2x) and the
# per-GPU decision "GPU Direct RDMA Disabled for GPU 18000 / HCA 0 (distance 5 > 4)" (2.4-2.1x NET subsystem).
_GDR_HCA = re.compile(r"^NET/(\w++) ?: GPU Direct RDMA (Disabled|Enabled) for HCA (\d++) '([^']*+)'(?: \((.*)\))?")
_GDR_GPU = re.compile(r"^GPU Direct RDMA (Disabled|Enabled) for GPU (\w++) / HCA (\d++)(?: \(([^)]*+)\))?")
# Communicator init. 2.18+: "comm 0x.. rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 4f000 commId 0x.. - Init START";
# 2.1x: "comm 0x.. rank 15 nranks 16 cudaDev 7 busId e7000 - Init COMPLETE"; 2.4: no busId;
# 2.22+: "ncclCommInitRank comm 0x.. rank .. - Init COMPLETE".
_COMM_INIT = re.compile(
    r"^(?:\w+ )?comm (0x[0-9a-f]+) rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev \d+)?(?: busId ([0-9a-f]+))?"
    r"(?: commId (0x[0-9a-f]+))?(?: localSize \d+)?(?: used \d+ bytes)? - Init (START|COMPLETE)",
    re.IGNORECASE,
)
# 2.19+: "comm 0x5b0bc60 rank 3 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0"
_COMM_NODES = re.compile(r"^comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
# Init timings. 2.22: "Init timings: rank 2 nranks 16 total 1.08 (kernels 0.51, ...)";
# 2.23+: "Init timings - ncclCommInitRank: rank 0 nranks 8 total 0.58 (kernels 0.12, alloc 0.01, ...)".
_INIT_TIMINGS = re.compile(r"^Init timings(?: -\s*+\w++)?:? rank (\d++) nranks (\d++) total ([\d.]++) \((.*)\)")
_TIMING_PART = re.compile(r"\b(\w++) ([\d.]++)")  # from a word's start only: no retry inside a long word
# Channels/transports. "Channel 00/0 : 2[2] -> 3[3] via P2P/direct pointer/read" (2.12+), "Channel 00 : 3[4a000] ->
# 6[44000] [send] via NET/IB/0/GDRDMA" (2.7-2.11), "Ring 00 : 34 -> 33 [send] via NET/Socket/0" (2.4).
_VIA = re.compile(r"^(?:Channel|Ring) \d++(?:/\d++)? : .*? via (\S++(?: \S++)*+)")
_CHANNELS = re.compile(r"^(\d+) coll channels")  # "16 coll channels, 0 nvls channels, 16 p2p channels, ..."
# Possessive: "(?:\d+\s*)+" alone splits "10" into "1" "0" in 2^n ways before failing (issue 16).
_RING_LIST = re.compile(r"^Channel (\d++)/(\d++) :\s++((?:\d++\s*+)++)$")
_TREES = re.compile(r"^Trees (.*)")
_P2P_DISABLED = re.compile(r"^P2P is disabled between connected GPUs (\d+) and (\d+)")
_COLL = re.compile(r"^(\w+): opCount ([0-9a-f]+) sendbuff \S+ recvbuff \S+ count (\d+) datatype (\d+) op (\d+) root (\d+) comm (0x[0-9a-f]+) \[nranks=(\d+)\]")
# "[0]eth0:10.0.0.1<0>" and "[0]mlx5_0:1/IB": names hold no bracket, so a match never runs past the next "[".
_SOCKET_IF = re.compile(r"\[\d++\]([^:\s\[\]]++):")
_IB_DEV = re.compile(r"\[\d++\]([^:\s\[\]]++):\d++/([^\s\[]++)")
_TRAIL = re.compile(r"^([\w./-]+:\d+) -> (\d+)")  # return-code trail "transport/net.cc:1302 -> 6 [Proxy Thread]"

# WARN texts
_DUP_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA device (\w+)")
_IB_COMPLETION = re.compile(  # 2.1x: "with error 4, opcode 32564, len 32564, vendor err 81"; 2.2x: "with status=12 opcode=0 len=0 vendor err 129"
    r"NET/IB ?: Got completion from peer (\S++) with (?:error (\d++)|status=(\d++)).{0,200}?vendor err (\d++)"
)
_IB_OTHER = re.compile(r"NET/IB|ibv_|IB(?:ext)? ?:|RoCE|mlx5")
_SOCKET_ERR = re.compile(r"socket|Socket|Call to (?:send|recv)|Connection (?:reset|closed|refused)|Broken pipe|connect")

_MISMATCH_NCCL = re.compile(r"Mismatched collective detected")

# --- ProcessGroupNCCL --------------------------------------------------------------------------------------------
_PG_PREFIX = re.compile(r"\[(?:PG (?:ID )?(\d++)(?: PG GUID ([^\s(]++)(?:\(([^)]{0,256})\))?)? )?Rank (\d++)\]")
_WORK = re.compile(
    r"WorkNCCL\(SeqNum=(\d++), OpType=(\w++)(?:, NumelIn=(-?\d++), NumelOut=(-?\d++))?, Timeout\(ms\)=(\d++)\)"
)
# Matched once, at the first occurrence of their fixed head (_first): searched, the ".*?" gap would be retried from
# every occurrence of the head, quadratic on a line that repeats it (issue 16). Shorter gaps elsewhere are bounded.
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: ?WorkNCCL\(.*?\) ran for (\d++) milliseconds")
_BLOCKING = re.compile(r"Work WorkNCCL\(.*?\) timed out in blocking wait")
_ASYNC_EXC = re.compile(r"Collective WorkNCCL\(.*?\) raised the following async exception: (.*)")
_HEADS = {_WATCHDOG: "Watchdog caught collective operation timeout:", _BLOCKING: "Work WorkNCCL(",
          _ASYNC_EXC: "Collective WorkNCCL("}


def _first(p: re.Pattern, line: str) -> re.Match | None:
    i = line.find(_HEADS[p])
    return p.match(line, i) if i >= 0 else None
# 2.0-2.5: "Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582,
# last completed NCCL work: 1579."; "Timeout at NCCL work: 7753, last enqueued ..."; 2.6+: "failure detected by
# watchdog at work sequence id: 120049 PG status: last enqueued work: 120051, last completed work: 120048".
_PG_STATUS = re.compile(
    r"(?:detected by watchdog at work|Timeout at NCCL work|failure detected by watchdog at work sequence id):? (-?\d++)"
    r".{0,200}?last enqueued (?:NCCL )?work: (-?\d++), last completed (?:NCCL )?work: (-?\d++)"
)
_DUMP_SIGNAL = re.compile(
    r"Received a dump signal (?:due to a collective timeout )?from\s++(this local rank|rank\s*+\d++)"
    r"(?:.{0,300}?Last enqueued \w++ work: (-?\d++), last completed \w++ work: (-?\d++))?"
)
_DUMP_OBSERVED = re.compile(r"Observed flight recorder dump signal from another rank")
_DUMP_FIRST = re.compile(r"First PG on this rank to signal dumping")
_DUMP_PREP = re.compile(r"preparing to dump debug info|Flight Recorder trace successfully dumped")
_HEARTBEAT = re.compile(r"Heartbeat monitor timed out")
_WATCHDOG_STUCK = re.compile(r"watchdog got stuck for (\d++) seconds")
_ABORT = re.compile(
    r"taking the entire process down|watchdog thread terminated with exception|terminate called after throwing"
    r"|Some NCCL operations have failed or timed out|Aborting communicators|ProcessGroupNCCL aborting|abort(?:ing|ed) (?:NCCL )?comm"
)
_PG_ENV = re.compile(r"(ProcessGroupNCCL environments|ProcessGroupNCCL initialization options|HeartbeatMonitor environments|PGNCCL Watchdog environments): (.*)")
_DEPRECATED_ENV = re.compile(r"\b(\w++) is (?:deprecated|the default now, this environment variable is thus deprecated)")
_CUDA_FAILURE = re.compile(r"Cuda failure '([^']{0,500})'")
# One attempt, at the first "NCCL error": everything after it is optional and ".*?...$" always ends the match.
_NCCL_ERROR = re.compile(r"NCCL error(?: in: ([^\s,]++),)?:? ?(.*?)(?:, NCCL version (\d++\.\d++\.\d++))?$")
_NCCL_ERR_NAME = re.compile(r"(?:^|[\s:])(nccl(?:Remote|System|UnhandledCuda|Internal|InvalidUsage|InvalidArgument|InProgress)Error|ncclUnhandledCudaError|ncclInvalidUsage): (.*)")
# The two fingerprints of a mismatch, found by two searches (the second from the end of the first): one pattern with
# ".*?" between them would be retried from every occurrence of the first.
_FINGERPRINT = re.compile(
    r"Detected mismatch between collectives on ranks\. Rank (\d++) is running collective: CollectiveFingerPrint\("
    r"SequenceNumber=(\d++),? ?OpType=(\w++)"
)
_FINGERPRINT_OTHER = re.compile(
    r"but Rank (\d++) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d++),? ?OpType=(\w++)"
)
# TORCH_NCCL_DESYNC_DEBUG report lines (TraceUtils.h).
_DESYNC_MISSING = re.compile(r"ranks \[([\d, ]*+)\] are the lagging ranks that caused this timeout")
_DESYNC_JOINED = re.compile(r"\[([\d, ]*+)\] joined but didn't finish collective #(\d++)")
_DESYNC_FINISHED = re.compile(r"\[([\d, ]*+)\] finished collective #(\d++), but didn't join collective #(\d++)")
# "\t - [7] Timeout at collective: ALLREDUCE, #2130": the rank whose watchdog asked for the report, where it waits.
_DESYNC_TIMEOUT = re.compile(r"\[(\d++)\] Timeout at collective: (\w++), #(\d++)")
_FR_DISABLED = re.compile(r"FlightRecorder is disabled")
_GLOG_SRC = re.compile(r"(?<![\w.])\[?([IWEF])(?:\d{4} [\d:.]++)? ?[\w.]{1,200}\.(?:cpp|hpp|h):\d++\]")  # level of a c10d log line

# Cheap prefilter: a line without any of these is foreign (application output, tracebacks).
_MARKS = ("NCCL", "nccl", "Watchdog", "watchdog", "collective", "Heartbeat", "dump signal", "NET/", "Rank ", "Cuda failure", "terminate called")
_MARKS_RE = re.compile("|".join(map(re.escape, _MARKS)))  # one search instead of eleven substring tests

# OpType spellings of WorkNCCL -> canonical collective names of the collectives table.
OP_NAMES = {
    "ALLREDUCE": "all_reduce", "ALLREDUCE_COALESCED": "all_reduce", "_ALLREDUCE_SPARSE": "all_reduce",
    "BROADCAST": "broadcast", "REDUCE": "reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather",
    "ALLGATHER_COALESCED": "all_gather", "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather", "GATHER": "gather",
    "SCATTER": "scatter", "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter", "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all",
    "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv", "BARRIER": "barrier", "COALESCED": "coalesced",
    "ALLREDUCE_BARRIER": "barrier", "UNKNOWN": "unknown",
    # NCCL COLL subsystem names
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "Broadcast": "broadcast",
    "Reduce": "reduce", "Send": "send", "Recv": "recv", "AllToAll": "all_to_all",
}

# Interfaces that are loopback or virtual: NCCL picking one for a multi-node job means traffic cannot leave the host
# or detours through a container bridge or VPN.
VIRTUAL_IF = re.compile(r"^(lo|docker\d*|veth\w*|virbr\d*|br-\w+|cni\d*|flannel\S*|cali\w+|tun\d*|tap\d*|wg\d*|tailscale\d*|zt\w+|CloudflareWARP|utun\d*|kube\S*)$")


@dataclass
class LineFact:
    """What one line says. kind names the fact; fields holds its values."""

    kind: str
    level: str = ""
    host: str | None = None
    pid: int | None = None
    tid: int | None = None
    cuda_dev: int | None = None
    rank: int | None = None  # from a launcher prefix
    src: str | None = None  # NCCL source location "file.cc:123"
    text: str = ""
    ts: int | None = None
    fields: dict = field(default_factory=dict)


def _ts(line: str) -> int | None:
    m = _TS_ISO.search(line)
    if m:
        y, mo, d, h, mi, s, frac = m.groups()
        try:
            base = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s or 0), tzinfo=timezone.utc)
        except ValueError:
            return None
        return int(base.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))
    m = _TS_GLOG.search(line)
    if m:
        mo, d, h, mi, s, frac = m.groups()
        try:
            base = datetime(_GLOG_YEAR, int(mo), int(d), int(h), int(mi), int(s), tzinfo=timezone.utc)
        except ValueError:
            return None
        return int(base.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0"))
    return None


def _ranks(s: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", s)]


def _int(s: str | None) -> int | None:
    return int(s) if s not in (None, "") else None


def _prefix_rank(line: str) -> int | None:
    m = _RANK_PREFIX.search(line) or _MPI_PREFIX.search(line) or _TAG_PREFIX.search(line)
    return int(m.group(1)) if m else None


def _nccl_text(text: str, level: str) -> tuple[str, dict]:
    """Classify the text of an NCCL INFO/WARN line."""
    if level == "WARN" or level == "ABORT":
        m = _DUP_GPU.search(text)
        if m:
            return "duplicate_gpu", {"ranks": [int(m.group(1)), int(m.group(2))], "bus_id": m.group(3)}
        m = _IB_COMPLETION.search(text)
        if m:
            status = m.group(2) or m.group(3)
            return "ib_error", {"peer": m.group(1), "status": int(status), "vendor_err": int(m.group(4))}
        if _MISMATCH_NCCL.search(text):
            return "collective_mismatch", {}
        if _IB_OTHER.search(text):
            return "ib_error", {}
        if _SOCKET_ERR.search(text):
            return "net_error", {}
        if re.search(r"fail|error|Error|Failed|timeout|Timeout", text):
            return "error", {}
        return "warn", {}
    m = _TRAIL.match(text)
    if m:
        return "trail", {"at": m.group(1), "code": int(m.group(2))}
    m = _VERSION.search(text)
    if m:
        return "version", {"version": m.group(1), "cuda": m.group(2)}
    m = _ENV.match(text)
    if m:
        value = m.group(2).rstrip()
        return "env", {"name": m.group(1), "value": (value[:-1] if value.endswith(".") else value).strip()}
    m = _COMM_INIT.match(text)
    if m:
        return "comm_init", {
            "comm": m.group(1), "comm_rank": int(m.group(2)), "nranks": int(m.group(3)), "cuda_dev": int(m.group(4)),
            "bus_id": m.group(5), "comm_id": m.group(6), "phase": m.group(7).upper(),
        }
    m = _COMM_NODES.match(text)
    if m:
        return "comm_nodes", {"comm": m.group(1), "comm_rank": int(m.group(2)), "nranks": int(m.group(3)),
                              "nnodes": int(m.group(4)), "local_ranks": int(m.group(5))}
    m = _INIT_TIMINGS.match(text)
    if m:
        parts = {k: float(v) for k, v in _TIMING_PART.findall(m.group(4))}
        return "init_timing", {"comm_rank": int(m.group(1)), "nranks": int(m.group(2)), "total_s": float(m.group(3)), "parts": parts}
    m = _VIA.match(text)
    if m:
        return "transport", {"via": normalise_transport(m.group(1))}
    m = _RING_LIST.match(text)
    if m:
        return "ring", {"channel": int(m.group(1)), "nchannels": int(m.group(2)), "order": m.group(3).split()}
    m = _CHANNELS.match(text)
    if m:
        return "channels", {"channels": int(m.group(1))}
    m = _TREES.match(text)
    if m:
        return "trees", {"trees": m.group(1)}
    m = _BOOTSTRAP.match(text)
    if m:
        return "bootstrap", {"iface": m.group(1), "addr": m.group(2)}
    m = _NET_SOCKET_IFS.match(text)
    if m:
        ifs = _SOCKET_IF.findall(m.group(1))
        return "net_socket", {"ifaces": ifs}
    m = _NET_IB_NONE.match(text)
    if m:
        return "net_ib", {"devices": []}
    m = _NET_IB_USING.match(text)
    if m:
        rest, oob = m.group(1), None
        i = rest.rfind("OOB ")  # "...[RO]; OOB ib0:10.0.0.1<0>": the last token after "OOB "
        if i >= 0 and rest[i + 4:] and not any(ch.isspace() for ch in rest[i + 4:]):
            rest, oob = rest[:i], rest[i + 4:]
        devs = _IB_DEV.findall(rest)
        return "net_ib", {"devices": [d for d, _ in devs], "link": sorted({t.split("/")[0] for _, t in devs}),
                          "oob": oob}
    m = _USING_NETWORK.match(text)
    if m:
        return "network", {"network": m.group(1)}
    m = _NET_PLUGIN.match(text)
    if m:
        plugin = None
        if m.group(1):
            plugin = "internal" if re.search(r"No plugin found|returned|Could not find", m.group(1)) else m.group(1)
        elif m.group(2):
            plugin = Path(m.group(2)).name
        elif m.group(3):
            plugin = m.group(3)
        return "plugin", {"plugin": plugin}
    if _NO_IBVERBS.match(text):
        return "net_ib", {"devices": [], "no_ibverbs": True}
    m = _GDR_HCA.match(text)
    if m:
        return "gdr", {"enabled": m.group(2) == "Enabled", "net": m.group(1), "hca": m.group(4), "why": m.group(5)}
    m = _GDR_GPU.match(text)
    if m:
        return "gdr", {"enabled": m.group(1) == "Enabled", "gpu": m.group(2), "why": m.group(4)}
    m = _P2P_DISABLED.match(text)
    if m:
        return "p2p_disabled", {"gpus": [int(m.group(1)), int(m.group(2))]}
    m = _COLL.match(text)
    if m:
        return "coll", {"op": OP_NAMES.get(m.group(1), m.group(1).lower()), "op_count": int(m.group(2), 16),
                        "count": int(m.group(3)), "comm": m.group(7), "nranks": int(m.group(8))}
    return "info", {}


def normalise_transport(via: str) -> str:
    """'NET/IB/3/GDRDMA' -> 'NET/IB/GDRDMA', 'P2P/CUMEM/read' -> 'P2P/CUMEM', 'direct shared memory' -> 'SHM'."""
    via = via.strip()
    if via.startswith("direct shared memory") or via.startswith("SHM"):
        return "SHM"
    if via.startswith("P2P"):
        parts = via.split("/")
        kind = parts[1] if len(parts) > 1 else ""
        kind = "direct" if kind.startswith("direct") else kind
        return f"P2P/{kind}" if kind else "P2P"
    if via.startswith("NET"):
        parts = [p for p in via.split("/") if p and not p.isdigit()]
        return "/".join(parts[:2] + (["GDRDMA"] if "GDRDMA" in parts else []))
    if via.startswith("CollNet"):
        return "CollNet"
    return via.split("/")[0]


def _pg_fields(line: str) -> dict:
    m = _PG_PREFIX.search(line)
    if not m:
        return {}
    pg_id, guid, desc, rank = m.groups()
    out = {"pg_rank": int(rank)}
    if guid is not None:
        out["pg_name"] = guid
    elif pg_id is not None:
        out["pg_name"] = pg_id
    if desc:
        out["pg_desc"] = desc
    return out


def _work(line: str) -> dict:
    m = _WORK.search(line)
    if not m:
        return {}
    return {"seq": int(m.group(1)), "op_type": m.group(2), "op": OP_NAMES.get(m.group(2), m.group(2).lower()),
            "numel_in": _int(m.group(3)), "numel_out": _int(m.group(4)), "timeout_ms": int(m.group(5))}


def _pg_text(line: str) -> tuple[str, dict] | None:
    """Classify a PyTorch distributed line (ProcessGroupNCCL, c10d). None where it says nothing we keep."""
    m = _first(_WATCHDOG, line)
    if m:
        f = _work(line)
        f["ran_ms"] = int(m.group(1))
        f["mode"] = "watchdog"
        return "watchdog_timeout", f
    if _first(_BLOCKING, line):
        return "watchdog_timeout", {**_work(line), "mode": "blocking_wait"}
    m = _first(_ASYNC_EXC, line)
    if m:
        f = _work(line)
        e = _NCCL_ERROR.search(m.group(1))
        if e:
            f.update({"reason": e.group(2), "version": e.group(3)})
        return "error", f
    m = _PG_STATUS.search(line)
    if m:
        return "pg_status", {"seq": int(m.group(1)), "last_enqueued": int(m.group(2)), "last_completed": int(m.group(3))}
    m = _DUMP_SIGNAL.search(line)
    if m:
        src = m.group(1)
        f = {"from": re.sub(r"\s+", " ", src), "role": "detector" if src == "this local rank" else "notified"}
        if src != "this local rank":
            f["detector_rank"] = _ranks(src)[0]
        if m.group(2) is not None:
            f.update({"last_enqueued": int(m.group(2)), "last_completed": int(m.group(3))})
        return "dump_signal", f
    if _DUMP_FIRST.search(line):
        return "dump_signal", {"from": "this local rank", "role": "detector"}
    if _DUMP_OBSERVED.search(line):
        return "dump_signal", {"from": "another rank", "role": "notified"}
    if _HEARTBEAT.search(line):
        return "heartbeat_timeout", {}
    m = _WATCHDOG_STUCK.search(line)
    if m:
        return "heartbeat_timeout", {"stuck_s": int(m.group(1))}
    if _DUMP_PREP.search(line):
        return "dump", {}
    m = _PG_ENV.search(line)
    if m:
        env = {}
        for part in m.group(2).split(","):  # "NCCL version: 2.21.5, TIMEOUT(ms): 600000, size: 8, ..."
            k, sep, v = part.partition(": ")
            k = k.split(" (")[0].strip()
            if sep and k:
                env[k] = v.strip().rstrip(".")
        return "pg_env", {"what": m.group(1), "env": env}
    m = _FINGERPRINT.search(line)
    o = _FINGERPRINT_OTHER.search(line, m.end()) if m else None
    if o:
        return "collective_mismatch", {
            "ranks": [int(m.group(1)), int(o.group(1))], "seqs": [int(m.group(2)), int(o.group(2))],
            "ops": [m.group(3), o.group(3)],
        }
    m = _DESYNC_MISSING.search(line)
    if m:
        return "desync_report", {"missing_ranks": _ranks(m.group(1))}
    m = _DESYNC_JOINED.search(line)
    if m:
        return "desync_report", {"stuck_ranks": _ranks(m.group(1)), "seq": int(m.group(2))}
    m = _DESYNC_FINISHED.search(line)
    if m:
        return "desync_report", {"lagging_ranks": _ranks(m.group(1)), "seq": int(m.group(2))}
    m = _DESYNC_TIMEOUT.search(line)
    if m:
        return "desync_report", {"timeout_rank": int(m.group(1)), "op": OP_NAMES.get(m.group(2), m.group(2).lower()),
                                 "seq": int(m.group(3))}
    if "Detected mismatch between collectives" in line:
        return "collective_mismatch", {}
    m = _DEPRECATED_ENV.search(line) if "deprecated" in line else None  # the test spares a slow search
    if m:
        return "warn", {"deprecated_env": m.group(1)}
    if _ABORT.search(line):
        return "abort", {}
    if "NCCL error" in line:
        e = _NCCL_ERROR.search(line)
        f = {}
        if e:
            f = {"where": e.group(1), "reason": e.group(2), "version": e.group(3)}
        return "error", f
    m = _NCCL_ERR_NAME.search(line) if "nccl" in line else None
    if m:
        return "error", {"code": m.group(1), "reason": m.group(2).strip()}
    m = _CUDA_FAILURE.search(line)
    if m:
        return "error", {"reason": f"Cuda failure '{m.group(1)}'"}
    if _FR_DISABLED.search(line):
        return "info", {"fr_disabled": True}
    i = line.find("NET/OFI ")
    if i >= 0 and "error" in line[i + 8:]:
        return "net_error", {"plugin": "aws-ofi-nccl"}
    return None


def parse_line(line: str) -> LineFact | None:
    """Classify one log line; None for blank and foreign lines."""
    if not line or _MARKS_RE.search(line) is None:
        return None
    line = line.rstrip("\r\n")
    rank = _prefix_rank(line)
    m = _core(line)
    if m:
        level, text = m.group("level"), m.group("text")
        kind, fields = _nccl_text(text, level)
        return LineFact(kind, level, m.group("host"), _int(m.group("pid")), _int(m.group("tid")), int(m.group("dev")),
                        rank, m.group("src"), text, _ts(line), fields)
    pg = _pg_text(line)
    if pg is not None:
        kind, fields = pg
        fields.update(_pg_fields(line))
        lm = _GLOG_SRC.search(line) if ".cpp:" in line or ".h:" in line or ".hpp:" in line else None
        level = lm.group(1) if lm else ("E" if kind not in ("pg_env", "info") else "I")
        return LineFact(kind, level, rank=rank, text=line.strip(), ts=_ts(line), fields=fields)
    m = _BARE.search(line) if "NCCL INFO " in line or "NCCL WARN " in line else None
    if m:
        level, text = m.group("level"), m.group("text")
        kind, fields = _nccl_text(text, level)
        return LineFact(kind, level, rank=rank, src=m.group("src"), text=text, ts=_ts(line), fields=fields)
    m = _VERSION.search(line)
    if m:
        return LineFact("version", "INFO", rank=rank, text=line.strip(), fields={"version": m.group(1), "cuda": m.group(2)})
    return None


# --- Lines a terminal or a paste wrapped -------------------------------------------------------------------------
# A line cut by a terminal (at its width, or at a blank by `fold -s`) continues on lines without any prefix. A
# continuation is joined back only where that is safe: the next line starts no record of its own (no launcher, glog,
# NCCL or traceback head), says nothing by itself, and the joined line says strictly more than the first piece did
# (a fact where there was none, or more fields). Up to _JOIN_MAX pieces; "Last error:" lines are never joined (the
# free text after them is read in context).
_JOIN_MAX = 8
_RECORD_START = re.compile(
    r"\[(?:rank\d++\]|default\d++\]|1,\d++\]|[IWEFV]\d{4} |PG |Rank |\d{4}-|\d++\] )|\(\w++ pid=\d++|\d++: |[^\s:\[\]]++:\d++:\d++ \[|[IWEFV]\d{4} |\d{4}-\d\d-\d\d|NCCL "
    r"|terminate called|\s*+what\(\)|Exception raised|frame #|#\d++ |Traceback|\s++File \"|[\w.]*+(?:Error|Exception)\b"
)


# NCCL's "host[:pid:tid] [dev] " head at a line's end, maybe with the start of its "file.cc:12 NCCL" after it
_CORE_HEAD_END = re.compile(r"(?<![^\s:\[\]])[^\s:\[\]]++(?::\d++:\d++)? \[\d++\](?: [\w./:-]*+)?(?: NC?C?L?)?$")


_KIND_RICHNESS = {"info": 1, "warn": 2, "error": 3}


def _richness(f: LineFact | None) -> tuple[int, int, int]:
    """(no fact / info / a bare WARN / a generic error / a named fact, fields with a value, items of its list and
    dict fields)."""
    if f is None:
        return (0, 0, 0)
    vals = f.fields.values()
    return (_KIND_RICHNESS.get(f.kind, 4), sum(1 for v in vals if v not in (None, "", [], {})),
            sum(len(v) for v in vals if isinstance(v, (list, dict))))


def _starts_record(line: str) -> bool:
    """A line that cannot continue the one before: NCCL's own lines (most of a big log, tested first), blank lines and
    launcher, glog and traceback heads."""
    return "NCCL INFO" in line or not line.strip() or _RECORD_START.match(line) is not None


def _wrap_width(lines: list[str], cands: list[int]) -> int | None:
    """The width a terminal cut these lines at: the commonest length (>= 60) of lines followed by a line that starts
    no record (cands: their indices), where at least three lines have it. None where nothing looks cut."""
    counts: dict[int, int] = {}
    for i in cands:
        n = len(lines[i].rstrip("\r"))
        if n >= 60:
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return None
    n, k = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    return n if k >= 3 else None


def _continues(piece: str) -> bool:
    """Whether a line may continue the one before: not blank, no record head, nothing to say by itself."""
    return bool(piece.strip()) and _RECORD_START.match(piece) is None and _richness(parse_line(piece))[0] < 2


def _completes(joined: str, piece: str, best: tuple) -> bool:
    """A piece that reads as a fact alone ("...: NCCL error: unhandled system e") still continues a first piece that
    says nothing alone ("Collective WorkNCCL(SeqNum=2, ... Timeout(m") where the join says more than either."""
    if not piece.strip() or _RECORD_START.match(piece) is not None:
        return False
    return _richness(parse_line(joined + piece.rstrip("\r"))) > max(best, _richness(parse_line(piece)))


def rejoin_wrapped(lines: list[str]) -> None:
    """Join wrapped continuations into the line they continue, in place (a joined piece becomes "", so that line
    numbers stay those of the file)."""
    n = len(lines)
    start = _RECORD_START.match  # _starts_record inlined: this runs once per line of the log
    # a line that cannot start a record follows; or a long host name was cut just before " NCCL INFO ...", right
    # after the "host:pid:tid [dev]" head (the piece then holds "NCCL INFO" but starts no record of its own)
    cands = [i for i, nxt in enumerate(lines[1:]) if ("NCCL INFO" not in nxt and nxt.strip() and start(nxt) is None)
             or (nxt[:1].isspace() and nxt.lstrip().startswith("NCCL ") and _CORE_HEAD_END.search(lines[i].rstrip("\r")))]
    if not cands:
        return
    width = _wrap_width(lines, cands)
    for i in cands:
        if not lines[i] or not lines[i + 1]:  # already joined
            continue
        first = lines[i].rstrip("\r")
        # a line cut right after NCCL's "host:pid:tid [dev] " head (`fold -s`, or a terminal inside "file.cc:12"):
        # the next piece is its text, which may read alone as a bare "file.cc:12 NCCL WARN ..." line
        head_cut = _CORE_HEAD_END.search(first) is not None
        nxt = lines[i + 1]
        if head_cut and nxt[:1].isspace() and nxt.lstrip().startswith("NCCL "):
            # the head, then its own level and text: one line whatever it says (the piece has no head to stand alone)
            lines[i], lines[i + 1] = first + nxt.rstrip("\r"), ""
            continue
        if len(first) < 30 or first.endswith("Last error:") or (
                len(first) != width and not head_cut and _MARKS_RE.search(first) is None):
            continue
        base = _richness(parse_line(first))
        # By meaning: the fewest pieces whose join says the most, strictly more than the first piece alone.
        best, best_j, joined, j = base, 0, first, i + 1
        # a number cut in two ("last completed work: 2" / "1, ..."): the first piece may read as a fact with the wrong
        # value, so the join need only say as much
        digit_cut = first[-1:].isdigit() and lines[i + 1][:1].isdigit()
        while j < n and j - i <= _JOIN_MAX and (_continues(lines[j]) or (head_cut and j == i + 1)
                                                 or (base[0] < 2 and _completes(joined, lines[j], best))):
            joined += lines[j].rstrip("\r")
            r = _richness(parse_line(joined))
            if r[0] >= 2 and (r > best or (digit_cut and j == i + 1 and r >= best)):
                best, best_j = r, j
            j += 1
        if not best_j and len(first) == width:
            # By shape: cut at the terminal's width, every piece as wide continues on the next and a shorter one
            # ends the line; a piece may then say something alone ("295 NCCL WARN ..." after "net_ib.cc:1").
            joined, last, j = first, i, i + 1
            while j < n and j - i <= _JOIN_MAX and lines[j].strip() and _RECORD_START.match(lines[j]) is None:
                piece = lines[j].rstrip("\r")
                joined += piece
                last = j
                if len(piece) != width:
                    break
                j += 1
            if last > i and _richness(parse_line(joined)) >= max(base, *(_richness(parse_line(lines[k]))
                                                                          for k in range(i + 1, last + 1))):
                best_j = last
        if best_j:
            lines[i] = first + "".join(lines[k].rstrip("\r") for k in range(i + 1, best_j + 1))
            for k in range(i + 1, best_j + 1):
                lines[k] = ""


def classify_last_error(line: str) -> LineFact:
    """The free-text line after PyTorch's "Last error:" (NCCL's own last WARN, without its prefix)."""
    text = line.strip()
    kind, fields = _nccl_text(text, "WARN")
    if kind == "warn":
        kind = "error"
    return LineFact(kind, "WARN", rank=_prefix_rank(line), text=text, fields={**fields, "last_error": True})


# ---------------------------------------------------------------------------------------------------------------
# Reading a file.

_EVENT_KINDS = {
    "warn", "error", "ib_error", "net_error", "duplicate_gpu", "collective_mismatch", "watchdog_timeout", "pg_status",
    "dump_signal", "dump", "heartbeat_timeout", "abort", "desync_report", "init_timing", "env", "pg_env", "trail",
}
_COMM_KINDS = {"comm_init", "comm_nodes", "init_timing", "transport", "channels", "trees", "ring", "p2p_disabled"}
_ERROR_KINDS = {"error", "ib_error", "net_error", "duplicate_gpu", "collective_mismatch"}


@dataclass
class _Comm:
    key: tuple
    host: str | None
    pid: int | None
    cuda_dev: int | None
    rank: int | None
    comm: str | None = None
    comm_id: str | None = None
    comm_rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    bus_id: str | None = None
    transports: set = field(default_factory=set)
    channels: int | None = None
    trees: str | None = None
    rings: list = field(default_factory=list)
    init_ms: float | None = None
    timing: dict | None = None
    p2p_disabled: list = field(default_factory=list)
    complete: bool = False
    line: int = 0


@dataclass
class _Process:
    """Facts NCCL prints once per process (version, network, env) and that hold for all its communicators."""

    version: str | None = None
    network: str | None = None
    plugin: str | None = None
    bootstrap_if: str | None = None
    socket_ifs: list = field(default_factory=list)
    ib_devices: list | None = None
    ib_link: list = field(default_factory=list)
    gdr: list = field(default_factory=list)
    env: dict = field(default_factory=dict)


def _events_frame(rows: list[dict]) -> pl.DataFrame:
    schema = SCHEMAS["nccl_events"]
    cols = {c: [r.get(c) for r in rows] for c in schema}
    return _frame(cols, schema)


def _frame(cols: dict, schema) -> pl.DataFrame:
    """The columns as a frame; a number read from a damaged line that no integer column can hold becomes null."""
    try:
        return pl.DataFrame(cols, schema=schema)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        fit = {c: [v if type(v) is not int or -(1 << 31) <= v < (1 << 31) or schema[c] == pl.Int64 and
                   -(1 << 63) <= v < (1 << 63) else None for v in vals] for c, vals in cols.items()}
        return pl.DataFrame(fit, schema=schema, strict=False)


_BLOCK = 1 << 20  # bytes read at a time: lines are cut once per block, never the whole file held

# The INFO lines a large log is made of say nothing the tables keep: NCCL_DEBUG_SUBSYS=COLL prints one per collective
# ("AllReduce: opCount 1a sendbuff ..."), and most init chatter classifies as "info". No earlier pattern of
# _nccl_text can match a text that starts like a COLL line except _VERSION, hence the "NCCL version" test beside it.
_COLL_HEAD = re.compile(r"\b\w++: opCount ")
_TEXT_CACHE_MAX = 1 << 14  # distinct INFO texts whose classification is kept (channel, ring and transport lines repeat)
_UNSET = object()


def read(path: Path, source: Source) -> dict[str, pl.DataFrame]:
    events: list[dict] = []
    done: list[_Comm] = []
    procs: dict[tuple, _Process] = {}
    open_comm: dict[tuple, _Comm] = {}  # (host, pid, dev) -> communicator being initialised
    last_done: dict[tuple, _Comm] = {}  # (host, pid, dev) -> the communicator whose init completed last
    last_warn: dict[tuple, dict] = {}  # (host, pid, tid) -> the WARN event a trail continues
    pid_rank: dict[tuple, tuple[int, int]] = {}  # (host, pid) -> (nranks, rank) of the widest comm seen

    def apply(k, fl, level, host, pid, tid, dev, src, text, ts, rank, line, lineno):
        """Fold one fact into the state. rank is the launcher-prefix rank, or _UNSET where not yet looked up."""
        hp = (host, pid)
        proc = procs.get(hp)
        if proc is None:
            proc = procs[hp] = _Process()
        if k in _COMM_KINDS:
            dev_key = (host, pid, dev)
            c = open_comm.get(dev_key)
            if c is None and k == "init_timing":
                # NCCL >= 2.23 prints "Init timings" just after "Init COMPLETE": it belongs to that communicator
                prev = last_done.get(dev_key)
                if prev is not None and prev.timing is None and (prev.comm_rank, prev.nranks) == (fl["comm_rank"], fl["nranks"]):
                    prev.init_ms, prev.timing = fl["total_s"] * 1000.0, fl["parts"]
                    c = prev
            attached = c is not None and c.complete
            if attached:
                pass
            elif c is None or (k == "comm_init" and c.comm is not None and c.comm != fl["comm"]) or (k == "comm_init" and c.complete):
                if rank is _UNSET:
                    rank = _prefix_rank(line)
                c = _Comm(key=dev_key + (len(done) + len(open_comm),), host=host, pid=pid,
                          cuda_dev=dev, rank=rank if rank is not None else source.rank, line=lineno)
                open_comm[dev_key] = c
            if k == "ring":
                c.rings.append(" ".join(fl["order"]))
            elif k == "transport":
                c.transports.add(fl["via"])
            elif k == "comm_init":
                c.comm = fl["comm"]
                c.comm_id = fl["comm_id"] or c.comm_id
                c.comm_rank, c.nranks = fl["comm_rank"], fl["nranks"]
                c.bus_id = fl["bus_id"] or c.bus_id
                if fl["phase"] == "COMPLETE":
                    c.complete = True
                    done.append(open_comm.pop(dev_key))
                    last_done[dev_key] = c
                if pid is not None:
                    prev = pid_rank.get(dev_key)
                    if prev is None or fl["nranks"] > prev[0]:
                        pid_rank[dev_key] = (fl["nranks"], fl["comm_rank"])
                    prev = pid_rank.get(hp)
                    if prev is None or fl["nranks"] > prev[0]:
                        pid_rank[hp] = (fl["nranks"], fl["comm_rank"])
            elif k == "comm_nodes":
                c.comm = c.comm or fl["comm"]
                c.nnodes = fl["nnodes"]
                c.comm_rank, c.nranks = fl["comm_rank"], fl["nranks"]
            elif k == "init_timing" and not attached:
                c.init_ms = fl["total_s"] * 1000.0
                c.timing = fl["parts"]
                c.comm_rank, c.nranks = fl["comm_rank"], fl["nranks"]
            elif k == "channels":
                c.channels = fl["channels"]
            elif k == "trees":
                c.trees = fl["trees"]
            elif k == "p2p_disabled":
                c.p2p_disabled.append(fl["gpus"])
        elif k == "version":
            proc.version = fl["version"]
        elif k == "env":
            proc.env[fl["name"]] = fl["value"]
        elif k == "network":
            proc.network = fl["network"]
        elif k == "plugin":
            if fl.get("plugin"):
                proc.plugin = fl["plugin"]
        elif k == "bootstrap":
            proc.bootstrap_if = fl["iface"]
        elif k == "net_socket":
            proc.socket_ifs = fl["ifaces"]
        elif k == "net_ib":
            proc.ib_devices = fl["devices"]
            proc.ib_link = fl.get("link", [])
        elif k == "gdr":
            proc.gdr.append(fl)
        if k == "trail":
            ev = last_warn.get((host, pid, tid))
            if ev is not None:
                ev["_trail"].append(f"{fl['at']} -> {fl['code']}")
                ev["_code"] = fl["code"]
                return
            k = "error"  # a return-code trail with no WARN before it is still an error
        if k in _EVENT_KINDS:
            if rank is _UNSET:
                rank = _prefix_rank(line)
            detail = dict(fl)
            if host:
                detail["host"] = host
            if pid is not None:
                detail["pid"] = pid
            if src:
                detail["src"] = src
            ev = {
                "rank": rank if rank is not None else source.rank, "kind": k, "ts": ts, "line": lineno,
                "level": level, "pg_name": fl.get("pg_name"), "seq": fl.get("seq"), "op": fl.get("op"),
                "numel_in": fl.get("numel_in"), "numel_out": fl.get("numel_out"),
                "timeout_ms": fl.get("timeout_ms"), "ran_ms": fl.get("ran_ms"), "text": text[:2000],
                "_detail": detail, "_trail": [], "_code": fl.get("code"), "_hp": hp,
                "_pg_rank": fl.get("pg_rank"),
            }
            events.append(ev)
            if level == "WARN":
                last_warn[(host, pid, tid)] = ev

    def apply_fact(fact: LineFact, line: str, lineno: int) -> None:
        apply(fact.kind, fact.fields, fact.level, fact.host, fact.pid, fact.tid, fact.cuda_dev, fact.src, fact.text,
              fact.ts, fact.rank, line, lineno)

    texts: dict[str, tuple[str, dict]] = {}  # INFO text -> (kind, fields) of _nccl_text (pure), for repeated texts
    heads: dict[str, tuple] = {}  # line up to "] NCCL INFO " -> (host, pid, tid, dev, (host, pid, dev)) of its match
    coll_head = _COLL_HEAD.match
    expect_last_error = False
    n_lines = n_facts = 0
    try:
        f = _gz.open_binary(path)
    except OSError as e:
        raise IngestError(f"{path}: cannot open NCCL log ({e.strerror or e}); check the path and permissions") from e
    with f:
        # One incremental decode per block gives what decoding each line would: a sequence cut at a block's end is
        # completed by the next block, and an invalid one is replaced the same way either side of a newline
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        rest = ""  # the block's last line, until the next block ends it
        while True:
            data = f.read(_BLOCK)
            chunk = decode(data, not data)
            if rest:
                chunk = rest + chunk
            if not chunk:
                if data:
                    continue  # a block that only began a multi-byte character
                break
            lines = chunk.split("\n")
            rest = lines.pop() if data else ""  # at the end of the file, a last line without a newline is a line
            if data and len(lines) > _JOIN_MAX + 1:
                # the block's last lines wait for the next block (a line wrapped there continues in it), from a line
                # that cannot continue another, so that no join crosses the cut
                k = len(lines) - 1
                while k > len(lines) - _JOIN_MAX - 1 and not _starts_record(lines[k]):
                    k -= 1
                rest = "\n".join(lines[k:] + [rest])
                del lines[k:]
            if not lines:
                continue
            has_cr = "\r" in chunk
            del chunk
            rejoin_wrapped(lines)
            lineno = n_lines
            n_lines += len(lines)
            for line in lines:
                lineno += 1
                if expect_last_error:
                    if line.strip():
                        expect_last_error = False
                        fact = classify_last_error(line)
                        if fact.text.endswith("Last error:"):
                            expect_last_error = True
                        n_facts += 1
                        apply_fact(fact, line, lineno)
                    continue
                i = line.find("] NCCL INFO ")
                if i >= 0:
                    # parse_line's first branch for INFO lines, taking only what the fact's kind needs: the launcher
                    # rank and the timestamp are looked up for events and new communicators, not for every line
                    if has_cr and line[-1:] == "\r":
                        line = line.rstrip("\r\n")
                    i += 12
                    head = line[:i]
                    hd = heads.get(head)
                    if hd is None:
                        m = _core(line)
                        # Where the first match ends at the first "] NCCL INFO ", every line with this head has that
                        # match (an earlier one would sit inside the head; a later one cannot start before it)
                        if m is not None and m.end("level") == i - 1:
                            host, pid, tid, dev = m.group("host", "pid", "tid", "dev")
                            pid = int(pid) if pid else None
                            hd = (host, pid, int(tid) if tid else None, int(dev), (host, pid, int(dev)))
                            if len(heads) >= _TEXT_CACHE_MAX:
                                heads.clear()
                            heads[head] = hd
                            # this line is a fact of that process: its entry comes first here, as parse_line's would
                            if hd[:2] not in procs:
                                procs[hd[:2]] = _Process()
                    if hd is not None:
                        text = line[i:]
                        if coll_head(text) is not None and "NCCL version" not in text:
                            k = "coll"
                        else:
                            kf = texts.get(text)
                            if kf is None:
                                kf = _nccl_text(text, "INFO")
                                if kf[0] not in _EVENT_KINDS:
                                    if len(texts) >= _TEXT_CACHE_MAX:
                                        texts.clear()
                                    texts[text] = kf
                            k = kf[0]
                        n_facts += 1
                        if text.endswith("Last error:"):
                            expect_last_error = True
                        if k == "coll" or k == "info":
                            continue
                        if k == "ring" or k == "transport":  # apply's work for the communicator being set up
                            c = open_comm.get(hd[4])
                            if c is not None:
                                if k == "ring":
                                    c.rings.append(" ".join(kf[1]["order"]))
                                else:
                                    c.transports.add(kf[1]["via"])
                                continue
                        host, pid, tid, dev, _ = hd
                        if k in _EVENT_KINDS:
                            apply(k, kf[1], "INFO", host, pid, tid, dev, None, text, _ts(line), _prefix_rank(line), line,
                                  lineno)
                        else:
                            apply(k, kf[1], "INFO", host, pid, tid, dev, None, text, None, _UNSET, line, lineno)
                        continue
                fact = parse_line(line)
                if fact is None:
                    if line.strip().endswith("Last error:"):
                        expect_last_error = True
                    continue
                if fact.text.endswith("Last error:"):
                    expect_last_error = True
                n_facts += 1
                apply_fact(fact, line, lineno)
    if n_facts == 0:
        raise IngestError(f"{path}: no NCCL or ProcessGroupNCCL lines in {n_lines} lines; "
                          "run with NCCL_DEBUG=INFO (and TORCH_CPP_LOG_LEVEL=INFO) to get them")
    done.extend(open_comm.values())

    def resolve_rank(r, hp, pg_rank=None, pg_name=None, dev=None):
        if r is not None:
            return r
        if (hp + (dev,)) in pid_rank and hp[1] is not None:
            return pid_rank[hp + (dev,)][1]
        if hp in pid_rank and hp[1] is not None:
            return pid_rank[hp][1]
        if pg_rank is not None and pg_name in (None, "0"):
            return pg_rank  # "[Rank N]" of the default group is the global rank
        return None

    ev_rows = []
    for ev in events:
        detail = ev.pop("_detail")
        if ev["_trail"]:
            detail["trail"] = ev["_trail"]
        if ev["_code"] is not None:
            detail["retcode"] = ev["_code"]
            if ev["kind"] == "warn":
                ev["kind"] = "error"  # a WARN followed by a nonzero return code trail is a failure
        ev["rank"] = resolve_rank(ev["rank"], ev.pop("_hp"), ev.pop("_pg_rank"), ev["pg_name"])
        for k in ("_trail", "_code"):
            ev.pop(k)
        try:
            ev["detail"] = orjson.dumps(detail, default=str).decode()
        except TypeError:  # an integer beyond 64 bits in the log line: the standard library writes it
            ev["detail"] = json.dumps(detail, default=str)
        ev_rows.append(ev)

    comm_rows = []
    for c in done:
        proc = procs.get((c.host, c.pid), _Process())
        rank = resolve_rank(c.rank, (c.host, c.pid), dev=c.cuda_dev)
        if rank is None and c.comm_rank is not None and c.nranks == max((x.nranks or 0) for x in done):
            rank = c.comm_rank
        detail = {
            "plugin": proc.plugin, "bootstrap_if": proc.bootstrap_if, "socket_ifs": proc.socket_ifs,
            "ib_devices": proc.ib_devices, "ib_link": proc.ib_link, "gdr": proc.gdr, "timing": c.timing,
            "p2p_disabled": c.p2p_disabled, "comm": c.comm, "complete": c.complete, "line": c.line,
        }
        comm_rows.append({
            "rank": rank, "comm_id": c.comm_id or c.comm, "comm_rank": c.comm_rank, "nranks": c.nranks,
            "nnodes": c.nnodes, "host": c.host, "pid": c.pid, "cuda_dev": c.cuda_dev, "bus_id": c.bus_id,
            "version": proc.version, "network": proc.network, "transports": orjson.dumps(sorted(c.transports)).decode(),
            "channels": c.channels, "trees": c.trees, "rings": orjson.dumps(c.rings).decode() if c.rings else None,
            "env": orjson.dumps(proc.env, option=orjson.OPT_SORT_KEYS).decode(), "init_ms": c.init_ms,
            "detail": orjson.dumps(detail).decode(),
        })
    # A process that printed its version/env but no communicator init (default subsystem mask) still gets one row,
    # so that version and env comparisons see it.
    seen = {(c.host, c.pid) for c in done}
    for hp, proc in procs.items():
        if hp in seen or hp == (None, None) or not (proc.version or proc.env or proc.network):
            continue
        detail = {"plugin": proc.plugin, "bootstrap_if": proc.bootstrap_if, "socket_ifs": proc.socket_ifs,
                  "ib_devices": proc.ib_devices, "ib_link": proc.ib_link, "gdr": proc.gdr, "process_only": True}
        comm_rows.append({
            "rank": resolve_rank(source.rank, hp), "host": hp[0], "pid": hp[1], "version": proc.version,
            "network": proc.network, "env": orjson.dumps(proc.env, option=orjson.OPT_SORT_KEYS).decode(),
            "transports": "[]", "detail": orjson.dumps(detail).decode(),
        })
    schema = SCHEMAS["nccl_comms"]
    comms_df = _frame({c: [r.get(c) for r in comm_rows] for c in schema}, schema)
    events_df = _events_frame(ev_rows)
    ranks = sorted({r for r in events_df["rank"].to_list() + comms_df["rank"].to_list() if r is not None})
    if source.rank is None and len(ranks) == 1:
        source.rank = ranks[0]
        source.rank_origin = source.rank_origin or "log content"
    source.ranks = ranks
    hosts = sorted({h for h, _ in procs if h})
    if len(hosts) == 1:
        source.host = hosts[0]
    return {"nccl_comms": comms_df, "nccl_events": events_df}
