"""NCCL and ProcessGroupNCCL logs as people paste them: the same findings on the same ranks as the original.

Each NCCL log fixture (fixtures/nccl-log-*, hand-made; fixtures/h200x2-desync and h200-duplicate-gpu, real NCCL
2.28.9 captures) is copied and transformed the way logs reach an issue or a chat: hard-wrapped by a terminal at 80 and
120 columns, wrapped at blanks (`fold -s`), behind the prefixes of torchrun, SLURM `srun --label` and Ray, cut to an
excerpt of the lines that carry events. TQL5xx findings (rule and ranks) must equal those on the original. The
reference corpus's real lines get the same wrapping and prefixes and must read into the same facts.
tests/data/nccl-paste/README.md says how each variant is made.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, corpus_path
from traceql import pipeline
from traceql.discover import discover
from traceql.ingest import IngestError
from traceql.ingest.nccl_log import parse_line, read
from traceql.model import Source

REAL = corpus_path("nccl", "real_lines.txt")
_RANK = re.compile(r"^\[rank(\d+)\]:")
_MPI = re.compile(r"^\[1,(\d+)\]<std(?:out|err)>:")  # mpirun --tag-output: the rank a launcher prefix would carry


def _hard_wrap(text: str, width: int) -> str:
    """A terminal's wrap: every line longer than the width is cut at exactly the width."""
    out = []
    for line in text.split("\n"):
        out += [line[i:i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out)


def _fold_s(text: str, width: int) -> str:
    """`fold -s -w WIDTH`: cut after the last blank within the width (the blank stays on the first piece)."""
    out = []
    for line in text.split("\n"):
        while len(line) > width:
            cut = line.rfind(" ", 0, width)
            cut = width if cut <= 0 else cut + 1
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return "\n".join(out)


def _prefixed(text: str, rank: int | None, make) -> str:
    """Each line behind a launcher prefix for its rank: the rank its own tag names, else the file's (from its name,
    or the first rank tag in it: a launcher prefixes all of one process's lines alike)."""
    if rank is None:
        m = re.search(r"^\[rank(\d+)\]:", text, re.M)
        rank = int(m.group(1)) if m else None
    out = []
    for line in text.split("\n"):
        m = _RANK.match(line)
        t = m or _MPI.match(line)
        r = int(t.group(1)) if t else rank
        out.append(make(0 if r is None else r, line, m) if line else line)
    return "\n".join(out)


def _torchrun(text, rank):  # torch >= 2.2 `--tee 3` / local_ranks_filter: "[rank3]:" (kept where present)
    return _prefixed(text, rank, lambda r, line, m: line if m else f"[rank{r}]:{line}")


def _torchrun_old(text, rank):  # torch.distributed.elastic before 2.2: "[default0]:" (role and LOCAL rank)
    return _prefixed(text, rank, lambda r, line, m: f"[default{r % 8}]:{line}")


def _slurm(text, rank):  # srun --label: "3: " (task id)
    return _prefixed(text, rank, lambda r, line, m: f"{r}: {line}")


def _ray(text, rank):  # Ray worker output
    return _prefixed(text, rank, lambda r, line, m: f"(RayTrainWorker pid={4000 + r}, ip=10.0.0.{r + 1}) {line}")


def _excerpt(text, rank):
    """What a user pastes from a failed job: the lines that say something happened (warnings, errors, timeouts,
    dumps, aborts), the communicator lines with rank and nranks, and the line after "Last error:"."""
    keep, after_last_error = [], False
    for line in text.split("\n"):
        f = parse_line(line)
        if after_last_error and line.strip():
            keep.append(line)
            after_last_error = False
        elif f is not None and (f.kind not in ("info", "coll", "ring", "transport", "trees", "channels", "plugin",
                                               "bootstrap", "net_socket", "net_ib", "network", "gdr", "env", "version")):
            keep.append(line)
        after_last_error = after_last_error or line.rstrip().endswith("Last error:")
    return "\n".join(keep) + "\n"


TRANSFORMS = {
    "wrap80": lambda t, r: _hard_wrap(t, 80),
    "wrap120": lambda t, r: _hard_wrap(t, 120),
    "fold-s80": lambda t, r: _fold_s(t, 80),
    "torchrun": _torchrun,
    "torchrun-old": _torchrun_old,
    "slurm": _slurm,
    "ray": _ray,
    "torchrun+wrap80": lambda t, r: _hard_wrap(_torchrun(t, r), 80),
    "slurm+fold-s120": lambda t, r: _fold_s(_slurm(t, r), 120),
    "ray+wrap120": lambda t, r: _hard_wrap(_ray(t, r), 120),
    "excerpt": _excerpt,
    "excerpt+wrap80": lambda t, r: _hard_wrap(_excerpt(t, r), 80),
}
# Findings that rest on init chatter (transports, channels, env) are not expected to survive an excerpt.
EVENT_FIXTURES = {"nccl-log-duplicate-gpu", "nccl-log-heartbeat", "nccl-log-timeout-desync", "nccl-log-timeout-hang",
                  "nccl-log-desync-report", "nccl-log-excerpt-one-rank", "h200x2-desync", "h200-duplicate-gpu"}
FIXTURE_DIRS = [d for d in sorted(FIXTURES.glob("nccl-log-*")) + [FIXTURES / "h200x2-desync", FIXTURES / "h200-duplicate-gpu"]
                if d.is_dir()]


def findings(d: Path) -> set[tuple[str, tuple[int, ...]]]:
    res = pipeline.check(d, rules_dirs=[REPO / "rules"], use_cache=False, jobs=1)
    errors = [f"{r.rule.id}: {r.reason}" for r in res.results if r.status == "error"]
    assert not errors, (d, errors)
    return {(f.rule, tuple(f.ranks or ())) for f in res.findings if f.rule.startswith(("TQL5", "TQL001"))}


def pasted_copy(src: Path, dst: Path, transform: str) -> Path:
    """A copy of src with every NCCL log transformed; other files as they are."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for s in discover(dst):
        if s.kind == "nccl_log":
            text = s.path.read_text(errors="replace")
            s.path.write_text(TRANSFORMS[transform](text, s.rank))
    return dst


CASES = [(d.name, t) for d in FIXTURE_DIRS for t in TRANSFORMS if not t.startswith("excerpt") or d.name in EVENT_FIXTURES]


@pytest.fixture(scope="module")
def originals():
    return {d.name: findings(d) for d in FIXTURE_DIRS}


@pytest.mark.parametrize("fixture,transform", CASES)
def test_pasted_log_gives_the_same_findings(tmp_path, originals, fixture, transform):
    base = originals[fixture]
    assert base or fixture == "nccl-log-healthy"  # a fixture without findings proves nothing here but quiet
    got = findings(pasted_copy(FIXTURES / fixture, tmp_path / fixture, transform))
    assert got == base, f"missing {sorted(base - got)}, extra {sorted(got - base)}"


def _facts(text: str, tmp_path: Path, name: str):
    p = tmp_path / name
    p.write_text(text)
    t = read(p, Source(p, "nccl_log"))
    # sorted by repr: seq and op may be null beside numbers and names
    ev = sorted(((r["kind"], r["seq"], r["op"]) for r in t["nccl_events"].iter_rows(named=True)), key=repr)
    comms = sorted((r["comm_id"] or "", r["comm_rank"] or -1, r["nranks"] or -1, r["version"] or "", r["network"] or "")
                   for r in t["nccl_comms"].iter_rows(named=True))
    return ev, comms


@pytest.mark.skipif(not REAL.is_file(), reason="reference corpus absent")
@pytest.mark.parametrize("transform", ["wrap80", "wrap120", "fold-s80", "torchrun", "torchrun-old", "slurm", "ray",
                                       "ray+wrap120"])
def test_real_corpus_lines_survive_pasting(tmp_path, transform):
    """The corpus's 177 real lines (64 issues), one block per issue: the same events and communicators after."""
    from tests.test_nccl import _blocks

    bad = []
    for i, (url, lines) in enumerate(_blocks(REAL.read_text())):
        text = "\n".join(lines) + "\n"
        try:
            want = _facts(text, tmp_path, f"o{i}.log")
        except IngestError:  # a block the reader refuses alone (no NCCL fact) is not a pasting case
            continue
        got = _facts(TRANSFORMS[transform](text, 0), tmp_path, f"p{i}.log")
        if got != want:
            bad.append(f"{url}: {want} != {got}")
    assert not bad, "\n".join(bad)


WD = ("[rank1]:[E1129 13:48:26.576543231 ProcessGroupNCCL.cpp:689] [Rank 1] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=22, OpType=ALLGATHER, NumelIn=4, NumelOut=8, Timeout(ms)=10000) ran for 10096 "
      "milliseconds before timing out.")
STATUS = ("[rank1]:[E1129 13:48:26.586975297 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank 1]  "
          "failure detected by watchdog at work sequence id: 22 PG status: last enqueued work: 27, last completed work: 21")


@pytest.mark.parametrize("cut", [WD.index("timeout: ") + 9, WD.index("10096") + 3, WD.index("SeqNum=") + 8, 40])
def test_a_line_cut_once_is_read_whole(tmp_path, cut):
    """One wrapped line and nothing else that shows the width: cut after "timeout: ", inside a number, inside the
    WorkNCCL(...) and inside the glog head. The reader joins it back (the join says strictly more, or a number
    continues) and reads the same fact as from the whole line."""
    whole = _facts(WD + "\n" + STATUS + "\n", tmp_path, "whole.log")
    got = _facts(WD[:cut] + "\n" + WD[cut:] + "\n" + STATUS + "\n", tmp_path, "cut.log")
    assert got == whole and ("watchdog_timeout", 22, "all_gather") in got[0]


def test_a_number_cut_at_the_end_is_not_read_short(tmp_path):
    """"last completed work: 2" / "1": the first piece alone reads as a status with the wrong number."""
    p = tmp_path / "x.log"
    p.write_text(STATUS[:-1] + "\n" + STATUS[-1:] + "\n")
    ev = read(p, Source(p, "nccl_log"))["nccl_events"]
    assert ev["detail"].str.json_path_match("$.last_completed").to_list() == ["21"]


def test_unrelated_lines_after_a_complete_line_are_not_joined(tmp_path):
    """Application output after a complete line (no prefix, nothing NCCL in it) stays apart: the join says no more."""
    p = tmp_path / "x.log"
    p.write_text(WD + "\nepoch 3 loss 2.31 lr 0.001 tokens/s 18234\n" + STATUS + "\n")
    ev = read(p, Source(p, "nccl_log"))["nccl_events"]
    wd = ev.filter(ev["kind"] == "watchdog_timeout")
    assert wd.height == 1 and wd["text"][0].endswith("before timing out.")


def test_a_line_cut_between_its_head_and_nccl_info_is_joined(tmp_path):
    # a long pod name under a launcher prefix puts the terminal's cut right after "host:pid:tid [dev]": the next piece
    # starts " NCCL INFO ..." and must not be read as a line of its own that lost its head
    real = [ln for p in sorted(FIXTURES.glob("*/*.log")) for ln in p.read_text(errors="replace").splitlines()
            if " NCCL INFO " in ln and ln.index(" NCCL INFO ") > 8][:200]
    assert real, "no NCCL INFO lines in the fixtures"
    text = "\n".join(real) + "\n"
    cut = "\n".join(ln.replace(" NCCL INFO ", "\n NCCL INFO ", 1) for ln in real) + "\n"
    assert _facts(cut, tmp_path, "cut.log") == _facts(text, tmp_path, "whole.log")
