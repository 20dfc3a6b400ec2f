"""Fuzz every importer (and the rule loader) with inputs mutated from the project's own recorded data.

    python benchmarks/fuzz.py                      # 10,000 cases per target, two worker processes
    python benchmarks/fuzz.py --cases 200 --targets kineto-c,nsys --seed 3
    python benchmarks/fuzz.py --salvage 1000       # one changed byte inside traceEvents: events kept, C and Python

Targets: kineto-c (the compiled scanner), kineto-py (TRACEQL_KSCAN=0: msgspec and orjson), nsys, torch_trace,
nccl_log, fr_pickle, fr_json, rules (the rule loader, rules/*.yaml). Seeds are the files of fixtures/ and samples/
(discovered by content, as `traceql check` finds them); Kineto and nsys seeds are also cut down to their first rows so
that most cases cost milliseconds. Each case is one seed plus one mutation, drawn from a random generator seeded by
(--seed, target, case number), so any case can be rebuilt from its number (--show TARGET:N writes it out).

Mutations: bytes (changed bytes, flipped bits, truncation, a deleted, repeated or spliced-in stretch, a byte order
mark), values (a JSON/YAML value swapped for one of another type: ints beyond int64, floats for ints, strings, lists,
objects, null, deep nesting, NaN, 400-digit numbers), lines (dropped, repeated, shuffled, cut, taken from another
seed), and for nsys SQL on a copy of the export (a table or column dropped or renamed, a column filled with text,
blobs, floats, huge ints or nulls, rows deleted) with a captured environment variable planted whose value must appear
in no detail, meta or error message.

Cases run in subprocess batches: a worker announces each case before running it, so a segfault (a crash) is pinned to
its case and the batch goes on after it; a case over --cap seconds is a hang (an alarm in the worker, else the parent
kills it). Outcomes: ok / partial (read, perhaps with losses), clean error (IngestError, RuleError, or the loader's
MemoryError message), traceback (any other exception: a bug), hang, crash, leak (the planted secret in the output).
For a sample of cases (--check-every) the fuzzed file is put beside a good run (fixtures/cpu-straggler) and
`traceql check` must still report every finding the good run has on its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import random
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["kineto-c", "kineto-py", "nsys", "torch_trace", "nccl_log", "fr_pickle", "fr_json", "rules"]
SECRET = "TQLSECRET_d41d8cd9"  # planted as a captured environment value in nsys cases: must never be echoed
GOOD_RUN = REPO / "fixtures" / "cpu-straggler"


# ----------------------------------------------------------------------------------------------------------------
# Seeds


def _discover(kind: str) -> list[Path]:
    from traceql.discover import discover

    out = []
    for root in (REPO / "fixtures", REPO / "samples"):
        for d in sorted(root.iterdir()):
            if d.is_dir():
                # a hand-made fixture's files damaged on purpose (its manifest's "damaged") are cases, not seeds
                m = d / "manifest.json"
                damaged = {d / f for f in json.loads(m.read_text()).get("damaged", [])} if m.is_file() else set()
                out += [s.path for s in discover(d) if s.kind == kind and s.path.is_file() and s.path not in damaged]
    return sorted(set(out))


def _plain(p: Path) -> bytes:
    data = p.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _cut_kineto(data: bytes, n: int) -> bytes | None:
    """A real trace cut to its first n events (the header and the array's end kept)."""
    m = re.search(rb'"traceEvents"\s*:\s*\[', data)
    if not m:
        return None
    seps = [x.start() for x in re.finditer(rb"\n  \},\n  \{", data[m.end():])]
    if len(seps) <= n:
        return data
    cut = m.end() + seps[n - 1]
    tail = data.rfind(b"\n  }\n  ]")
    return data[: cut + 4] + data[tail + 4:] if tail > 0 else None


def _cut_nsys(src: Path, dst: Path, rows: int) -> None:
    """A copy of a real export with each activity table cut to its first rows (every table and column kept)."""
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        if t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")):
            cols = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
            order = "start" if "start" in cols else "rowid"
            con.execute(f'DELETE FROM "{t}" WHERE rowid NOT IN (SELECT rowid FROM "{t}" ORDER BY {order} LIMIT {rows})')
    con.commit()
    con.execute("VACUUM")
    con.close()


def seeds(target: str, work: Path) -> list[tuple[str, bytes]]:
    """(file name to write the case under, seed bytes) for a target."""
    if target.startswith("kineto"):
        out = []
        for i, p in enumerate(_discover("kineto")):
            data = _plain(p)
            for n in (60, 60, 400):
                cut = _cut_kineto(data, n)
                if cut:
                    out.append(("rank7.pt.trace.json", cut))
            if len(data) < 400_000:  # whole traces too, the small ones (--salvage reads a 1 MB one 1,000 times)
                out.append(("rank7.pt.trace.json", data))
        return out
    if target == "nsys":
        out = []
        for i, p in enumerate(_discover("nsys")[:4]):
            dst = work / f"seed{i}.sqlite"
            _cut_nsys(p, dst, 150)
            con = sqlite3.connect(dst)  # the planted secret, where exporters record the launched process's environment
            con.execute("CREATE TABLE IF NOT EXISTS META_DATA_CAPTURE (name TEXT, value TEXT)")
            for v in (f"RANK={SECRET}", f"API_TOKEN={SECRET}"):
                con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)", (v,))
            con.commit()
            con.close()
            out.append(("rank7.nsys.sqlite", dst.read_bytes()))
        return out
    if target == "torch_trace":
        return [("dedicated_log_torch_trace_rank_7_fuzz.log", _plain(p)[:200_000]) for p in _discover("torch_trace")]
    if target == "nccl_log":
        return [("rank7.log", p.read_bytes()) for p in _discover("nccl_log") if p.suffix == ".log"][:40]
    if target == "fr_pickle":
        return [("nccl_trace_rank_7", p.read_bytes()) for p in _discover("flight_recorder") if p.read_bytes()[:1] == b"\x80"]
    if target == "fr_json":
        return [("nccl_trace_rank_7.json", p.read_bytes()) for p in _discover("flight_recorder") if p.read_bytes()[:1] != b"\x80"]
    if target == "rules":
        return [("TQL999.yaml", p.read_bytes()) for p in sorted((REPO / "rules").glob("TQL*.yaml"))]
    raise SystemExit(f"unknown target {target}; choose from {', '.join(TARGETS)}")


# ----------------------------------------------------------------------------------------------------------------
# Mutations


def _odd_value(rng: random.Random) -> str:
    """JSON text of a value of a surprising type or size."""
    depth = rng.choice([50, 1000, 20000])
    return rng.choice([
        "18446744073709551617", "-9223372036854775809", "9223372036854775807", "1" + "0" * 400, "1e999", "-1e308",
        "1.5", "0.0", "-0", "NaN", "Infinity", "true", "false", "null", '""', '"text"', '"12"', '"\\u0000\\ud800"',
        "[]", "[1, 2]", '["a"]', "{}", '{"a": 1}', '{"name": null}', "[" * depth + "]" * depth,
        '{"a":' * depth + "1" + "}" * depth, '"' + "x" * 100_000 + '"',
    ])


_JSON_VALUE = re.compile(rb'("[^"\\\n]{1,40}"\s*:\s*)(-?\d[\d.eE+-]*|"(?:[^"\\\n]|\\.){0,200}"|true|false|null|\{|\[)')


def _swap_value(data: bytes, rng: random.Random) -> bytes:
    """One JSON member's value replaced by an odd one (scalars whole; an object or list: the value it opens)."""
    hits = list(_JSON_VALUE.finditer(data, 0, len(data)))
    if not hits:
        return data
    m = rng.choice(hits)
    end = m.end(2)
    if m.group(2) in (b"{", b"["):  # an object or list: find its end by bracket depth (good enough for a fuzzer)
        close = {b"{": b"}", b"[": b"]"}[m.group(2)]
        depth, i = 0, m.start(2)
        while i < len(data):
            c = data[i:i + 1]
            if c == m.group(2):
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    break
            i += 1
        end = i + 1
    return data[: m.start(2)] + _odd_value(rng).encode() + data[end:]


def mutate_bytes(data: bytes, rng: random.Random, donors: list[bytes]) -> tuple[str, bytes]:
    op = rng.choice(["bytes", "bits", "truncate", "delete", "repeat", "splice", "bom", "swap", "swap", "swap"])
    b = bytearray(data)
    n = len(b) or 1
    if op == "bytes":
        for _ in range(rng.choice([1, 1, 2, 8])):
            b[rng.randrange(n)] = rng.randrange(256)
    elif op == "bits":
        for _ in range(rng.choice([1, 3])):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
    elif op == "truncate":
        del b[rng.randrange(n):]
    elif op == "delete":
        i = rng.randrange(n)
        del b[i: i + rng.choice([1, 10, 1000])]
    elif op == "repeat":
        i = rng.randrange(n)
        b[i:i] = b[i: i + rng.choice([1, 100, 5000])] * rng.choice([1, 3])
    elif op == "splice":
        d = rng.choice(donors)
        j = rng.randrange(len(d) or 1)
        b[rng.randrange(n):rng.randrange(n)] = d[j: j + rng.choice([50, 2000, 50_000])]
    elif op == "bom":
        b = bytearray(rng.choice([b"\xef\xbb\xbf" + data, b"\xff\xfe" + data.decode("utf-8", "replace").encode("utf-16-le")]))
    else:
        for _ in range(rng.choice([1, 1, 3])):
            b = bytearray(_swap_value(bytes(b), rng))
    return op, bytes(b)


def mutate_lines(data: bytes, rng: random.Random, donors: list[bytes]) -> tuple[str, bytes]:
    lines = data.split(b"\n")
    op = rng.choice(["drop", "dup", "shuffle", "cut", "donor", "swap", "swap", "number", "bytes"])
    i = rng.randrange(len(lines))
    if op == "drop":
        del lines[i: i + rng.choice([1, 5])]
    elif op == "dup":
        lines[i:i] = lines[i: i + 3] * rng.choice([1, 50])
    elif op == "shuffle":
        part = lines[i: i + 20]
        rng.shuffle(part)
        lines[i: i + 20] = part
    elif op == "cut":
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    elif op == "donor":
        d = rng.choice(donors).split(b"\n")
        j = rng.randrange(len(d))
        lines[i:i] = d[j: j + rng.choice([1, 10])]
    elif op == "swap":
        lines[i] = _swap_value(lines[i], rng)
    elif op == "number":
        nums = list(re.finditer(rb"\d+", lines[i]))
        if nums:
            m = rng.choice(nums)
            lines[i] = lines[i][: m.start()] + rng.choice([b"99999999999999999999999", b"-1", b"0", b"1e308", b"x"]) + lines[i][m.end():]
    else:
        return mutate_bytes(data, rng, donors)
    return "line-" + op, b"\n".join(lines)


def _odd_py(rng: random.Random):
    deep: object = 1
    for _ in range(rng.choice([10, 3000])):
        deep = [deep]
    return rng.choice([2**64 + 1, -2**63 - 1, 1.5, float("nan"), float("inf"), "text", "", "12", None, True, [], [1, "a"],
                       {}, {"a": None}, ("t",), deep, b"bytes"])


def _swap_py(obj, rng: random.Random, depth: int = 0):
    """A copy of plain data with one value, somewhere inside, replaced by an odd one."""
    if isinstance(obj, dict) and obj and depth < 8:
        k = rng.choice(list(obj))
        out = dict(obj)
        out[k] = _odd_py(rng) if rng.random() < 0.3 else _swap_py(obj[k], rng, depth + 1)
        return out
    if isinstance(obj, (list, tuple)) and obj and depth < 8:
        out = list(obj)
        i = rng.randrange(len(out))
        out[i] = _odd_py(rng) if rng.random() < 0.3 else _swap_py(out[i], rng, depth + 1)
        return out if isinstance(obj, list) else tuple(out)
    return _odd_py(rng)


def mutate_pickle(data: bytes, rng: random.Random, donors: list[bytes]) -> tuple[str, bytes]:
    if rng.random() < 0.6:
        obj = pickle.loads(data)  # noqa: S301 - our own fixture files
        for _ in range(rng.choice([1, 1, 4])):
            obj = _swap_py(obj, rng)
        try:
            return "value", pickle.dumps(obj, protocol=rng.choice([2, 4, 5]))
        except RecursionError:
            return "value", data
    op, out = mutate_bytes(data, rng, donors)
    return op, out


_NSYS_ODD = ["'text'", "x'00ff'", "9223372036854775807", "-9223372036854775808", "1e300", "1.5", "NULL", "''", "'12'",
             "'" + SECRET + "'"]


def mutate_nsys(data: bytes, rng: random.Random, work: Path) -> tuple[str, bytes]:
    p = work / "mut.sqlite"
    p.write_bytes(data)
    con = sqlite3.connect(p)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    op = rng.choice(["drop_table", "drop_column", "rename", "fill", "fill", "fill", "delete", "nulls", "bytes"])
    t = rng.choice(tables)
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
    try:
        if op == "drop_table":
            con.execute(f'DROP TABLE "{t}"')
        elif op == "drop_column" and len(cols) > 1:
            con.execute(f'ALTER TABLE "{t}" DROP COLUMN "{rng.choice(cols)}"')
        elif op == "rename" and cols:
            con.execute(f'ALTER TABLE "{t}" RENAME COLUMN "{rng.choice(cols)}" TO "renamed_x"')
        elif op == "fill" and cols:
            c = rng.choice(cols)
            where = rng.choice(["", " WHERE rowid % 7 = 0", " WHERE rowid = (SELECT min(rowid) FROM \"%s\")" % t])
            con.execute(f'UPDATE "{t}" SET "{c}" = {rng.choice(_NSYS_ODD)}{where}')
        elif op == "delete":
            con.execute(f'DELETE FROM "{t}"')
        elif op == "nulls" and cols:
            con.execute(f'INSERT INTO "{t}" DEFAULT VALUES')
    except sqlite3.DatabaseError:
        pass
    con.commit()
    con.close()
    out = p.read_bytes()
    if op == "bytes":
        b = bytearray(out)
        for _ in range(rng.choice([1, 10, 100])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        out = bytes(b) if rng.random() < 0.8 else bytes(b[: rng.randrange(len(b))])
    return "sql-" + op, out


def make_case(target: str, i: int, seed: int, seeds_: list, work: Path) -> tuple[str, str, bytes]:
    """(file name, mutation, bytes) of case i."""
    rng = random.Random(f"{seed}:{target.split('-')[0]}:{i}")  # kineto-c and kineto-py: the same cases
    name, data = rng.choice(seeds_)
    donors = [d for _, d in seeds_]
    if target == "nsys":
        op, out = mutate_nsys(data, rng, work)
    elif target == "fr_pickle":
        op, out = mutate_pickle(data, rng, donors)
    elif target in ("torch_trace", "nccl_log", "rules") and rng.random() < 0.5:
        op, out = mutate_lines(data, rng, donors)
    else:
        op, out = mutate_bytes(data, rng, donors)
    if target.startswith("kineto") and rng.random() < 0.2:
        name, out = name + ".gz", gzip.compress(out, 1)
    return name, op, out


# ----------------------------------------------------------------------------------------------------------------
# Running one case (in a worker process)


class _Hang(BaseException):
    """Raised by the alarm: a BaseException so that no importer's `except Exception` swallows it."""


def _alarm(signum, frame):
    raise _Hang()


def _where(tb) -> str:
    """The innermost frame of traceql's own code in a traceback: the bug's address."""
    frames = [f for f in traceback.extract_tb(tb) if "/traceql/" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(tb)[-1]
    return f"{Path(f.filename).name}:{f.lineno} {f.name}"


def run_case(target: str, path: Path) -> dict:
    from traceql.discover import read_head
    from traceql.ingest import IngestError, module_for, read_source
    from traceql.model import Source
    from traceql.rules.loader import RuleError, load_rule

    try:
        if target == "rules":
            load_rule(path)
            return {"outcome": "ok"}
        kind = {"torch_trace": "torch_trace", "nccl_log": "nccl_log", "fr_pickle": "flight_recorder",
                "fr_json": "flight_recorder", "nsys": "nsys"}.get(target, "kineto")
        mod = module_for(kind)
        mod.sniff(path, read_head(path))
        src = Source(path, kind, rank=7, rank_origin="file name")
        read_source(src)
        text = f"{src.detail} {json.dumps(src.meta, default=str)}"
        out = {"outcome": src.status if src.status in ("ok", "partial") else "ok"}
        if target.startswith("kineto"):
            out["events"] = src.meta.get("events", 0)
    except (IngestError, RuleError) as e:
        text = str(e)
        out = {"outcome": "clean"}
        if "\n" in text.strip():
            out = {"outcome": "traceback", "where": "message has several lines", "error": text[:300]}
    except MemoryError:
        text, out = "", {"outcome": "clean", "memory": True}  # the loader turns this into a one-line message
    except _Hang:
        text, out = "", {"outcome": "hang"}
    except RecursionError as e:
        text, out = "", {"outcome": "traceback", "where": _where(e.__traceback__), "error": "RecursionError"}
    except Exception as e:  # noqa: BLE001 - the point of the exercise
        text = ""
        out = {"outcome": "traceback", "where": _where(e.__traceback__), "error": f"{type(e).__name__}: {str(e)[:200]}"}
    if SECRET in text or SECRET in out.get("error", ""):  # a traceback's text reaches the report as "internal error"
        out["leak"] = True
    return out


def worker(target: str, start: int, count: int, seed: int, cap: float) -> None:
    """Cases start..start+count-1: announce each ("S n"), run it, print its result as one JSON line."""
    import resource

    try:  # a runaway allocation must fail as MemoryError here, not take the machine down
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    sys.setrecursionlimit(5000)
    work = Path(tempfile.mkdtemp(prefix="tqlfuzz-"))
    seeds_ = seeds(target, work)
    signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(start, start + count):
            name, op, data = make_case(target, i, seed, seeds_, work)
            d = work / f"c{i}"
            d.mkdir()
            path = d / name
            path.write_bytes(data)
            print(f"S {i}", flush=True)
            signal.setitimer(signal.ITIMER_REAL, cap)
            try:
                res = run_case(target, path)
            except _Hang:
                res = {"outcome": "hang"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            res.update(case=i, op=op)
            print("R " + json.dumps(res), flush=True)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# The parent: batches, crash and hang accounting


def _spawn(target: str, start: int, count: int, seed: int, cap: float, err) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), POLARS_MAX_THREADS="1", TRACEQL_KSCAN="0" if target == "kineto-py" else "1")
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", target, str(start), str(count),
                             str(seed), str(cap)], stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO)


def run_target(target: str, cases: int, seed: int, cap: float, jobs: int, batch: int, results: list,
               first: int = 0, log=None) -> None:
    """Cases first..first+cases-1 of a target, in batches over `jobs` worker processes; one result dict per case."""
    todo = [(s, min(batch, first + cases - s)) for s in range(first, first + cases, batch)]
    running: list = []  # (proc, end, state)
    while todo or running:
        while todo and len(running) < jobs:
            s, n = todo.pop(0)
            err = tempfile.TemporaryFile()
            running.append((_spawn(target, s, n, seed, cap, err), s + n,
                            {"cur": None, "t": time.time(), "buf": b"", "err": err}))
        for proc, end, st in list(running):
            eof = False
            r, _, _ = select.select([proc.stdout], [], [], 0.05)
            if r:
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                st["buf"] += chunk
                *lines, st["buf"] = st["buf"].split(b"\n")
                for line in lines:
                    if line.startswith(b"S "):
                        st["cur"], st["t"] = int(line[2:]), time.time()
                    elif line.startswith(b"R "):
                        results.append(json.loads(line[2:]))
                        st["cur"] = None
                        if log is not None:
                            log.write(line[2:].decode() + "\n")
                            log.flush()
                eof = not chunk
            if not eof and time.time() - st["t"] < cap + 30:
                continue
            # the worker ended, or hung past its own alarm: account for the case it was on, go on after it
            outcome = None
            if not eof:
                proc.kill()
                outcome = "hang"
            proc.wait()
            if outcome is None and proc.returncode != 0:
                outcome = "crash"
            st["err"].seek(0)
            err = st["err"].read().decode("utf-8", "replace")[-400:]
            st["err"].close()
            running.remove((proc, end, st))
            cur = st["cur"]
            if cur is not None:
                results.append({"case": cur, "outcome": outcome or "crash", "error": err.strip()[-300:],
                                "where": f"worker exit {proc.returncode}"})
                if log is not None:
                    log.write(json.dumps(results[-1]) + "\n")
                    log.flush()
                if cur + 1 < end:
                    todo.insert(0, (cur + 1, end - cur - 1))
            elif proc.returncode != 0 and not any(r.get("case") == end - 1 for r in results):
                raise SystemExit(f"fuzz worker for {target} failed before its first case: {err}")


def check_beside_good(target: str, case: int, seed: int) -> bool:
    """The fuzzed file beside a good run (fixtures/cpu-straggler): the good ranks must still be read and keep every
    finding they have beside the same file unmutated (a new rank can change cross-rank findings; damage must not)."""
    work = Path(tempfile.mkdtemp(prefix="tqlfuzz-check-"))
    try:
        seeds_ = seeds(target, work)
        name, _, data = make_case(target, case, seed, seeds_, work)
        _, plain = random.Random(f"{seed}:{target.split('-')[0]}:{case}").choice(seeds_)  # make_case's first draw
        if name.endswith(".gz"):
            plain = gzip.compress(plain, 1)
        got = []
        for k, content in enumerate((plain, data)):
            run = work / f"run{k}"
            shutil.copytree(GOOD_RUN, run)
            (run / "manifest.json").unlink(missing_ok=True)
            (run / name).write_bytes(content)
            got.append(_findings(run, name))
        (before, ranks_b, _), (after, ranks_a, good_ok) = got
        alone = _alone()
        if before is None or after is None or alone is None or not good_ok:
            return False
        good = {0, 1} - ranks_b - ranks_a  # the ranks only the good run's own files hold

        def on_good(fs):
            return {(r, tuple(sorted(set(ranks) & good))) for r, ranks in fs if set(ranks) & good}

        # The good run's own findings (alone, and beside the unmutated file): cross-source findings that the extra file
        # brings (a Flight Recorder group missing ranks) or takes away (a straggler among more ranks) are not its own.
        return on_good(alone) & on_good(before) <= on_good(after)
    finally:
        shutil.rmtree(work, ignore_errors=True)


_ALONE: list = []


def _alone() -> set | None:
    """The good run's findings on its own (once per process)."""
    if not _ALONE:
        work = Path(tempfile.mkdtemp(prefix="tqlfuzz-alone-"))
        shutil.copytree(GOOD_RUN, work / "run")
        (work / "run" / "manifest.json").unlink(missing_ok=True)
        _ALONE.append(_findings(work / "run", "")[0])
        shutil.rmtree(work, ignore_errors=True)
    return _ALONE[0]


def _findings(run: Path, name: str) -> tuple[set | None, set, bool]:
    """(rule, ranks) of each finding of `traceql check RUN` (None when it did not finish with a report), the ranks the
    file `name` was read as, and whether every other input of the run was read."""
    env = dict(os.environ, PYTHONPATH=str(REPO), POLARS_MAX_THREADS="1")
    out = subprocess.run([sys.executable, "-c", "from traceql.cli import main; main()", "check", str(run),
                          "--format", "json", "--no-cache"], capture_output=True, env=env, cwd=REPO, timeout=300)
    try:
        doc = json.loads(out.stdout) if out.returncode in (0, 1) else None
    except ValueError:
        doc = None
    if doc is None:
        return None, set(), False
    srcs = doc.get("sources", [])
    mine = [x for x in srcs if Path(str(x.get("path"))).name == name]
    ranks = {r for x in mine for r in (x.get("ranks") or [x.get("rank")]) if r is not None}
    others_ok = all(x.get("status") in ("ok", "partial") for x in srcs if x not in mine and x.get("kind") != "unknown")
    return {(f.get("rule"), tuple(f.get("ranks") or ())) for f in doc.get("findings", [])}, ranks, others_ok


def summarise(target: str, results: list) -> dict:
    count = {k: 0 for k in ("ok", "partial", "clean", "traceback", "hang", "crash", "leak")}
    classes: dict[str, list] = {}
    for r in results:
        count[r["outcome"]] = count.get(r["outcome"], 0) + 1
        count["leak"] += bool(r.get("leak"))
        if r["outcome"] in ("traceback", "hang", "crash"):
            classes.setdefault(f"{r['outcome']} {r.get('where', '')} {r.get('error', '')[:80]}", []).append(r["case"])
    return {"target": target, "cases": len(results), **count, "classes": classes}


# ----------------------------------------------------------------------------------------------------------------
# One changed byte inside traceEvents: how often the trace keeps >= 99% of its events


def salvage(n: int, seed: int, use_kscan: bool, trace: Path) -> tuple[int, int, dict]:
    os.environ["TRACEQL_KSCAN"] = "1" if use_kscan else "0"
    from traceql.ingest import IngestError, kineto
    from traceql.model import Source

    kineto._USE_KSCAN = use_kscan and kineto._kscan is not None
    data = _plain(trace)
    lo = data.index(b"[", data.index(b'"traceEvents"'))
    hi = data.rindex(b"]")
    work = Path(tempfile.mkdtemp(prefix="tqlfuzz-salvage-"))
    p = work / "rank0.pt.trace.json"
    p.write_bytes(data)
    src = Source(p, "kineto")
    kineto.read(p, src)
    base = src.meta["events"]
    rng = random.Random(seed)
    kept, why = 0, {}
    for _ in range(n):
        pos = rng.randrange(lo, hi + 1)
        b = rng.randrange(256)
        while b == data[pos]:  # any other byte
            b = rng.randrange(256)
        m = bytearray(data)
        m[pos] = b
        p.write_bytes(m)
        src = Source(p, "kineto")
        try:
            kineto.read(p, src)
            got = src.meta.get("events", 0)
        except IngestError as e:
            got = 0
            key = str(e).split(": ", 1)[-1][:60]
            why[key] = why.get(key, 0) + 1
        kept += got >= 0.99 * base
    shutil.rmtree(work, ignore_errors=True)
    return kept, base, why


# ----------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="cases per target (default 10,000)")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0, help="number of the first case (to split a long run)")
    ap.add_argument("--cap", type=float, default=20.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--check-every", type=int, default=2500, help="every Nth case also runs beside a good run (0: never)")
    ap.add_argument("--salvage", type=int, default=0, help="run the one-changed-byte salvage measure with N cases")
    ap.add_argument("--salvage-seed", type=int, default=1234)
    ap.add_argument("--trace", default=str(REPO / "fixtures" / "h200-ddp-eager" / "rank0.pt.trace.json.gz"))
    ap.add_argument("--show", help="TARGET:N: write case N of TARGET to the current folder and exit")
    ap.add_argument("--json", help="write the per-target summaries here")
    ap.add_argument("--check-only", action="store_true", help="only the beside-a-good-run checks of the cases")
    ap.add_argument("--log", help="append each case's result to LOG.TARGET.jsonl as it comes (a long run can be cut)")
    ap.add_argument("--summarise", nargs="+", metavar="JSONL", help="print the table of logged results and exit")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if a.worker:
        t, s, n, seed, cap = a.worker
        worker(t, int(s), int(n), int(seed), float(cap))
        return 0
    if a.salvage:
        for use in (True, False):
            kept, base, why = salvage(a.salvage, a.salvage_seed, use, Path(a.trace))
            print(f"salvage ({'C scanner' if use else 'msgspec/Python'}): {kept}/{a.salvage} = {kept / a.salvage:.1%} "
                  f"of one-byte changes inside traceEvents keep >= 99% of {base} events; lost whole: {why or 'none'}")
        return 0
    if a.check_only:
        for t in a.targets.split(","):
            cases = list(range(a.first, a.first + a.cases, a.check_every))
            print(f"{t}: good run kept its findings beside {sum(check_beside_good(t, i, a.seed) for i in cases)}/"
                  f"{len(cases)} fuzzed cases ({cases})", flush=True)
        return 0
    if a.summarise:
        for f in a.summarise:
            rows = [json.loads(x) for x in Path(f).read_text().splitlines() if x.strip()]
            s = summarise(Path(f).name.split(".")[-2], list({r["case"]: r for r in rows}.values()))
            print(json.dumps({k: v for k, v in s.items() if k != "classes"}), s["classes"] or "")
        return 0
    if a.show:
        t, n = a.show.split(":")
        work = Path(tempfile.mkdtemp())
        name, op, data = make_case(t, int(n), a.seed, seeds(t, work), work)
        Path(name).write_bytes(data)
        print(f"wrote {name} ({op}, {len(data)} bytes)")
        return 0
    summaries = []
    print(f"{'target':12} {'cases':>6} {'ok':>6} {'partial':>7} {'clean':>6} {'traceback':>9} {'hang':>4} {'crash':>5} "
          f"{'leak':>4} {'good kept':>9}  seconds", flush=True)
    for t in a.targets.split(","):
        t0 = time.time()
        results: list = []
        log = open(f"{a.log}.{t}.jsonl", "a") if a.log else None  # noqa: SIM115 - closed below
        run_target(t, a.cases, a.seed, a.cap, a.jobs, a.batch, results, a.first, log)
        if log is not None:
            log.close()
        s = summarise(t, results)
        checks = list(range(a.first, a.first + a.cases, a.check_every)) if a.check_every and t != "rules" else []
        kept = sum(check_beside_good(t, i, a.seed) for i in checks)
        s["good_kept"] = f"{kept}/{len(checks)}" if checks else "n/a"
        s["seconds"] = round(time.time() - t0, 1)
        summaries.append(s)
        print(f"{t:12} {s['cases']:>6} {s['ok']:>6} {s['partial']:>7} {s['clean']:>6} {s['traceback']:>9} {s['hang']:>4} "
              f"{s['crash']:>5} {s['leak']:>4} {s['good_kept']:>9}  {s['seconds']}", flush=True)
        for k, v in sorted(s["classes"].items(), key=lambda kv: -len(kv[1]))[:15]:
            print(f"    {len(v):5} x {k}  (e.g. --show {t}:{v[0]})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(summaries, indent=1))
    bad = sum(s["traceback"] + s["hang"] + s["crash"] + s["leak"] for s in summaries)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
