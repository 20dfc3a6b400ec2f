"""What a cached (warm) check reuses beyond the sources' tables: the step columns link_run assigns and the rule
pack's views, both kept in the run's derived-table cache; and derived tables whose inputs are all empty, which are
never built. Each must give exactly what the cold path gives. conftest gives every test its own cache folder."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceql import link, pipeline
from traceql.link import STEPPED
from traceql.model.derived import DERIVED
from traceql.rules import views as viewsmod
from traceql.rules.loader import default_rules_dir, views_of

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "fixtures" / "h200x2-straggler"  # kernels, runtime, collectives, steps: every stepped table has rows
CPU = ROOT / "fixtures" / "cpu-straggler"  # no kernels, no runtime


def _findings(res) -> list:
    return sorted((f.rule, tuple(f.ranks), f.step, f.message, f.fingerprint) for f in res.findings)


def _stepped(run) -> dict[str, pl.Series]:
    return {n: run.table(n)["step"] for n in STEPPED}


def test_a_warm_check_reuses_the_step_columns_and_finds_the_same():
    cold = pipeline.check(GPU, use_cache=False)
    first = pipeline.check(GPU)  # fills the cache
    folder = first.run.derived_cache
    assert folder is not None
    stored = {p.name for p in folder.glob("step-of-*.parquet")}
    assert stored == {f"step-of-{n}.parquet" for n in STEPPED if first.run.table(n).height}
    assert "step-of-kernels.parquet" in stored
    warm = pipeline.check(GPU)
    for name, col in _stepped(cold.run).items():
        assert warm.run.table(name)["step"].equals(col, check_names=True), name
        assert warm.run.table(name).schema == cold.run.table(name).schema, name
    assert _findings(warm) == _findings(cold) == _findings(first)


def test_a_step_entry_that_does_not_fit_is_a_miss(monkeypatch):
    cold = pipeline.check(GPU, use_cache=False)
    folder = pipeline.check(GPU).run.derived_cache
    # one row short: the columns cannot belong to these tables, so every step is assigned again
    bad = pl.read_parquet(folder / "step-of-host_ops.parquet").head(-1)
    bad.write_parquet(folder / "step-of-host_ops.parquet")
    calls = []
    from traceql.link import steps

    real = steps.assign_steps
    monkeypatch.setattr(steps, "assign_steps", lambda run: (calls.append(1), real(run))[1])
    warm = pipeline.check(GPU)
    assert calls == [1]
    for name, col in _stepped(cold.run).items():
        assert warm.run.table(name)["step"].equals(col), name
    assert _findings(warm) == _findings(cold)


def test_a_cold_check_writes_no_cache():
    res = pipeline.check(GPU, use_cache=False)
    assert res.run.derived_cache is None


def test_views_are_read_back_from_the_cache_unchanged():
    views = views_of([default_rules_dir()])
    first = pipeline.load_run(GPU)
    built = viewsmod.frame(first, "runtime_kernels", views)
    assert built.height  # the fixture has launches with kernels: the view has rows to compare
    entry = viewsmod.cache_name(views["runtime_kernels"], views)
    assert (first.derived_cache / f"{entry}.parquet").exists()
    again = pipeline.load_run(GPU)
    assert again.derived_cache == first.derived_cache
    assert viewsmod.frame(again, "runtime_kernels", views).equals(built)


def test_a_view_entry_changes_with_its_sql_and_the_views_it_reads():
    views = views_of([default_rules_dir()])
    v = views["runtime_kernels"]
    name = viewsmod.cache_name(v, views)
    other = viewsmod.View(v.name, v.sql + " AND r.rank >= 0", v.doc, v.path, v.columns)
    other.reads = v.reads
    assert viewsmod.cache_name(other, views) not in (None, name)
    # a view over a table of the sources' statuses is never cached: the cache key does not cover them
    stat = viewsmod.View("over_problems", "SELECT * FROM source_problems", "doc", v.path, {})
    stat.reads = ["source_problems"]
    assert viewsmod.cache_name(stat, views) is None
    on_top = viewsmod.View("on_top", "SELECT * FROM over_problems", "doc", v.path, {})
    on_top.reads = ["over_problems"]
    assert viewsmod.cache_name(on_top, {**views, "over_problems": stat}) is None


def _empty_inputs_tables(run) -> list[str]:
    return [n for n, d in DERIVED.items() if d.reads and link._empty_inputs(run, n)]


def test_a_table_whose_inputs_are_all_empty_is_not_built(monkeypatch):
    run = pipeline.load_run(CPU, use_cache=False)
    assert run.table("kernels").height == 0 and run.table("runtime").height == 0
    skipped = _empty_inputs_tables(run)
    assert {"path_kernels", "gemm_classes"} <= set(skipped)
    reg = link.derived_tables()
    called = []
    for name in skipped:
        monkeypatch.setitem(reg, name, lambda r, n=name: called.append(n))
    for name in skipped:
        df = link.ensure(run, name)
        assert df.height == 0 and dict(df.schema) == DERIVED[name].schema, name
    assert called == []


def test_the_shortcut_gives_what_the_builders_give():
    """On runs with and without GPU data: every table the shortcut would skip, built by its builder, is empty with
    no note; and a table with rows in any input is built as before."""
    for fx in (CPU, GPU, ROOT / "samples" / "demo"):
        run = pipeline.load_run(fx, use_cache=False)
        skipped = set(_empty_inputs_tables(run))
        for name in sorted(skipped):
            before = list(run.notes)
            df = link.derived_tables()[name](run)
            assert df.height == 0 and run.notes == before, f"{fx.name}: {name}"
        for name, d in DERIVED.items():
            if name not in skipped and any(link.ensure(run, t).height for t in d.reads):
                assert not link._empty_inputs(run, name), f"{fx.name}: {name}"


def test_tables_held_on_workers_are_not_empty():
    run = pipeline.load_run(CPU, use_cache=False)
    assert link._empty_inputs(run, "path_kernels")
    run.held["kernels"] = 10
    assert not link._empty_inputs(run, "path_kernels")


@pytest.mark.parametrize("name", ["source_errors", "source_problems"])
def test_tables_of_the_sources_statuses_always_run_their_builder(name):
    assert not DERIVED[name].reads
    run = pipeline.load_run(CPU, use_cache=False)
    assert not link._empty_inputs(run, name)
