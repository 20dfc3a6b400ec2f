"""The run dir is untrusted: discovery stays inside it (symbolic links out are skipped sources, loops end), the
verdict's configuration comes from the checkout, and input-derived text cannot forge terminal output."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
from click.testing import CliRunner
from conftest import FIXTURES, REPO, SAMPLES

from traceql.cli import main
from traceql.discover import discover
from traceql.model.text_safety import visible
from traceql.pipeline import load_run

TRACE = SAMPLES / "demo" / "rank0.pt.trace.json.gz"


def _inside(p: Path, root: Path) -> bool:
    return p.resolve() == root.resolve() or root.resolve() in p.resolve().parents


# ---------------------------------------------------------------- symbolic links


def test_links_to_root_and_parent_neither_escape_nor_loop(tmp_path):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    shutil.copy(TRACE, run / "rank0.pt.trace.json.gz")
    (run / "root").symlink_to("/")
    (run / "sub" / "up").symlink_to("..")
    (run / "sub" / "up2").symlink_to("..")
    (run / "sub" / "upup").symlink_to("../..")  # tmp_path: outside the run dir
    sources = discover(run)
    by = {s.path.relative_to(run).as_posix(): s for s in sources}
    assert by["root"].status == "skipped" and "outside the run dir" in by["root"].detail
    assert by["sub/upup"].status == "skipped" and "outside the run dir" in by["sub/upup"].detail
    # links back into the run dir add nothing: each real file once
    assert [k for k, s in by.items() if s.kind == "kineto"] == ["rank0.pt.trace.json.gz"]
    assert "sub/up" not in by and "sub/up2" not in by
    assert all("\n" not in s.detail for s in sources)


def test_link_to_a_file_outside_is_skipped_and_not_read(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank1.pt.trace.json.gz").symlink_to(SAMPLES / "demo" / "rank1.pt.trace.json.gz")
    shutil.copy(TRACE, run / "rank0.pt.trace.json.gz")
    r = load_run(run, use_cache=False)
    link = next(s for s in r.sources if s.path.name.startswith("rank1"))
    assert link.kind == "unknown" and link.status == "skipped" and "not followed" in link.detail
    assert r.ranks == [0] and r.table("kernels")["rank"].unique().to_list() == [0]
    res = CliRunner().invoke(main, ["check", str(run), "--quiet", "-v"])
    (line,) = [ln for ln in res.stdout.splitlines() if "rank1.pt.trace.json.gz" in ln]
    assert "outside the run dir" in line


def test_link_inside_the_run_dir_reads_its_target_once_under_its_own_name(tmp_path):
    shutil.copy(TRACE, tmp_path / "rank0.pt.trace.json.gz")
    (tmp_path / "again.json.gz").symlink_to("rank0.pt.trace.json.gz")
    (tmp_path / "alias").symlink_to(".", target_is_directory=True)
    kin = [s for s in discover(tmp_path) if s.kind == "kineto"]
    assert [s.path.name for s in kin] == ["rank0.pt.trace.json.gz"]


def test_link_loop_is_a_skipped_source(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    by = {s.path.name: s for s in discover(tmp_path)}
    assert by["a"].status == by["b"].status == "skipped" and "loops" in by["a"].detail


def test_folder_input_holding_a_link_out_is_not_read(tmp_path):
    src = next((FIXTURES / "cpu-divergent-compile" / "torch_compile_debug").iterdir())
    dbg = tmp_path / "torch_compile_debug" / src.name
    shutil.copytree(src, dbg)
    (dbg / "torchinductor" / "secret.py").parent.mkdir(exist_ok=True)
    (dbg / "torchinductor" / "secret.py").symlink_to("/etc/hostname")
    (folder,) = [s for s in discover(tmp_path) if s.kind == "compile_debug"]
    assert folder.status == "skipped" and "symbolic link out of the run dir" in folder.detail


def test_discovery_of_a_link_to_root_ends_quickly(tmp_path):
    """In a subprocess with a deadline: a walk that followed `/` or looped would not end in time."""
    (tmp_path / "root").symlink_to("/")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "loop").symlink_to("..")
    code = f"from traceql.discover import discover; print(len(discover(__import__('pathlib').Path({str(tmp_path)!r}))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr


# ---------------------------------------------------------------- configuration comes from the checkout


def _run_with_config(tmp_path, text):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "h200-exposed-allreduce", run)
    (run / "traceql.toml").write_text(text)
    return run


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", "from traceql.cli import main; main()", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_config_inside_the_run_dir_is_ignored_and_named(tmp_path):
    # fail-on never in an uploaded run would turn a failing check green
    run = _run_with_config(tmp_path, 'fail-on = "never"\n[rules.TQL101]\nmin_exposed_ms = 1000000\n')
    res = CliRunner().invoke(main, ["check", str(run), "--select", "TQL101", "--quiet"])
    assert res.exit_code == 1, res.output
    notes = [ln for ln in res.stderr.splitlines() if "traceql.toml" in ln]
    assert len(notes) == 1 and "--trust-run-config" in notes[0]
    res = CliRunner().invoke(main, ["check", str(run), "--select", "TQL101", "--quiet", "--trust-run-config"])
    assert res.exit_code == 0, res.output


def test_cwd_inside_the_run_dir_does_not_pick_up_its_config(tmp_path):
    run = _run_with_config(tmp_path, 'fail-on = "never"\n')
    out = _cli(["check", ".", "--select", "TQL101", "--quiet"], cwd=run)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ignoring" in out.stderr


def test_checkout_config_applies(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "h200-exposed-allreduce", run)
    (tmp_path / "traceql.toml").write_text('fail-on = "never"\n')
    out = _cli(["check", run, "--select", "TQL101", "--quiet"], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_bad_config_values_are_usage_errors_naming_file_and_key(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "h200-exposed-allreduce", run)
    cases = [
        ('[rules.TQL101]\nmin_exposed_ms = "lots"\n', "min_exposed_ms"),
        ('selct = ["TQL1"]\n', "selct"),
        ('select = ["TQL9"]\n', "select"),
        ('ignore = ["TQL999"]\n', "ignore"),
        ('fail-on = "sometimes"\n', "fail-on"),
    ]
    for text, key in cases:
        cfg = tmp_path / "traceql.toml"
        cfg.write_text(text)
        res = CliRunner().invoke(main, ["check", str(run), "--config", str(cfg), "--quiet"])
        assert res.exit_code == 2, (text, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and str(cfg) in lines[0] and key in lines[0], (text, lines)


# ---------------------------------------------------------------- output that cannot be forged

PAYLOAD = "\x1b]52;c;SGVsbG8=\x07\x1b]0;pwned\x07\x1b[2J\x1b[H\nNo findings\r\u009b31m"


def _hostile_run(corpus, tmp_path) -> Path:
    """A real single-GPU trace (HTA's MI250 ROCm 6.2 sample: it reports GPU idle gaps between named kernels) with
    every kernel renamed to carry terminal escapes, under a file name that carries them too."""
    run = tmp_path / "run"
    run.mkdir()
    with gzip.open(corpus / "hta" / "tests" / "data" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz", "rb") as f:
        doc = orjson.loads(f.read())
    n = 0
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel":
            ev["name"] = PAYLOAD + "k" + str(n)
            n += 1
    assert n
    name = "trace\x1b]0;title\x07\n\x1b[2J.pt.trace.json.gz"
    with gzip.open(run / name, "wb") as f:
        f.write(json.dumps(doc).encode())
    return run


def test_visible_escapes_controls_only():
    assert visible("a\x1b[2Jb\nc\r\x07\u009b\x7f\u202e") == "a\\x1b[2Jb\\nc\\r\\x07\\u009b\\x7f\\u202e"
    assert visible("ncclDevKernel_AllReduce<float> C:\\path é") == "ncclDevKernel_AllReduce<float> C:\\path é"


def test_hostile_kernel_and_file_names_reach_the_terminal_escaped(corpus, tmp_path):
    run = _hostile_run(corpus, tmp_path)
    res = CliRunner().invoke(main, ["check", str(run), "--quiet", "-v"])
    assert res.exit_code in (0, 1), res.output
    out = res.stdout
    for raw in ("\x1b", "\x07", "\r", "\u009b"):
        assert raw not in out, repr(raw)
    assert "\\x1b]52;c;SGVsbG8=\\x07" in out  # the kernel name, shown, not executed
    assert "trace\\x1b]0;title\\x07\\n\\x1b[2J.pt.trace.json.gz" in out  # the file name on its source line
    # no forged line: "No findings" never starts a line, each source is on one line
    assert not any(ln.startswith("No findings") for ln in out.splitlines())
    src_lines = [ln for ln in out.splitlines() if ".pt.trace.json.gz" in ln and "(kineto" in ln]
    assert len(src_lines) == 1 and "rank 0 assumed" in src_lines[0]
    # JSON keeps the real name (its encoder escapes it)
    doc = json.loads(CliRunner().invoke(main, ["check", str(run), "--quiet", "--format", "json"]).stdout)
    assert any(PAYLOAD in str(f["evidence"].get("prev_name")) for f in doc["findings"])


def test_error_lines_on_stderr_are_escaped(tmp_path):
    bad = tmp_path / "x\x1b]0;t\x07\n.toml"
    bad.write_text("select = [\n")
    res = CliRunner().invoke(main, ["check", str(FIXTURES / "h200-exposed-allreduce"), "--config", str(bad), "--quiet"])
    assert res.exit_code == 2
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "\\x1b]0;t\\x07\\n.toml" in res.stderr


def test_a_link_not_followed_is_named_without_verbose(tmp_path):
    # a trace linked into the run dir from outside is not read: the report must say so, not fold it into "other files"
    from traceql.cli import main as _main

    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    demo = Path(__file__).resolve().parents[1] / "samples" / "demo"
    shutil.copy(demo / "rank0.pt.trace.json.gz", run / "rank0.pt.trace.json.gz")
    shutil.copy(demo / "rank1.pt.trace.json.gz", outside / "rank1.pt.trace.json.gz")
    (run / "rank1.pt.trace.json.gz").symlink_to(outside / "rank1.pt.trace.json.gz")
    res = CliRunner().invoke(_main, ["check", str(run), "-q", "--no-cache", "--select", "TQL1"])
    lines = [ln for ln in res.output.splitlines() if "rank1.pt.trace.json.gz" in ln]
    assert len(lines) == 1 and "skipped" in lines[0] and "outside the run dir" in lines[0], res.output


def test_an_empty_trace_is_named_without_verbose_and_an_empty_log_is_not(tmp_path):
    from traceql.cli import main as _main

    run = tmp_path / "run"
    run.mkdir()
    demo = Path(__file__).resolve().parents[1] / "samples" / "demo"
    shutil.copy(demo / "rank0.pt.trace.json.gz", run / "rank0.pt.trace.json.gz")
    (run / "rank1.pt.trace.json").write_bytes(b"")
    (run / "rank1.stderr.log").write_bytes(b"")
    res = CliRunner().invoke(_main, ["check", str(run), "-q", "--no-cache", "--select", "TQL1,TQL003"])
    shown = [ln for ln in res.output.splitlines() if "empty file" in ln and not ln.startswith("  - ")]
    # an empty trace is a lost input: an error source (TQL003), not a neighbour passed over; an empty log is routine
    assert len(shown) == 1 and "rank1.pt.trace.json" in shown[0] and "error" in shown[0], res.output
    assert "TQL003" in res.output and res.exit_code == 1
