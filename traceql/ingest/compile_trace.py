"""TORCH_TRACE structured logs (dedicated_log_torch_trace_rank_N_*.log, plain or gzip) -> compile_events.

A record is one glog-prefixed line whose tail is a JSON object (`V1129 09:20:23.443000 14423 path.py:12] {...}`),
followed by its payload: zero or more lines that each start with a tab. The JSON names the record kind by its
single non-envelope key (dynamo_start, compilation_metrics, artifact, ...); the envelope carries rank,
frame_id, frame_compile_id, attempt (restart attempt) and compiled_autograd_id. `str` records intern file names
that stack frames refer to by number.

What becomes a row (kind): compile (compilation_metrics, bwd_compilation_metrics), graph_break
(dynamo_graph_break_reason), recompile (recompile_reasons), cache_hit / cache_miss / cache_bypass (FX graph and
AOTAutograd cache artifacts), cache_limit (a frame given up on after the recompile limit), graph_op (ops of the
dynamo output graph and the inductor post-grad graphs, in order), ddp_split (DDPOptimizer submodules), and
unknown (record kinds this importer does not know, counted in source.meta["unknown_kinds"]).

compile_id is torch's own string ("F/C", "!A/F/C"); frame_id is F and attempt is C (the frame's compile count).
The restart attempt (the `_1` of tlparse's [0/0_1]) is kept in detail.restart.
"""

from __future__ import annotations

import calendar
import re
import zlib
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError, _gz
from traceql.ingest._compile_common import MAX_VALUE as _MAX_VALUE
from traceql.ingest._compile_common import failure as _failure
from traceql.ingest._compile_common import graph_inputs as _graph_inputs
from traceql.ingest._compile_common import graph_break as _graph_break
from traceql.ingest._compile_common import guard_text as _guard_text
from traceql.ingest._compile_common import is_cache_limit as _is_cache_limit
from traceql.ingest._compile_common import json_or_lines as _json_or_lines
from traceql.ingest._compile_common import parse_graph_ops
from traceql.ingest.sniff import torch_trace as sniff  # noqa: F401  (discovery's test, kept in one place)

KIND = "torch_trace"
SUPPORTED = True

# glog prefix then a JSON object: `V1129 09:20:23.443000 14423 torch/_dynamo/...py:123] {"dynamo_start": ...`
_HEAD = re.compile(r"^(?:\[rank\d+\]:)?([VIWEC])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+) +(\d+) ([^\]]*)\] (\{.*)$")
_RANK_IN_NAME = re.compile(r"rank_(\d+)")
# a printed FX node's origin in user code (`# File: /x/train.py:20 in forward, code: ...`), torch's own files excluded
_USER_NODE = re.compile(r"# File: ((?:(?!/torch/)[^:\n])+):(\d+) in (\w+)")

_ENVELOPE = {"rank", "frame_id", "frame_compile_id", "attempt", "compiled_autograd_id", "has_payload", "stack"}
# Record kinds we read or knowingly skip; anything else is counted as unknown.
_KNOWN = {
    "str", "dynamo_start", "compilation_metrics", "bwd_compilation_metrics", "artifact", "dynamo_output_graph",
    "optimize_ddp_split_graph", "optimize_ddp_split_child", "inductor_post_grad_graph", "chromium_event",
    "describe_storage", "describe_tensor", "describe_source", "dynamo_cpp_guards_str", "dynamo_guards",
    "aot_forward_graph", "aot_backward_graph", "aot_inference_graph", "aot_joint_graph", "inductor_pre_grad_graph",
    "inductor_output_code", "compiled_autograd_graph", "graph_dump", "link", "symbolic_shape_specialization",
    "propagate_real_tensors_provenance", "guard_added", "guard_added_fast", "create_unbacked_symbol",
    "create_symbol", "expression_created", "missing_fake_kernel", "mismatched_fake_kernel", "memoizer_artifacts",
    "dump_file", "exported_program", "aot_autograd_backward_compilation_metrics",
}
_CACHE_ARTIFACTS = {
    "fx_graph_cache_hit": ("cache_hit", "fx_graph"),
    "fx_graph_cache_miss": ("cache_miss", "fx_graph"),
    "fx_graph_cache_bypass": ("cache_bypass", "fx_graph"),
    "aotautograd_cache_hit": ("cache_hit", "aotautograd"),
    "aotautograd_cache_miss": ("cache_miss", "aotautograd"),
    "aotautograd_cache_bypass": ("cache_bypass", "aotautograd"),
}
# Kinds whose payload we need; every other payload is skipped without being kept in memory.
_NEED_PAYLOAD_ARTIFACTS = {"dynamo_graph_break_reason", "recompile_reasons", "inductor_post_grad_graph",
                           "fx_graph_cache_hash", *_CACHE_ARTIFACTS}
_NEED_PAYLOAD_KINDS = {"dynamo_output_graph", "inductor_post_grad_graph", "optimize_ddp_split_child"}

_COMPONENT = re.compile(r"^\[(\w+)\] ([^:]+?): ?(.*)$", re.S)
# The gap is bounded: unbounded, it is rescanned from every mention of the limit, quadratic on a long reason (issue 16).
_LIMIT = re.compile(r"(?:recompile_limit|cache_size_limit|cache size limit)[^\n]{0,200}?(?:currently set to |\()(\d++)")


def _open_text(path: Path):
    return _gz.open_text(path, encoding="utf-8", errors="replace", newline="\n")


def compile_id_of(env: dict) -> str | None:
    """torch's CompileId string from a record's envelope (keep in step with torch._guards.CompileId.__str__)."""
    ca = env.get("compiled_autograd_id")
    f, c = env.get("frame_id"), env.get("frame_compile_id")
    if not all(v is None or type(v) in (int, str) for v in (ca, f, c)):  # a damaged record: no compile id
        return None
    if ca is not None:
        return f"!{ca}/{f}/{c}" if f is not None and c is not None else f"!{ca}"
    if f is None or c is None:
        return None
    return f"{f}/{c}"


def parse_compile_id(cid: str | None) -> tuple[int | None, int | None]:
    """(frame_id, frame_compile_id) of "F/C" or "!A/F/C"; None where absent."""
    if not cid:
        return None, None
    parts = cid.lstrip("!").split("/")
    if cid.startswith("!"):
        parts = parts[1:]
    try:
        return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else (None, None)
    except ValueError:
        return None, None


def _dumps(obj) -> str:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()


def parse_components(items) -> dict:
    """Cache-key components `[hash] name: value` -> {name: {"hash": h, "value": short value}}."""
    out = {}
    for item in items or []:
        if not isinstance(item, str):
            continue
        m = _COMPONENT.match(item)
        if not m:
            continue
        h, name, value = m.group(1), m.group(2).strip(), m.group(3)
        if name == "gm":  # the whole graph's source: its hash says enough
            value = value.split("\n", 1)[0][:_MAX_VALUE]
        elif "\ufffd" in value or any(ord(ch) < 32 and ch not in "\n\t" for ch in value):
            value = "<binary>"
        else:
            value = value[:_MAX_VALUE]
        if name in out:  # repeated names (rare): keep them apart
            k = 2
            while f"{name}#{k}" in out:
                k += 1
            name = f"{name}#{k}"
        out[name] = {"hash": h, "value": value}
    return out


# --- reading --------------------------------------------------------------------------------------------------


# Records whose body read() takes apart as an object, and the types of the metrics it reads (anything else is dropped:
# a damaged or hand-edited record must cost its odd values, not the log).
_OBJECT_KINDS = ("dynamo_start", "compilation_metrics", "bwd_compilation_metrics", "artifact", "optimize_ddp_split_child")
_METRIC_TEXT = ("compile_id", "co_name", "co_filename", "fail_type", "fail_reason", "recompile_reason")


def _fit_record(env: dict, kind) -> None:
    if kind not in _OBJECT_KINDS:
        return
    if not isinstance(env.get(kind), dict):
        env[kind] = {}
    if kind in ("compilation_metrics", "bwd_compilation_metrics"):
        m = env[kind]
        for k, v in list(m.items()):
            if k in _METRIC_TEXT:
                ok = isinstance(v, str)
            elif k == "restart_reasons":
                ok = isinstance(v, list)
            elif k.endswith(("_s", "_us", "_count", "_time", "_size", "lineno", "graph_breaks")) or k == "start_time":
                ok = type(v) in (int, float) and v == v and abs(v) < 1e15
            else:
                continue
            if not ok:
                del m[k]
    if kind == "dynamo_start" and not isinstance(env[kind].get("stack", []), list):
        env[kind]["stack"] = []
    if not isinstance(env.get("stack", []), list):
        env["stack"] = []


def _records(path: Path, stats: dict):
    """Yield (glog fields, envelope dict, payload lines or None). Payloads are kept only for kinds we need."""
    cur = None
    keep = False
    payload: list[str] = []
    lineno = 0
    f = _open_text(path)
    try:
        try:
            for raw in f:
                lineno += 1
                if raw.startswith("\t"):
                    if cur is not None and keep:
                        payload.append(raw[1:])
                    continue
                if cur is not None:
                    yield cur[0], cur[1], (payload if keep else None)
                    cur, payload, keep = None, [], False
                line = raw.rstrip("\n")
                if not line.strip():
                    continue
                m = _HEAD.match(line)
                if not m:
                    stats["bad_lines"] += 1
                    continue
                if not raw.endswith("\n"):
                    stats["truncated"] = True  # the last line was cut mid-write
                try:
                    env = orjson.loads(m.group(10))
                except orjson.JSONDecodeError:
                    stats["bad_lines"] += 1
                    if not raw.endswith("\n"):
                        stats["truncated"] = True
                    continue
                if not isinstance(env, dict):
                    stats["bad_lines"] += 1
                    continue
                kind = next((k for k in env if k not in _ENVELOPE), None)
                _fit_record(env, kind)
                env["_kind"] = kind
                env["_line"] = lineno
                glog = m.groups()[1:7]
                if kind == "artifact":
                    art = env.get("artifact")
                    name = art.get("name", "") if isinstance(art, dict) else ""
                    keep = isinstance(name, str) and name in _NEED_PAYLOAD_ARTIFACTS
                else:
                    keep = kind in _NEED_PAYLOAD_KINDS or (kind == "chromium_event" and stats["clock"] is None)
                cur = (glog, env)
        except (EOFError, zlib.error, OSError) as e:  # truncated gzip stream: keep what decompressed
            stats["truncated"] = True
            stats["error"] = str(e)
        if cur is not None:
            if keep and payload and stats.get("truncated") and cur[1].get("has_payload"):
                # a payload cut short by truncation: the record is incomplete, drop it
                stats["dropped_incomplete"] += 1
            else:
                yield cur[0], cur[1], (payload if keep else None)
    finally:
        f.close()


def _glog_ns(glog, year: int) -> int:
    mon, day, hh, mm, ss, frac = glog
    secs = calendar.timegm((year, int(mon), int(day), int(hh), int(mm), int(ss), 0, 0, 0))
    frac_ns = int((frac + "000000000")[:9])
    return secs * 1_000_000_000 + frac_ns


def read(path: Path, source) -> dict[str, pl.DataFrame]:
    stats = {"bad_lines": 0, "truncated": False, "dropped_incomplete": 0, "clock": None, "error": None}
    strings: dict[int, str] = {}
    frames: dict[str, tuple[str | None, str | None, int | None]] = {}  # compile_id -> (function, file, line)
    starts: list[tuple[dict, tuple, str | None]] = []  # (base row, frame, caller's function) per dynamo_start
    graph_fn: dict[str | None, tuple] = {}  # compile_id -> the user frame of its dynamo graph's first user-code node
    has_metrics = False
    rows: list[dict] = []
    unknown: dict[str, int] = {}
    ranks_seen: set[int] = set()
    graph_no: dict[tuple[str | None, str], int] = {}
    cache_seq: dict[str | None, int] = {}
    n_records = 0
    first_glog = None
    year = None

    for glog, env, payload in _records(path, stats):
        n_records += 1
        kind = env["_kind"]
        if first_glog is None:
            first_glog = glog
        r = env.get("rank")
        if not (type(r) is int and 0 <= r < 1 << 31):  # a rank no rank column can hold: unknown
            r = None
        if isinstance(r, int):
            ranks_seen.add(r)
        cid = compile_id_of(env)
        base = {"rank": r, "compile_id": cid, "frame_id": env.get("frame_id"), "attempt": env.get("frame_compile_id"),
                "_glog": glog, "_restart": env.get("attempt")}

        if kind == "str":
            v = env.get("str")
            if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int):
                strings[v[1]] = str(v[0])
        elif kind == "chromium_event":
            if stats["clock"] is None and payload:
                try:
                    ev = orjson.loads("".join(payload))
                    if isinstance(ev.get("ts"), (int, float)):
                        stats["clock"] = (glog, int(ev["ts"] * 1000))
                except orjson.JSONDecodeError:
                    pass
        elif kind == "dynamo_start":
            stack = (env.get("dynamo_start") or {}).get("stack") or env.get("stack") or []
            if stack and isinstance(stack[-1], dict):
                fr = stack[-1]
                fn = fr.get("filename")
                frames[cid] = (fr.get("name"), strings.get(fn, str(fn)) if isinstance(fn, int) else fn, fr.get("line"))
                caller = stack[-2].get("name") if len(stack) > 1 and isinstance(stack[-2], dict) else None
                starts.append((base, frames[cid], caller))
        elif kind in ("compilation_metrics", "bwd_compilation_metrics"):
            has_metrics = True
            m = env.get(kind) or {}
            cid = cid or m.get("compile_id")
            f_id, c_id = parse_compile_id(cid)
            backward = kind == "bwd_compilation_metrics"
            if backward:
                dur_s = m.get("inductor_compile_time_s")
            else:
                dur_s = m.get("entire_frame_compile_time_s")
            dur_us = m.get("duration_us") if not backward else None
            ts_us = m.get("start_time_us") or (int(m["start_time"] * 1e6) if isinstance(m.get("start_time"), (int, float)) else None)
            detail = {
                "phase": "backward" if backward else "forward",
                "dynamo_s": None if backward else m.get("entire_frame_compile_time_s"),
                "backend_s": m.get("backend_compile_time_s"),
                "inductor_s": m.get("inductor_compile_time_s"),
                "code_gen_s": m.get("code_gen_time_s"),
                "cache_size": m.get("cache_size"),
                "accumulated_cache_size": m.get("accumulated_cache_size"),
                "graph_op_count": m.get("graph_op_count"),
                "guard_count": m.get("guard_count"),
                "fail_type": m.get("fail_type"),
                "num_graph_breaks_cumulative": m.get("num_graph_breaks"),  # per process, cumulative: not per frame
                "restart_reasons": len(m.get("restart_reasons") or []),
                "fx_cache_hits": m.get("inductor_fx_local_cache_hit_count"),
                "fx_cache_misses": m.get("inductor_fx_local_cache_miss_count"),
                "restart": env.get("attempt"),
            }
            fail_reason = m.get("fail_reason") or None
            row = {**base, "compile_id": cid, "frame_id": f_id, "attempt": c_id, "kind": "compile",
                   "ts": ts_us * 1000 if ts_us else None,
                   "dur": int(dur_us * 1000) if dur_us is not None else (int(dur_s * 1e9) if dur_s is not None else None),
                   "function": m.get("co_name"), "filename": m.get("co_filename"), "line": m.get("co_firstlineno"),
                   "reason": (fail_reason or "").split("\n", 1)[0] or None,
                   "detail": {k: v for k, v in detail.items() if v is not None}}
            rows.append(row)
            if fail_reason and _is_cache_limit(fail_reason):
                lm = _LIMIT.search(fail_reason)
                guard = _guard_text(m.get("recompile_reason"))
                rows.append({**row, "kind": "cache_limit", "dur": None, "guard": guard,
                             "reason": fail_reason.split("\n", 1)[0],
                             "detail": {"limit": int(lm.group(1)) if lm else None, "recompile_reason": m.get("recompile_reason")}})
            fail = None if backward else _failure(m.get("fail_type"), fail_reason)
            if fail is not None:
                # a frame whose compile failed: with suppress_errors it runs eager, without it the error reached the
                # caller (BackendCompilerFailed, InternalTorchDynamoError)
                fail["suppress_errors"] = m.get("config_suppress_errors")
                if m.get("fail_user_frame_filename"):
                    fail["user_frame"] = f"{m['fail_user_frame_filename']}:{m.get('fail_user_frame_lineno')}"
                rows.append({**row, "kind": "compile_failure", "dur": None, "user_frame": fail.get("user_frame"),
                             "reason": fail["fail_reason"], "op": fail["fail_type"],
                             "detail": {k: v for k, v in fail.items() if v is not None}})
            if not backward and m.get("recompile_reason") and cid is not None:
                row["_recompile_reason"] = m.get("recompile_reason")
            if not backward and m.get("restart_reasons"):
                row["_restart_reasons"] = m.get("restart_reasons")
        elif kind == "artifact":
            a = env.get("artifact") if isinstance(env.get("artifact"), dict) else {}
            name = a.get("name", "") if isinstance(a.get("name", ""), str) else ""
            text = "".join(payload or [])
            if name == "dynamo_graph_break_reason":
                rows.append({**base, "kind": "graph_break", **_graph_break(text)})
            elif name == "recompile_reasons":
                reasons = _json_or_lines(text)
                rows.append({**base, "kind": "recompile", "reason": "\n".join(reasons) or None,
                             "guard": _guard_text(reasons[0] if reasons else None),
                             "detail": {"failed_guards": reasons[:16], "n_failed": len(reasons)}})
            elif name in _CACHE_ARTIFACTS or name == "fx_graph_cache_hash":
                try:
                    info = orjson.loads(text) if text.strip() else {}
                except orjson.JSONDecodeError:
                    info = {}
                if not isinstance(info, dict):
                    info = {}
                if name == "fx_graph_cache_hash":  # torch 2.5: one artifact, its cache_state says hit or miss
                    name = f"fx_graph_cache_{info.get('cache_state') or 'miss'}"
                    if name not in _CACHE_ARTIFACTS:
                        name = "fx_graph_cache_bypass"
                k, cache = _CACHE_ARTIFACTS[name]
                comps = parse_components(info.get("components"))
                seq = None
                if cache == "fx_graph":
                    seq = cache_seq.get(cid, 0)
                    cache_seq[cid] = seq + 1
                det = {"cache": cache, "status": info.get("cache_status_detailed") or info.get("cache_state"), "seq": seq}
                if info.get("cache_bypass_reason"):
                    det["bypass_reason"] = str(info["cache_bypass_reason"])[:_MAX_VALUE]
                rows.append({**base, "kind": k, "cache_key": info.get("key"),
                             "components": comps or None, "reason": det.get("bypass_reason"), "detail": det})
            elif name == "inductor_post_grad_graph":
                rows.extend(_graph_rows(base, text, "post_grad", graph_no))
        elif kind == "inductor_post_grad_graph":
            rows.extend(_graph_rows(base, "".join(payload or []), "post_grad", graph_no))
        elif kind == "dynamo_output_graph":
            text = "".join(payload or [])
            rows.extend(_graph_rows(base, text, "dynamo", graph_no))
            um = _USER_NODE.search(text)
            if um and cid not in graph_fn:
                graph_fn[cid] = (um.group(3), um.group(1), int(um.group(2)))
            inputs = _graph_inputs(text, (env.get(kind) or {}).get("sizes"))
            if inputs:  # the graph's input shapes and dtypes, compared across ranks (TQL409)
                rows.append({**base, "kind": "graph_inputs", "reason": "; ".join(inputs)[:4 * _MAX_VALUE],
                             "detail": {"n_inputs": len(inputs)}})
        elif kind == "optimize_ddp_split_child":
            name = (env.get(kind) or {}).get("name")
            n_ops = len(parse_graph_ops("".join(payload or [])))
            rows.append({**base, "kind": "ddp_split", "op": name, "detail": {"ops": n_ops}})
        elif kind not in _KNOWN:
            key = str(kind)
            unknown[key] = unknown.get(key, 0) + 1
            rows.append({**base, "kind": "unknown", "detail": {"record": key, "line": env.get("_line")}})

    if n_records == 0:
        if stats["bad_lines"]:
            raise IngestError(f"{path.name}: no TORCH_TRACE record could be parsed ({stats['bad_lines']} malformed lines); "
                              "is it a TORCH_TRACE log written by torch >= 2.2?")
        raise IngestError(f"{path.name}: TORCH_TRACE log holds no records; re-run with TORCH_TRACE set and let the job compile")

    if not has_metrics and any(_torch_internal(fr) for _, fr, _ in starts):
        # torch < 2.4 (no compilation_metrics in TORCH_TRACE, and stacks that end inside torch, at eval_frame's _fn):
        # dynamo_start's stack ends at the *caller* of the compiled frame, which is not on it; the frame is named by
        # its graph's first user-code node where it has one
        starts = [(b, graph_fn.get(b["compile_id"], (None, None, None)), fr[0]) for b, fr, _ in starts]
        for i in range(1, len(starts)):
            # a resume function calling the next compiled frame was itself compiled just before it (a resume frame
            # that breaks at once has no graph to name it by)
            b, fr, caller = starts[i - 1]
            rm = _RESUME.match(starts[i][2] or "")
            if fr[0] is None and rm:
                starts[i - 1] = (b, (starts[i][2], starts[i][1][1], int(rm.group(2))), caller)
        for b, fr, _ in starts:
            frames[b["compile_id"]] = fr
    _fallbacks(rows, starts)

    # rank: the records' own, else the file name (torch writes rank_N into it), else the source's, else 0
    rank = None
    origin = ""
    if len(ranks_seen) == 1:
        rank, origin = next(iter(ranks_seen)), "TORCH_TRACE records"
        m = _RANK_IN_NAME.search(path.name)
        if m and int(m.group(1)) != rank:  # a launcher that set RANK unlike the process group, or a renamed file
            note = f"its records say rank {rank}, its file name rank {m.group(1)}: the records are trusted"
            source.detail = f"{source.detail}; {note}" if source.detail else note
    elif not ranks_seen:
        m = _RANK_IN_NAME.search(path.name)
        if m:
            rank, origin = int(m.group(1)), "file name"
        elif getattr(source, "rank", None) is not None:
            rank, origin = source.rank, source.rank_origin or "file name"
        else:
            rank, origin = 0, "assumed"  # a single process's log names no rank; link.ranks checks no other claims 0
    if rank is not None:
        source.rank = rank
        source.ranks = [rank]
    else:
        source.ranks = sorted(ranks_seen)
    source.rank_origin = origin or "TORCH_TRACE records"

    # clock: glog prefixes carry local wall time without a year; anchor them on the first chromium event (epoch)
    offset = None
    if stats["clock"] is not None:
        g, epoch_ns = stats["clock"]
        import datetime as _dt

        year = _dt.datetime.fromtimestamp(epoch_ns / 1e9, tz=_dt.timezone.utc).year
        naive = _glog_ns(g, year)
        quarter = 900 * 1_000_000_000  # time zones are whole quarter hours
        offset = round((epoch_ns - naive) / quarter) * quarter

    frame_by_id = {}
    for cid_, fr_ in frames.items():
        f_, _ = parse_compile_id(cid_)
        if cid_ is not None and f_ is not None:
            frame_by_id.setdefault((cid_.startswith("!"), f_), fr_)
    out = []
    for row in rows:
        glog = row.pop("_glog", None)
        restart = row.pop("_restart", None)
        row.pop("_recompile_reason", None)
        row.pop("_restart_reasons", None)
        if row.get("rank") is None:
            row["rank"] = rank
        if row.get("ts") is None and glog is not None and offset is not None:
            row["ts"] = _glog_ns(glog, year) + offset
        if row.get("compile_id") is not None and not isinstance(row["compile_id"], str):  # a damaged record's value
            row["compile_id"] = str(row["compile_id"])
        fr = frames.get(row.get("compile_id"))
        if fr is None and type(row.get("frame_id")) is int:  # e.g. the attempt that hit the recompile limit
            fr = frame_by_id.get(((row.get("compile_id") or "").startswith("!"), row["frame_id"]))
        if fr is not None:
            if row.get("function") is None:
                row["function"] = fr[0]
            if row.get("filename") is None:
                row["filename"] = fr[1]
            if row.get("line") is None:
                row["line"] = fr[2]
        det = row.get("detail") or {}
        if restart and "restart" not in det:
            det["restart"] = restart
        row["detail"] = _dumps(det) if det else None
        if isinstance(row.get("components"), dict):
            row["components"] = _dumps(row["components"])
        out.append(row)

    source.meta["records"] = n_records
    if unknown:
        source.meta["unknown_kinds"] = unknown
    notes = []
    if stats["truncated"] or stats["dropped_incomplete"]:
        source.status = "partial"
        notes.append("log ends mid-record (truncated); complete records were kept")
    if stats["bad_lines"]:
        notes.append(f"{stats['bad_lines']} malformed line(s) skipped")
        if source.status == "ok":
            source.status = "partial"
    if unknown:
        notes.append(f"{sum(unknown.values())} record(s) of unknown kind(s) {sorted(unknown)} kept as kind unknown")
    if notes:
        source.detail = "; ".join(notes)
    if not out:
        return {}
    # every value made to fit its column first: polars takes minutes over a deeply nested one before it refuses it
    return {"compile_events": pl.DataFrame(_fit(out), schema=_ROW_SCHEMA)}


def _fit(rows: list[dict]) -> list[dict]:
    """Rows whose values fit their columns: text columns take other values as JSON text, integer columns take only
    int64 integers (anything else is null)."""
    out = []
    for r in rows:
        r = dict(r)
        for c, t in _ROW_SCHEMA.items():
            v = r.get(c)
            if v is None:
                continue
            if t == pl.Utf8 and not isinstance(v, str):
                try:
                    r[c] = _dumps(v)
                except TypeError:  # an integer beyond 64 bits, or nesting deeper than orjson writes
                    try:
                        r[c] = str(v)
                    except RecursionError:
                        r[c] = None
            elif t != pl.Utf8 and not (type(v) is int and -(1 << 31 if t == pl.Int32 else 1 << 63) <= v
                                       < (1 << 31 if t == pl.Int32 else 1 << 63)):
                r[c] = None
        out.append(r)
    return out


_ROW_SCHEMA = {
    "rank": pl.Int32, "compile_id": pl.Utf8, "frame_id": pl.Int64, "attempt": pl.Int64, "kind": pl.Utf8,
    "ts": pl.Int64, "dur": pl.Int64, "function": pl.Utf8, "filename": pl.Utf8, "line": pl.Int64, "reason": pl.Utf8,
    "guard": pl.Utf8, "user_frame": pl.Utf8, "cache_key": pl.Utf8, "components": pl.Utf8, "op": pl.Utf8,
    "op_index": pl.Int64, "detail": pl.Utf8,
}


def _graph_rows(base: dict, text: str, graph: str, graph_no: dict) -> list[dict]:
    key = (base.get("compile_id"), graph)
    n = graph_no.get(key, 0)
    graph_no[key] = n + 1
    return [{**base, "kind": "graph_op", "op": o["op"], "op_index": i,
             "detail": {"graph": graph, "graph_no": n, "out": o["out"], "in": o["in"]}}
            for i, o in enumerate(parse_graph_ops(text))]


_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_(\d+)$")
_WRAPPERS = {"_fn", "_call_impl", "_wrapped_call_impl", "compile_wrapper", "__call__"}


def _torch_internal(fr: tuple) -> bool:
    """Whether a stack frame (function, file, line) is torch's own code, not the user's."""
    return fr[0] in _WRAPPERS or "/torch/" in str(fr[1] or "")


def _fallbacks(rows: list[dict], starts: list[tuple[dict, tuple, str | None]]) -> None:
    """Facts older torch logs do not write directly, inferred from what they do write (detail.from says from what):
    - compiles: torch < 2.4 writes no compilation_metrics to TORCH_TRACE: each dynamo_start is one compile;
    - recompiles: without a recompile_reasons artifact, compilation_metrics.recompile_reason; without that either,
      each compile of a frame after its first (frame_compile_id > 0) is a recompile whose reason the log lacks;
    - graph breaks: without a dynamo_graph_break_reason artifact, each of compilation_metrics.restart_reasons (dynamo
      restarts an attempt at a graph break); without those either, each resume frame
      torch_dynamo_resume_in_<fn>_at_<line> (dynamo compiles one per graph break) is a break in <fn> at that line."""
    have_compile = {r["compile_id"] for r in rows if r["kind"] == "compile"}
    extra = []
    for base, fr, _ in starts:
        if base["compile_id"] is not None and base["compile_id"] not in have_compile:
            have_compile.add(base["compile_id"])
            extra.append({**base, "kind": "compile", "function": fr[0], "filename": fr[1], "line": fr[2],
                          "detail": {"from": "dynamo_start"}})
    rows.extend(extra)
    have_recompile = {r["compile_id"] for r in rows if r["kind"] == "recompile"}
    have_break = {r["compile_id"] for r in rows if r["kind"] == "graph_break"}
    extra = []
    for r in rows:
        if r["kind"] != "compile" or (r.get("detail") or {}).get("phase") == "backward":
            continue
        rr = r.get("_recompile_reason")
        if r["compile_id"] not in have_recompile:
            if rr:
                extra.append({**r, "kind": "recompile", "dur": None, "reason": rr, "guard": _guard_text(rr),
                              "detail": {"from": "compilation_metrics"}})
            elif (r.get("attempt") or 0) > 0 and not str(r["compile_id"]).startswith("!"):
                extra.append({**r, "kind": "recompile", "dur": None, "reason": None, "guard": None,
                              "detail": {"from": "frame_compile_id"}})
            have_recompile.add(r["compile_id"])
        for reason in r.get("_restart_reasons") or []:
            if r["compile_id"] not in have_break:
                extra.append({**r, "kind": "graph_break", "dur": None, "reason": str(reason).split("\n", 1)[0],
                              "detail": {"from": "compilation_metrics.restart_reasons"}})
    for e in extra:
        e.pop("_recompile_reason", None)
        e.pop("_restart_reasons", None)
    rows.extend(extra)
    if any(r["kind"] == "graph_break" for r in rows):
        return
    seen: set[tuple] = set()
    for i, (base, fr, _) in enumerate(starts):
        m = _RESUME.match(fr[0] or "")
        if not m or base.get("attempt") != 0 or (fr[0], fr[1]) in seen:
            continue
        seen.add((fr[0], fr[1]))
        # dynamo compiles the resume function when the broken frame first reaches it: the frame compiled just before
        parent = starts[i - 1][0] if i > 0 else None
        row = {**(parent or base), "kind": "graph_break", "reason": None, "user_frame": f"{fr[1]}:{m.group(2)}",
               "detail": {"from": "resume frame", "resume_frame": fr[0]}}
        if parent is None:  # the broken frame's own compile is not in this log: name it by the resume frame
            row.update(compile_id=None, frame_id=None, attempt=None, function=m.group(1), filename=fr[1])
        rows.append(row)
