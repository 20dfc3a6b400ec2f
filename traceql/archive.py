"""An archive of a run dir (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz, .tar.zst, .zip) read as a run dir.

It is expanded into a private temporary folder (mode 0700, removed afterwards, also on an error or Ctrl-C), and never
written outside it: an archive is as untrusted as a run dir, and its entry names are chosen by whoever made it. So,
entry by entry:

- a name that escapes the folder (absolute, a `..` part, a drive letter, a backslash) is refused;
- symbolic and hard links, devices and fifos are refused (a link is how tar writes outside the folder it extracts to);
- files are written with O_EXCL | O_NOFOLLOW and mode 0600, so an entry can neither replace nor follow another;
- budgets stop the expansion: entries (TRACEQL_ARCHIVE_MAX_ENTRIES), expanded bytes (TRACEQL_ARCHIVE_MAX_MB, and the
  free space of the temporary folder), and the expansion ratio (TRACEQL_ARCHIVE_MAX_RATIO, expanded bytes over the
  archive's bytes, counted once past RATIO_FLOOR so that a small archive of text is not a bomb). They count the bytes
  actually written, never the sizes an entry header claims;
- an archive inside it (by name and content) is expanded once, in place, into a folder named after it with a `!`
  (run.tar.gz!/rank0.zip!/trace.json); an archive inside that one is refused.

Each refusal is one line naming the entry; it becomes an error source of the run, so the rest is analysed and the
report and exit status say what was left out. Paths in reports are ARCHIVE!/PATH-IN-ARCHIVE, as in a jar URL:
`run.tar.gz!/run/rank0/trace.json` is the entry `run/rank0/trace.json` of `run.tar.gz`.

Only the standard library is used, except zstandard for .tar.zst (optional: `pip install zstandard`).
"""

from __future__ import annotations

import io
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from traceql.model.source import Source

# The decompressors, tarfile, zipfile, shutil and tempfile load only when an archive is read (_expand_into, expanded):
# every check asks is_archive(), almost always of a folder, and must not pay for them.

MB = 1 << 20
DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_MB = 64 * 1024  # 64 GB expanded
DEFAULT_MAX_RATIO = 200.0  # Kineto JSON compresses 10-30x, zstd -19 up to ~80x; bombs are 1000x and more
RATIO_FLOOR = 64 * MB  # below this many expanded bytes the ratio is not checked
FREE_MARGIN = 256 * MB  # left free on the temporary folder's file system
_CHUNK = 1 * MB
MAX_REFUSALS_LISTED = 200
# A GNU long name or a PAX header is read whole into memory by tarfile before the entry is seen (a 305 KB .tar.gz
# with a 300 MB name took the process to 1.2 GB); real ones are a path and a few keywords, well under this.
MAX_TAR_HEADER_BYTES = 1 * MB
NAME_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tzst", ".zip")
_DRIVE = re.compile(r"^[A-Za-z]:")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SKIP = ("__MACOSX",)  # macOS zip resource forks: never inputs


class ArchiveError(Exception):
    """The archive as a whole cannot be read (not an archive, truncated header, zstandard missing): one line."""


@dataclass
class Expanded:
    archive: Path  # the archive as given
    tmp: Path  # the private folder it was expanded into
    run_dir: Path  # the run dir inside tmp: its single top-level folder, else tmp itself
    refused: list[Source] = field(default_factory=list)  # one error source per refused entry or budget stop
    entries: int = 0
    bytes: int = 0
    more_refused: int = 0  # refusals past MAX_REFUSALS_LISTED, counted only


# ------------------------------------------------------------------------------------------------ recognising


def _compression(head: bytes) -> str | None:
    if head[:2] == b"\x1f\x8b":
        return "gz"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:4] == _ZSTD_MAGIC:
        return "zst"
    return None


def _is_tar_header(block: bytes) -> bool:
    """A POSIX/GNU tar header (ustar magic at 257), or an old v7 header whose checksum adds up."""
    if len(block) < 512:
        return False
    if block[257:262] == b"ustar":
        return True
    try:
        # the v7 checksum as tarfile computes it (calc_chksums): every byte, the checksum field counted as 8 spaces
        return 256 + sum(block[:148]) + sum(block[156:512]) == int(block[148:156].strip(b"\x00 ") or b"-1", 8)
    except ValueError:
        return False


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a truncated or corrupt archive raises while it is read (an except clause evaluates this only when an
    exception is being matched, so the modules load then)."""
    import lzma
    import tarfile
    import zipfile
    import zlib

    return (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile)


def _decompressed_head(path: Path, kind: str, n: int = 1024) -> bytes:
    import zlib

    with open(path, "rb") as f:
        raw = f.read(64 * 1024)
    try:
        if kind == "gz":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, n)
        if kind == "bz2":
            import bz2

            return bz2.BZ2Decompressor().decompress(raw, n)
        if kind == "xz":
            import lzma

            return lzma.LZMADecompressor().decompress(raw, n)
        if kind == "zst":
            with open(path, "rb") as f, _zstd(path).ZstdDecompressor().stream_reader(f) as r:
                return r.read(n)
    except (*_read_errors(), ValueError):
        return b""
    except Exception as e:  # zstandard.ZstdError is not an OSError
        if type(e).__name__ == "ZstdError":
            return b""
        raise
    return b""


def kind_of(path: Path) -> str | None:
    """"zip", "tar", "tar.gz", "tar.bz2", "tar.xz" or "tar.zst" by content (a .json.gz trace is gzip but no tar), else
    None. A zstd file named like a tar when zstandard is missing raises ArchiveError saying so."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    comp = _compression(head)
    if comp is None:
        return "tar" if _is_tar_header(head) else None
    if comp == "zst" and not _has_zstd() and not _named_like_archive(path):
        return None  # a zstd file of something else; without zstandard it cannot be told apart, and it is no tar name
    return f"tar.{comp}" if _is_tar_header(_decompressed_head(path, comp)) else None


def _named_like_archive(path: Path) -> bool:
    return path.name.lower().endswith(NAME_SUFFIXES)


def is_archive(path: Path) -> bool:
    return Path(path).is_file() and kind_of(Path(path)) is not None


def _has_zstd() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def _zstd(path: Path):
    try:
        import zstandard
    except ImportError:
        raise ArchiveError(f"{path}: a zstandard-compressed archive; reading it needs the zstandard package: "
                           "pip install zstandard (or unpack it: zstd -d, then tar xf)") from None
    return zstandard


# ------------------------------------------------------------------------------------------------ budgets


def _env_int(name: str, default: float) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ArchiveError(f"{name}={raw!r}: not a number; give a number >= 0 (0 = no limit)") from None
    if v < 0:
        raise ArchiveError(f"{name}={raw!r}: negative; give a number >= 0 (0 = no limit)")
    return None if v == 0 else v


@dataclass
class _Budget:
    max_entries: float | None
    max_bytes: float | None
    max_ratio: float | None
    archive_bytes: int
    entries: int = 0
    written: int = 0

    @classmethod
    def for_archive(cls, path: Path, tmp: Path) -> _Budget:
        max_mb = _env_int("TRACEQL_ARCHIVE_MAX_MB", DEFAULT_MAX_MB)
        max_bytes = None if max_mb is None else max_mb * MB
        import shutil

        try:
            free = shutil.disk_usage(tmp).free - FREE_MARGIN
            max_bytes = free if max_bytes is None else min(max_bytes, free)
        except OSError:
            pass
        return cls(_env_int("TRACEQL_ARCHIVE_MAX_ENTRIES", DEFAULT_MAX_ENTRIES), max_bytes,
                   _env_int("TRACEQL_ARCHIVE_MAX_RATIO", DEFAULT_MAX_RATIO), max(path.stat().st_size, 1))

    def over(self) -> str | None:
        """Why the expansion must stop now, or None."""
        if self.max_bytes is not None and self.written > self.max_bytes:
            return (f"expands past {self.max_bytes / MB:,.0f} MB (the budget, or the free space of the temporary "
                    "folder); raise TRACEQL_ARCHIVE_MAX_MB or set TMPDIR to a larger disk")
        if self.max_ratio is not None and self.written > RATIO_FLOOR and self.written > self.max_ratio * self.archive_bytes:
            return (f"expands more than {self.max_ratio:g} times its size ({self.written / MB:,.0f} MB from "
                    f"{self.archive_bytes / MB:,.1f} MB): a compression bomb? raise TRACEQL_ARCHIVE_MAX_RATIO if it is not")
        return None

    def count(self) -> str | None:
        self.entries += 1
        if self.max_entries is not None and self.entries > self.max_entries:
            return f"holds more than {self.max_entries:,.0f} entries; raise TRACEQL_ARCHIVE_MAX_ENTRIES if it is a real run"
        return None


class _Stop(Exception):
    """A budget is spent: no further entry is read."""


class _BadHeader(Exception):
    """A tar header that would be read whole into memory is too large, or is of a kind not read (GNU sparse)."""


_TARINFO: type | None = None


def _bounded_tarinfo() -> type:
    """TarInfo that refuses an oversized long-name/PAX header before tarfile reads it into memory (the class is made
    on first use, so that tarfile loads only when a tar is read).

    tarfile reads the body of a GNU long name/link or a PAX header in one read of its declared size; the size is
    checked here, where tarfile dispatches on the header's type (TarInfo's tarinfo= hook). GNU sparse entries are
    refused outright: their maps are read block by block with no bound, and traces are never sparse files."""
    global _TARINFO
    if _TARINFO is not None:
        return _TARINFO
    import tarfile

    class _BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tf):
            if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                             tarfile.SOLARIS_XHDTYPE) and self.size > MAX_TAR_HEADER_BYTES:
                kind = "GNU long name" if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) else "PAX"
                raise _BadHeader(f"holds a {kind} header of {self.size / MB:,.1f} MB (at most "
                                 f"{MAX_TAR_HEADER_BYTES / MB:g} MB is read; real ones are a path and a few keywords): "
                                 "a hostile archive?")
            if self.type == tarfile.GNUTYPE_SPARSE:
                raise _BadHeader("holds a GNU sparse entry (sparse files are not extracted; traces never are)")
            try:
                return super()._proc_member(tf)
            except ValueError as e:  # tarfile's own parse of a malformed PAX sparse map or number field
                raise _BadHeader(f"holds a malformed header ({str(e)[:120]}): a hostile archive?") from None

    _TARINFO = _BoundedTarInfo
    return _TARINFO


# ------------------------------------------------------------------------------------------------ expanding


def _safe_parts(name: str) -> tuple[list[str] | None, str]:
    """The entry name as path parts inside the folder, or None and why it is refused."""
    if "\\" in name:
        return None, "a backslash in its name (a Windows path that could escape the archive's folder)"
    if name.startswith("/"):
        return None, "an absolute path"
    if _DRIVE.match(name):
        return None, "a drive letter in its name"
    if "\x00" in name:
        return None, "a NUL character in its name"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None, "a '..' part that escapes the archive's folder"
    return parts, ""


def _short(name: str, keep: int = 300) -> str:
    """An entry name as a report may show it: a hostile 300 MB long name is cut, not copied into every report."""
    return name if len(name) <= keep else name[:keep] + f"... ({len(name):,} characters)"


class _Writer:
    """Writes entries under one folder, refusing what escapes it and stopping at the budget."""

    def __init__(self, x: Expanded, budget: _Budget, label: str, depth: int):
        self.x, self.budget, self.label, self.depth = x, budget, label, depth

    def refuse(self, where: Path, name: str, why: str) -> None:
        name = _short(name)
        # the source is placed at its would-be path inside tmp so that it shows as ARCHIVE!/NAME; a hostile name is
        # kept as written ('..' parts are not collapsed by pathlib), minus a leading slash
        if len(self.x.refused) >= MAX_REFUSALS_LISTED:  # a million hostile entries make one line, not a million
            self.x.more_refused += 1
            return
        shown = name.replace("\\", "/").lstrip("/") or "(empty name)"
        self.x.refused.append(Source(where / shown, "unknown", status="error",
                                     detail=f"entry {name!r} of {self.label}: refused: {why}", meta={"shown": True}))

    def stop(self, where: Path, name: str, why: str) -> None:
        name = _short(name)
        self.x.refused.append(Source(where / (name.lstrip("/") or "(empty name)"), "unknown", status="error", detail=(
            f"{self.label} {why}: expansion stopped at entry {name!r}; the entries before it are analysed, "
            "the rest are not read"), meta={"shown": True}))
        raise _Stop

    def tick(self, where: Path, name: str) -> None:
        """Count one entry; past the entry budget, stop."""
        why = self.budget.count()
        if why:
            self.stop(where, name, why)

    def place(self, where: Path, name: str, is_dir: bool) -> Path | None:
        self.tick(where, name)
        parts, why = _safe_parts(name)
        if parts is None:
            self.refuse(where, name, why)
            return None
        if not parts or parts[0] in _SKIP:
            return None
        target = where.joinpath(*parts)
        try:
            # parents are made by us, never by an entry's link: none can exist, as no link is ever written
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if is_dir:
                target.mkdir(exist_ok=True, mode=0o700)
        except OSError as e:
            self.refuse(where, name, f"cannot be placed ({e.strerror or e}): a file and a folder of the same name?")
            return None
        return target

    def write(self, where: Path, name: str, target: Path, src) -> bool:
        """Copy the stream into target; False (and a refusal) when it cannot be written."""
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            self.refuse(where, name, "a second entry of the same name (the first one is kept)")
            return False
        except OSError as e:
            self.refuse(where, name, f"cannot be written ({e.strerror or e})")
            return False
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    chunk = src.read(_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    self.budget.written += len(chunk)
                    self.x.bytes += len(chunk)
                    why = self.budget.over()
                    if why:
                        out.close()
                        target.unlink(missing_ok=True)
                        self.stop(where, name, why)
        except _Stop:
            raise
        except _read_errors() as e:
            target.unlink(missing_ok=True)
            self.refuse(where, name, f"truncated or corrupt ({type(e).__name__}: {str(e)[:120]}); the archive may "
                        "be cut short: copy it again")
            return False
        except Exception as e:
            if type(e).__name__ != "ZstdError":
                raise
            target.unlink(missing_ok=True)
            self.refuse(where, name, f"truncated or corrupt (zstd: {str(e)[:120]}); copy the archive again")
            return False
        self.x.entries += 1
        if _named_like_archive(target):
            self.nested(target, name)
        return True

    def nested(self, target: Path, name: str) -> None:
        """An archive inside: expanded once, into NAME! beside it; deeper ones are refused."""
        try:
            kind = kind_of(target)
        except ArchiveError:
            kind = None
        if kind is None:
            return  # named like an archive, but not one: left as a file for discovery to judge
        if self.depth >= 1:
            target.unlink(missing_ok=True)
            self.refuse(target.parent, target.name, f"an archive inside an archive inside {self.x.archive.name}: "
                        "nested archives are expanded one level deep only; unpack it and upload its contents")
            return
        inner = target.with_name(target.name + "!")
        try:
            inner.mkdir(mode=0o700)
        except OSError as e:
            self.refuse(target.parent, target.name, f"cannot be expanded ({e.strerror or e})")
            return
        label = f"{self.label}!/{name}"
        try:
            _expand_into(target, kind, inner, self.x, self.budget, label, self.depth + 1)
        except ArchiveError as e:
            self.refuse(target.parent, target.name, str(e))
        finally:
            target.unlink(missing_ok=True)  # its content is the folder now; keeping it would count its bytes twice


def _expand_into(path: Path, kind: str, where: Path, x: Expanded, budget: _Budget, label: str, depth: int) -> None:
    w = _Writer(x, budget, label, depth)
    try:
        if kind == "zip":
            _expand_zip(path, where, w)
        else:
            _expand_tar(path, kind, where, w)
    except _read_errors() as e:
        if not x.entries and not x.refused:
            raise ArchiveError(f"{label}: not a readable {kind} archive ({type(e).__name__}: {str(e)[:160]}); "
                               "check that the upload is complete") from None
        x.refused.append(Source(where / "(rest of the archive)", "unknown", status="error", detail=(
            f"{label}: unreadable after {x.entries} entries ({type(e).__name__}: {str(e)[:120]}): truncated? "
            "the entries before are analysed"), meta={"shown": True}))


def _expand_tar(path: Path, kind: str, where: Path, w: _Writer) -> None:
    import tarfile

    with open(path, "rb") as raw:
        try:  # in stream mode tarfile.open reads the first header itself
            if kind == "tar.zst":
                stream = _zstd(path).ZstdDecompressor().stream_reader(raw, read_across_frames=True)
                tf = tarfile.open(fileobj=stream, mode="r|", tarinfo=_bounded_tarinfo())
            else:
                tf = tarfile.open(fileobj=raw, mode="r|" + ("*" if kind == "tar" else kind.split(".")[1]),
                                  tarinfo=_bounded_tarinfo())
        except _BadHeader as e:
            w.stop(where, "(the first entry)", str(e))
        with tf:
            members = iter(tf)  # streaming: the archive is read once, front to back, never seeked
            while True:
                try:
                    m = next(members)
                except StopIteration:
                    break
                except _BadHeader as e:
                    w.stop(where, f"(the entry after {w.x.entries} entries)", str(e))
                name = m.name
                if m.isdir():
                    w.place(where, name, True)
                    continue
                if m.issym() or m.islnk():
                    w.tick(where, name)
                    w.refuse(where, name, f"a {'symbolic' if m.issym() else 'hard'} link (to {m.linkname!r}): links "
                             "are not extracted from an untrusted archive")
                    continue
                if m.ischr() or m.isblk() or m.isfifo():
                    w.tick(where, name)
                    w.refuse(where, name, "a device or fifo: only files and folders are extracted")
                    continue
                if not m.isreg():
                    w.tick(where, name)
                    w.refuse(where, name, f"an entry of type {m.type!r}: only files and folders are extracted")
                    continue
                target = w.place(where, name, False)
                if target is None:
                    continue
                src = tf.extractfile(m)
                w.write(where, name, target, src if src is not None else io.BytesIO())


def _expand_zip(path: Path, where: Path, w: _Writer) -> None:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                w.tick(where, name)
                w.refuse(where, name, "a symbolic link: links are not extracted from an untrusted archive")
                continue
            if mode and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                w.tick(where, name)
                w.refuse(where, name, "a device, fifo or socket: only files and folders are extracted")
                continue
            if info.is_dir():
                w.place(where, name, True)
                continue
            if info.flag_bits & 0x1:
                w.tick(where, name)
                w.refuse(where, name, "encrypted: traceql reads no passwords; upload it unencrypted")
                continue
            target = w.place(where, name, False)
            if target is None:
                continue
            try:
                src = zf.open(info)
            except (NotImplementedError, RuntimeError, zipfile.BadZipFile) as e:
                w.refuse(where, name, f"cannot be read ({e}); re-create the zip with deflate or no compression")
                continue
            with src:
                w.write(where, name, target, src)


def _run_dir(tmp: Path) -> Path:
    """The archive's single top-level folder, else the folder it was expanded into."""
    top = [p for p in tmp.iterdir() if p.name not in _SKIP]
    return top[0] if len(top) == 1 and top[0].is_dir() and not top[0].is_symlink() else tmp


@contextmanager
def expanded(path: Path):
    """Expand the archive into a private temporary folder, yield an Expanded, remove the folder afterwards."""
    path = Path(path)
    kind = kind_of(path)
    if kind is None:
        raise ArchiveError(f"{path}: not a tar or zip archive")
    if kind == "tar.zst":
        _zstd(path)
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="traceql-archive-"))  # mode 0700: private to this user
    try:
        os.chmod(tmp, 0o700)
        x = Expanded(path, tmp, tmp)
        budget = _Budget.for_archive(path, tmp)
        try:
            _expand_into(path, kind, tmp, x, budget, path.name, 0)
        except _Stop:
            pass
        if x.more_refused:
            x.refused.append(Source(tmp / "(more refused entries)", "unknown", status="error", detail=(
                f"{path.name}: {x.more_refused} more entries refused (links, devices or escaping paths, as the "
                f"{MAX_REFUSALS_LISTED} listed)"), meta={"shown": True}))
        x.run_dir = _run_dir(tmp)
        yield x
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def shown_path(x: Expanded, p: Path) -> Path:
    """Where p (under x.tmp) is shown: ARCHIVE!/PATH-IN-ARCHIVE, beside the archive, so that renderers (which show
    paths relative to the folder holding a single-file input) print `run.tar.gz!/run/rank0/trace.json`."""
    try:
        rel = p.relative_to(x.tmp)
    except ValueError:
        return p
    return x.archive.with_name(x.archive.name + "!") / rel


def relocate(run, x: Expanded) -> None:
    """After reading, point the run and its sources at the archive: the temporary folder is about to go."""
    tmp = str(x.tmp)
    shown = str(x.archive.with_name(x.archive.name + "!"))
    for s in run.sources:
        s.path = shown_path(x, s.path)
        if s.detail and tmp in s.detail:
            s.detail = s.detail.replace(tmp, shown)
    run.notes = [n.replace(tmp, shown) if isinstance(n, str) else n for n in run.notes]
    run.path = x.archive
