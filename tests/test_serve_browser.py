"""The upload page in headless Chromium (Debian `chromium`), as a person uses it: sign in, upload, wait, open the
report, then open a share link in a fresh browser (a new --user-data-dir: no cookie, no token).

Chromium is driven with the Chrome DevTools Protocol over --remote-debugging-pipe (file descriptors 3 and 4, one JSON
message per NUL-terminated line), which needs no websocket client."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")

from tests.conftest import FIXTURES, REPO  # noqa: E402

# Debian's /usr/bin/chromium is a shell wrapper that does not keep descriptors 3 and 4 open: run the binary itself
CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium",) if os.access(p, os.X_OK)), None) or shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")

_spec = importlib.util.spec_from_file_location("serve_load", REPO / "benchmarks" / "serve_load.py")
load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load)


def _high(fd: int) -> int:
    """The descriptor moved to 10 or above (close-on-exec), so that putting the pipes on 3 and 4 clobbers none."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    def __init__(self, profile):
        r1, w1, r2, w2 = (_high(fd) for fd in (*os.pipe(), *os.pipe()))  # r1/w1: commands, r2/w2: replies

        def onto_3_and_4():  # in the child: where --remote-debugging-pipe expects them (dup2 clears close-on-exec)
            os.dup2(r1, 3)
            os.dup2(w2, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             f"--user-data-dir={profile}", "about:blank"],
            close_fds=False, preexec_fn=onto_3_and_4, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self.w, self.r = os.fdopen(w1, "wb"), os.fdopen(r2, "rb")
        self.n = 0
        self.buf = b""
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("DOM.enable", session=True)

    def call(self, method, session=False, **params):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        self.w.flush()
        while True:
            reply = self._read()
            if reply.get("id") == self.n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.r.fileno(), 65536)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\0", 1)
        return json.loads(line)

    def js(self, expr):
        r = self.call("Runtime.evaluate", session=True, expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    def goto(self, url):
        self.call("Page.navigate", session=True, url=url)
        self.settle()

    def settle(self, timeout=20):
        deadline = time.monotonic() + timeout
        time.sleep(0.3)
        while time.monotonic() < deadline:
            try:
                if self.js("document.readyState") == "complete":
                    return
            except RuntimeError:
                pass  # the page is between documents
            time.sleep(0.1)

    def wait_for(self, expr, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                v = self.js(expr)
                if v:
                    return v
            except RuntimeError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {expr}; page: {self.js('document.body && document.body.innerText')!r}")

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def server(tmp_path):
    store = tmp_path / "store"
    token = load.create_token(store)
    s = load.Server(store, load.free_port(), workers=1).start()
    yield s, token
    s.stop()


def test_upload_wait_open_and_share_in_a_browser(server, tmp_path):
    srv, token = server
    arc = load.make_archive(FIXTURES / "cpu-straggler", tmp_path, "tar.gz")
    b = Browser(tmp_path / "profile-a")
    try:
        b.goto(srv.url + "/")
        assert b.js("!!document.querySelector('#token')")  # the sign-in form
        b.js(f"document.querySelector('#token').value = {json.dumps(token)}; document.querySelector('#signin').click()")
        b.wait_for("!!document.querySelector('#upload')")
        # choose the file as a person would in the file dialog, then press the button
        doc = b.call("DOM.getDocument", session=True)["root"]["nodeId"]
        node = b.call("DOM.querySelector", session=True, nodeId=doc, selector="#file")["nodeId"]
        b.call("DOM.setFileInputFiles", session=True, nodeId=node, files=[str(arc)])
        b.js("document.querySelector('#send').click()")
        b.wait_for("document.querySelector('#jobs tr.job') && document.querySelector('#jobs tr.job').className.includes('done')")
        assert b.js("document.querySelector('#jobs tr.job td').textContent") == "cpu-straggler.tar.gz"
        href = b.js("document.querySelector('#jobs tr.job a[href$=\"report.html\"]').href")
        b.goto(href)
        assert b.js("document.querySelector('h1').textContent").startswith("traceql report")
        assert "TQL302" in b.js("document.body.innerText")
        b.goto(srv.url + "/")
        b.js("document.querySelector('#jobs button.share').click()")
        share = b.wait_for("document.querySelector('#share-url') && document.querySelector('#share-url').href")
    finally:
        b.close()
    fresh = Browser(tmp_path / "profile-b")  # another person: no cookie, no token
    try:
        fresh.goto(share)
        assert fresh.js("document.querySelector('h1').textContent").startswith("traceql report")
        assert "TQL302" in fresh.js("document.body.innerText")
        fresh.goto(srv.url + "/")
        assert fresh.js("!!document.querySelector('#token')") and not fresh.js("!!document.querySelector('#jobs')")
    finally:
        fresh.close()
