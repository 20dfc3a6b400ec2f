"""Run dirs at fsspec URLs (s3://bucket/run7/, gs://, az://, memory://, file://): listed and sniffed through the URL's
filesystem, each source copied where it is read.

- Discovery lists the prefix once (recursive, with sizes) and reads a bounded head of each object (one ranged read;
  for gzip, chunks until the head inflates to traceql.discover.HEAD_BYTES), then classifies it with traceql.discover's
  own rules on names and heads. Nothing else is downloaded on the driver.
- A source is read where its ingest runs (the process calling traceql.ingest.loader.ingest: a Dask worker under
  --scheduler): it is copied into a private temporary folder (mode 0700, files 0600, O_EXCL | O_NOFOLLOW), read by the
  usual reader as a local file under the usual budgets, and the copy is removed afterwards. The copy is bounded while
  it streams: TRACEQL_URL_MAX_MB per source (default 64 GB, 0 = no limit) and the free space of the temporary folder;
  past either it stops and the source becomes an error source, the others are read as usual. Copying first rather
  than reading through a file object keeps every reader, its mmap and SQLite paths and its budgets unchanged; the
  copy costs one sequential write of the source, next to the parse that costs far more (see the report of issue 21).
- A run dir at a URL is as untrusted as a local one: a listing entry outside the prefix, or with an empty, `.` or
  `..` segment, is refused (an error source saying so), and the URL itself may not hold `..`.
- Credentials come from the environment and fsspec's own configuration only; nothing in the run dir configures
  the filesystem.
- The Parquet cache keys a URL source by its URL and what the listing says of it (size plus ETag, version id,
  checksum or mtime where the filesystem gives them); where nothing identifies a version it is not cached.

Sources at a URL have a URLPath (a PurePosixPath whose str is the URL) as their path, so that reports name them by
URL. fsspec is imported only for a URL: a local run dir never loads it.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path, PurePosixPath

from traceql.model.source import Source

MB = 1 << 20
DEFAULT_MAX_MB = 64 * 1024
FREE_MARGIN = 256 * MB  # left free on the temporary folder's file system
CHUNK = 4 * MB
HEAD_GZ_MAX = 4 * MB  # compressed bytes read at most for a gzip object's head
THREADS = 16  # listing heads and copies are network round trips: many at once
# a URL: scheme://, possibly chained (simplecache::s3://); a local path never matches (a drive letter has no //)
# (two letters at least, as fsspec has it: C://x is a Windows drive)
URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+(?:::[A-Za-z][A-Za-z0-9+.\-]+)*://")
_NO_AUTHORITY = ("file", "local")  # file:///abs/path: the path follows an empty authority
# what an fsspec listing may say that identifies one version of an object (s3fs, gcsfs, adlfs, local, memory)
_VERSION_KEYS = ("ETag", "etag", "e_tag", "VersionId", "version_id", "generation", "md5Hash", "md5", "content_md5",
                 "crc32c", "checksum", "LastModified", "last_modified", "mtime", "updated", "modified", "created")


class RemoteError(ValueError):
    """A URL that cannot be read as a run: unknown protocol, missing plugin, nothing there (one line)."""


class URLPath(PurePosixPath):
    """A path at a URL, shown as the URL. Its first part is the scheme ("s3:"), the rest the path after `://`."""

    def __str__(self) -> str:
        head, *rest = self.parts
        if not head.endswith(":"):  # a relative part (relative_to, the name of a member): a plain path
            return "/".join(self.parts)
        proto = head[:-1].rsplit("::", 1)[-1]
        return head + ("///" if proto in _NO_AUTHORITY else "//") + "/".join(rest)

    def relative_to(self, *other) -> PurePosixPath:
        return PurePosixPath(*super().relative_to(*other).parts)

    def resolve(self, strict: bool = False) -> URLPath:
        return self

    def as_uri(self) -> str:
        return str(self)

    def is_dir(self) -> bool:
        return False

    def is_file(self) -> bool:  # never a local file: local-only checks (sparse holes, progress sizes) pass it over
        return False

    def exists(self) -> bool:
        return False

    def is_symlink(self) -> bool:
        return False


class URLDir(URLPath):
    """A folder at a URL (the run dir, a TORCH_COMPILE_DEBUG folder); its members are URLPaths."""

    def is_dir(self) -> bool:
        return True

    def __truediv__(self, key) -> URLPath:
        return URLPath(*self.parts, key)

    def joinpath(self, *keys) -> URLPath:
        return URLPath(*self.parts, *keys)


def is_url(path) -> bool:
    return isinstance(path, URLPath) or (isinstance(path, str) and bool(URL_RE.match(path)))


def filesystem(url: str):
    """(filesystem, path inside it) for a URL, or a RemoteError naming what to install."""
    proto = url.split("://", 1)[0].rsplit("::", 1)[-1].lower()
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise RemoteError(f"{url}: a run at a URL is read through fsspec: pip install 'traceql[dask]' "
                          "(or pip install fsspec)") from None
    try:
        return url_to_fs(url)
    except ImportError:
        pkg = _plugin(proto)
        raise RemoteError(f"{url}: {proto}:// needs {pkg}: pip install {pkg}") from None
    except ValueError as e:
        if "protocol not known" in str(e).lower():
            raise RemoteError(f"{url}: no fsspec filesystem knows {proto}://; check the URL, or install the fsspec "
                              "plugin that provides it") from None
        raise RemoteError(f"{url}: {e}") from None


def _plugin(proto: str) -> str:
    from fsspec.registry import known_implementations

    cls = known_implementations.get(proto, {}).get("class", "")
    return cls.split(".", 1)[0] or f"the fsspec plugin for {proto}://"


def _dotdot(url: str) -> bool:
    return any(p in ("..", ".") for p in url.split("://", 1)[-1].split("/"))


def locate(url) -> URLPath:
    """The run at a URL as a URLDir (a prefix) or a URLPath (one object); RemoteError where nothing is there."""
    url = str(url)
    if _dotdot(url):
        raise RemoteError(f"{url}: a `.` or `..` segment in a run's URL; name the run's prefix itself")
    fs, path = filesystem(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise RemoteError(f"{url}: no such object or prefix; check the URL") from None
    except Exception as e:  # noqa: BLE001 - a plugin's own error (credentials, network): one line, not a traceback
        raise RemoteError(f"{url}: cannot list it ({type(e).__name__}: {first_line(e)}); check access (credentials come "
                          "from the environment or fsspec's configuration)") from None
    return (URLDir if info.get("type") == "directory" else URLPath)(url.rstrip("/") or url)


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


def member(root: str, name: str) -> str | None:
    """name's path below root, or None where it is not inside it (another prefix, an empty, `.` or `..` segment)."""
    root = root.rstrip("/")
    if not name.startswith(root + "/"):
        return None
    rel = name[len(root) + 1:].rstrip("/")
    if not rel or any(p in ("", ".", "..") for p in rel.split("/")):
        return None
    return rel


def version(info: dict) -> str | None:
    """What identifies this version of an object in its listing (size plus ETag, checksum, mtime ...), or None."""
    found = [f"{k}={info[k]}" for k in _VERSION_KEYS if info.get(k) not in (None, "")]
    return "|".join([f"size={info.get('size')}", *found]) if found else None


def listing_meta(url: URLPath, root_url: str, fspath: str, size: int, ver: str | None, folder: bool = False) -> dict:
    return {"url": str(url), "root": root_url, "path": fspath, "size": int(size or 0), "version": ver, "folder": folder}


# ------------------------------------------------------------------------------------------------ reading


def is_remote(source: Source) -> bool:
    return isinstance(source.path, URLPath) and isinstance(source.meta.get("remote"), dict)


def size(source: Source) -> int:
    return int(source.meta["remote"].get("size") or 0)


def max_bytes() -> int | None:
    """TRACEQL_URL_MAX_MB in bytes (None: no limit), read as the archive budgets are (traceql.archive)."""
    raw = os.environ.get("TRACEQL_URL_MAX_MB", "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MAX_MB
    except ValueError:
        mb = -1
    if mb < 0:
        raise RemoteError(f"TRACEQL_URL_MAX_MB={raw!r}: not a number >= 0; give megabytes (0 = no limit)")
    return None if mb == 0 else int(mb * MB)


class _OverCap(Exception):
    pass


def _over(cap: int, listed: int | None) -> str:
    said = f" (its listing says {listed / MB:.0f} MB)" if listed is not None else " (stopped there while copying)"
    return (f"{{url}}: larger than the {cap // MB} MB a source at a URL may be copied to be read{said}; raise "
            "TRACEQL_URL_MAX_MB (0 = no limit) or check a local copy")


class Spool:
    """URL sources copied into one private temporary folder for reading; close() removes it."""

    def __init__(self, sources: list[Source], read=lambda s: True):
        """Copies of the sources at a URL that read(source) says are read (not a recognised-only manifest)."""
        self.ready: list[Source] = []
        self.failed: list[Source] = []
        self.tmp: Path | None = None
        remote = [s for s in sources if is_remote(s) and read(s)]
        copied = {id(s) for s in remote}
        self.ready = [s for s in sources if id(s) not in copied]
        if not remote:
            return
        import shutil
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        self.tmp = Path(tempfile.mkdtemp(prefix="traceql-url-"))
        os.chmod(self.tmp, 0o700)
        try:
            self.cap = max_bytes()
        except RemoteError as e:
            for s in remote:
                s.status, s.detail = "error", str(e)
            self.failed = remote
            return
        self.free = shutil.disk_usage(self.tmp).free - FREE_MARGIN
        self.lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(remote)))) as ex:
            for s, ok in zip(remote, ex.map(self._copy, remote)):
                (self.ready if ok else self.failed).append(s)

    def _take(self, n: int) -> bool:
        with self.lock:
            if n > self.free:
                return False
            self.free -= n
            return True

    def _copy(self, s: Source) -> bool:
        r = s.meta["remote"]
        url = str(s.path)
        local = self.tmp.joinpath(*url.split("://", 1)[1].strip("/").split("/"))
        try:
            fs, root = filesystem(r["root"])
            whole = r["path"].rstrip("/") == root.rstrip("/")  # the run is this one object
            if (not whole and member(root, r["path"]) is None) or _dotdot(r["root"]) or _dotdot(r["url"]):
                raise _Refused(f"{url}: not inside the run's prefix: not read (a run dir is untrusted)")
            if self.cap is not None and r.get("size", 0) > self.cap:  # said by its listing: not even started
                raise _OverCap(_over(self.cap, r["size"]))
            if r.get("folder"):
                members = [(n, i) for n, i in fs.find(r["path"], detail=True).items() if i.get("type") != "directory"]
                total = 0
                for n, _ in sorted(members):
                    inner = member(r["path"], n)
                    if inner is None:
                        raise _Refused(f"{url}: listing entry {n!r} is not inside the folder: not read (a run dir is "
                                       "untrusted)")
                    total += self._stream(fs, n, local.joinpath(*inner.split("/")), total)
            else:
                self._stream(fs, r["path"], local, 0)
        except _OverCap as e:  # what was copied goes at once: the other sources may need the room
            _remove(local)
            s.status, s.detail = "error", str(e).replace("{url}", url)
            return False
        except _Refused as e:
            s.status, s.detail = "error", str(e)
            return False
        except Exception as e:  # noqa: BLE001 - a plugin's own error (network, permissions): this source only
            s.status, s.detail = "error", (f"{url}: cannot read it ({type(e).__name__}: {first_line(e)}); check access "
                                           "(credentials come from the environment or fsspec's configuration)")
            return False
        r["local"] = str(local)
        s.path = local
        return True

    def _stream(self, fs, fspath: str, local: Path, done: int) -> int:
        """Copy one object to local, bounded by the cap (with `done` bytes already copied for this source) and by the
        free space; the bytes written."""
        local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        n = 0
        with os.fdopen(fd, "wb") as out, fs.open(fspath, "rb", block_size=CHUNK) as f:
            while chunk := f.read(CHUNK):
                n += len(chunk)
                if self.cap is not None and done + n > self.cap:  # the listing said less: stopped while streaming
                    raise _OverCap(_over(self.cap, None))
                if not self._take(len(chunk)):
                    raise _OverCap(f"{{url}}: no room left to copy it into {self.tmp.parent} (keeping "
                                   f"{FREE_MARGIN // MB} MB free): stopped at {(done + n) // MB} MB; set TMPDIR to a "
                                   "larger file system")
                out.write(chunk)
        return n

    def close(self) -> None:
        if self.tmp is not None:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


class _Refused(Exception):
    pass


def _remove(p: Path) -> None:
    import shutil

    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def named_back(source: Source) -> None:
    """A source read from its temporary copy named by its URL again, in its path and its detail (before the cache
    stores it, and before any report names it)."""
    r = source.meta.get("remote") if isinstance(source.meta, dict) else None
    if not isinstance(r, dict) or "local" not in r:
        return
    local = r.pop("local")
    url = (URLDir if r.get("folder") else URLPath)(r["url"])
    if source.detail:
        source.detail = source.detail.replace(local, str(url)).replace(str(Path(local).parent), str(url.parent))
    source.path = url


def uncached_note(sources: list[Source]) -> str | None:
    """One line where sources at a URL could not be cached (their listing names no version)."""
    n = sum(1 for s in sources if is_remote(s) and s.status in ("ok", "partial") and not s.meta["remote"].get("version"))
    if not n:
        return None
    return (f"not cached: {n} source(s) at the URL carry no version in their listing (ETag, checksum or mtime), so "
            "they are read again on every check")
