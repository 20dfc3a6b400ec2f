"""TORCH_LOGS text (recompiles, graph_breaks, dynamo) in a process's stdout/stderr -> compile_events.

A logged message is one or more lines that share a glog prefix, optionally behind a launcher prefix (`[rank3]:`):
`[rank1]:V1129 09:20:23.630000 14423 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks] text`.
The bracket after the prefix is the compile id; the next one names the artifact (__recompiles, __graph_breaks,
__recompiles_verbose). What becomes a row: recompile (function, file:line, failed guards), graph_break (reason,
user frame), cache_limit (`torch._dynamo hit config.recompile_limit (8)`). These logs carry no compile times,
cache keys or graphs; TORCH_TRACE does, and link/ prefers it where a rank has both.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import polars as pl

from traceql.ingest import IngestError, _gz
from traceql.ingest._compile_common import graph_break, guard_text, wont_convert
from traceql.ingest.compile_trace import parse_compile_id
from traceql.ingest.sniff import torch_logs as sniff  # noqa: F401  (discovery's test, kept in one place)

KIND = "torch_logs"
SUPPORTED = True

_LINE = re.compile(
    r"^(?:\[rank(?P<rank>\d++)\]:)?(?P<lvl>[VIWE])(?P<md>\d{4}) (?P<t>\d\d:\d\d:\d\d\.\d++) ++(?P<tid>\d++) "
    r"(?P<loc>[^\]]++)\] (?:\[(?P<cid>!?[\d/]++)\] )?(?:\[(?P<art>__\w++)\] )?(?P<text>.*)$"
)
# torch <= 2.1 logging: `[2026-12-01 13:16:29,700] [0/0] torch._dynamo.symbolic_convert.__graph_breaks: [DEBUG] text`
_LINE_OLD = re.compile(
    r"^(?:\[rank(?P<rank>\d++)\]:)?\[(?P<md>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d,\d++)\] (?:\[(?P<cid>!?[\d/]++)\] )?"
    r"(?P<loc>torch\.[\w\.]+?)(?:\.(?P<art>__\w++))?: \[(?P<lvl>[A-Z]++)\] (?P<text>.*)$"
)
# Matched once, where the phrase first occurs (_first): searched, "(.+):" would be retried from every
# occurrence of the phrase, quadratic on a line that repeats it (issue 16).
_RECOMPILING = re.compile(r"(\S++) in (.+):(\d++)")
_LIMIT = re.compile(r"torch\._dynamo hit config\.(\w++) \((\d++)\)")
_FILE = re.compile(r'File "([^"]++)", line (\d++)')
_FAILURE = re.compile(r"^\s*+- (.+)$")
# Both matched at their phrase's first occurrence (_first): searched, the lazy or greedy run to the end of the line is
# retried from every occurrence of the phrase, quadratic on a line that repeats it (issue 16).
_OLD_FAILURE = re.compile(r"(.+?)[\"']\)[ \t]*+$", re.M)
_IN_FN = re.compile(r'File "[^"]++", line \d++, in (<resume in \w++>|\w++)')
_LIMIT_FN = re.compile(r"([^']++)' \((.+):(\d++)\)")


def _first(pattern: re.Pattern, phrase: str, text: str) -> re.Match | None:
    i = text.find(phrase)
    return pattern.match(text, i + len(phrase)) if i >= 0 else None


def _stand_in_frame(row: dict, frames: dict, count: bool = True) -> None:
    """torch < 2.4 logs recompiles without a compile id: number the frames by function (negative ids, so they never
    pass for torch's own) and the recompiles of each in order, so that a frame's recompiles still count together."""
    key = (row["function"], row["filename"], row["line"])
    f = frames.setdefault(key, [-(len(frames) + 1), 0])
    if count:
        f[1] += 1
    row["frame_id"], row["attempt"] = f[0], f[1]
    row["detail"]["stand_in_frame_id"] = True


def _messages(path: Path):
    """Group consecutive lines that share (rank, time, thread, location, compile id, artifact) into messages."""
    cur_key = None
    cur: list[str] = []
    meta = None
    with _gz.open_text(path, encoding="utf-8", errors="replace") as f:
        try:
            for lineno, raw in enumerate(f, 1):
                line = raw.rstrip("\n")
                m = _LINE.match(line) or _LINE_OLD.match(line)
                if not m:
                    if cur:
                        yield meta, cur
                        cur, cur_key = [], None
                    continue
                key = (m["rank"], m["md"], m["t"], m.groupdict().get("tid"), m["loc"], m["cid"], m["art"])
                if key != cur_key and cur:
                    yield meta, cur
                    cur = []
                if key != cur_key:
                    meta = {"rank": int(m["rank"]) if m["rank"] else None, "cid": m["cid"], "art": m["art"],
                            "line": lineno, "level": m["lvl"], "time": f"{m['md']} {m['t']}"}
                    cur_key = key
                cur.append(m["text"])
        except (EOFError, OSError):
            pass
    if cur:
        yield meta, cur


def read(path: Path, source) -> dict[str, pl.DataFrame]:
    rows = []
    frames: dict[tuple, list[int]] = {}  # (function, file, line) -> [stand-in frame id, compiles seen]
    seen_recompile: set[tuple] = set()
    seen_failure: set[tuple] = set()  # (rank, function, reason): one report per frame, though torch may print it twice
    ranks: set[int] = set()
    for meta, lines in _messages(path):
        text = "\n".join(lines)
        r = meta["rank"] if meta["rank"] is not None else source.rank
        if meta["rank"] is not None:
            ranks.add(meta["rank"])
        f_id, c_id = parse_compile_id(meta["cid"])
        base = {"rank": r, "compile_id": meta["cid"], "frame_id": f_id, "attempt": c_id}
        det = {"line": meta["line"], "logged_at": meta["time"]}
        art = meta["art"] or ""
        m = _first(_RECOMPILING, "Recompiling function ", text)
        if art.startswith("__recompiles") and m:
            # __recompiles and __recompiles_verbose report the same recompile; torch < 2.4 logs no compile id
            key = (r, meta["cid"]) if meta["cid"] else (r, meta["time"], m.group(1))
            if key in seen_recompile:
                continue
            seen_recompile.add(key)
            failures = [fm.group(1).strip() for ln in lines if (fm := _FAILURE.match(ln))]
            if not failures and (om := _first(_OLD_FAILURE, "triggered by the following guard failure: ", text)):  # torch 2.1 logs a tuple's repr on one line
                failures = [om.group(1)]
            row = {**base, "kind": "recompile", "function": m.group(1), "filename": m.group(2),
                   "line": int(m.group(3)), "reason": "\n".join(failures) or None,
                   "guard": guard_text(failures[0]) if failures else None,
                   "detail": {**det, "failed_guards": failures[:16], "n_failed": len(failures)}}
            if base["frame_id"] is None:
                _stand_in_frame(row, frames)
            rows.append(row)
        elif meta["level"] in ("W", "E", "WARNING", "ERROR") and (wc := wont_convert(text)) is not None:
            # a frame whose compile raised, run eager (suppress_errors); at INFO level torch reports frames it skips
            # on purpose (generators, its own files) the same way: those are no failures
            row = {**base, "kind": "compile_failure", "function": wc["function"], "filename": wc["filename"],
                   "line": wc["line"], "reason": wc["fail_reason"], "op": wc["fail_type"],
                   "detail": {**det, **{k: v for k, v in wc.items() if k in ("fail_type", "fail_reason", "backend",
                                                                            "category") and v is not None},
                              "suppress_errors": True}}
            if (r, row["function"], row["reason"]) not in seen_failure:
                seen_failure.add((r, row["function"], row["reason"]))
                rows.append(row)
        elif art == "__graph_breaks" and ("Graph break in user code" in text or "Graph Break Reason" in text
                                          or "Graph break: " in text):
            gb = graph_break(text)
            if base.get("function") is None and (fn := _IN_FN.search(text)):  # the broken frame, where no id names it
                base = {**base, "function": fn.group(1)}
            rows.append({**base, "kind": "graph_break", "reason": gb["reason"], "user_frame": gb["user_frame"],
                         "detail": {**det, **gb["detail"]}})
        elif text.startswith("Graph break from "):  # the warning torch prints without TORCH_LOGS (older wording too)
            fm = _FILE.search(text)
            rows.append({**base, "kind": "graph_break", "reason": lines[0].rstrip(", consider setting:").strip(),
                         "user_frame": f"{fm.group(1)}:{fm.group(2)}" if fm else None,
                         "detail": {**det, "from": "warning"}})
        elif (lm := _LIMIT.search(text)) is not None:
            row = {**base, "kind": "cache_limit", "reason": text.split("\n", 1)[0],
                   "detail": {**det, "limit": int(lm.group(2)), "config": lm.group(1)}}
            fm = _first(_LIMIT_FN, "function: '", text)
            if fm:
                row.update(function=fm.group(1), filename=fm.group(2), line=int(fm.group(3)))
                if base["frame_id"] is None:
                    _stand_in_frame(row, frames, count=False)
            rows.append(row)
    if any(r["kind"] == "graph_break" and "from" not in r["detail"] for r in rows):  # TORCH_LOGS reports win
        rows = [r for r in rows if not (r["kind"] == "graph_break" and r["detail"].get("from") == "warning")]
    if not rows:
        raise IngestError(f"{path.name}: no recompile, graph-break, recompile-limit or WON'T CONVERT message found; "
                          "run with TORCH_LOGS=recompiles,graph_breaks to log them")
    if ranks:
        source.ranks = sorted(ranks)
        if len(ranks) == 1:
            source.rank = next(iter(ranks))
        source.rank_origin = "[rankN]: line prefixes"
    for row in rows:
        row["detail"] = orjson.dumps(row["detail"]).decode()
        if row["rank"] is None:
            row["rank"] = source.rank
    return {"compile_events": pl.DataFrame(rows, schema={
        "rank": pl.Int32, "compile_id": pl.Utf8, "frame_id": pl.Int64, "attempt": pl.Int64, "kind": pl.Utf8,
        "function": pl.Utf8, "filename": pl.Utf8, "line": pl.Int64, "reason": pl.Utf8, "guard": pl.Utf8,
        "user_frame": pl.Utf8, "op": pl.Utf8, "detail": pl.Utf8})}
