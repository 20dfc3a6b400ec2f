"""TORCH_COMPILE_DEBUG output folders (run_<time>-pid_<pid>/ with torchdynamo/debug.log) -> compile_events.

debug.log carries neither rank nor compile ids, so both are inferred: the frame id is the order in which a
(function, file, line) first starts tracing ("Step 1: torchdynamo start tracing f file:line"), the attempt counts
how often that frame started again; such rows say detail.inferred_compile_id = true. The rank comes from the
folder name (RANK/rank_N) or from a TORCH_TRACE log beside it written by the same pid; else it stays unknown.
Per-graph folders torchinductor/model__N_{forward,backward,inference}_X.Y appear only on FX graph cache misses:
each is a cache_miss row, and its fx_graph_readable.py gives the graph's ops (graph_op rows, op order).
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError, _gz
from traceql.ingest._compile_common import graph_break, parse_graph_ops
from traceql.ingest.sniff import compile_debug as sniff  # noqa: F401  (discovery's test, kept in one place)

KIND = "compile_debug"
SUPPORTED = True
FOLDER = True  # discovery hands this module directories, and does not descend into ones it takes

_START = re.compile(r"^Step 1: torchdynamo start tracing (\S+) (.+):(\d+)\s*$")
_PID = re.compile(r"-pid_(\d+)")
_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.I)
_MODEL_DIR = re.compile(r"^model__(\d+)_(forward|backward|inference)_(\d+)\.(\d+)$")
_LIMIT = re.compile(r"torch\._dynamo hit config\.(\w+) \((\d+)\)")


def _rank_from_sibling_trace(folder: Path, pid: int) -> int | None:
    """The rank of the TORCH_TRACE log (within three levels up) whose glog lines carry this pid."""
    pat = re.compile(rb"^[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +(\d+) ")
    for up in list(folder.parents)[:3]:
        for log in sorted(up.rglob("dedicated_log_torch_trace_rank_*.log*"))[:256]:
            m = re.search(r"rank_(\d+)", log.name)
            if not m:
                continue
            try:
                with _gz.open_binary(log) as f:
                    first = f.readline(4096)
            except (OSError, EOFError):
                continue
            pm = pat.match(first)
            if pm and int(pm.group(1)) == pid:
                return int(m.group(1))
    return None


def _blocks(text: str) -> list[str]:
    """Split debug.log into messages: a new one starts at every unindented line."""
    blocks, cur = [], []
    for ln in text.split("\n"):
        if ln and not ln[0].isspace() and cur and not ln.startswith(("Graph Break Reason", "User code traceback",
                                                                       "Unsupported", "Failed", "Attempted", "Call to",
                                                                       "Traceback", "Encountered")):
            blocks.append("\n".join(cur))
            cur = []
        cur.append(ln)
    if cur:
        blocks.append("\n".join(cur))
    return blocks


def read(path: Path, source) -> dict[str, pl.DataFrame]:
    log = path / "torchdynamo" / "debug.log"
    inductor = path / "torchinductor"
    if not log.is_file() and not inductor.is_dir():
        raise IngestError(f"{path.name}: TORCH_COMPILE_DEBUG folder without torchdynamo/debug.log or torchinductor/; "
                          "was the run stopped before compiling?")
    rank, origin = None, ""
    m = _RANK.search(path.name)
    if m:
        rank, origin = int(m.group(1)), "folder name"
    else:
        pm = _PID.search(path.name)
        if pm:
            rank = _rank_from_sibling_trace(path, int(pm.group(1)))
            origin = "TORCH_TRACE log of the same pid" if rank is not None else ""
    if rank is None and source.rank is not None:
        rank, origin = source.rank, source.rank_origin
    source.rank = rank
    source.ranks = [rank] if rank is not None else []
    source.rank_origin = origin or "unknown (debug.log names no rank)"

    rows: list[dict] = []
    frames: dict[tuple, int] = {}
    starts: dict[int, int] = {}
    cur_cid, cur_fn = None, None
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    last_warning = None
    for block in _blocks(text):
        first = block.split("\n", 1)[0]
        if first.startswith("Graph break from "):
            last_warning = first.rstrip(", consider setting:").strip()
        sm = _START.match(first)
        if sm:
            key = (sm.group(1), sm.group(2), int(sm.group(3)))
            f_id = frames.setdefault(key, len(frames))
            c = starts.get(f_id, -1) + 1
            starts[f_id] = c
            cur_cid, cur_fn = f"{f_id}/{c}", key
            rows.append({"kind": "compile", "compile_id": cur_cid, "frame_id": f_id, "attempt": c, "function": key[0],
                         "filename": key[1], "line": key[2], "detail": {"inferred_compile_id": True}})
        elif first.startswith("Graph break in user code at"):
            gb = graph_break(block)
            rows.append({"kind": "graph_break", "compile_id": cur_cid, **_frame(cur_cid, cur_fn), "reason": gb["reason"],
                         "user_frame": gb["user_frame"], "detail": {**gb["detail"], "inferred_compile_id": True}})
        elif first.startswith("Graph break: from user code at:"):  # debug-level wording; no reason headline
            fm = re.search(r'File "([^"]+)", line (\d+)', block)
            rows.append({"kind": "graph_break", "compile_id": cur_cid, **_frame(cur_cid, cur_fn),
                         "reason": last_warning, "user_frame": f"{fm.group(1)}:{fm.group(2)}" if fm else None,
                         "detail": {"from": "user code at", "inferred_compile_id": True}})
        elif (lm := _LIMIT.search(first)) is not None:
            rows.append({"kind": "cache_limit", "compile_id": cur_cid, **_frame(cur_cid, cur_fn), "reason": first,
                         "detail": {"limit": int(lm.group(2)), "inferred_compile_id": True}})
    if any(r["kind"] == "graph_break" and r["detail"].get("from") is None for r in rows):  # the full reports win
        rows = [r for r in rows if not (r["kind"] == "graph_break" and r["detail"].get("from"))]
    # a restart re-traces the same frame ("Step 1" again) without a new compile: the graph-break restart is
    # therefore counted as a second attempt here; say so rather than guess
    if inductor.is_dir():
        for d in sorted(inductor.iterdir(), key=lambda p: p.name):
            mm = _MODEL_DIR.match(d.name)
            if not mm or not d.is_dir():
                continue
            graph = f"{mm.group(2)}_{mm.group(3)}"
            rows.append({"kind": "cache_miss", "detail": {"graph": graph, "folder": d.name, "cache": "fx_graph"}})
            readable = d / "fx_graph_readable.py"
            if readable.is_file():
                ops = parse_graph_ops(readable.read_text(encoding="utf-8", errors="replace"))
                for i, o in enumerate(ops):
                    rows.append({"kind": "graph_op", "op": o["op"], "op_index": i,
                                 "detail": {"graph": "aot", "graph_name": graph, "out": o["out"], "in": o["in"]}})
    if not rows:
        raise IngestError(f"{path.name}: TORCH_COMPILE_DEBUG folder holds no compile, graph break or graph; "
                          "nothing to analyse")
    for r in rows:
        r["rank"] = rank
        r["detail"] = orjson.dumps(r["detail"]).decode()
    return {"compile_events": pl.DataFrame(rows, schema={
        "rank": pl.Int32, "compile_id": pl.Utf8, "frame_id": pl.Int64, "attempt": pl.Int64, "kind": pl.Utf8,
        "function": pl.Utf8, "filename": pl.Utf8, "line": pl.Int64, "reason": pl.Utf8, "user_frame": pl.Utf8,
        "op": pl.Utf8, "op_index": pl.Int64, "detail": pl.Utf8})}


def _frame(cid, fn) -> dict:
    if cid is None or fn is None:
        return {}
    f_id, c = (int(x) for x in cid.split("/"))
    return {"frame_id": f_id, "attempt": c, "function": fn[0], "filename": fn[1], "line": fn[2]}
