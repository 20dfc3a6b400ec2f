"""Terminal manners and output paths of the commands: width, colour, NO_COLOR, --out errors, the run-config trust
rule of annotate and diff, and --help/--version without polars."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceql.cli import _common, main

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"
# long messages (kernel names, sync calls, compile reasons), two ranks, a compiled run
WIDE = ["h200x2-straggler-nsys", "h200-graph-break-hot-loop", "compile-5rank-graph-divergence", "nccl-log-misconfigured"]
ESC = "\x1b["


def _cli(*args, env=None):
    return CliRunner().invoke(main, list(map(str, args)), env=env)


def _overlong(text: str, width: int) -> list[str]:
    """Lines over `width` that are not a single unbreakable token after their lead ("  - ", an indent)."""
    bad = []
    for ln in text.splitlines():
        if len(ln) <= width:
            continue
        last = ln.split()[-1]
        lead = ln.rstrip()[: -len(last)]
        # allowed: a short lead ("  - ", "traceql check ") and one token too long to share a line (a path, a name)
        if not (len(lead) <= 20 and len(last) > width // 2):
            bad.append(ln)
    return bad


@pytest.mark.parametrize("name", WIDE)
@pytest.mark.parametrize("width", [80, 60])
def test_text_report_wraps_at_the_width(name, width):
    r = _cli("check", FIX / name, "--width", width, "-q", "-v", "--fail-on", "never")
    assert r.exit_code == 0, r.output
    assert not _overlong(r.stdout, width), _overlong(r.stdout, width)
    lines = r.stdout.splitlines()
    assert any(ln.startswith("  - ") for ln in lines)
    # continuation lines are indented under their text, never at column 0
    wide = _cli("check", FIX / name, "--width", 400, "-q", "-v", "--fail-on", "never").stdout
    assert len(lines) > len(wide.splitlines())  # it did wrap
    assert " ".join(r.stdout.split()) == " ".join(wide.split())  # and lost or added no word


def test_width_follows_columns_and_off_a_terminal_an_entry_is_one_line():
    name = FIX / "h200x2-straggler-nsys"
    off_tty = _cli("check", name, "-q", "--fail-on", "never").stdout
    lines = off_tty.splitlines()
    # a log keeps one line per finding, so that grep finds a whole message (after it its cost; a consequence sits
    # indented under its cause)
    res = __import__("traceql.pipeline", fromlist=["check"]).check(name)
    for f in res.findings:
        assert any(ln.lstrip().startswith("- ") and f.message in ln for ln in lines), f.message
    cols = _cli("check", name, "-q", "--fail-on", "never", env={"COLUMNS": "70"}).stdout
    assert not _overlong(cols, 70)
    summ = _cli("summary", name, "-q", "--width", 80)
    assert summ.exit_code == 0 and max(map(len, summ.stdout.splitlines())) <= 80


def test_color_flag():
    name = FIX / "cpu-straggler"
    assert ESC in _cli("check", name, "-q", "--color", "always").stdout
    assert ESC not in _cli("check", name, "-q", "--color", "never").stdout
    assert ESC not in _cli("check", name, "-q").stdout  # auto, not a terminal
    assert ESC in _cli("summary", name, "-q", "--color", "always").stdout


@pytest.mark.parametrize(("mode", "tty", "no_color", "want"), [
    ("auto", True, None, True), ("auto", True, "1", False), ("auto", True, "", True), ("auto", False, None, False),
    ("always", False, "1", True), ("never", True, None, False)])
def test_color_modes(monkeypatch, mode, tty, no_color, want):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color is not None:
        monkeypatch.setenv("NO_COLOR", no_color)
    assert _common._color(mode) is want
    assert _common._color(mode, to_file=True) is (mode == "always")


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@pytest.mark.parametrize(("env", "colored"), [({}, True), ({"NO_COLOR": "1"}, False)])
def test_on_a_real_terminal_color_and_width_follow_it(env, colored):
    """check on a pseudo-terminal of 72 columns: coloured unless NO_COLOR, wrapped at the terminal's width."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 72, 0, 0))
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    e.update(env, PYTHONPATH=str(REPO), TERM="xterm")
    p = subprocess.Popen([sys.executable, "-m", "traceql", "check", str(FIX / "h200x2-straggler"), "-q"],
                         stdout=slave, stderr=subprocess.DEVNULL, env=e, cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    p.wait(timeout=300)
    os.close(master)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert (ESC in out) is colored
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", out).replace("\r", "")
    assert "TQL302" in plain and not _overlong(plain, 72)


@pytest.mark.parametrize("cmd", [["check"], ["annotate"], ["graph"]])
def test_out_to_a_missing_folder_a_directory_or_under_a_file(cmd, tmp_path):
    (tmp_path / "afile").write_text("x")
    for out, says in [(tmp_path / "missing" / "x.json", "does not exist"), (tmp_path, "is a directory"),
                      (tmp_path / "afile" / "x.json", "is not a folder")]:
        r = _cli(*cmd, FIX / "cpu-straggler", "--out", out)
        assert r.exit_code == 2, (cmd, out, r.output)
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and str(out) in err[0] and says in err[0], r.stderr
        assert "Traceback" not in r.output


def test_out_unwritable_is_one_line(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    # running as root ignores permission bits: the check is exercised through os.access, and the write itself
    # (a failure after the check: a full disk, a race) through a write that raises
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p).startswith(str(ro)) else real(p, m))
    r = _cli("check", FIX / "cpu-straggler", "--out", ro / "x.txt")
    assert r.exit_code == 2 and "not writable" in r.stderr and str(ro / "x.txt") in r.stderr
    monkeypatch.setattr(os, "access", real)

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    monkeypatch.setattr(Path, "write_bytes", full)
    for cmd in (["check"], ["annotate"]):
        r = _cli(*cmd, FIX / "cpu-straggler", "--out", tmp_path / "x.json")
        assert r.exit_code == 2, r.output
        assert r.stderr.strip().count("\n") == 0 and "No space left on device" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("cmd", ["annotate", "diff"])
def test_annotate_and_diff_read_run_configs_only_when_trusted(cmd, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(FIX / "cpu-straggler", run)
    # a config inside the (untrusted) run that would hide every finding
    (run / "traceql.toml").write_text('ignore = ["TQL1", "TQL2", "TQL3", "TQL4", "TQL5"]\n')
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.json"
    args = ["annotate", run, "--out", out, "-q"] if cmd == "annotate" else ["diff", run, run, "--format", "json", "-q"]

    def findings(r):
        import json

        if cmd == "annotate":
            return json.loads(out.read_text())["otherData"]["traceql"]["findings"]
        return json.loads(r.stdout)["a"]["findings"]

    r = _cli(*args)
    assert r.exit_code == 0, r.output
    assert "not trusted" in r.stderr and "traceql.toml" in r.stderr
    untrusted = findings(r)
    assert untrusted > 0
    r = _cli(*args, "--trust-run-config")
    assert r.exit_code == 0, r.output
    assert findings(r) < untrusted  # the run's config was read: it ignored those rules


def test_help_and_version_do_not_import_polars():
    code = ("import sys\nfrom traceql.cli import main\n"
            "for args in (['--version'], ['--help'], ['check', '--help'], ['annotate', '--help']):\n"
            "    try:\n        main(args, standalone_mode=False)\n    except SystemExit:\n        pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'pyarrow', 'networkx', 'numpy', 'rich'))\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


@pytest.mark.parametrize("name", ["rank0.pt.trace.json.gz", "plain"])
def test_a_worker_reports_bytes_read(name, tmp_path, monkeypatch):
    """Progress for long single-file reads: the ingest worker sends its position in the file (gzip: compressed bytes;
    plain JSON: the mapped scanner's offset); the bar shows it as 'x of y MB read'."""
    import gzip as gz

    from traceql import pipeline
    from traceql.discover import discover
    from traceql.ingest import loader

    src = FIX / "h200x2-straggler" / "rank0.pt.trace.json.gz"
    run = tmp_path / "run"
    run.mkdir()
    if name == "plain":
        (run / "rank0.pt.trace.json").write_bytes(gz.decompress(src.read_bytes()))
    else:
        shutil.copy(src, run / name)
    monkeypatch.setenv("TRACEQL_SOURCE_ISOLATION", "always")
    got = []
    loader.ingest(run, discover(run), use_cache=False, read_progress=lambda s, done, total: got.append((s.path.name, done, total)))
    size = next(run.iterdir()).stat().st_size
    assert got and all(0 < d <= t == size for _, d, t in got), got

    class Rec:
        def update(self, task, **kw):
            self.kw = kw

    bar = pipeline._Bar.__new__(pipeline._Bar)
    bar.p, bar.task = Rec(), 0
    bar.reading(discover(run)[-1], 3 << 29, 3 << 30)
    assert bar.p.kw["description"].endswith("1.5 of 3.0 GB read")


def test_no_progress_off_a_terminal():
    r = _cli("check", FIX / "h200x2-straggler-nsys", "--fail-on", "never")
    assert r.exit_code == 0 and "read" not in r.stderr and "ingest" not in r.stderr


def test_capture_out_to_a_file_or_under_one_is_one_line(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for out, says in [(f, "is a file"), (f / "sub", "cannot write the run there")]:
        r = _cli("capture", "straggler", "--out", out, "--ranks", "2")
        assert r.exit_code == 2, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and str(out) in r.stderr and says in r.stderr
