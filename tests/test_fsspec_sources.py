"""Runs at fsspec URLs (traceql.remote): the same fixtures checked from a local path, from memory:// (on an in-process
LocalCluster: the memory filesystem is per process, and without --scheduler) and from file:// with Dask worker
processes, compared finding fingerprint by fingerprint and source by source; the budgets, the prefix and the errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec", reason="the [dask] extra is part of the test install")
distributed = pytest.importorskip("distributed", reason="the [dask] extra is part of the test install")

from click.testing import CliRunner

from traceql import pipeline
from traceql.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = ["cpu-straggler", "h200x2-straggler", "h200x2-straggler-nsys", "nccl-log-timeout-desync",
            "lost-rank-cpu-ddp-eager", "h200x2-divergent-compile"]  # the last holds TORCH_COMPILE_DEBUG folders


def _upload(local: Path, prefix: str, fs=None) -> str:
    """Copy a local run dir into the memory filesystem under prefix; its URL."""
    fs = fs or fsspec.filesystem("memory")
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.pipe(f"/{prefix}/{p.relative_to(local).as_posix()}", p.read_bytes())
    return f"memory://{prefix}/"


@pytest.fixture(autouse=True)
def _empty_memory_fs():
    fs = fsspec.filesystem("memory")
    yield
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]


def _answers(result):
    run = result.run
    root = run.path if run.path.is_dir() else run.path.parent
    findings = sorted((f.fingerprint, f.rule, f.message) for f in result.findings)
    sources = sorted(tuple(sorted(s.to_json(root).items())) for s in run.sources)
    rules = sorted((r.rule.id, r.status) for r in result.results)
    return findings, sources, rules


@pytest.fixture(scope="module")
def local_answers():
    return {name: _answers(pipeline.check(REPO / "fixtures" / name, use_cache=False)) for name in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_memory_url_on_an_in_process_cluster_gives_the_local_answers(name, client, local_answers):
    url = _upload(REPO / "fixtures" / name, f"runs/{name}")
    got = pipeline.check(url, use_cache=False, scheduler=client)
    assert str(got.run.path) == f"memory://runs/{name}"
    f, s, r = _answers(got)
    lf, ls, lr = local_answers[name]
    assert f == lf
    assert s == ls
    assert r == lr


@pytest.mark.parametrize("name", ["h200x2-straggler-nsys", "lost-rank-cpu-ddp-eager"])
def test_memory_url_without_a_scheduler_gives_the_local_answers(name, local_answers):
    url = _upload(REPO / "fixtures" / name, f"plain/{name}")
    assert _answers(pipeline.check(url, use_cache=False)) == local_answers[name]


def test_file_urls_on_worker_processes_give_the_local_answers(local_answers):
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0") as c, \
            distributed.Client(c) as cl:
        for name in ["h200x2-straggler", "nccl-log-timeout-desync", "h200x2-divergent-compile"]:
            url = (REPO / "fixtures" / name).as_uri()
            got = pipeline.check(url, use_cache=False, scheduler=cl)
            assert str(got.run.path) == url
            assert _answers(got) == local_answers[name], name


def _big_kineto(mb: int) -> bytes:
    head = b'{"schemaVersion": 1, "traceEvents": [\n'
    event = b'{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0},\n'
    return head + event * (mb * (1 << 20) // len(event) + 1)


def test_a_huge_object_stops_at_the_cap_and_the_others_keep_every_finding(monkeypatch, local_answers):
    url = _upload(REPO / "fixtures" / "cpu-straggler", "big")
    fsspec.filesystem("memory").pipe("/big/rank2.pt.trace.json", _big_kineto(3))
    monkeypatch.setenv("TRACEQL_URL_MAX_MB", "1")
    got = pipeline.check(url, use_cache=False)
    big = [s for s in got.run.sources if s.path.name == "rank2.pt.trace.json"]
    assert len(big) == 1 and big[0].status == "error"
    assert big[0].detail.startswith("memory://big/rank2.pt.trace.json: larger than the 1 MB a source at a URL may be "
                                    "copied to be read (its listing says 3 MB)")
    assert "TRACEQL_URL_MAX_MB" in big[0].detail and "\n" not in big[0].detail
    fps = {f.fingerprint for f in got.findings}
    assert {f[0] for f in local_answers["cpu-straggler"][0]} <= fps
    read = [s for s in got.run.sources if s.status == "ok" and s.kind == "kineto"]
    assert sorted(s.rank for s in read) == [0, 1]


def test_an_object_larger_than_its_listing_says_stops_at_the_cap_while_it_streams(monkeypatch, tmp_path):
    fs = fsspec.filesystem("memory")
    url = _upload(REPO / "fixtures" / "cpu-straggler", "liar")
    fs.pipe("/liar/rank2.pt.trace.json", _big_kineto(3))
    real_find = type(fs).find

    def small(self, path, **k):  # the listing under-reports the object's size (it grew, or the store lies)
        out = real_find(self, path, **k)
        if k.get("detail"):
            out = {n: ({**i, "size": 1000} if n.endswith("rank2.pt.trace.json") else i) for n, i in out.items()}
        return out

    monkeypatch.setattr(type(fs), "find", small)
    monkeypatch.setenv("TRACEQL_URL_MAX_MB", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    got = pipeline.check(url, use_cache=False)
    big = [s for s in got.run.sources if s.path.name == "rank2.pt.trace.json"]
    assert big[0].status == "error"
    assert big[0].detail == ("memory://liar/rank2.pt.trace.json: larger than the 1 MB a source at a URL may be copied "
                             "to be read (stopped there while copying); raise TRACEQL_URL_MAX_MB (0 = no limit) or "
                             "check a local copy")
    assert sorted(got.run.ranks) == [0, 1]
    assert not list(tmp_path.glob("traceql-url-*"))


def test_a_single_letter_scheme_is_a_local_path_not_a_url():
    from traceql.remote import is_url

    assert not is_url("C://runs/run7") and is_url("s3://bucket/run7/") and is_url("simplecache::s3://b/r")


def test_members_outside_the_prefix_are_refused_and_never_read(monkeypatch):
    fs = fsspec.filesystem("memory")
    url = _upload(REPO / "fixtures" / "cpu-straggler", "pre")
    secret = (REPO / "fixtures" / "cpu-straggler" / "rank1.pt.trace.json.gz").read_bytes()
    fs.pipe("/pre/../secret.pt.trace.json.gz", secret)  # a key with a `..` segment: it names /secret... elsewhere
    fs.pipe("/prefix-sibling/rank9.pt.trace.json.gz", secret)  # shares the prefix's characters, not its folder
    opened = []
    real_open, real_cat = type(fs)._open, type(fs).cat_file

    def spy_open(self, path, *a, **k):
        opened.append(path)
        return real_open(self, path, *a, **k)

    def spy_cat(self, path, *a, **k):
        opened.append(path)
        return real_cat(self, path, *a, **k)

    monkeypatch.setattr(type(fs), "_open", spy_open)
    monkeypatch.setattr(type(fs), "cat_file", spy_cat)
    got = pipeline.check(url, use_cache=False)
    refused = [s for s in got.run.sources if "not inside the run's prefix" in s.detail]
    assert len(refused) == 1 and refused[0].status == "error"
    assert "secret" in refused[0].detail
    assert not any("secret" in p or "sibling" in p for p in opened)
    assert sorted(got.run.ranks) == [0, 1]


def test_a_url_with_dotdot_is_a_usage_error():
    r = CliRunner().invoke(main, ["check", "memory://a/../b/", "-q"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [("traceql: memory://a/../b/: a `.` or `..` segment in a run's URL; name "
                                              "the run's prefix itself")]


def test_a_missing_plugin_is_one_line_naming_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # not importable, whether or not it is installed here
    r = CliRunner().invoke(main, ["check", "s3://bucket/run7/", "-q"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == ["traceql: s3://bucket/run7/: s3:// needs s3fs: pip install s3fs"]


def test_an_unknown_protocol_is_one_line():
    r = CliRunner().invoke(main, ["check", "nosuchfs://bucket/run/", "-q"])
    assert r.exit_code == 2
    assert "nosuchfs://bucket/run/: no fsspec filesystem knows nosuchfs://" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_memory_urls_are_refused_for_worker_processes():
    url = _upload(REPO / "fixtures" / "cpu-straggler", "mine")
    r = CliRunner().invoke(main, ["check", url, "--scheduler", "local", "-q"])
    assert r.exit_code == 2
    assert r.output.strip() == ("traceql: memory://mine/: memory:// is this process's own memory, which Dask's worker "
                                "processes cannot see; check it without --scheduler")


def test_nothing_at_the_url_is_one_line():
    r = CliRunner().invoke(main, ["check", "memory://nothing-here/", "-q"])
    assert r.exit_code == 2
    assert r.output.strip() == "traceql: memory://nothing-here/: no such object or prefix; check the URL"


def test_an_unreadable_rank_among_good_ones_becomes_an_error_source(monkeypatch, client, local_answers):
    fs = fsspec.filesystem("memory")
    url = _upload(REPO / "fixtures" / "h200x2-straggler", "denied")
    real_open = type(fs)._open

    def deny(self, path, mode="rb", **k):
        if path.endswith("rank1.pt.trace.json.gz") and k.get("block_size") != 64 * 1024:  # the head reads; the copy not
            raise PermissionError(13, "Access Denied", path)
        return real_open(self, path, mode, **k)

    monkeypatch.setattr(type(fs), "_open", deny)
    for scheduler in (None, client):
        got = pipeline.check(url, use_cache=False, scheduler=scheduler)
        bad = [s for s in got.run.sources if s.path.name == "rank1.pt.trace.json.gz"]
        assert len(bad) == 1 and bad[0].status == "error"
        assert bad[0].detail.startswith("memory://denied/rank1.pt.trace.json.gz: cannot read it (PermissionError")
        assert "traceql-url-" not in bad[0].detail
        good = [s for s in got.run.sources if s.path.name == "rank0.pt.trace.json.gz"]
        assert good[0].status == "ok"
        assert 0 in got.run.ranks


def test_the_cache_keys_a_url_source_by_its_listing_and_is_hit_without_a_download(monkeypatch):
    fs = fsspec.filesystem("memory")
    url = _upload(REPO / "fixtures" / "cpu-straggler", "cached")
    first = pipeline.check(url)
    keys = {s.path.name: s.cache_key for s in first.run.sources if s.kind == "kineto"}
    assert all(keys.values()) and len(keys) == 2
    copies = []
    real_open = type(fs)._open

    def spy(self, path, mode="rb", **k):
        copies.append((path, k.get("block_size")))
        return real_open(self, path, mode, **k)

    monkeypatch.setattr(type(fs), "_open", spy)
    second = pipeline.check(url)
    assert {s.path.name: s.cache_key for s in second.run.sources if s.kind == "kineto"} == keys
    from traceql.remote import CHUNK

    assert not [p for p, bs in copies if bs == CHUNK]  # no source copied: both came from the cache
    assert sorted(f.fingerprint for f in second.findings) == sorted(f.fingerprint for f in first.findings)
    # a new version of a rank (its listing changes) is a miss
    fs.pipe("/cached/rank1.pt.trace.json.gz", (REPO / "fixtures" / "cpu-straggler" / "rank1.pt.trace.json.gz").read_bytes())
    third = pipeline.check(url)
    assert {s.path.name: s.cache_key for s in third.run.sources if s.kind == "kineto"}["rank1.pt.trace.json.gz"] != \
        keys["rank1.pt.trace.json.gz"]


def test_without_a_version_in_the_listing_nothing_is_cached_and_v_says_so_once(monkeypatch):
    fs = fsspec.filesystem("memory")
    url = _upload(REPO / "fixtures" / "cpu-straggler", "unversioned")
    real_find, real_info = type(fs).find, type(fs).info

    def bare(info):
        return {k: v for k, v in info.items() if k in ("name", "size", "type")}

    monkeypatch.setattr(type(fs), "find", lambda self, path, **k: {
        n: bare(i) for n, i in real_find(self, path, **k).items()} if k.get("detail") else real_find(self, path, **k))
    monkeypatch.setattr(type(fs), "info", lambda self, path, **k: bare(real_info(self, path, **k)))
    got = pipeline.check(url)
    assert not any(s.cache_key for s in got.run.sources)
    r = CliRunner().invoke(main, ["check", url, "-q", "-v", "--fail-on", "never"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "not cached" in ln]
    assert len(lines) == 1 and "carry no version in their listing" in lines[0]


def test_reports_name_sources_by_url_never_by_a_temporary_copy():
    url = _upload(REPO / "fixtures" / "cpu-straggler", "shown")
    fsspec.filesystem("memory").pipe("/shown/rank3.pt.trace.json", b'{"traceEvents": [{"ph": "X", "na')  # cut short
    runner = CliRunner()
    text = runner.invoke(main, ["check", url, "-q", "--fail-on", "never", "--no-cache"]).output
    assert text.startswith("traceql check memory://shown: 2 rank(s)")
    assert "traceql-url-" not in text
    js = json.loads(runner.invoke(main, ["check", url, "-q", "--fail-on", "never", "--no-cache", "--format", "json"]).output)
    assert js["run"]["path"] == "memory://shown"
    paths = {s["path"] for s in js["sources"]}
    assert {"rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "rank3.pt.trace.json"} <= paths
    assert "traceql-url-" not in json.dumps(js)
    sarif = json.loads(runner.invoke(main, ["check", url, "-q", "--fail-on", "never", "--no-cache", "--format", "sarif"]).output)
    assert sarif["runs"][0]["originalUriBaseIds"]["RUNDIR"]["uri"] == "memory://shown/"
    assert "traceql-url-" not in json.dumps(sarif)


def test_the_temporary_copies_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    url = _upload(REPO / "fixtures" / "cpu-straggler", "tidy")
    pipeline.check(url, use_cache=False)
    assert not list(tmp_path.glob("traceql-url-*"))


def test_a_local_check_never_imports_fsspec():
    code = ("import sys; from traceql import pipeline; pipeline.check(sys.argv[1], use_cache=False); "
            "print('fsspec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "fixtures" / "cpu-straggler")], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert out.stdout.strip() == "False"


def test_a_gzip_head_is_read_through_the_url(tmp_path):
    fs = fsspec.filesystem("memory")
    events = json.dumps({"traceEvents": [{"ph": "X", "name": "x" * 10, "pid": 0, "tid": 0, "ts": i, "dur": 1}
                                         for i in range(20000)]}).encode()
    fs.pipe("/gz/rank0.trace.json.gz", gzip.compress(events))
    from traceql.discover import discover

    found = discover("memory://gz/")
    assert [(s.path.name, s.kind, s.rank) for s in found] == [("rank0.trace.json.gz", "kineto", 0)]
