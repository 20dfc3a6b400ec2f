"""The oldest polars traceql runs on: declared once in pyproject.toml, held by traceql.polars_env, and said in one
line where an environment has an older one (the rule pack's SQL would otherwise fail to load, blaming a rule file)."""

from __future__ import annotations

import re
import tomllib

import polars as pl
import pytest
from click.testing import CliRunner

from tests.conftest import REPO
from traceql import polars_env


def test_the_declared_floor_is_the_one_enforced():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(d for d in deps if re.match(r"polars\b", d))
    assert floor.split(";")[0].replace(" ", "") == "polars>=" + ".".join(map(str, polars_env.MIN_POLARS))
    polars_env.require(pl.__version__)  # the polars the tests run on meets it


@pytest.mark.parametrize("version, ok", [("2.1.0", True), ("2.10.3", True), ("3.0.0rc1", True), ("2.0.0", False),
                                         ("1.44.2", False), ("0.20.31", False), ("local-build", True)])
def test_require_reads_major_and_minor(version, ok):
    if ok:
        polars_env.require(version)
    else:
        with pytest.raises(polars_env.PolarsTooOld, match=rf"polars {re.escape(version)} is too old.*pip install -U"):
            polars_env.require(version)


@pytest.mark.parametrize("command", [["check", "samples/demo", "--no-cache"], ["summary", "samples/demo"]])
def test_an_old_polars_is_one_line_and_exit_2(monkeypatch, tmp_path, command):
    from traceql import pipeline  # noqa: F401  (imported before, as an earlier test would: the check must not rest on it)
    from traceql.cli import main

    monkeypatch.setenv("TRACEQL_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(pl, "__version__", "1.44.2")
    res = CliRunner().invoke(main, command)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert lines == ["traceql: polars 1.44.2 is too old: traceql needs polars >= 2.1 (pip install -U 'polars>=2.1')"]
