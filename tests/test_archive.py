"""Archives of run dirs are run dirs: the same findings as the folder, and hostile entries refused one by one.

Every hostile archive is built here, in the test, with tarfile/zipfile (the kinds of entry an attacker can write)."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import unquote

import pytest
from click.testing import CliRunner

from tests.conftest import FIXTURES
from traceql import archive, pipeline
from traceql.cli import main


def _tar(path: Path, run_dir: Path, mode: str = "w:gz", top: str | None = None) -> Path:
    with tarfile.open(path, mode) as tf:
        tf.add(run_dir, arcname=top if top is not None else run_dir.name)
    return path


def _zip(path: Path, run_dir: Path, top: str = "") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(run_dir.rglob("*")):
            if p.is_file():
                zf.write(p, str(Path(top) / p.relative_to(run_dir)) if top else str(p.relative_to(run_dir)))
    return path


def _tar_zst(path: Path, run_dir: Path) -> Path:
    zstandard = pytest.importorskip("zstandard")
    buf = io.BytesIO()
    _tar_into(buf, run_dir)
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(buf.getvalue()))
    return path


def _tar_into(buf, run_dir: Path) -> None:
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(run_dir, arcname=run_dir.name)


def _findings(result) -> list[tuple]:
    return [(f.rule, tuple(f.ranks), f.step, f.message, json.dumps(f.evidence, sort_keys=True, default=str), f.fingerprint)
            for f in result.findings]


def _statuses(result) -> list[tuple]:
    return sorted((r.rule.id, r.status) for r in result.results)


def _build(fmt: str, tmp: Path, run_dir: Path) -> Path:
    if fmt == "zip":
        return _zip(tmp / f"{run_dir.name}.zip", run_dir, top=run_dir.name)
    if fmt == "tar.zst":
        return _tar_zst(tmp / f"{run_dir.name}.tar.zst", run_dir)
    mode = {"tar": "w", "tar.gz": "w:gz", "tgz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz"}[fmt]
    return _tar(tmp / f"{run_dir.name}.{fmt}", run_dir, mode)


@pytest.mark.parametrize("fixture", ["cpu-straggler", "cpu-desync", "compile-graph-break", "h200-exposed-allreduce-nsys"])
def test_archive_of_a_fixture_gives_the_fixtures_findings(tmp_path, fixture):
    run_dir = FIXTURES / fixture
    want = pipeline.check(run_dir)
    got = pipeline.check(_build("tar.gz", tmp_path, run_dir))
    assert _findings(got) == _findings(want)
    assert _statuses(got) == _statuses(want)
    # every source is shown inside the archive: ARCHIVE!/PATH-IN-ARCHIVE
    shown = [s["path"] for s in got.to_json()["sources"]]
    assert shown and all(p.startswith(f"{fixture}.tar.gz!/{fixture}/") for p in shown), shown
    assert sorted(p.split("!/", 1)[1].split("/", 1)[1] for p in shown) == sorted(s["path"] for s in want.to_json()["sources"])


@pytest.mark.parametrize("fmt", ["tar", "tgz", "tar.zst", "zip", "tar.xz"])
def test_every_archive_format_reads_like_the_folder(tmp_path, fmt):
    run_dir = FIXTURES / "cpu-straggler"
    want = pipeline.check(run_dir)
    assert want.findings  # a fixture that fires, so equality means something
    got = pipeline.check(_build(fmt, tmp_path, run_dir))
    assert _findings(got) == _findings(want)


def test_a_gzip_trace_is_not_taken_for_an_archive():
    trace = FIXTURES / "cpu-straggler" / "rank0.pt.trace.json.gz"
    assert archive.kind_of(trace) is None
    assert not archive.is_archive(FIXTURES / "cpu-straggler")


def _hostile_tar(path: Path, entries: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tf:
        good = (FIXTURES / "cpu-straggler" / "rank0.pt.trace.json.gz").read_bytes()
        ti = tarfile.TarInfo("run/rank0.pt.trace.json.gz")
        ti.size = len(good)
        tf.addfile(ti, io.BytesIO(good))
        for e in entries:
            tf.addfile(e, io.BytesIO(data) if e.isreg() else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 1) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.size = size if kind == tarfile.REGTYPE else 0
    return ti


HOSTILE = [
    ("traversal", _info("run/../../escaped.txt"), "'..'"),
    ("absolute", _info("/tmp/traceql-escaped-absolute.txt"), "absolute"),
    ("backslash", _info("run\\..\\..\\escaped.txt"), "backslash"),
    ("drive", _info("C:/Windows/escaped.txt"), "drive letter"),
    ("symlink", _info("run/passwd", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
    ("hardlink", _info("run/hard", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
    ("chardev", _info("run/null", tarfile.CHRTYPE), "device"),
    ("fifo", _info("run/pipe", tarfile.FIFOTYPE), "fifo"),
]


@pytest.mark.parametrize("case,entry,why", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_entries_are_refused_and_the_rest_is_analysed(tmp_path, case, entry, why):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    path = _hostile_tar(work / "run.tar.gz", [entry])
    before = set(tmp_path.rglob("*"))
    result = pipeline.check(path)
    refused = [s for s in result.run.sources if s.status == "error"]
    assert len(refused) == 1, [(s.path, s.detail) for s in result.run.sources]
    assert why in refused[0].detail and repr(entry.name) in refused[0].detail
    assert "\n" not in refused[0].detail
    # the rest is analysed: the good trace was read
    assert any(s.status == "ok" and s.kind == "kineto" for s in result.run.sources)
    # nothing was written beside the archive nor anywhere it points at
    assert set(tmp_path.rglob("*")) == before
    assert not Path("/tmp/traceql-escaped-absolute.txt").exists()
    # shown inside the archive, in the JSON report too
    j = result.to_json()
    assert any(s["status"] == "error" and s["path"].startswith("run.tar.gz!/") for s in j["sources"])


def test_zip_symlink_and_traversal_refused(tmp_path):
    path = tmp_path / "run.zip"
    good = (FIXTURES / "cpu-straggler" / "rank0.pt.trace.json.gz").read_bytes()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("run/rank0.pt.trace.json.gz", good)
        zf.writestr("run/../../escaped.txt", b"x")
        link = zipfile.ZipInfo("run/etc")
        link.create_system = 3
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc")
    result = pipeline.check(path)
    details = sorted(s.detail for s in result.run.sources if s.status == "error")
    assert len(details) == 2 and "'..'" in details[0] + details[1] and "symbolic link" in details[0] + details[1]
    assert not (tmp_path.parent / "escaped.txt").exists()
    assert any(s.status == "ok" for s in result.run.sources)


def test_bomb_by_ratio_stops_the_expansion(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "RATIO_FLOOR", 1 << 20)  # the default floor is 64 MB; the rule is the same
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        ti = tarfile.TarInfo("run/zeros.bin")
        ti.size = 32 << 20
        tf.addfile(ti, io.BytesIO(bytes(ti.size)))
    assert path.stat().st_size < (1 << 20)
    with archive.expanded(path) as x:
        assert len(x.refused) == 1 and "times its size" in x.refused[0].detail and "'run/zeros.bin'" in x.refused[0].detail
        assert not list(x.tmp.rglob("*.bin"))  # the partly written entry is removed
        assert x.bytes < 8 << 20  # stopped soon after the ratio passed, not after 32 MB


def test_zip_bomb_by_entry_count(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEQL_ARCHIVE_MAX_ENTRIES", "50")
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(200):
            zf.writestr(f"run/f{i:03}.log", b"")
    with archive.expanded(path) as x:
        assert len(x.refused) == 1 and "more than 50 entries" in x.refused[0].detail and "'run/f050.log'" in x.refused[0].detail
        assert len(list(x.tmp.rglob("*.log"))) == 50


def test_a_lying_zip_header_counts_the_bytes_written(tmp_path, monkeypatch):
    """A zip entry that claims a small size but inflates to more is stopped by what was written, not by the claim."""
    monkeypatch.setenv("TRACEQL_ARCHIVE_MAX_MB", "2")
    path = tmp_path / "big.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run/zeros.bin", bytes(8 << 20))
    with archive.expanded(path) as x:
        assert len(x.refused) == 1 and "expands past 2 MB" in x.refused[0].detail


def test_nested_archive_one_level_is_read_two_levels_refused(tmp_path):
    run_dir = FIXTURES / "cpu-straggler"
    inner = _tar(tmp_path / "rank-traces.tar.gz", run_dir, top="traces")
    deeper = tmp_path / "deeper.zip"
    with zipfile.ZipFile(deeper, "w") as zf:
        zf.write(_zip(tmp_path / "innermost.zip", run_dir), "innermost.zip")
    outer = tmp_path / "outer.tar"
    with tarfile.open(outer, "w") as tf:
        tf.add(inner, "upload/rank-traces.tar.gz")
        tf.add(deeper, "upload/deeper.zip")
    result = pipeline.check(outer)
    want = pipeline.check(run_dir)
    # the refused entry is an unreadable source (TQL003, severity error: the exit code says the run is incomplete);
    # every finding of the readable files is there as on the folder
    refused = [f for f in result.findings if f.rule == "TQL003"]
    assert [f.evidence["detail"] for f in refused] and "one level deep" in refused[0].evidence["detail"]
    assert [f for f in _findings(result) if f[0] != "TQL003"] == _findings(want)
    shown = {s["path"]: s for s in result.to_json()["sources"]}
    assert "outer.tar!/upload/rank-traces.tar.gz!/traces/rank0.pt.trace.json.gz" in shown
    errors = [s for s in shown.values() if s["status"] == "error"]
    assert len(errors) == 1 and errors[0]["path"] == "outer.tar!/upload/deeper.zip!/innermost.zip"
    assert "one level deep" in errors[0]["detail"]


def test_the_private_folder_is_removed_also_on_ctrl_c(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    path = _build("tar.gz", tmp_path, FIXTURES / "cpu-desync")
    seen = []

    def interrupted(run_dir, extra=None):
        seen.append(run_dir)
        assert stat.S_IMODE(os.stat(run_dir.parent).st_mode) == 0o700
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "discover", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.load_run(path)
    assert seen and not seen[0].exists() and list((tmp_path / "t").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    pipeline.load_run(path)
    assert list((tmp_path / "t").iterdir()) == []


def test_zstd_archive_without_zstandard_says_what_to_install(tmp_path, monkeypatch):
    path = _tar_zst(tmp_path / "run.tar.zst", FIXTURES / "cpu-desync")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    r = CliRunner().invoke(main, ["check", str(path)])
    assert r.exit_code == 2 and "pip install zstandard" in r.output


def test_cli_on_archives(tmp_path):
    run_dir = FIXTURES / "cpu-straggler"
    arc = _build("tar.gz", tmp_path, run_dir)
    runner = CliRunner()
    a, d = runner.invoke(main, ["check", str(arc), "--format", "json"]), runner.invoke(main, ["check", str(run_dir), "--format", "json"])
    assert a.exit_code == d.exit_code == 1
    assert json.loads(a.output)["findings"] == json.loads(d.output)["findings"]
    sarif = json.loads(runner.invoke(main, ["check", str(arc), "--format", "sarif"]).output)
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for res in sarif["runs"][0]["results"] for loc in res.get("locations", [])]
    assert uris and all(unquote(u).startswith("cpu-straggler.tar.gz!/") for u in uris)  # a URI: "!" is %21
    s = runner.invoke(main, ["summary", str(arc), "--format", "json"])
    assert s.exit_code == 0 and json.loads(s.output) == json.loads(runner.invoke(main, ["summary", str(run_dir), "--format", "json"]).output)
    q = runner.invoke(main, ["query", str(arc), "SELECT count(*) AS n FROM host_ops", "--format", "json"])
    assert q.exit_code == 0 and q.output == runner.invoke(main, ["query", str(run_dir), "SELECT count(*) AS n FROM host_ops", "--format", "json"]).output
    out = tmp_path / "annotated.json.gz"
    assert runner.invoke(main, ["annotate", str(arc), "--out", str(out)]).exit_code == 0
    assert json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    df = runner.invoke(main, ["diff", str(arc), str(run_dir), "--format", "json"])
    assert df.exit_code == 0 and not json.loads(df.output)["findings"]["new"]


def test_an_archive_of_only_refused_entries_is_nothing_analysable(tmp_path):
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tf:
        tf.addfile(_info("run/passwd", tarfile.SYMTYPE, "/etc/passwd"))
    r = CliRunner().invoke(main, ["check", str(path)])
    assert r.exit_code == 2 and "evil.tar!/run/passwd" in r.output and "symbolic link" in r.output


def test_a_truncated_archive_is_one_line(tmp_path):
    whole = _build("tar.gz", tmp_path, FIXTURES / "cpu-straggler").read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[:200])
    r = CliRunner().invoke(main, ["check", str(cut)])
    assert r.exit_code == 2, r.output
    assert "cut.tar.gz" in r.output and "Traceback" not in r.output


def test_an_archive_inside_a_plain_run_dir_is_named_as_such(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _build("zip", run_dir, FIXTURES / "cpu-desync")
    result = pipeline.check(run_dir)
    (src,) = result.run.sources
    assert src.status == "skipped" and "an archive inside the run dir" in src.detail


def test_many_refused_entries_make_a_bounded_list_and_count_to_the_entry_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEQL_ARCHIVE_MAX_ENTRIES", "1000")
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as tf:
        for i in range(1500):
            tf.addfile(_info(f"run/l{i}", tarfile.SYMTYPE, "/etc/passwd"))
    with archive.expanded(path) as x:
        assert len(x.refused) == archive.MAX_REFUSALS_LISTED + 2  # the listed, the budget stop, the count of the rest
        assert any("more than 1,000 entries" in s.detail for s in x.refused)
        assert any("800 more entries refused" in s.detail for s in x.refused)


def _tar_with_big_header(path: Path, kind: bytes, body_mb: int) -> Path:
    """A .tar.gz holding the good trace, then a GNU long-name or PAX header whose body is body_mb MB of real bytes
    (tarfile reads such a body whole before the entry is seen), then a small file."""
    good = (FIXTURES / "cpu-straggler" / "rank0.pt.trace.json.gz").read_bytes()
    with gzip.open(path, "wb", compresslevel=1) as gz:
        ti = tarfile.TarInfo("run/rank0.pt.trace.json.gz")
        ti.size = len(good)
        gz.write(ti.tobuf(tarfile.GNU_FORMAT) + good + b"\0" * (-len(good) % 512))
        big = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "run/PaxHeader")
        big.type = kind
        big.size = body_mb * archive.MB
        gz.write(big.tobuf(tarfile.GNU_FORMAT))
        chunk = (b"a" * 1023 + b"=") * 1024 if kind == tarfile.GNUTYPE_LONGNAME else b"9" * archive.MB
        for _ in range(body_mb):
            gz.write(chunk)
        last = tarfile.TarInfo("run/after.txt")
        last.size = 1
        gz.write(last.tobuf(tarfile.GNU_FORMAT) + b"x" + b"\0" * 511 + b"\0" * 1024)
    return path


@pytest.mark.parametrize("kind,what", [(tarfile.GNUTYPE_LONGNAME, "GNU long name"), (tarfile.XHDTYPE, "PAX")])
def test_an_oversized_long_name_or_pax_header_stops_before_it_is_read(tmp_path, kind, what):
    path = _tar_with_big_header(tmp_path / "run.tar.gz", kind, 64)
    result = pipeline.check(path)
    stopped = [s for s in result.run.sources if s.status == "error"]
    assert len(stopped) == 1, [(s.path, s.detail) for s in result.run.sources]
    assert f"{what} header of 64.0 MB" in stopped[0].detail and "\n" not in stopped[0].detail
    assert any(s.status == "ok" and s.kind == "kineto" for s in result.run.sources)  # the entry before is kept


def test_an_oversized_long_name_costs_no_memory(tmp_path):
    # before the bound, tarfile joined the whole body in memory (a 305 KB upload with a 300 MB name took 1.2 GB)
    path = _tar_with_big_header(tmp_path / "run.tar.gz", tarfile.GNUTYPE_LONGNAME, 128)
    code = ("import resource, sys; from pathlib import Path; from traceql import archive\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "with archive.expanded(Path(sys.argv[1])) as x: refused = [s.detail for s in x.refused]\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024, len(refused))")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grew_mb, refused = map(int, out.stdout.split())
    assert refused == 1
    assert grew_mb < 64, f"expanding grew the process by {grew_mb} MB for a 128 MB header it should not read"


def test_a_gnu_sparse_entry_stops_the_expansion_with_its_reason(tmp_path):
    entry = _info("run/sparse.bin")
    entry.type = tarfile.GNUTYPE_SPARSE
    path = _hostile_tar(tmp_path / "run.tar.gz", [entry])
    result = pipeline.check(path)
    stopped = [s for s in result.run.sources if s.status == "error"]
    assert len(stopped) == 1 and "GNU sparse" in stopped[0].detail
    assert any(s.status == "ok" and s.kind == "kineto" for s in result.run.sources)


def test_an_oversized_header_as_the_first_entry_is_one_line_not_a_crash(tmp_path):
    path = tmp_path / "run.tar.gz"
    with gzip.open(path, "wb") as gz:  # tarfile.open reads the first header itself in stream mode
        big = tarfile.TarInfo("run/PaxHeader")
        big.type = tarfile.XHDTYPE
        big.size = 2 * archive.MB
        gz.write(big.tobuf(tarfile.GNU_FORMAT) + b"9" * big.size)
    r = CliRunner().invoke(main, ["check", str(path)])
    assert r.exit_code == 2, r.output
    assert "PAX header of 2.0 MB" in r.output and "internal error" not in r.output


def test_a_malformed_pax_sparse_map_is_refused_not_a_crash(tmp_path):
    entry = _info("run/sparse.bin")
    entry.pax_headers = {"GNU.sparse.map": "x,y", "GNU.sparse.size": "1"}
    path = tmp_path / "run.tar.gz"
    good = (FIXTURES / "cpu-straggler" / "rank0.pt.trace.json.gz").read_bytes()
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("run/rank0.pt.trace.json.gz")
        ti.size = len(good)
        tf.addfile(ti, io.BytesIO(good))
        tf.addfile(entry, io.BytesIO(b"x"))
    result = pipeline.check(path)
    stopped = [s for s in result.run.sources if s.status == "error"]
    assert len(stopped) == 1 and "malformed header" in stopped[0].detail, [s.detail for s in stopped]
    assert any(s.status == "ok" and s.kind == "kineto" for s in result.run.sources)
