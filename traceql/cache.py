"""Parquet cache of parsed tables, keyed by the source file's content (not its name or mtime).

Layout: <cache_dir>/<digest>/<table>.parquet plus source.json (status, detail, rank, meta). The digest covers the
file's bytes, its kind, the importers' code (their sources and the compiled scanner) and the version, so a
re-export, a traceql upgrade, a changed importer or an edit all miss.
A small index maps (path, size, mtime) to the digest so that a warm re-check does not re-hash large files.
<cache_dir>/run-<key>/ holds what linking builds from one exact set of sources (run_dir): derived tables
(<name>.parquet and its notes), the step columns link_run assigns (step-of-<table>), the rule pack's views
(view-<name>-<digest of its SQL, the views it reads and polars>) and what the rules concluded, costs included
(rules-<rules_digest>.json: the rules as loaded, their parameters, the sources as found and the engine's code).
A source's entry records each table's rows and bytes (source.json "shapes"): a warm check reads a table's file only
when it reads the table (model.run.Pending).

The cache is bounded: TRACEQL_CACHE_MAX_MB (default 4096; 0 = no limit) caps the bytes of its files. A folder's mtime is
its last use (a store writes it, a hit touches it); when a store takes the cache past the cap, the least recently used
entries go until it holds at most 90% of the cap, never those of the check under way (begin_run). Adding up the files
of every entry on every store would cost tens of ms on a large cache, so stores append their bytes to a running
estimate (the `usage` file) and the cache is measured only when the estimate passes the cap, or every RESCAN_EVERY
stores to correct its drift.
An entry is complete only with its source.json (written last, and listing its tables); a prune renames an entry away in
one step before deleting its files, so a reader sees a whole entry or a miss, never part of one.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from traceql import __version__

if TYPE_CHECKING:  # polars loads where tables are read: `traceql cache info|clear` never needs it
    import polars as pl

    from traceql.model import Source
    from traceql.model.run import Pending

FORMAT_VERSION = "4"  # bump when the cache layout itself changes (importer code changes are caught by _ingest_digest)
# Parquet without compression: a warm re-check is mostly these reads, and decoding uncompressed pages takes half the CPU
# of lz4 ones (8 ranks x 216k events: 0.06 against 0.12 CPU s) for ~1.7x the bytes (47 against 28 MB), still an eighth
# of the traces' JSON. Entries written compressed (by older versions) read the same: Parquet names its codec per page.
_COMPRESSION = "uncompressed"


def cache_dir() -> Path:
    env = os.environ.get("TRACEQL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "traceql"


def hash_path(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(path)).encode())
                h.update(hash_path(p).encode())
        return h.hexdigest()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def digest(source: Source) -> str:
    remote = source.meta.get("remote")
    if isinstance(remote, dict):  # at a URL (traceql.remote): keyed by its URL and its listing's version, not read
        if not remote.get("version"):
            raise OSError("no version in its listing: not cached")  # _cached: the cache is not used for it
        content = hashlib.blake2b(f"{remote['root']}|{remote['path']}|{remote['version']}".encode(),
                                  digest_size=16).hexdigest()
        return hashlib.blake2b(f"{content}|{source.kind}|{_ingest_digest()}|{FORMAT_VERSION}|{__version__}".encode(),
                               digest_size=16).hexdigest()
    st = source.path.stat()
    index = cache_dir() / "index"
    stamp = hashlib.blake2b(f"{source.path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode(), digest_size=12).hexdigest()
    idx = index / stamp
    content = None
    if not source.path.is_dir():
        try:
            content = idx.read_text().strip() or None
            if content is not None:
                _touch(idx)
        except OSError:
            content = None
    if content is None:
        content = hash_path(source.path)
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
        here = Path(__file__).resolve().parent / "ingest"
        h = hashlib.blake2b(digest_size=12)
        files = [*here.glob("*.py"), *here.glob("*.c"), *here.glob("_kscan*.so"), here.parent / "model" / "tables.py",
                 Path(__file__).resolve()]
        for p in sorted(files):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _INGEST = h.hexdigest()
    return _INGEST


def load(source: Source, key: str, reread=None) -> dict[str, pl.DataFrame | Pending] | None:
    """The tables the store wrote for this source, restamped with its id; None for a miss. An entry that records its
    tables' rows and bytes gives each table as a Pending (model.run): its file is read when the check first reads the
    table, and many a warm check never does. reread(name): the table read from the source itself, for a file found
    damaged only then (a damaged entry is a miss, never an error, however late it is found)."""
    d = cache_dir() / key
    meta_path = d / "source.json"
    if not meta_path.exists():
        return None
    import polars as pl

    from traceql.model.run import Pending

    try:
        meta = orjson.loads(meta_path.read_bytes())
        shapes = meta.get("shapes")
        if shapes is not None and reread is not None:
            # exactly the tables the store wrote, each of the size it wrote: one missing or cut short is a miss now
            tables = {}
            for n in meta["tables"]:
                rows, nbytes = shapes[n]
                p = d / f"{n}.parquet"
                if p.stat().st_size != nbytes:
                    return None
                tables[n] = Pending(rows, _reader(p, n, source.id, reread))
        else:
            tables = {n: _restamp(pl.read_parquet(d / f"{n}.parquet"), source.id) for n in meta["tables"]}
        fields = (meta["status"], meta["detail"], meta["rank"], meta["ranks"], meta["rank_origin"],
                  meta.get("host"), meta.get("meta", {}))
    except Exception:  # a damaged cache entry is a miss, never an error
        return None
    _touch(d)
    source.status, source.detail, source.rank, source.ranks, source.rank_origin, source.host, source.meta = fields
    return tables


def _reader(path: Path, name: str, source_id: int, reread):
    def read():
        import polars as pl

        try:
            df = pl.read_parquet(path)
        except Exception:  # damaged or pruned since load() looked: read from the source instead
            return reread(name)
        return _restamp(df, source_id)  # source ids are per discovery

    return read


def _restamp(t, source_id: int):
    """t with its source column (in place, or appended) set to source_id: built as a Series, not by with_columns,
    which runs a polars plan per table of every cached source on each warm check."""
    import polars as pl

    col = pl.Series("source", [source_id], dtype=pl.Int32).new_from_index(0, t.height)
    if "source" in t.columns:
        return t.clone().replace_column(t.get_column_index("source"), col)
    return t.hstack([col])


def store(source: Source, key: str, tables: dict[str, pl.DataFrame]) -> None:
    d = cache_dir() / key
    tmp = d.with_name(d.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        written = []
        shapes = {}  # rows and bytes of each table: a load reads a table's file only when the check reads it
        for name, df in tables.items():
            if df.height:
                df.write_parquet(tmp / f"{name}.parquet", compression=_COMPRESSION, statistics=False)
                written.append(name)
                shapes[name] = [df.height, (tmp / f"{name}.parquet").stat().st_size]
        meta = {
            "tables": written,
            "shapes": shapes,
            "status": source.status,
            "detail": source.detail,
            "rank": source.rank,
            "ranks": source.ranks,
            "rank_origin": source.rank_origin,
            "host": source.host,
            "meta": source.meta,
        }
        (tmp / "source.json").write_bytes(orjson.dumps(meta, default=str))  # last: it makes the entry complete
        if d.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        nbytes = _tree_size(tmp)
        tmp.rename(d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    _added(nbytes, keep=d)


def _code_digest() -> str:
    """The code derived tables come from (traceql/link and the measures it uses): a change to it is a miss even
    when the version string stays the same, as it does between releases."""
    global _CODE
    if _CODE is None:
        root = Path(__file__).resolve().parent
        h = hashlib.blake2b(digest_size=12)
        for p in sorted([*(root / "link").glob("*.py"), root / "intervals.py", *(root / "model").glob("*.py")]):
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
    import polars as pl

    try:
        # the notes are written before the table and always exist beside it: without them the entry is incomplete
        notes = orjson.loads((folder / f"{name}.notes.json").read_bytes())
        df = pl.read_parquet(p)
    except Exception:  # a damaged or half-deleted entry is a miss
        return None
    _touch(folder)
    return df, notes


def store_derived(folder: Path, name: str, df: pl.DataFrame, notes: list[str]) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}.parquet"
        df.write_parquet(tmp, compression=_COMPRESSION, statistics=False)
        notes_path = folder / f"{name}.notes.json"
        notes_path.write_bytes(orjson.dumps(notes))
        nbytes = tmp.stat().st_size + notes_path.stat().st_size
        tmp.rename(folder / f"{name}.parquet")
    except Exception:  # a table parquet cannot hold, a full disk: build it again next time
        return
    _added(nbytes, keep=folder)


def rules_digest(rules, overrides: dict, sources) -> str:
    """The key of what the rules concluded on a run whose derived tables live in one run folder: every rule as loaded
    (all its fields, the pack's views), the parameters it ran with, the sources as this check found them (paths,
    statuses, ranks: tables built from the statuses, and the findings' source lists, are not covered by the run
    folder's key), the rule engine's code and polars' version."""
    import polars as pl

    h = hashlib.blake2b(digest_size=16)
    root = Path(__file__).resolve().parent
    h.update(f"{_code_digest()}|{pl.__version__}|{FORMAT_VERSION}|{__version__}".encode())
    for p in sorted((root / "rules").glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    views: dict = {}
    for r in rules:
        fields = {k: v for k, v in vars(r).items() if k not in ("views", "docs", "fixtures", "path")}
        h.update(orjson.dumps([r.path.name, fields, overrides.get(r.id) or {}], default=repr,
                              option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
        views.update({n: v.sql for n, v in (r.views or {}).items()})
    h.update(orjson.dumps(views, option=orjson.OPT_SORT_KEYS))
    for s in sources:
        h.update(orjson.dumps([str(s.path), s.kind, s.status, s.detail, s.rank, s.ranks, s.rank_origin, s.host,
                               s.cache_key], default=repr))
    return h.hexdigest()


def load_results(folder: Path, key: str) -> dict | None:
    try:
        data = orjson.loads((folder / f"rules-{key}.json").read_bytes())
    except Exception:  # absent or damaged: a miss
        return None
    _touch(folder)
    return data


def store_results(folder: Path, key: str, data: dict) -> None:
    try:
        raw = orjson.dumps(data)
        if orjson.loads(raw) != data:  # a value JSON would not give back exactly: not kept
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".rules-{key}.{os.getpid()}.json"
        tmp.write_bytes(raw)
        tmp.rename(folder / f"rules-{key}.json")
    except Exception:
        return
    _added(len(raw), keep=folder)


# --- size cap ---------------------------------------------------------------------------------------------------------

MAX_MB_DEFAULT = 4096
PRUNE_TO = 0.9  # a prune leaves room for several stores before the next one
RESCAN_EVERY = 100  # stores between measurements even under the cap: the estimate misses deletions by hand, lost lines
STALE_TMP_S = 3600  # a store's temporary folder this old belongs to a process that died

# Only names the cache writes are ever deleted; anything else in the folder is left alone.
_CONTENT = re.compile(r"[0-9a-f]{32}")
_RUN = re.compile(r"run-[0-9a-f]{32}")
_TMP = re.compile(r"[0-9a-f]{32}\.tmp\d+")  # store() writing, or a store that died
_DOOMED = re.compile(r"(?:run-)?[0-9a-f]{32}\.del\d+")  # renamed away by a prune, its files being deleted
_STAMP = re.compile(r"[0-9a-f]{24}")  # index/<stamp>
_USAGE = "usage"  # running estimate of the cache's bytes: one number a line, summed


@dataclass
class Entry:
    path: Path
    kind: str  # "content" (a source's tables), "run" (a run's derived tables), "tmp", "doomed" (leftovers)
    used: float  # last use, seconds since the epoch: the folder's mtime (stores write it, hits touch it)
    size: int  # bytes of its files


def cap_setting() -> tuple[int | None, str | None]:
    """(the cap in bytes, or None for no limit; what is wrong with TRACEQL_CACHE_MAX_MB, if anything)."""
    raw = os.environ.get("TRACEQL_CACHE_MAX_MB", "").strip()
    if not raw:
        return MAX_MB_DEFAULT << 20, None
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not math.isfinite(mb) or mb < 0:
        return MAX_MB_DEFAULT << 20, (f"TRACEQL_CACHE_MAX_MB={raw!r} is not a size in MB (a number >= 0, 0 for no "
                                      f"limit); using {MAX_MB_DEFAULT}")
    return (None if mb == 0 else int(mb * (1 << 20))), None


def max_bytes() -> int | None:
    return cap_setting()[0]


def _touch(path: Path) -> None:
    """Mark a use. A read-only cache still serves hits; it just cannot keep its order of use."""
    try:
        os.utime(path)
    except OSError:
        pass


def _tree_size(path: str | Path) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    total += _tree_size(e.path) if e.is_dir(follow_symlinks=False) else e.stat(follow_symlinks=False).st_size
                except OSError:  # deleted meanwhile
                    pass
    except OSError:
        pass
    return total


def entries(root: Path | None = None) -> list[Entry]:
    """Every folder the cache wrote, with its last use and size. Symbolic links are not followed, nor deleted."""
    root = cache_dir() if root is None else root
    out = []
    try:
        it = os.scandir(root)
    except OSError:
        return out
    with it:
        for e in it:
            n = e.name
            kind = ("content" if _CONTENT.fullmatch(n) else "run" if _RUN.fullmatch(n) else "tmp" if _TMP.fullmatch(n)
                    else "doomed" if _DOOMED.fullmatch(n) else None)
            if kind is None:
                continue
            try:
                if not e.is_dir(follow_symlinks=False):
                    continue
                used = e.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            out.append(Entry(Path(e.path), kind, used, _tree_size(e.path)))
    return out


def _stamps(root: Path) -> list[Entry]:
    out = []
    if (root / "index").is_symlink():  # not a folder the cache made: leave what it points at alone
        return out
    try:
        it = os.scandir(root / "index")
    except OSError:
        return out
    with it:
        for e in it:
            if _STAMP.fullmatch(e.name):
                try:
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out.append(Entry(Path(e.path), "stamp", st.st_mtime, st.st_size))
                except OSError:
                    pass
    return out


def _remove(e: Entry) -> bool:
    """Delete one entry; False where another process got there first (or the cache is read-only)."""
    if e.kind == "stamp":
        try:
            os.unlink(e.path)
            return True
        except OSError:
            return False
    if e.kind in ("content", "run"):
        # One rename takes the whole entry out of use: a reader finds all of it or nothing, never a part.
        doomed = e.path.with_name(f"{e.path.name}.del{os.getpid()}")
        try:
            os.rename(e.path, doomed)
        except OSError:  # FileNotFoundError: pruned by another process meanwhile
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        return True
    shutil.rmtree(e.path, ignore_errors=True)
    return not e.path.exists()


def _write_usage(root: Path, total: int) -> None:
    tmp = root / f"{_USAGE}.tmp{os.getpid()}"
    try:
        tmp.write_bytes(b"%d\n" % total)
        os.replace(tmp, root / _USAGE)
    except OSError:
        pass


# The check under way: the entries it has stored or hit (used since it began) are its own, and a prune never evicts
# them: a run bigger than the cap would otherwise evict its own first ranks while storing its last (and its derived
# tables after them), and the next check of the same run would be cold again. The cache then holds more than the cap
# and the run says so (over_cap_note). A process checks one run at a time: the next begin_run ends the protection.
_run_began: tuple[Path, float] | None = None  # (the cache folder, when the check began)
_run_over: int = 0  # the most bytes above the cap this run's own entries needed


def begin_run(since: float | None = None) -> None:
    """From now on (or from `since`, when the check began elsewhere), this check's entries are never evicted."""
    global _run_began, _run_over
    # mtimes are whole seconds on some filesystems
    _run_began, _run_over = (cache_dir(), time.time() - 2 if since is None else since), 0


def _ours_since(root: Path) -> float | None:
    return _run_began[1] if _run_began is not None and _run_began[0] == root else None


def over_cap_note() -> str | None:
    """A note when the run's own entries did not fit under the cap, else None."""
    cap = max_bytes()
    if not _run_over or cap is None:
        return None
    return (f"the Parquet cache holds {(cap + _run_over) / (1 << 20):.0f} MB, above its {cap / (1 << 20):.0f} MB cap "
            "(TRACEQL_CACHE_MAX_MB), because this run's parsed sources alone need that much and evicting them would "
            "make the next check of this run cold; other runs' entries go first (raise the cap to keep them too)")


def prune(keep: Path | None = None, cap: int | None = None) -> tuple[int, int]:
    """Measure the cache and, where it holds more than `cap` bytes (default: TRACEQL_CACHE_MAX_MB), delete the least
    recently used entries, run folders and index stamps alike, until it holds at most PRUNE_TO of the cap. `keep` (the
    entry just written) is never deleted. Leftovers of dead processes go whatever the size. Returns (entries deleted,
    bytes freed), counting source and run entries only as entries."""
    global _run_over
    root = cache_dir()
    cap = max_bytes() if cap is None else cap
    now = time.time()
    found = entries(root)
    total = sum(e.size for e in found)
    removed = freed = 0
    for e in found:
        if e.kind == "doomed" or (e.kind == "tmp" and now - e.used > STALE_TMP_S):
            if _remove(e):
                total -= e.size
                freed += e.size
    stamps = _stamps(root)
    total += sum(s.size for s in stamps)
    if cap is not None and total > cap:
        # Stamps join the order of use: one not used since before the last entry evicted most likely names a file
        # whose entry is gone. Ties go to the stamp, which is cheaper to rebuild.
        ours = _ours_since(root)
        lru = sorted([e for e in found if e.kind in ("content", "run") and e.path != keep
                      and (ours is None or e.used < ours)] + stamps,
                     key=lambda e: (e.used, e.kind != "stamp"))
        for e in lru:
            if total <= cap * PRUNE_TO:
                break
            if _remove(e):
                freed += e.size
                removed += e.kind != "stamp"
            total -= e.size  # gone either way: by us or by a process pruning beside us
        if ours is not None and total > cap:
            _run_over = max(_run_over, total - cap)
    if root.is_dir():
        _write_usage(root, total)
    return removed, freed


def _added(nbytes: int, keep: Path) -> None:
    """After a store: add its bytes to the running estimate, and prune when the estimate passes the cap. Appends are
    atomic, so concurrent stores do not lose each other's lines; a prune rewrites the file with what it measured."""
    cap = max_bytes()
    root = cache_dir()
    if cap is None:  # no limit: drop the estimate, so that the first store under a cap measures the cache afresh
        try:
            os.unlink(root / _USAGE)
        except OSError:
            pass
        return
    try:
        with open(root / _USAGE, "a+b") as f:
            f.write(b"%d\n" % nbytes)
            f.seek(0)
            lines = f.read().split()
        estimate = sum(map(int, lines))
    except (OSError, ValueError):  # unreadable estimate: measure
        lines, estimate = [], cap + 1
    # one line: the file was just created, so the estimate knows only this store
    if estimate > cap or len(lines) <= 1 or len(lines) > RESCAN_EVERY:
        prune(keep, cap)


def usage() -> dict[str, int]:
    """What the cache holds: parsed sources, runs' derived tables, unfinished leftovers, and the bytes of all of them
    with the index."""
    root = cache_dir()
    found = entries(root)
    return {
        "sources": sum(e.kind == "content" for e in found),
        "runs": sum(e.kind == "run" for e in found),
        "leftovers": sum(e.kind in ("tmp", "doomed") for e in found),
        "bytes": sum(e.size for e in found) + sum(s.size for s in _stamps(root)),
    }


def clear() -> tuple[int, int]:
    """Delete every entry, leftover and index stamp, and the estimate; files the cache did not write stay.
    Returns (source and run entries deleted, bytes freed: what usage() counted)."""
    root = cache_dir()
    removed = freed = 0
    for e in entries(root) + _stamps(root):
        if _remove(e):
            freed += e.size
            removed += e.kind in ("content", "run")
    try:
        (root / "index").rmdir()  # only if empty: unknown files in it stay
    except OSError:
        pass
    try:
        os.unlink(root / _USAGE)
    except OSError:
        pass
    return removed, freed
