"""Load test of `traceql serve` on loopback: concurrent uploads of real fixture archives, one job killed mid-run, the
service restarted mid-queue. Checks that no job is lost (each ends done, or failed with a reason), that no report is
mixed up (each done job's findings equal `traceql check` on the same run dir) and prints the server's resident memory.

    python benchmarks/serve_load.py [--jobs N] [--workers W] [--deadline S]

tests/test_serve_load.py runs a bounded version (small N). Numbers: benchmarks/README.md, "Upload service".
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
LOAD_FIXTURES = ["cpu-straggler", "cpu-desync", "cpu-exposed-allreduce", "cpu-small-allreduce-storm", "compile-graph-break",
                 "cpu-grad-accum-without-no_sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def traceql_cmd() -> list[str]:
    return [sys.executable, "-c", "from traceql.cli import main; main()"]  # this checkout's traceql, whatever is on PATH


def env_for(store: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TRACEQL_CACHE_DIR"] = str(store / "cli-cache")
    return env


def create_token(store: Path) -> str:
    out = subprocess.run([*traceql_cmd(), "serve", "token", "create", "--store", str(store)], capture_output=True,
                         text=True, check=True, env=env_for(store), cwd=REPO).stdout
    return out.split()[-1]  # the interface: the token is the last word


class Server:
    """`traceql serve` in a subprocess on 127.0.0.1:PORT, with its RSS sampled."""

    def __init__(self, store: Path, port: int, workers: int = 2, extra: list[str] | None = None):
        self.store, self.port, self.workers, self.extra = store, port, workers, extra or []
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.rss_max = 0
        self._sampling = False

    def start(self, timeout: float = 60) -> Server:
        self.log = open(self.store.parent / f"serve-{self.port}.log", "ab")
        self.proc = subprocess.Popen([*traceql_cmd(), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--store",
                                      str(self.store), "--workers", str(self.workers), *self.extra],
                                     stdout=self.log, stderr=self.log, env=env_for(self.store), cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"traceql serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                httpx.get(self.url + "/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"traceql serve did not answer within {timeout} s")
        self._sampling = True
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self) -> None:
        while self._sampling and self.proc and self.proc.poll() is None:
            self.rss_max = max(self.rss_max, rss_bytes(self.proc.pid))
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        self._sampling = False
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def job_pids(job_id: str) -> list[int]:
    """Processes of `python -m traceql.serve.job` for this job (their command line names its folder)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"traceql.serve.job" in cmd and any(job_id.encode() in c for c in cmd):
                pids.append(int(d.name))
    return pids


def make_archive(run_dir: Path, out_dir: Path, fmt: str) -> Path:
    if fmt == "zip":
        path = out_dir / f"{run_dir.name}.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in sorted(run_dir.rglob("*")):
                if p.is_file():
                    zf.write(p, f"{run_dir.name}/{p.relative_to(run_dir)}")
        return path
    path = out_dir / f"{run_dir.name}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        tf.add(run_dir, arcname=run_dir.name)
    return path


def expected_findings(run_dir: Path, store: Path) -> list[tuple]:
    """`traceql check RUN_DIR --format json`, as the comparison key of each finding."""
    r = subprocess.run([*traceql_cmd(), "check", str(run_dir), "--format", "json", "-q"], capture_output=True, text=True,
                       env=env_for(store), cwd=REPO)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"traceql check {run_dir} exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return key(json.loads(r.stdout)["findings"])


def key(findings: list[dict]) -> list[tuple]:
    return [(f["rule"], tuple(f["ranks"]), f["step"], f["message"], f["fingerprint"]) for f in findings]


def upload(url: str, token: str, path: Path) -> str:
    with open(path, "rb") as f:
        r = httpx.post(url + "/api/jobs", headers={"Authorization": f"Bearer {token}"},
                       files={"file": (path.name, f, "application/octet-stream")}, timeout=120)
    r.raise_for_status()
    return r.json()["id"]


def status(url: str, token: str, jid: str) -> dict:
    r = httpx.get(f"{url}/api/jobs/{jid}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def run_load(n_jobs: int = 12, workers: int = 2, deadline_s: float = 600, fixtures: list[str] | None = None,
             work: Path | None = None, log=print) -> dict:
    """The scenario; returns its numbers and the problems found (an empty list: none)."""
    work = Path(work or tempfile.mkdtemp(prefix="traceql-serve-load-"))
    store = work / "store"
    names = fixtures or LOAD_FIXTURES
    archives_dir = work / "archives"
    archives_dir.mkdir(parents=True, exist_ok=True)
    archives = {n: make_archive(FIXTURES / n, archives_dir, "zip" if i % 2 else "tar.gz") for i, n in enumerate(names)}
    want = {n: expected_findings(FIXTURES / n, store) for n in names}
    tokens = [create_token(store), create_token(store)]
    port = free_port()
    server = Server(store, port, workers).start()
    rss = []
    t0 = time.monotonic()
    problems: list[str] = []
    plan = [(names[i % len(names)], tokens[i % 2]) for i in range(n_jobs)]
    try:
        with cf.ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda p: upload(server.url, p[1], archives[p[0]]), plan))
        uploaded = time.monotonic() - t0
        jobs = {jid: (name, tok) for jid, (name, tok) in zip(ids, plan)}
        log(f"uploaded {n_jobs} archives in {uploaded:.2f} s")
        # one job killed mid-run: the first one seen running whose process can be found
        killed = None
        while killed is None and time.monotonic() - t0 < deadline_s:
            for jid, (_, tok) in jobs.items():
                if status(server.url, tok, jid)["status"] == "running":
                    pids = job_pids(jid)
                    if pids:
                        for pid in pids:
                            os.kill(pid, signal.SIGKILL)
                        killed = jid
                        break
            time.sleep(0.05)
        log(f"killed the check process of job {killed}")
        # the service restarted mid-queue and mid-run: once a job is done, one is running and one still waits, the
        # server stopped at once after that look (a job seen running then is interrupted, unless it ends in the few
        # milliseconds between: a fresh look after it, as here before, could find both workers between two jobs)
        before: dict[str, str] = {}
        while time.monotonic() - t0 < deadline_s:
            before = {jid: status(server.url, tok, jid)["status"] for jid, (_, tok) in jobs.items()}
            st = list(before.values())
            if "done" in st and "queued" in st and "running" in st:
                break
            if "queued" not in st:
                problems.append("the queue drained before the restart could happen (raise --jobs)")
                break
            time.sleep(0.05)
        server.stop()
        rss.append(server.rss_max)
        log(f"restarted the service with {sum(s == 'queued' for s in before.values())} queued and "
            f"{sum(s == 'running' for s in before.values())} running")
        server = Server(store, port, workers).start()
        final: dict[str, dict] = {}
        while time.monotonic() - t0 < deadline_s and len(final) < len(jobs):
            for jid, (_, tok) in jobs.items():
                if jid not in final:
                    s = status(server.url, tok, jid)
                    if s["status"] in ("done", "failed"):
                        final[jid] = s
            time.sleep(0.2)
        wall = time.monotonic() - t0
        rss.append(server.rss_max)
        # the checks
        lost = [jid for jid in jobs if jid not in final]
        if lost:
            problems.append(f"{len(lost)} job(s) not finished within {deadline_s} s: {lost}")
        for jid, s in final.items():
            name, tok = jobs[jid]
            if s["status"] == "failed":
                if jid != killed:
                    problems.append(f"job {jid} ({name}) failed: {s['reason']!r}")
                elif not s["reason"]:
                    problems.append(f"killed job {jid} failed without a reason")
                continue
            if jid == killed:
                continue  # it finished before the kill reached it
            report = httpx.get(s["report"]["json"], headers={"Authorization": f"Bearer {tok}"}, timeout=30).json()
            if key(report["findings"]) != want[name]:
                problems.append(f"job {jid}: findings differ from traceql check fixtures/{name}")
            if not all(src["path"].startswith(archives[name].name + "!/") for src in report["sources"]):
                problems.append(f"job {jid}: its report lists sources of another upload")
            other = tokens[1] if tok == tokens[0] else tokens[0]
            if httpx.get(f"{server.url}/api/jobs/{jid}", headers={"Authorization": f"Bearer {other}"}).status_code != 404:
                problems.append(f"job {jid} is visible to another token")
        killed_reason = final.get(killed, {}).get("reason") if killed else None
    finally:
        server.stop()
    return {
        "jobs": n_jobs, "workers": workers, "wall_s": round(wall, 2), "upload_s": round(uploaded, 2),
        "jobs_per_min": round(60 * len(final) / wall, 1) if wall else None,
        "done": sum(s["status"] == "done" for s in final.values()),
        "failed": sum(s["status"] == "failed" for s in final.values()),
        "killed": killed, "killed_reason": killed_reason, "rss_max_mb": [round(r / 2**20, 1) for r in rss],
        "requeued_at_restart": sum(s == "running" for s in before.values()), "problems": problems,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=24)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=900)
    a = ap.parse_args()
    out = run_load(a.jobs, a.workers, a.deadline)
    print(json.dumps(out, indent=2))
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
