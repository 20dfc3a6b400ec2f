"""What a command imports, pinned: each command pays only for what it uses (issue 20, startup).

Each case runs the command in a fresh interpreter and reads `sys.modules` at its end. Adding an eager import back
(polars in the CLI modules, rich in the text report, tarfile in traceql.archive, networkx or Dask on the check path)
fails here, whatever the timing of the box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The command runs as the console script does (traceql.cli.main); the module list is taken before json is imported.
_HARNESS = """
import sys
from traceql.cli import main
try:
    main(sys.argv[2:], prog_name="traceql")
except SystemExit:
    pass
mods = sorted(sys.modules)
import json
open(sys.argv[1], "w").write(json.dumps(mods))
"""

# None of these is needed to print help or the version: they cost 0.1-0.3 s of a `--help` that should answer at once.
HEAVY = ("polars", "rich", "yaml", "pyarrow", "msgspec", "orjson", "networkx", "starlette", "uvicorn", "dask",
         "distributed", "traceql.ingest", "traceql.rules", "traceql.link", "traceql.report", "traceql.pipeline")

# A text `check` of a plain run dir: no graph library, no service, no cluster client, no archive reader, no other
# renderer. (zipfile, bz2, lzma and shutil are not listed: polars imports them through importlib.metadata.)
NOT_FOR_A_TEXT_CHECK = ("networkx", "starlette", "uvicorn", "multipart", "dask", "distributed", "tarfile",
                        "zstandard", "rich", "traceql.executor", "traceql.report.html", "traceql.report.sarif",
                        "traceql.report.json", "traceql.report.diff", "traceql.report.annotate", "traceql.serve",
                        "traceql.capture", "traceql.cli.serve", "traceql.cli.capture", "traceql.cli.graph", "torch",
                        "multiprocessing", "concurrent.futures.process")  # those two: only where workers start


def _modules(tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACEQL_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", _HARNESS, str(out), *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert out.exists(), r.stderr[-2000:]
    return set(json.loads(out.read_text()))


def _loaded(mods: set[str], names) -> list[str]:
    return sorted(n for n in names if n in mods or any(m.startswith(n + ".") for m in mods))


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], ["-h"],
    ["check", "--help"], ["summary", "--help"], ["rules", "--help"], ["rules", "list", "--help"],
    ["rules", "explain", "--help"], ["rules", "test", "--help"], ["cache", "--help"], ["cache", "info", "--help"],
    ["annotate", "--help"], ["diff", "--help"], ["query", "--help"], ["graph", "--help"], ["capture", "--help"],
    ["capture", "list", "--help"], ["serve", "--help"], ["serve", "token", "--help"], ["whatif", "--help"],
])
def test_help_and_version_import_nothing_heavy(tmp_path, args):
    mods = _modules(tmp_path, *args)
    assert "traceql.cli" in mods  # the harness ran the command
    assert _loaded(mods, HEAVY) == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], []])
def test_version_and_help_load_no_command_module(tmp_path, args):
    mods = _modules(tmp_path, *args)
    assert "traceql.cli" in mods
    assert sorted(m for m in mods if m.startswith("traceql.cli.") and m != "traceql.cli._common") == []


def test_the_console_scripts_version_imports_not_even_click(tmp_path):
    """`traceql --version` as the console script runs it (traceql.__main__.run) says what click's version option
    says, without importing click; beside other arguments click answers it."""
    from click.testing import CliRunner

    from traceql.cli import main

    code = ("import sys; sys.argv = ['traceql', '--version']; from traceql.__main__ import run; rc = run(); "
            "print('click' in sys.modules, rc)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    said = CliRunner().invoke(main, ["--version"])
    assert said.exit_code == 0
    assert r.stdout == said.output + "False 0\n"
    # not alone: the entry hands the command line to click's group, which answers it
    code = ("import sys; sys.argv = ['traceql', '--version', '--help']; from traceql.__main__ import run\n"
            "try:\n    run()\nexcept SystemExit:\n    pass\nprint('click' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "True"


def test_help_lists_each_command_in_the_commands_own_words():
    """`traceql --help` lists the commands from COMMANDS without loading them; each line must be what the loaded
    command itself gives, at every width click may cut it to."""
    import click

    from traceql.cli import COMMANDS, main

    for name, (_, summary) in COMMANDS.items():
        real = main.get_command(None, name)
        stand_in = click.Command(name, help=summary)
        assert not real.hidden and not real.deprecated and real.short_help is None, name
        for limit in range(1, 240):
            assert stand_in.get_short_help_str(limit) == real.get_short_help_str(limit), (name, limit)


def test_help_in_a_fresh_process_is_the_help_with_every_command_loaded():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    loading = ("import sys; from traceql.cli import COMMANDS, main\n"
               "for name in COMMANDS: main.get_command(None, name)\n"
               "main(['--help'], prog_name='traceql')")
    for columns in ("40", "100"):
        env["COLUMNS"] = columns
        fresh, loaded = (subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                                        timeout=120) for args in (["-m", "traceql", "--help"], ["-c", loading]))
        assert fresh.returncode == 0 and loaded.returncode == 0, fresh.stderr + loaded.stderr
        assert "Commands:" in fresh.stdout
        assert fresh.stdout == loaded.stdout


def test_every_registered_command_loads_and_help_lists_them_all(tmp_path):
    from click.testing import CliRunner

    from traceql.cli import COMMANDS, main

    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    listed = [line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)
    for name in COMMANDS:
        assert main.get_command(None, name).name == name


def test_cache_info_needs_no_polars(tmp_path):
    mods = _modules(tmp_path, "cache", "info")
    assert "traceql.cache" in mods
    assert _loaded(mods, ("polars", "rich", "yaml", "traceql.ingest", "traceql.rules")) == []


def test_a_text_check_imports_only_what_it_uses(tmp_path):
    mods = _modules(tmp_path, "check", "samples/demo", "-q", "--no-cache", "--fail-on", "never")
    assert {"traceql.pipeline", "traceql.report.text", "polars"} <= mods  # it did check and render
    assert _loaded(mods, NOT_FOR_A_TEXT_CHECK) == []


def test_the_archive_module_loads_its_readers_only_for_an_archive(tmp_path):
    code = ("import sys; from pathlib import Path; from traceql import archive; "
            "assert not archive.is_archive(Path('samples/demo')); "
            "assert not archive.is_archive(Path('samples/demo/manifest.json')); "
            "assert not archive.is_archive(Path('samples/demo/rank0.pt.trace.json.gz')); "
            "print(' '.join(m for m in ('tarfile', 'zipfile', 'bz2', 'lzma', 'tempfile', 'polars') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


def test_model_names_resolve_lazily_and_all_of_them_exist():
    import traceql.model as model

    for name in model.__all__:
        assert getattr(model, name) is not None
    from traceql.model.tables import SCHEMAS

    assert model.SCHEMAS is SCHEMAS
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        model.Nope  # noqa: B018


def test_the_recognised_only_kinds_are_those_whose_module_says_so():
    """ingest.loader tries the cache before importing a reader; the kinds it passes over must be exactly those no
    reader reads."""
    import importlib

    from traceql.ingest import _MODULES
    from traceql.ingest.loader import RECOGNISED_ONLY

    assert RECOGNISED_ONLY == {k for k, m in _MODULES.items() if not getattr(importlib.import_module(m), "SUPPORTED", False)}


def test_a_warm_check_imports_no_reader(tmp_path):
    """A re-check served by the Parquet cache does not import the Kineto reader (pyarrow, msgspec, the scanner)."""
    first = _modules(tmp_path, "check", "samples/demo", "-q", "--fail-on", "never")
    assert "traceql.ingest.kineto" in first  # the first check read the traces
    again = _modules(tmp_path, "check", "samples/demo", "-q", "--fail-on", "never")
    assert "traceql.pipeline" in again
    assert _loaded(again, ("traceql.ingest.kineto", "pyarrow", "msgspec")) == []
