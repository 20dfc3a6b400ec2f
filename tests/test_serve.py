"""`traceql serve` over HTTP: a real uvicorn on 127.0.0.1 (random port), driven with httpx as a script would."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tests.conftest import FIXTURES, REPO  # noqa: E402

_spec = importlib.util.spec_from_file_location("serve_load", REPO / "benchmarks" / "serve_load.py")
load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("serve")
    store = work / "store"
    a, b = load.create_token(store), load.create_token(store)
    server = load.Server(store, load.free_port(), workers=2, extra=["--max-upload-mb", "2"]).start()
    archives = work / "archives"
    archives.mkdir()
    yield {"url": server.url, "a": a, "b": b, "store": store, "archives": archives, "server": server}
    server.stop()


def _auth(token):
    return {"Authorization": f"Bearer {token}"}


def _wait(url, token, jid, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = httpx.get(f"{url}/api/jobs/{jid}", headers=_auth(token)).json()
        if s["status"] in ("done", "failed"):
            return s
        time.sleep(0.2)
    raise AssertionError(f"job {jid} still {s['status']} after {timeout} s")


@pytest.fixture(scope="module")
def done_job(served):
    arc = load.make_archive(FIXTURES / "cpu-straggler", served["archives"], "tar.gz")
    jid = load.upload(served["url"], served["a"], arc)
    return jid, _wait(served["url"], served["a"], jid)


def test_token_create_prints_the_token_last(tmp_path):
    t = load.create_token(tmp_path / "s")
    assert t.startswith("tq_") and len(t) > 30
    # only its hash is stored
    assert t.encode() not in (tmp_path / "s" / "traceql.sqlite").read_bytes()


def test_upload_gives_the_findings_of_traceql_check(served, done_job):
    jid, s = done_job
    assert set(s) >= {"id", "status", "reason", "report"} and s["id"] == jid and s["status"] == "done", s
    assert set(s["report"]) >= {"html", "json", "sarif"}
    report = httpx.get(s["report"]["json"], headers=_auth(served["a"])).json()
    assert load.key(report["findings"]) == load.expected_findings(FIXTURES / "cpu-straggler", served["store"])
    assert report["findings"]
    assert all(src["path"].startswith("cpu-straggler.tar.gz!/") for src in report["sources"])
    sarif = httpx.get(s["report"]["sarif"], headers=_auth(served["a"])).json()
    assert sarif["version"] == "2.1.0" and len(sarif["runs"][0]["results"]) == len(report["findings"])
    page = httpx.get(s["report"]["html"], headers=_auth(served["a"]))
    assert page.status_code == 200 and "<h1>traceql report" in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "sandbox" in csp and "script-src" not in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["referrer-policy"] == "no-referrer"
    trace = httpx.get(s["report"]["trace"], headers=_auth(served["a"]))
    assert trace.status_code == 200 and trace.content[:2] == b"\x1f\x8b"


def test_another_token_sees_nothing(served, done_job):
    jid, s = done_job
    other = _auth(served["b"])
    assert httpx.get(f"{served['url']}/api/jobs/{jid}", headers=other).status_code == 404
    assert httpx.get(s["report"]["json"], headers=other).status_code == 404
    assert httpx.post(f"{served['url']}/api/jobs/{jid}/share", headers=other).status_code == 404
    assert jid not in json.dumps(httpx.get(f"{served['url']}/api/jobs", headers=other).json())
    assert jid in json.dumps(httpx.get(f"{served['url']}/api/jobs", headers=_auth(served["a"])).json())
    # no token, or a made-up one: 401
    assert httpx.get(f"{served['url']}/api/jobs/{jid}").status_code == 401
    assert httpx.get(f"{served['url']}/api/jobs/{jid}", headers=_auth("tq_madeup")).status_code == 401
    assert httpx.get(s["report"]["html"]).status_code == 404


def test_a_share_link_opens_that_report_only(served, done_job):
    jid, s = done_job
    r = httpx.post(f"{served['url']}/api/jobs/{jid}/share", headers=_auth(served["a"]))
    assert r.status_code == 201
    url = r.json()["url"]
    page = httpx.get(url)  # no token
    assert page.status_code == 200 and "cpu-straggler.tar.gz" in page.text and "sandbox" in page.headers["content-security-policy"]
    assert httpx.get(url + "/report.json").json()["findings"] == httpx.get(s["report"]["json"], headers=_auth(served["a"])).json()["findings"]
    # the secret opens no API and no other path
    secret = url.rsplit("/", 1)[1]
    assert httpx.get(f"{served['url']}/api/jobs/{jid}", headers=_auth(secret)).status_code == 401
    assert httpx.get(url[:-3] + "abc").status_code == 404
    assert httpx.get(url + "/upload").status_code == 404


def test_share_links_are_revoked_by_their_owner_only(served, done_job):
    jid, s = done_job
    url = served["url"]
    links = [httpx.post(f"{url}/api/jobs/{jid}/share", headers=_auth(served["a"])).json()["url"] for _ in range(2)]
    assert all(httpx.get(link).status_code == 200 for link in links)
    # another token, no token, a cross-origin cookie: refused, the links still open
    assert httpx.delete(f"{url}/api/jobs/{jid}/share", headers=_auth(served["b"])).status_code == 404
    assert httpx.delete(f"{url}/api/jobs/{jid}/share").status_code == 401
    assert httpx.delete(f"{url}/api/jobs/{jid}/share", cookies={"traceql_token": served["a"]},
                        headers={"Origin": "http://evil.example"}).status_code == 403
    assert all(httpx.get(link).status_code == 200 for link in links)
    r = httpx.delete(f"{url}/api/jobs/{jid}/share", headers=_auth(served["a"]))
    assert r.status_code == 200 and r.json()["id"] == jid and r.json()["revoked"] >= 2
    assert all(httpx.get(link).status_code == 404 and httpx.get(link + "/report.json").status_code == 404
               for link in links)
    assert httpx.delete(f"{url}/api/jobs/{jid}/share", headers=_auth(served["a"])).json()["revoked"] == 0
    # the owner's own access is untouched, and a new link works again
    assert httpx.get(s["report"]["json"], headers=_auth(served["a"])).status_code == 200
    again = httpx.post(f"{url}/api/jobs/{jid}/share", headers=_auth(served["a"])).json()["url"]
    assert httpx.get(again).status_code == 200

    # the page: an "unshare (N)" button beside a shared job; its form post revokes them, a cross-origin one does not
    c = httpx.Client(base_url=url, follow_redirects=False, cookies={"traceql_token": served["a"]})
    assert f"/jobs/{jid}/unshare" in c.get("/").text and "unshare (1)" in c.get("/").text
    assert c.post(f"/jobs/{jid}/unshare", headers={"Origin": "http://evil.example"}).status_code == 404
    assert httpx.get(again).status_code == 200
    assert c.post(f"/jobs/{jid}/unshare", headers={"Origin": url}).status_code == 303
    assert httpx.get(again).status_code == 404 and f"/jobs/{jid}/unshare" not in c.get("/").text


def test_a_revoked_token_opens_nothing_and_its_share_links_close(served):
    import subprocess

    url, store = served["url"], served["store"]
    t = load.create_token(store)
    arc = load.make_archive(FIXTURES / "cpu-desync", served["archives"], "tar.gz")
    jid = load.upload(url, t, arc)
    assert _wait(url, t, jid)["status"] == "done"
    link = httpx.post(f"{url}/api/jobs/{jid}/share", headers=_auth(t)).json()["url"]
    kept = httpx.post(f"{url}/api/jobs/{_wait(url, served['a'], load.upload(url, served['a'], arc))['id']}/share",
                      headers=_auth(served["a"])).json()["url"]  # another token's link
    assert httpx.get(link).status_code == 200

    def revoke(arg_or_stdin):
        args, stdin = (["-"], arg_or_stdin) if arg_or_stdin.endswith("\n") else ([arg_or_stdin], None)
        return subprocess.run([*load.traceql_cmd(), "serve", "token", "revoke", *args, "--store", str(store)],
                              input=stdin, capture_output=True, text=True, env=load.env_for(store), cwd=REPO)

    p = revoke(t + "\n")  # on stdin: out of shell history
    assert p.returncode == 0 and "revoked the token and 1 share link(s)" in p.stdout, p.stderr
    assert httpx.get(f"{url}/api/jobs/{jid}", headers=_auth(t)).status_code == 401
    assert httpx.get(f"{url}/api/jobs", headers=_auth(t)).status_code == 401
    assert httpx.post(f"{url}/api/jobs", headers=_auth(t), files={"file": ("a.tar.gz", arc.read_bytes())}).status_code == 401
    assert httpx.get(link).status_code == 404
    assert httpx.get(kept).status_code == 200 and httpx.get(f"{url}/api/jobs", headers=_auth(served["a"])).status_code == 200
    # an unknown or already revoked token: exit 2 and one line saying so
    p = revoke(t)
    assert p.returncode == 2 and "no such token" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_upload_limits_and_bad_requests(served):
    big = served["archives"] / "big.tar"
    big.write_bytes(b"\0" * (3 << 20))
    with open(big, "rb") as f:
        r = httpx.post(f"{served['url']}/api/jobs", headers=_auth(served["a"]), files={"file": ("big.tar", f)})
    assert r.status_code == 413 and "2 MB" in r.json()["error"]
    r = httpx.post(f"{served['url']}/api/jobs", headers=_auth(served["a"]), files={"other": ("x", b"x")})
    assert r.status_code == 400 and "`file`" in r.json()["error"]
    assert httpx.post(f"{served['url']}/api/jobs", files={"file": ("x", b"x")}).status_code == 401
    # nothing is left of the refused uploads
    assert not [p for p in (served["store"] / "jobs").rglob("big.tar")]


def test_a_hostile_archive_is_a_job_with_its_refusals(served):
    buf = served["archives"] / "evil.tar.gz"
    good = (FIXTURES / "cpu-desync" / "rank0.pt.trace.json.gz").read_bytes()
    with tarfile.open(buf, "w:gz") as tf:
        for name, data in (("run/rank0.pt.trace.json.gz", good), ("../../../escaped", b"x")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        ln = tarfile.TarInfo("run/passwd")
        ln.type, ln.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(ln)
    jid = load.upload(served["url"], served["a"], buf)
    s = _wait(served["url"], served["a"], jid)
    assert s["status"] == "done", s
    srcs = httpx.get(s["report"]["json"], headers=_auth(served["a"])).json()["sources"]
    errors = sorted(x["detail"] for x in srcs if x["status"] == "error")
    assert len(errors) == 2 and "'..'" in errors[0] + errors[1] and "symbolic link" in errors[0] + errors[1]
    assert not list(served["store"].parent.rglob("escaped"))


def test_nothing_analysable_fails_with_the_reason(served):
    jid = load.upload(served["url"], served["a"], _file(served["archives"] / "notes.txt", b"just some notes\n"))
    s = _wait(served["url"], served["a"], jid)
    assert s["status"] == "failed" and "nothing could be analysed" in s["reason"], s


def _file(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def test_pages_escape_input_and_refuse_cross_origin_posts(served):
    url = served["url"]
    c = httpx.Client(base_url=url, follow_redirects=False)
    assert "default-src 'none'" in c.get("/").headers["content-security-policy"]
    assert c.post("/login", data={"token": served["b"]}, headers={"Origin": "http://evil.example"}).status_code == 403
    r = c.post("/login", data={"token": served["b"]}, headers={"Origin": url})
    assert r.status_code == 303 and "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
    hostile = "<img src=x onerror=alert(1)>.tar.gz"
    arc = load.make_archive(FIXTURES / "cpu-desync", served["archives"], "tar.gz")
    assert c.post("/upload", files={"file": (hostile, arc.read_bytes())}, headers={"Origin": "http://evil.example"}).status_code == 303
    assert "onerror" not in c.get("/").text  # refused: nothing uploaded
    assert c.post("/upload", files={"file": (hostile, arc.read_bytes())}, headers={"Origin": url}).status_code == 303
    page = c.get("/").text
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;.tar.gz" in page
    assert "<script" not in page
    # the cookie authenticates the API too, but a cross-origin POST with it is refused
    assert c.post("/api/jobs", files={"file": ("a.tar.gz", arc.read_bytes())}, headers={"Origin": "http://evil.example"}).status_code == 403


def test_retention_removes_old_finished_jobs(tmp_path):
    from traceql.serve.store import Store

    st = Store(tmp_path / "s")
    owner = st.owner(st.create_token())
    ids = []
    for i in range(3):
        jid, d = st.new_job_dir()
        (d / "u.tar").write_bytes(b"x")
        st.add_job(jid, owner, "u.tar", d / "u.tar")
        ids.append(jid)
        time.sleep(0.01)
    st.finish(ids[0], "done", "")
    st.finish(ids[1], "failed", "why")
    assert st.cleanup(None, 1) == 1  # the oldest finished one goes; the queued one is never removed
    assert st.job(ids[0]) is None and not (st.jobs_dir / ids[0]).exists()
    assert st.job(ids[1]) and st.job(ids[2])["status"] == "queued"


def test_restart_recovery_requeues_then_fails(tmp_path):
    from traceql.serve.store import MAX_ATTEMPTS, Store

    st = Store(tmp_path / "s")
    owner = st.owner(st.create_token())
    jid, d = st.new_job_dir()
    st.add_job(jid, owner, "u.tar", d / "u.tar")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert st.claim()["attempts"] == attempt
        st.recover()
    assert st.job(jid)["status"] == "failed" and "service restarts" in st.job(jid)["reason"]


def test_queue_place_and_stale_upload_folders(tmp_path):
    import os

    from traceql.serve.store import Store

    st = Store(tmp_path / "s")
    assert (os.stat(tmp_path / "s").st_mode & 0o777) == 0o700
    owner = st.owner(st.create_token())
    ids = []
    for _ in range(3):
        jid, d = st.new_job_dir()
        st.add_job(jid, owner, "u.tar", d / "u.tar")
        ids.append(jid)
        time.sleep(0.01)
    assert [st.queued_before(st.job(j)) for j in ids] == [0, 1, 2]
    st.claim()
    assert st.queued_before(st.job(ids[2])) == 1
    orphan, d = st.new_job_dir()  # an upload folder whose job row was never written
    os.utime(d, (time.time() - 7200, time.time() - 7200))
    st.cleanup(None, None)
    assert not d.exists() and all((st.jobs_dir / j).exists() for j in ids)
