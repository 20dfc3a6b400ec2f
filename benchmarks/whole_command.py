"""The whole command, as users meet it: `/usr/bin/time` on `traceql check DIR --no-cache`, process start included.

    python benchmarks/whole_command.py [--corpus DIR] [--hta-python PY] [--repeat 3] [--big-mb 1000]
        [--recheck 8] [--ranks 128x35] [--installed VENV [--installed-checks]] [--tmp DIR] [--json OUT]

Every figure is one fresh process measured by /usr/bin/time (wall seconds, CPU seconds = user + sys, peak RSS), best
of --repeat by CPU, all in the same run; a row's traceql, floor and HTA runs take turns (one of each per round), so
that a box whose speed drifts moves a row's figures together:
- traceql: `traceql check DIR -q --no-cache --fail-on never` (cold: no Parquet cache read or written);
- the floor: the interpreter starting, importing polars and inflating the file(s) (what no reader can avoid);
- HTA: `TraceAnalysis(trace_dir=DIR)` then `get_comm_comp_overlap()` (its nearest job to `check`'s overlap rule),
  in HTA's own venv, on a temp copy (HTA may write beside the traces; the corpus is read-only).
Rows: each corpus folder holding NCCL kernels; samples/demo; `traceql --help` and `--version`; a ~1 GB plain trace
(--big-mb, scaled from df_index_resolver with shifted timestamps, never committed); a warm re-check of N ranks of
df_index_resolver (--recheck: the second `check` with the cache); N ranks x M MB cold (--ranks, optional: disk).
The traceql rows run this checkout with the running interpreter (an editable install's import hook costs about 50 M
instructions at every start); --installed VENV adds `VENV/bin/traceql --help` and `--version` of a regular
`pip install .` there, the console script as a user runs it, and with --installed-checks every check row runs that
console script too, its floor that venv's python.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ingest import scaled_copy  # noqa: E402  (the same scaled copies as the ingest benchmark)
from ranks import make_run  # noqa: E402  (the many-rank runs of benchmarks/ranks.py)

NCCL_DIRS = [  # the corpus folders with NCCL kernels (benchmarks/hta_reference.py)
    "hta/tests/data/df_index_resolver",
    "hta/tests/data/nccl_parser_config",
    "hta/tests/data/negative_queue_length_values_check",
    "hta/tests/data/timeline_analysis",
    "hta/tests/data/trace_diff/control",
    "hta/tests/data/trace_diff/test",
    "hta/tests/data/trace_filter",
]
TRACEQL = [sys.executable, "-c", "import sys; from traceql.__main__ import run; sys.exit(run())"]  # the console script
PYTHON = sys.executable  # the floor's interpreter: the one traceql runs on (use_installed: a regular install's)
HTA_JOB = ("import logging, sys; logging.disable(logging.WARNING); from hta.trace_analysis import TraceAnalysis; "
           "a = TraceAnalysis(trace_dir=sys.argv[1]); a.get_comm_comp_overlap()")
FLOOR_JOB = ("import sys, polars\nfrom pathlib import Path\n"
             "for p in sorted(Path(sys.argv[1]).rglob('*')):\n"
             "    if p.is_file() and ('.json' in p.name):\n"
             "        f = __import__('gzip').open(p, 'rb') if p.name.endswith('.gz') else open(p, 'rb')\n"
             "        while f.read(1 << 24): pass\n")


def timed(cmd: list[str], env: dict | None = None, timeout: float = 3600, ok=(0, 1)) -> dict | None:
    """wall s, CPU s (user + sys) and peak RSS MB of one process, from /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        try:
            r = subprocess.run(["/usr/bin/time", "-o", t.name, "-f", "%e %U %S %M", *cmd], capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            print(f"  (timed out after {timeout:.0f} s: {' '.join(cmd[-3:])})")
            return None
        fields = Path(t.name).read_text().split()[-4:]
    if r.returncode not in ok:  # traceql exits 1 on findings (--fail-on never aside); anything else failed
        print(f"  (exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:200]})")
        return None
    wall, user, sys_, rss = fields
    return {"wall": float(wall), "cpu": float(user) + float(sys_), "rss_mb": int(rss) / 1024}


def best(cmd: list[str], repeat: int, env: dict | None = None, timeout: float = 3600, ok=(0, 1)) -> dict | None:
    runs = [r for r in (timed(cmd, env, timeout, ok) for _ in range(repeat)) if r]
    return min(runs, key=lambda r: r["cpu"]) if runs else None


def interleaved(jobs: dict[str, tuple[list[str], tuple]], repeat: int, env: dict, once: tuple = ()) -> dict:
    """Best (by CPU) of each job over `repeat` rounds, every round running each job once in turn (those in `once` in
    the first round only): a box whose speed drifts between rows moves the jobs of a row together, not one ratio."""
    runs: dict[str, list] = {k: [] for k in jobs}
    for i in range(repeat):
        for k, (cmd, ok) in jobs.items():
            if i and k in once:
                continue
            r = timed(cmd, env if k != "hta" else None, ok=ok)
            if r:
                runs[k].append(r)
    return {k: min(v, key=lambda r: r["cpu"]) if v else None for k, v in runs.items()}


def check_cmd(path: Path, cache: bool = False) -> list[str]:
    return [*TRACEQL, "check", str(path), "-q", "--fail-on", "never", *([] if cache else ["--no-cache"])]


def use_installed(venv: Path) -> None:
    """Every row as a user of a regular install meets it: VENV/bin/traceql for traceql, VENV/bin/python for the
    floor (no editable-install import hook in either)."""
    global TRACEQL, PYTHON
    TRACEQL = [str(venv / "bin" / "traceql")]
    PYTHON = str(venv / "bin" / "python")


def _fmt(r: dict | None) -> str:
    return "-" if r is None else f"{r['cpu']:.2f} / {r['wall']:.2f} / {r['rss_mb']:.0f}"


def _ratio(a: dict | None, b: dict | None) -> str:
    return "-" if not a or not b or not b["cpu"] else f"{a['cpu'] / b['cpu']:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    ap.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON", "/work/venvs/hta/bin/python"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-mb", type=float, default=0, help="also a scaled plain trace of this many MB (e.g. 1000)")
    ap.add_argument("--recheck", type=int, default=0, metavar="N", help="warm re-check of N scaled ranks")
    ap.add_argument("--ranks", default="", help="NxMB cold run of N ranks of MB each (e.g. 128x35)")
    ap.add_argument("--installed", type=Path, default=None, help="a venv with a regular install: its --help/--version")
    ap.add_argument("--installed-checks", action="store_true",
                    help="with --installed: every check row (and its floor) through that venv, not this checkout")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    a = ap.parse_args()
    hta = Path(a.hta_python).exists()
    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="tql-whole-", dir=a.tmp))
    env = {**os.environ, "TRACEQL_CACHE_DIR": str(tmp / "cache")}
    try:
        print("CPU s / wall s / peak RSS MB, each one process under /usr/bin/time, best of", a.repeat, "by CPU")
        print(f"{'input':58} {'traceql check':>20} {'floor':>20} {'HTA load+overlap':>20} {'vs floor':>9} {'HTA/tql':>8}")
        for name in ("--help", "--version"):
            r = best([*TRACEQL, name], a.repeat, env)
            rows.append({"input": f"traceql {name}", "traceql": r})
            print(f"{'traceql ' + name:58} {_fmt(r):>20}")
        if a.installed:
            for name in ("--help", "--version"):
                r = best([str(a.installed / "bin" / "traceql"), name], a.repeat, env)
                rows.append({"input": f"installed traceql {name}", "traceql": r})
                print(f"{'installed traceql ' + name + ' (pip install .)':58} {_fmt(r):>20}")
        if a.installed and a.installed_checks:
            use_installed(a.installed)
        targets = [(REPO / "samples" / "demo", False)]
        targets += [(a.corpus / d, True) for d in NCCL_DIRS if (a.corpus / d).is_dir()]
        if a.big_mb:
            src = a.corpus / "hta/tests/data/df_index_resolver"
            gz = next(iter(sorted(src.glob("*.json.gz"))))
            targets.append((scaled_copy(gz, tmp / f"big-{a.big_mb:.0f}", a.big_mb).parent, a.big_mb <= 1200))
        for path, with_hta in targets:
            jobs = {"traceql": (check_cmd(path), (0, 1)), "floor": ([PYTHON, "-c", FLOOR_JOB, str(path)], (0, 1))}
            if with_hta and hta:
                copy = tmp / "hta" / path.name
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(path, copy)
                jobs["hta"] = ([a.hta_python, "-c", HTA_JOB, str(copy)], (0,))
            got = interleaved(jobs, a.repeat, env, once=("hta",) if "big" in path.name else ())
            r, fl, h = got["traceql"], got["floor"], got.get("hta")
            label = str(path.relative_to(a.corpus)) if path.is_relative_to(a.corpus) else path.name
            mb = sum((len(gzip.decompress(p.read_bytes())) if p.name.endswith(".gz") else p.stat().st_size)
                     for p in path.rglob("*") if p.is_file() and ".json" in p.name) / 1e6
            rows.append({"input": label, "mb": mb, "traceql": r, "floor": fl, "hta": h})
            print(f"{label + f' ({mb:.0f} MB)':58} {_fmt(r):>20} {_fmt(fl):>20} {_fmt(h):>20} {_ratio(r, fl):>9} "
                  f"{_ratio(h, r):>8}")
        if a.recheck:
            gz = next(iter(sorted((a.corpus / "hta/tests/data/df_index_resolver").glob("*.json.gz"))))
            run = tmp / f"recheck-{a.recheck}"
            for rank in range(a.recheck):
                f = scaled_copy(gz, run, 0, rank=rank)  # one copy: the trace itself, its rank rewritten
                f.rename(run / f"rank{rank}.json")
            timed(check_cmd(run, cache=True), env)  # fill the cache
            r = best(check_cmd(run, cache=True), a.repeat, env)
            rows.append({"input": f"warm re-check {a.recheck} ranks", "traceql": r})
            print(f"{f'warm re-check, {a.recheck} ranks x df_index_resolver':58} {_fmt(r):>20}")
        if a.ranks:
            n, mb = a.ranks.split("x")
            gz = next(iter(sorted((a.corpus / "hta/tests/data/df_index_resolver").glob("*.json.gz"))))
            run = tmp / f"ranks-{a.ranks}"
            make_run(gz, run, int(n), float(mb))  # benchmarks/ranks.py's recipe: one scaled copy, rank rewritten
            r = best(check_cmd(run), 1, env)
            rows.append({"input": f"{a.ranks} cold", "traceql": r})
            print(f"{f'{n} ranks x {mb} MB, cold':58} {_fmt(r):>20}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
