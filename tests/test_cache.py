"""The Parquet cache stays under its cap (TRACEQL_CACHE_MAX_MB): least recently used entries go first, the entry just
written stays, files it did not write are never touched, and a half-deleted entry reads as a miss.
Every test gets its own cache folder (conftest points TRACEQL_CACHE_DIR at a fresh tmp folder)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from traceql.cli import main
from traceql.cli.cache import _size
from traceql import cache
from traceql.model import Source

OLD = 1_000_000  # seconds since the epoch: "used long ago", set with os.utime so that no test sleeps


def key(i: int) -> str:
    return f"{i:032x}"


def source(tmp_path: Path) -> Source:
    return Source(path=tmp_path / "rank0.pt.trace.json", kind="kineto", id=7, rank=0, ranks=[0], rank_origin="file name")


def tables() -> dict[str, pl.DataFrame]:
    return {"kernels": pl.DataFrame({"ts": range(500), "dur": range(500)}),
            "memcpys": pl.DataFrame({"ts": [1, 2], "bytes": [10, 20]}),
            "collectives": pl.DataFrame({"ts": []}, schema={"ts": pl.Int64})}  # empty: not written, not needed for a hit


def store(tmp_path: Path, i: int) -> Path:
    cache.store(source(tmp_path), key(i), tables())
    return cache.cache_dir() / key(i)


def used(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def names() -> set[str]:
    return {p.name for p in cache.cache_dir().iterdir()}


def set_cap(monkeypatch, nbytes: float) -> None:
    monkeypatch.setenv("TRACEQL_CACHE_MAX_MB", repr(nbytes / (1 << 20)))


@pytest.fixture
def entry_size(tmp_path, monkeypatch) -> int:
    """Bytes of one stored entry of tables() (all are the same size), measured in a throwaway cache."""
    with monkeypatch.context() as m:
        m.setenv("TRACEQL_CACHE_DIR", str(tmp_path / "measure"))
        store(tmp_path, 999)
        size = cache.entries()[0].size
    assert size > 0
    return size


def test_a_stored_entry_is_a_whole_hit(tmp_path):
    store(tmp_path, 1)
    s = Source(path=tmp_path / "x", kind="kineto", id=3)
    hit = cache.load(s, key(1))
    assert hit is not None and set(hit) == {"kernels", "memcpys"}
    assert hit["kernels"]["source"].unique().to_list() == [3]
    assert (s.rank, s.ranks, s.rank_origin) == (0, [0], "file name")


def test_eviction_is_least_recently_used_not_first_created(tmp_path, monkeypatch, entry_size):
    set_cap(monkeypatch, 3.5 * entry_size)
    a, b, c = (store(tmp_path, i) for i in (1, 2, 3))
    for age, p in enumerate((a, b, c)):
        used(p, OLD + age)
    assert cache.load(source(tmp_path), key(1)) is not None  # a hit: a, the oldest written, is now the latest used
    store(tmp_path, 4)  # 4 entries > 3.5: one goes, the least recently used
    assert names() >= {key(1), key(3), key(4)}
    assert key(2) not in names()


def test_run_folders_take_their_turn_in_the_same_order(tmp_path, monkeypatch, entry_size):
    set_cap(monkeypatch, 10 * entry_size)
    run = cache.cache_dir() / f"run-{'ab' * 16}"
    cache.store_derived(run, "collective_instances", tables()["kernels"], ["rank 3 has no step markers"])
    a, b = store(tmp_path, 1), store(tmp_path, 2)
    used(run, OLD), used(a, OLD + 1), used(b, OLD + 2)
    df, notes = cache.load_derived(run, "collective_instances")  # a hit marks the run folder used
    assert df.equals(tables()["kernels"]) and notes == ["rank 3 has no step markers"]
    total = sum(e.size for e in cache.entries())
    set_cap(monkeypatch, total + entry_size - 1)
    store(tmp_path, 3)
    assert run.name in names() and key(2) in names() and key(3) in names()
    assert key(1) not in names()

    used(run, OLD)  # unused again: now it is the least recently used
    set_cap(monkeypatch, sum(e.size for e in cache.entries()) + entry_size - 1)
    store(tmp_path, 4)
    assert run.name not in names()
    assert {key(2), key(3), key(4)} <= names()


def test_the_cap_holds_after_every_store(tmp_path, monkeypatch, entry_size):
    cap = 5.5 * entry_size
    set_cap(monkeypatch, cap)
    for i in range(1, 21):
        used(store(tmp_path, i), OLD + i)  # file times can tie within a few ms: make the order of use explicit
        assert cache.usage()["bytes"] <= cap, f"after store {i}"
    # the survivors are the latest written
    assert {e.path.name for e in cache.entries()} == {key(i) for i in range(20 - len(cache.entries()) + 1, 21)}


def test_the_entry_just_written_stays_even_over_the_cap(tmp_path, monkeypatch, entry_size):
    set_cap(monkeypatch, entry_size / 2)  # smaller than any entry
    store(tmp_path, 1)
    assert names() >= {key(1)}
    store(tmp_path, 2)
    assert key(1) not in names() and key(2) in names()
    assert cache.load(source(tmp_path), key(2)) is not None

    run = cache.cache_dir() / f"run-{'cd' * 16}"
    cache.store_derived(run, "step_breakdown", tables()["kernels"], [])
    assert run.name in names() and key(2) not in names()


def test_no_limit_keeps_everything(tmp_path, monkeypatch, entry_size):
    monkeypatch.setenv("TRACEQL_CACHE_MAX_MB", "0")
    for i in range(1, 6):
        store(tmp_path, i)
    assert len(cache.entries()) == 5
    assert "usage" not in names()  # no estimate kept: the first store under a cap measures afresh


def test_stores_do_not_measure_the_cache_each_time(tmp_path, monkeypatch):
    """Measuring walks every file of every entry (about 0.1 s for 1000 entries); stores add to an estimate instead and
    measure only when it passes the cap or every RESCAN_EVERY stores."""
    calls = []
    real = cache.prune
    monkeypatch.setattr(cache, "prune", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(cache, "RESCAN_EVERY", 10)
    for i in range(1, 26):
        store(tmp_path, i)
    assert 1 <= len(calls) <= 3  # the first store (no estimate yet), then one in ten


def test_an_estimate_deleted_by_hand_is_measured_again(tmp_path, monkeypatch, entry_size):
    set_cap(monkeypatch, 3.5 * entry_size)
    for i in range(1, 4):
        store(tmp_path, i)
    (cache.cache_dir() / "usage").unlink()
    store(tmp_path, 4)
    assert cache.usage()["bytes"] <= 3.5 * entry_size


def test_files_the_cache_did_not_write_are_left_alone(tmp_path, monkeypatch, entry_size):
    root = cache.cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.parquet").write_bytes(b"x" * 100)
    (root / "notes.txt").write_text("mine")
    (root / "mine").mkdir()
    (root / "mine" / "a.parquet").write_bytes(b"x")
    (root / "run-notes").mkdir()
    (root / ("ef" * 16)).symlink_to(outside, target_is_directory=True)  # looks like an entry, points outside
    (root / "index").mkdir()
    (root / "index" / "README").write_text("mine")
    fresh_tmp = root / f"{key(50)}.tmp4242"  # another process writing right now
    fresh_tmp.mkdir()
    stale_tmp = root / f"{key(51)}.tmp4243"  # a process that died long ago
    stale_tmp.mkdir()
    (stale_tmp / "kernels.parquet").write_bytes(b"x" * 10)
    used(stale_tmp, OLD)
    doomed = root / f"{key(52)}.del4244"  # a prune that died halfway through deleting
    doomed.mkdir()
    unknown = {"notes.txt", "mine", "run-notes", "ef" * 16, "index"}

    set_cap(monkeypatch, 1.5 * entry_size)
    for i in range(1, 5):
        store(tmp_path, i)
    assert names() == unknown | {fresh_tmp.name, key(4), "usage"}

    r = CliRunner().invoke(main, ["cache", "clear"])
    assert r.exit_code == 0, r.output
    assert names() == unknown  # a fresh tmp too: clearing is meant to empty the cache, and its store just misses
    assert (root / "mine" / "a.parquet").exists() and (root / "index" / "README").exists()
    assert (outside / "precious.parquet").read_bytes() == b"x" * 100


def test_index_stamps_of_evicted_files_go_with_them(tmp_path, monkeypatch, entry_size):
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text("{}")
    old_stamp_key = cache.digest(Source(path=trace, kind="kineto"))
    stamps = list((cache.cache_dir() / "index").iterdir())
    assert len(stamps) == 1
    used(stamps[0], OLD)
    set_cap(monkeypatch, 2.5 * entry_size)
    cache.store(Source(path=trace, kind="kineto"), old_stamp_key, tables())
    used(cache.cache_dir() / old_stamp_key, OLD + 1)
    fresh = tmp_path / "rank1.pt.trace.json"
    fresh.write_text("{ }")
    cache.digest(Source(path=fresh, kind="kineto"))  # a stamp used now
    store(tmp_path, 1)
    store(tmp_path, 2)  # 3 entries > 2.5: the least recently used entry goes, and the stamp used before it
    assert old_stamp_key not in names()
    assert not stamps[0].exists()
    assert len(list((cache.cache_dir() / "index").iterdir())) == 1  # the fresh one


def test_a_half_deleted_entry_is_a_miss(tmp_path):
    d = store(tmp_path, 1)
    (d / "memcpys.parquet").unlink()
    assert cache.load(source(tmp_path), key(1)) is None

    d = store(tmp_path, 2)
    (d / "source.json").unlink()
    assert cache.load(source(tmp_path), key(2)) is None

    run = cache.cache_dir() / f"run-{'ab' * 16}"
    cache.store_derived(run, "collective_instances", tables()["kernels"], ["a note"])
    (run / "collective_instances.notes.json").unlink()  # without its notes a derived table would lose findings' context
    assert cache.load_derived(run, "collective_instances") is None


def test_a_prune_beside_another_tolerates_entries_vanishing(tmp_path, monkeypatch, entry_size):
    for i in range(1, 4):
        store(tmp_path, i)
    seen = cache.entries()
    for e in seen:
        used(e.path, OLD)
    import shutil

    shutil.rmtree(seen[0].path)  # the other process deleted it after our scan
    monkeypatch.setattr(cache, "entries", lambda root=None: seen)
    removed, _ = cache.prune(cap=1)
    assert removed == 2
    assert not any(e.path.exists() for e in seen)


def test_a_hit_on_a_read_only_cache_is_still_a_hit(tmp_path, monkeypatch):
    store(tmp_path, 1)

    def refuse(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(cache.os, "utime", refuse)
    assert cache.load(source(tmp_path), key(1)) is not None


def test_cache_info_and_clear(tmp_path, monkeypatch, entry_size):
    store(tmp_path, 1)
    store(tmp_path, 2)
    cache.store_derived(cache.cache_dir() / f"run-{'ab' * 16}", "step_breakdown", tables()["kernels"], [])
    monkeypatch.setenv("TRACEQL_CACHE_MAX_MB", "512")
    r = CliRunner().invoke(main, ["cache", "info"])
    assert r.exit_code == 0, r.output
    assert f"path     {cache.cache_dir()}" in r.output
    assert "2 parsed sources, 1 runs' derived tables" in r.output
    assert f"size     {_size(cache.usage()['bytes'])}" in r.output and " KB" in r.output
    assert "cap      512 MB" in r.output

    monkeypatch.setenv("TRACEQL_CACHE_MAX_MB", "0")
    assert "cap      no limit" in CliRunner().invoke(main, ["cache", "info"]).output
    monkeypatch.setenv("TRACEQL_CACHE_MAX_MB", "lots")
    r = CliRunner().invoke(main, ["cache", "info"])
    assert "TRACEQL_CACHE_MAX_MB='lots' is not a size in MB" in r.output and "cap      4096 MB" in r.output

    size = cache.usage()["bytes"]
    r = CliRunner().invoke(main, ["cache", "clear"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"freed {_size(size)}: 3 entries deleted from {cache.cache_dir()}")
    assert cache.usage() == {"sources": 0, "runs": 0, "leftovers": 0, "bytes": 0}
    assert cache.load(source(tmp_path), key(1)) is None


def _copies(src: Path, dst: Path, n: int) -> Path:
    """A run dir of n ranks: the demo's rank 0 trace, its rank rewritten per copy (real content, distinct digests)."""
    import gzip
    import json

    dst.mkdir()
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for r in range(n):
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (dst / f"rank{r}.pt.trace.json").write_text(json.dumps(doc))
    return dst


def test_a_run_bigger_than_the_cap_keeps_its_own_entries_and_says_so(tmp_path, monkeypatch):
    from traceql import pipeline

    demo = sorted((Path(__file__).resolve().parents[1] / "samples" / "demo").glob("rank0*.json.gz"))[0]
    run = _copies(demo, tmp_path / "run", 4)
    store(tmp_path, 1)
    used(cache.cache_dir() / key(1), OLD)  # another run's entry, used long ago
    set_cap(monkeypatch, 1)  # far below what four parsed ranks take
    first = pipeline.load_run(run, use_cache=True)
    assert all(s.cache_key for s in first.sources if s.status == "ok")
    assert key(1) not in names()  # the older run's entry went first
    assert any("above its" in n and "cap" in n for n in first.notes)
    # the re-check is warm for every rank: none of the run's entries was evicted by its own later stores
    hits = []
    real = cache.load
    monkeypatch.setattr(cache, "load", lambda s, k, **kw: hits.append(real(s, k, **kw) is not None) or real(s, k, **kw))
    pipeline.load_run(run, use_cache=True)
    assert len(hits) == 4 and all(hits)


def test_without_protection_the_same_run_would_evict_itself(tmp_path, monkeypatch):
    # the test above could not fail if a tiny cap evicted nothing anyway: outside a check (here: a check that began
    # on another cache folder), the same stores prune
    cache.begin_run()
    monkeypatch.setenv("TRACEQL_CACHE_DIR", str(tmp_path / "another"))
    set_cap(monkeypatch, 1)
    for i in range(4):
        store(tmp_path, i)
    assert len([n for n in names() if len(n) == 32]) == 1
