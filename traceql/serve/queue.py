"""The job queue: the store's jobs table is the queue (it survives a restart), worker threads take the oldest queued
job and run it as a subprocess (job.py), at most `workers` at once.

A job's process reads untrusted input: it runs with every source in a budgeted worker (TRACEQL_SOURCE_ISOLATION=
always), under a whole-job time limit, in its own process group, and dies with the service (PR_SET_PDEATHSIG on
Linux). Each attempt writes into its own folder (run-N), so a process of an earlier attempt can never write into the
reports of a later one. A kill or crash fails the job with the reason; a service stop leaves its running jobs
'running', and the next start puts them back in the queue (store.recover)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from traceql.serve.store import Store

DEFAULT_JOB_TIMEOUT_S = 1800.0
CLEANUP_EVERY_S = 600.0


def _libc_prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:  # not Linux: the child simply does not die with the service
        return None


# resolved here, once: between fork and exec a multithreaded server must not import or dlopen anything
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    line = lines[-1] if lines else ""
    return line.removeprefix("traceql: ")[:500]


class Queue:
    def __init__(self, store: Store, workers: int = 2, job_timeout_s: float | None = DEFAULT_JOB_TIMEOUT_S,
                 keep_days: float | None = 30, keep_jobs: int | None = 1000):
        self.store, self.workers, self.job_timeout_s = store, max(1, workers), job_timeout_s
        self.keep_days, self.keep_jobs = keep_days, keep_jobs
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: dict[str, subprocess.Popen] = {}
        self._last_cleanup = 0.0
        self.env = dict(os.environ)
        self.env.update({
            "TRACEQL_SOURCE_ISOLATION": "always",
            "TRACEQL_CACHE_DIR": str(store.root / "cache"),
            "TMPDIR": str(store.root / "tmp"),  # archives expand on the store's disk, not in a small /tmp
            "PYTHONWARNINGS": "ignore",
        })
        (store.root / "tmp").mkdir(exist_ok=True, mode=0o700)

    def start(self) -> tuple[int, int]:
        recovered = self.store.recover()
        self.cleanup(force=True)
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"traceql-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return recovered

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    def stop(self) -> None:
        """Stop taking jobs and kill the running ones; they stay 'running' and are resumed on the next start."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for p in list(self._procs.values()):
            _kill(p)
        for t in self._threads:
            t.join(timeout=10)

    def cleanup(self, force: bool = False) -> int:
        if not force and time.monotonic() - self._last_cleanup < CLEANUP_EVERY_S:
            return 0
        self._last_cleanup = time.monotonic()
        try:
            return self.store.cleanup(self.keep_days, self.keep_jobs)
        except Exception:  # noqa: BLE001  (two workers cleaning at once, a locked database: the next round retries)
            return 0

    def _work(self) -> None:
        while not self._stop.is_set():
            job = self.store.claim()
            if job is None:
                with self._wake:
                    self._wake.wait(timeout=1.0)
                self.cleanup()
                continue
            try:
                self._run(job)
            except Exception as e:  # a bug here must fail the job, not leave it running forever
                if not self._stop.is_set():
                    self.store.finish(job["id"], "failed", f"internal error of the service: {type(e).__name__}: {e}")
            self.cleanup()  # after the job is recorded: a cleanup's error never turns a finished job into a failed one

    def _run(self, job: dict) -> None:
        jid = job["id"]
        out = self.store.jobs_dir / jid / f"run-{job['attempts']}"
        out.mkdir(mode=0o700, exist_ok=True)
        with open(out / "stderr.log", "wb") as err:
            p = subprocess.Popen([sys.executable, "-m", "traceql.serve.job", job["upload"], str(out)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                                 cwd=str(out), start_new_session=True, preexec_fn=_die_with_parent)
        self._procs[jid] = p
        try:
            rc = p.wait(timeout=self.job_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill(p)
            rc, timed_out = p.wait(), True
        finally:
            self._procs.pop(jid, None)
        if self._stop.is_set():
            return  # stopped by the service's shutdown: left 'running', resumed at the next start
        said = _last_line(out / "stderr.log")
        if timed_out:
            self.store.finish(jid, "failed", f"stopped after the job time limit of {self.job_timeout_s:g} s "
                              "(traceql serve --job-timeout); split the run or check it locally")
        elif rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            self.store.finish(jid, "failed", f"the check process was killed ({name})" + (f": {said}" if said else ""),
                              exit_code=rc)
        elif rc in (0, 1, 3) and (out / "report.json").is_file():
            findings = json.loads((out / "report.json").read_bytes()).get("findings", [])
            reason = said if rc == 3 else ""  # 3: a rule or a source hit an internal error; the report says which
            self.store.finish(jid, "done", reason, report=out.name, exit_code=rc, findings=findings)
        else:
            self.store.finish(jid, "failed", said or f"the check process exited with status {rc}", exit_code=rc)


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # its budget workers too
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except ProcessLookupError:
            pass
