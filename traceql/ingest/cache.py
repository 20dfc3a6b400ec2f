"""Parquet cache of parsed tables, keyed by the source file's content (not its name or mtime).

Layout: <cache_dir>/<digest>/<table>.parquet plus source.json (status, detail, rank, meta). The digest covers the
file's bytes, its kind, the importers' code (their sources and the compiled scanner) and the version, so a
re-export, a traceql upgrade, a changed importer or an edit all miss.
A small index maps (path, size, mtime) to the digest so that a warm re-check does not re-hash large files.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import polars as pl

from traceql import __version__
from traceql.model import Source

FORMAT_VERSION = "3"  # bump when the cache layout itself changes (importer code changes are caught by _ingest_digest)


def cache_dir() -> Path:
    env = os.environ.get("TRACEQL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceql"


def _hash_path(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(path)).encode())
                h.update(_hash_path(p).encode())
        return h.hexdigest()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def digest(source: Source) -> str:
    st = source.path.stat()
    index = cache_dir() / "index"
    stamp = hashlib.blake2b(f"{source.path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode(), digest_size=12).hexdigest()
    idx = index / stamp
    content = None
    if not source.path.is_dir():
        try:
            content = idx.read_text().strip() or None
        except OSError:
            content = None
    if content is None:
        content = _hash_path(source.path)
        try:
            index.mkdir(parents=True, exist_ok=True)
            idx.write_text(content)
        except OSError:
            pass
    code = _ingest_digest()
    return hashlib.blake2b(f"{content}|{source.kind}|{code}|{FORMAT_VERSION}|{__version__}".encode(),
                           digest_size=16).hexdigest()


_INGEST: str | None = None


def _ingest_digest() -> str:
    """The code tables come from: every importer, the compiled scanner and the canonical schemas. A change to any of
    them is a miss, even when the version string stays the same (as it does between releases)."""
    global _INGEST
    if _INGEST is None:
        here = Path(__file__).resolve().parent
        h = hashlib.blake2b(digest_size=12)
        files = [*here.glob("*.py"), *here.glob("*.c"), *here.glob("_kscan*.so"), here.parent / "model" / "tables.py"]
        for p in sorted(files):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _INGEST = h.hexdigest()
    return _INGEST


def load(source: Source, key: str) -> dict[str, pl.DataFrame] | None:
    d = cache_dir() / key
    meta_path = d / "source.json"
    if not meta_path.exists():
        return None
    try:
        meta = orjson.loads(meta_path.read_bytes())
        tables = {p.stem: pl.read_parquet(p) for p in d.glob("*.parquet")}
    except Exception:  # a damaged cache entry is a miss, never an error
        return None
    source.status = meta["status"]
    source.detail = meta["detail"]
    source.rank = meta["rank"]
    source.ranks = meta["ranks"]
    source.rank_origin = meta["rank_origin"]
    source.host = meta.get("host")
    source.meta = meta.get("meta", {})
    # source ids are per discovery; restamp them
    return {n: t.with_columns(pl.lit(source.id, dtype=pl.Int32).alias("source")) for n, t in tables.items()}


def store(source: Source, key: str, tables: dict[str, pl.DataFrame]) -> None:
    d = cache_dir() / key
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            if df.height:
                df.write_parquet(tmp / f"{name}.parquet", compression="lz4", statistics=False)
        meta = {
            "status": source.status,
            "detail": source.detail,
            "rank": source.rank,
            "ranks": source.ranks,
            "rank_origin": source.rank_origin,
            "host": source.host,
            "meta": source.meta,
        }
        (tmp / "source.json").write_bytes(orjson.dumps(meta, default=str))
        if d.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            return
        tmp.rename(d)
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _code_digest() -> str:
    """The code derived tables come from (traceql/link and the measures it uses): a change to it is a miss even
    when the version string stays the same, as it does between releases."""
    global _CODE
    if _CODE is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.blake2b(digest_size=12)
        for p in sorted([*(root / "link").glob("*.py"), root / "rules" / "measures.py", root / "model" / "tables.py"]):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _CODE = h.hexdigest()
    return _CODE


_CODE: str | None = None


def run_dir(keyed_sources: list[tuple[int, str]]) -> Path:
    """Derived tables of a run depend on exactly its sources (with their ids, which appear in the tables) and the
    linking code: one folder per such combination."""
    text = "|".join(f"{i}:{k}" for i, k in sorted(keyed_sources))
    key = hashlib.blake2b(f"{text}|{_code_digest()}|{FORMAT_VERSION}|{__version__}".encode(), digest_size=16).hexdigest()
    return cache_dir() / f"run-{key}"


def load_derived(folder: Path, name: str) -> tuple[pl.DataFrame, list[str]] | None:
    p = folder / f"{name}.parquet"
    if not p.exists():
        return None
    try:
        notes_path = folder / f"{name}.notes.json"
        notes = orjson.loads(notes_path.read_bytes()) if notes_path.exists() else []
        return pl.read_parquet(p), notes
    except Exception:  # a damaged entry is a miss
        return None


def store_derived(folder: Path, name: str, df: pl.DataFrame, notes: list[str]) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}.parquet"
        df.write_parquet(tmp, compression="lz4", statistics=False)
        if notes:
            (folder / f"{name}.notes.json").write_bytes(orjson.dumps(notes))
        tmp.rename(folder / f"{name}.parquet")
    except Exception:  # a table parquet cannot hold, a full disk: build it again next time
        return
