"""Work a command no longer repeats on every run, checked by what it leaves behind (never by timing)."""

from __future__ import annotations

from pathlib import Path

from traceql import pipeline
from traceql.rules import sql_guard
from traceql.rules.loader import load_rules

DEMO = Path(__file__).resolve().parents[1] / "samples" / "demo"


def test_the_bundled_pack_reads_a_rule_s_sql_only_where_it_runs():
    sql_rules = [r for r in load_rules() if r.sql]
    sql_guard._plan.cache_clear()
    load_rules()
    assert sql_guard._plan.cache_info().currsize < len(sql_rules) // 2  # the views' statements at most
    res = pipeline.check(DEMO, use_cache=False)
    ran = {r.rule.id for r in res.results if r.status == "ran" and r.rule.sql}
    skipped = {r.rule.id for r in res.results if r.status == "skipped" and r.rule.sql}
    assert ran and skipped  # the demo has no NCCL log and no compile log: their SQL rules do not run
    read = sql_guard._plan.cache_info().currsize
    assert read < len(sql_rules)  # the skipped rules' statements were never read
    # a full validation (`traceql rules check`, a user's pack) guards every statement at load
    sql_guard._plan.cache_clear()
    load_rules(trust_manifest=False)
    assert sql_guard._plan.cache_info().currsize >= len(sql_rules)


# ------------------------------------------------------------------ the end of the process (traceql.cli._common)

import os
import subprocess
import sys

REPO = Path(__file__).resolve().parents[1]


def _check(*args, code: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """`traceql check ...` as its own process, after `code` (run first, in that process)."""
    prog = f"{code}\nimport sys\nsys.argv = ['traceql', 'check', *sys.argv[1:]]\nfrom traceql.cli import main\nmain(prog_name='traceql')\n"
    return subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=300)


def test_a_check_that_ends_at_once_says_and_exits_what_the_interpreter_s_exit_would(tmp_path):
    """The fast end (os._exit once the report is out) against the interpreter's own exit, forced by a second thread
    left running (exit_now leaves the interpreter to join it): the same report, the same status, and the atexit
    handlers run on both (with the collector on: the imports' pause is over); only the interpreter's exit frees the modules' objects (a __del__ of one writes a file)."""
    mark_fast, mark_slow = tmp_path / "fast", tmp_path / "slow"
    atexit_code = ("import atexit, pathlib\nimport gc\natexit.register(lambda: pathlib.Path({0!r}).write_text(f'ran {{gc.isenabled()}}'))\n"
                   "class _Freed:\n    def __del__(self, p=pathlib.Path({0!r} + '.freed')):\n        p.write_text('')\n"
                   "import traceql\ntraceql._freed = _Freed()\n")
    # a thread that lives until the main thread ends: the interpreter must join it, so exit_now leaves the exit to it
    thread_code = "import threading\nthreading.Thread(target=threading.main_thread().join).start()\n"
    for fmt in ("text", "json"):
        args = [str(DEMO), "--no-cache", "-q", "--format", fmt]
        fast = _check(*args, code=atexit_code.format(str(mark_fast)))
        slow = _check(*args, code=atexit_code.format(str(mark_slow)) + thread_code)
        assert fast.returncode == slow.returncode == 1  # the demo has warnings
        if fmt == "json":
            import json

            a, b = json.loads(fast.stdout), json.loads(slow.stdout)
            for k in ("elapsed_s", "timings", "generated_at"):
                a.pop(k, None), b.pop(k, None)
            assert a == b
        else:
            assert fast.stdout == slow.stdout and fast.stdout.endswith("\n")
        assert fast.stderr == slow.stderr
        assert mark_fast.read_text() == mark_slow.read_text() == "ran True"  # the collector on again after the imports
        assert Path(f"{mark_slow}.freed").exists() and not Path(f"{mark_fast}.freed").exists()
        for p in tmp_path.iterdir():
            p.unlink()


def test_a_check_writes_its_out_file_whole_before_it_ends(tmp_path):
    out = tmp_path / "r.json"
    p = _check(str(DEMO), "--no-cache", "-q", "--format", "json", "--out", str(out), "--fail-on", "never")
    assert p.returncode == 0 and p.stdout == ""
    import json

    assert json.loads(out.read_text())["findings"]


def test_only_a_command_line_of_the_process_s_own_ends_at_once():
    """click's CliRunner (args given) gets click's SystemExit, and the process goes on."""
    from click.testing import CliRunner

    from traceql.cli import main

    res = CliRunner().invoke(main, ["check", str(DEMO), "--no-cache", "-q", "--fail-on", "never"])
    assert res.exit_code == 0 and "finding(s)" in res.output


def test_usage_errors_keep_the_interpreter_s_exit():
    p = _check(str(DEMO), "--select", "TQL999", "--no-cache", "-q")
    assert p.returncode == 2 and "TQL999" in p.stderr


def test_copy_names_read_by_ascii_classes_as_by_unicode_ones():
    """ingest.kineto reads a copy's kinds with ASCII word classes (polars compiles a Unicode \\w into a large automaton
    on first use): the same groups as the Unicode pattern gave, on every GPU activity name of the Kineto fixtures."""
    import polars as pl

    from traceql.discover import discover
    from traceql.ingest import read_source

    names = set()
    for d in ("h200-pageable-copy", "h200-sync-memcpy", "h200-straggler", "h200x2-ddp-eager", "h200-cold-start"):
        for s in discover(REPO / "fixtures" / d):
            if s.kind == "kineto":
                names |= set(read_source(s)["kernels"]["name"].unique().to_list())
    names |= {"Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)", "Memset (Device)", "Memcpy DtoD",
              "Memcpy PtoP (Device -> Device)", "Memset (Pinned)", "Memcpy HtoD (Pageable -> Device) extra"}
    assert any(n.startswith("Memcpy") for n in names) and any(n.startswith("Memset") for n in names)
    col = pl.Series("n", sorted(n for n in names if n is not None)).to_frame()
    unicode = col.select(pl.col("n").str.extract_groups(r"^Memcpy (\w+)(?: \((\w+) -> (\w+)\))?").alias("g"),
                         pl.col("n").str.extract(r"^Memset \((\w+)\)", 1).alias("s"))
    ascii_ = col.select(
        pl.col("n").str.extract_groups(r"^Memcpy ([0-9A-Za-z_]+)(?: \(([0-9A-Za-z_]+) -> ([0-9A-Za-z_]+)\))?").alias("g"),
        pl.col("n").str.extract(r"^Memset \(([0-9A-Za-z_]+)\)", 1).alias("s"))
    assert unicode.equals(ascii_)
    import inspect

    from traceql.ingest import kineto

    src = inspect.getsource(kineto._kernel_rows)  # the patterns compared are the reader's own
    assert r'r"^Memcpy ([0-9A-Za-z_]+)(?: \(([0-9A-Za-z_]+) -> ([0-9A-Za-z_]+)\))?"' in src
    assert r'r"^Memset \(([0-9A-Za-z_]+)\)"' in src


def test_a_check_whose_sources_went_to_workers_ends_at_once_as_well():
    """Sources read in budget workers (TRACEQL_SOURCE_ISOLATION=always): the pool is closed by its atexit handler
    before the fast end, and the report and status are those of the interpreter's own exit."""
    import json

    env = {"TRACEQL_SOURCE_ISOLATION": "always"}
    args = [str(DEMO), "--no-cache", "-q", "--format", "json"]
    fast = _check(*args, env=env)
    slow = _check(*args, env=env, code="import threading\nthreading.Thread(target=threading.main_thread().join).start()\n")
    assert fast.returncode == slow.returncode == 1 and fast.stderr == slow.stderr
    a, b = json.loads(fast.stdout), json.loads(slow.stdout)
    for k in ("elapsed_s", "timings", "generated_at"):
        a.pop(k, None), b.pop(k, None)
    assert a == b and a["findings"]
