"""The embedded store: one SQLite file (jobs, findings, tokens and share links, secrets kept as SHA-256 hashes) and
one folder per job for the upload and its reports, under --store DIR (default $XDG_DATA_HOME/traceql, else
~/.local/share/traceql)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (hash TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, upload TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')), reason TEXT NOT NULL DEFAULT '',
  created REAL NOT NULL, started REAL, finished REAL, attempts INTEGER NOT NULL DEFAULT 0, report TEXT,
  exit_code INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner, created);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created);
CREATE TABLE IF NOT EXISTS findings (
  job TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE, rule TEXT, severity TEXT, ranks TEXT, step INTEGER,
  message TEXT, fingerprint TEXT
);
CREATE INDEX IF NOT EXISTS findings_job ON findings (job);
CREATE TABLE IF NOT EXISTS shares (
  hash TEXT PRIMARY KEY, job TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE, created REAL NOT NULL
);
"""
MAX_ATTEMPTS = 2  # a job interrupted by this many service restarts fails instead of running again


def default_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "traceql"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Store:
    """One store folder. Thread-safe: one connection per call, SQLite's own locking (WAL) between the server's threads
    and `traceql serve token create` run beside it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        if not self.root.exists():
            self.root.mkdir(parents=True, mode=0o700)  # uploads and tokens' jobs: private to the service's user
        self.jobs_dir = self.root / "jobs"
        self.jobs_dir.mkdir(exist_ok=True, mode=0o700)
        self.db = self.root / "traceql.sqlite"
        self._lock = threading.Lock()
        with self.conn() as c:
            c.executescript(SCHEMA)

    @contextmanager
    def conn(self):
        c = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        c.row_factory = sqlite3.Row
        try:
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("PRAGMA foreign_keys=ON")
            yield c
        finally:
            c.close()

    # ---------------------------------------------------------------------------------------------- tokens
    def create_token(self) -> str:
        token = "tq_" + secrets.token_urlsafe(32)
        with self.conn() as c:
            c.execute("INSERT INTO tokens VALUES (?, ?)", (_hash(token), time.time()))
        return token

    def owner(self, token: str | None) -> str | None:
        """The owner id (the token's hash) of a valid token, else None."""
        if not token:
            return None
        h = _hash(token)
        with self.conn() as c:
            return h if c.execute("SELECT 1 FROM tokens WHERE hash = ?", (h,)).fetchone() else None

    def revoke_token(self, token: str) -> int | None:
        """Revoke a token: it opens nothing from now on, and the share links made for its jobs stop working too (a
        leaked token could have made them). Its jobs stay until retention removes them. The number of share links
        revoked with it, or None for a token the store does not know."""
        h = _hash(token.strip())
        with self.conn() as c:
            c.execute("BEGIN IMMEDIATE")
            if c.execute("DELETE FROM tokens WHERE hash = ?", (h,)).rowcount == 0:
                c.execute("ROLLBACK")
                return None
            n = c.execute("DELETE FROM shares WHERE job IN (SELECT id FROM jobs WHERE owner = ?)", (h,)).rowcount
            c.execute("COMMIT")
        return n

    # ---------------------------------------------------------------------------------------------- jobs
    def new_job_dir(self) -> tuple[str, Path]:
        jid = uuid.uuid4().hex
        d = self.jobs_dir / jid
        d.mkdir(mode=0o700)
        return jid, d

    def add_job(self, jid: str, owner: str, name: str, upload: Path) -> None:
        with self.conn() as c:
            c.execute("INSERT INTO jobs (id, owner, name, upload, status, created) VALUES (?, ?, ?, ?, 'queued', ?)",
                      (jid, owner, name, str(upload), time.time()))

    def job(self, jid: str, owner: str | None = None) -> dict | None:
        """The job, only for its owner (owner=None: any, for the queue and share links)."""
        with self.conn() as c:
            row = c.execute("SELECT * FROM jobs WHERE id = ?", (jid,)).fetchone()
        if row is None or (owner is not None and row["owner"] != owner):
            return None
        return dict(row)

    def jobs_of(self, owner: str, limit: int = 200) -> list[dict]:
        with self.conn() as c:
            rows = c.execute("SELECT * FROM jobs WHERE owner = ? ORDER BY created DESC LIMIT ?", (owner, limit)).fetchall()
        return [dict(r) for r in rows]

    def claim(self) -> dict | None:
        """The oldest queued job, marked running (atomically: two workers never take the same job)."""
        with self._lock, self.conn() as c:
            row = c.execute(
                "UPDATE jobs SET status = 'running', started = ?, attempts = attempts + 1 WHERE id = "
                "(SELECT id FROM jobs WHERE status = 'queued' ORDER BY created LIMIT 1) RETURNING *", (time.time(),)
            ).fetchone()
        return dict(row) if row else None

    def finish(self, jid: str, status: str, reason: str, report: str | None = None, exit_code: int | None = None,
               findings: list[dict] | None = None) -> None:
        with self.conn() as c:
            c.execute("BEGIN IMMEDIATE")
            c.execute("UPDATE jobs SET status = ?, reason = ?, report = ?, exit_code = ?, finished = ? WHERE id = ?",
                      (status, reason, report, exit_code, time.time(), jid))
            c.execute("DELETE FROM findings WHERE job = ?", (jid,))
            c.executemany("INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?)", [
                (jid, f.get("rule"), f.get("severity"), ",".join(map(str, f.get("ranks") or [])), f.get("step"),
                 f.get("message"), f.get("fingerprint")) for f in findings or []])
            c.execute("COMMIT")

    def findings(self, jid: str) -> list[dict]:
        with self.conn() as c:
            return [dict(r) for r in c.execute("SELECT rule, severity, ranks, step, message, fingerprint FROM findings "
                                               "WHERE job = ? ORDER BY rowid", (jid,))]

    def queued_before(self, job: dict) -> int:
        """How many queued jobs will be taken before this one (its place in the queue)."""
        with self.conn() as c:
            return c.execute("SELECT count(*) FROM jobs WHERE status = 'queued' AND created < ?", (job["created"],)).fetchone()[0]

    def recover(self) -> tuple[int, int]:
        """At start: jobs left running by the last service run go back to the queue, or fail after MAX_ATTEMPTS.
        Returns (requeued, failed)."""
        with self.conn() as c:
            c.execute("BEGIN IMMEDIATE")
            failed = c.execute(
                "UPDATE jobs SET status = 'failed', finished = ?, reason = 'interrupted by ' || attempts || "
                "' service restarts while running; upload it again' WHERE status = 'running' AND attempts >= ?",
                (time.time(), MAX_ATTEMPTS)).rowcount
            requeued = c.execute("UPDATE jobs SET status = 'queued', reason = 'resumed after a service restart' "
                                 "WHERE status = 'running'").rowcount
            c.execute("COMMIT")
        return requeued, failed

    # ---------------------------------------------------------------------------------------------- shares
    def share(self, jid: str) -> str:
        secret = secrets.token_urlsafe(24)
        with self.conn() as c:
            c.execute("INSERT INTO shares VALUES (?, ?, ?)", (_hash(secret), jid, time.time()))
        return secret

    def shared_job(self, secret: str) -> dict | None:
        with self.conn() as c:
            row = c.execute("SELECT job FROM shares WHERE hash = ?", (_hash(secret),)).fetchone()
        return self.job(row["job"]) if row else None

    def unshare(self, jid: str) -> int:
        """Revoke every share link of a job; how many there were."""
        with self.conn() as c:
            return c.execute("DELETE FROM shares WHERE job = ?", (jid,)).rowcount

    def share_counts(self, owner: str) -> dict[str, int]:
        """Live share links per job of an owner (jobs without any are absent)."""
        with self.conn() as c:
            rows = c.execute("SELECT s.job, COUNT(*) FROM shares s JOIN jobs j ON j.id = s.job WHERE j.owner = ? "
                             "GROUP BY s.job", (owner,)).fetchall()
        return {r[0]: r[1] for r in rows}

    # ---------------------------------------------------------------------------------------------- retention
    def cleanup(self, keep_days: float | None, keep_jobs: int | None) -> int:
        """Remove finished jobs older than keep_days, and the oldest finished ones past keep_jobs; their files too."""
        gone: list[str] = []
        with self.conn() as c:
            if keep_days:
                gone += [r[0] for r in c.execute("SELECT id FROM jobs WHERE status IN ('done', 'failed') AND created < ?",
                                                 (time.time() - keep_days * 86400,))]
            if keep_jobs:
                gone += [r[0] for r in c.execute("SELECT id FROM jobs WHERE status IN ('done', 'failed') ORDER BY created "
                                                 "DESC LIMIT -1 OFFSET ?", (keep_jobs,))]
            gone = sorted(set(gone))
            c.executemany("DELETE FROM jobs WHERE id = ?", [(g,) for g in gone])
            known = {r[0] for r in c.execute("SELECT id FROM jobs")}
        # folders of uploads that never became a job (the service stopped between the two): after an hour
        stale = [d for d in self.jobs_dir.iterdir() if d.name not in known and time.time() - d.stat().st_mtime > 3600]
        for d in [*(self.jobs_dir / g for g in gone), *stale]:
            shutil.rmtree(d, ignore_errors=True)
        return len(gone)
