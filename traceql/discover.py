"""Discovery: a run directory (or one file) -> sources, recognised by content, not by extension alone."""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

from traceql import remote
from traceql.ingest import sniffers
from traceql.model import Source

HEAD_BYTES = 64 * 1024
_SKIP_DIRS = {".git", "__pycache__", ".traceql-cache", "node_modules"}
# rank-3, rank_3, rank3, RANK3 as a name token; also the ranks of torch's own files (..._rank_3_...).
# names of the inputs themselves (traces, exports, dumps), as opposed to logs beside them
_LOOKS_LIKE_INPUT = re.compile(r"\.(?:json|json\.gz|sqlite|nsys-rep|qdrep)$|nccl_trace|torch_trace", re.IGNORECASE)
# names only traces, exports and dumps carry (torch.profiler's *.pt.trace.json, trace.json, Flight Recorder's
# nccl_trace_rank_N, TORCH_TRACE's dedicated_log_torch_trace_*): such a file that cannot be read is a lost input, an
# error, not a neighbour to pass over (a config.json or metrics.json is not named so)
_NAMED_AS_TRACE = re.compile(r"(?:^|[._-])(?:pt\.)?trace\.json(?:\.gz)?$|^(?:kineto|chrome_trace)\S*\.json(?:\.gz)?$"
                             r"|^nccl_trace|dedicated_log_torch_trace", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


def _open_local(path) -> object:
    return open(path, "rb")


def read_head(path: Path, n: int = HEAD_BYTES, opener=_open_local) -> bytes:
    """First n bytes of a file, gunzipped where it is gzip (members after the first included: pigz, `cat a.gz b.gz`,
    a writer that flushes a member per chunk). A broken gzip stream yields what decompressed. `opener(path)`: a
    binary file object (traceql.remote reads an object at a URL through it, bounded)."""
    with opener(path) as f:
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = b""
        try:
            with opener(path) as f:
                pending = b""
                while len(out) < n:
                    chunk = pending or f.read(65536)
                    pending = b""
                    if not chunk:
                        break
                    out += d.decompress(chunk, n - len(out))
                    if d.eof:  # the next member starts in what this one left over
                        pending = d.unused_data
                        if not pending and not (pending := f.read(65536)):
                            break
                        while len(pending) < 2 and (more := f.read(65536)):  # a member that ends a byte short of a read
                            pending += more
                        if pending[:2] != b"\x1f\x8b":
                            break  # trailing garbage after a complete member: what decompressed is the head
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        except zlib.error:
            pass
        return out[:n]
    return raw


def rank_from_name(path: Path) -> int | None:
    """Rank from the file name, else from the enclosing folder names (rank-3/trace.json)."""
    for part in [path.name, *[p.name for p in path.parents][:3]]:
        m = _RANK_IN_NAME.search(part)
        if m:
            return int(m.group(1))
    return None


def _sniff_file(path: Path, mods) -> list[Source]:
    try:
        size = path.stat().st_size
        head = read_head(path)
    except OSError as e:
        return [Source(path, "unknown", status="error", detail=f"cannot read: {e.strerror or e}; check permissions")]
    return classify(path, size, head, mods)


def classify(path: Path, size: int, head: bytes, mods, raw2: bytes | None = None, archive: bool | None = None
             ) -> list[Source]:
    """The sources one file is, from its name, size and head. raw2 (its first two raw bytes) and archive (whether it
    is a tar or zip) are read from the local file where not given (traceql.remote gives them for an object at a URL)."""
    if size == 0:
        # an empty stdout/stderr log is routine; an empty trace, export or dump is a lost input, said without -v
        if _NAMED_AS_TRACE.search(path.name):
            return [Source(path, "unknown", status="error", detail=(
                "empty file (0 bytes), named like a trace: the profiler or the copy did not finish; record or copy it "
                "again"))]
        shown = bool(_LOOKS_LIKE_INPUT.search(path.name))
        return [Source(path, "unknown", status="skipped", detail="empty file (0 bytes)", meta={"shown": shown})]
    kinds = []
    for kind, sniff, folder in mods:
        if folder:
            continue
        try:
            hit = sniff(path, head)
        except Exception:  # a sniffer must never take discovery down
            hit = False
        if hit:
            kinds.append(kind)
            # Text logs can carry both NCCL and TORCH_LOGS lines; every other format claims the file alone.
            if kind not in ("nccl_log", "torch_logs"):
                break
    if not kinds:
        status, detail = _unrecognised(path, head, raw2, archive)
        return [Source(path, "unknown", status=status, detail=detail)]
    rank = rank_from_name(path)
    return [Source(path, k, rank=rank, rank_origin="file name" if rank is not None else "") for k in kinds]


def _unrecognised(path: Path, head: bytes, raw2: bytes | None = None, archive: bool | None = None) -> tuple[str, str]:
    """(status, why) for a file that is not an input, naming the neighbours of the inputs that users most often point
    traceql at. A damaged gzip stream, or a file named like a trace whose content is none, is an error: an input that
    was meant and cannot be read, said in the exit code (TQL003), never passed over as a neighbour."""
    text = head.lstrip()
    if text[:1] == b"{" and b'"nodes"' in head and b'"schema"' in head:
        return "skipped", ("PyTorch execution trace (ExecutionTraceObserver): operator graph without timings; traceql "
                           "reads the Kineto trace (torch.profiler export_chrome_trace) recorded beside it")
    if path.name.startswith("memory_timeline") or (text[:1] == b"[" and b"[[" in head[:64] and b'"ph"' not in head):
        return "skipped", ("torch.profiler memory timeline (export_memory_timeline): allocations only; traceql reads "
                           "the Kineto trace recorded beside it")
    if archive if archive is not None else _archive_kind(path):
        return "skipped", ("an archive inside the run dir: not expanded here; check it on its own (traceql check FILE) "
                           "or unpack it")
    if raw2 is None:
        with open(path, "rb") as f:
            raw2 = f.read(2)
    if raw2 == b"\x1f\x8b" and not head:
        return "error", "gzip file that does not decompress (damaged or cut short); copy it again"
    if _NAMED_AS_TRACE.search(path.name):
        start = " ".join(text[:24].decode("ascii", "replace").split())
        return "error", (f"named like a trace, but its content is not one (it starts {start!r}); record or copy it "
                         "again, or rename it if it is not a trace")
    return "skipped", ("not a recognised input (not a Kineto trace, nsys SQLite export, TORCH_TRACE log, NCCL log or "
                       "Flight Recorder dump)")


def _archive_kind(path: Path) -> str | None:
    from traceql import archive

    try:
        return archive.kind_of(path)
    except archive.ArchiveError:
        return "tar.zst"


def _real(p: Path) -> Path | None:
    """The real path of p (symbolic links resolved), or None where the links loop or cannot be followed."""
    try:
        return p.resolve(strict=True)
    except (OSError, RuntimeError):  # a loop raises RuntimeError before Python 3.13, OSError (ELOOP) after
        return None


def _link_out(folder: Path, root: Path) -> str | None:
    """A symbolic link under a folder input that leads out of the run dir (or loops): "name -> target", else None."""
    stack = [folder]
    seen = set()
    while stack:
        d = stack.pop()
        try:
            entries = list(d.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.is_symlink():
                real = _real(p)
                if real is None or not real.is_relative_to(root):
                    return f"{p.relative_to(folder)} -> {real if real is not None else 'a link loop'}"
                continue
            if p.is_dir() and p not in seen:
                seen.add(p)
                stack.append(p)
    return None


def discover(run_path: Path, extra: list[Source] | None = None) -> list[Source]:
    """Every input under run_path (a directory or a single file), in a stable order, with ids assigned; `extra`
    sources (an archive's refused entries) join them before the order and ids are given.

    A run dir is untrusted: symbolic links are followed only where they stay inside it (a link out of it is a
    skipped source saying so), and every real folder and file is visited once, so links to `..` or `/` neither
    walk outside nor loop."""
    mods = sniffers()
    folder_mods = [(kind, sniff) for kind, sniff, folder in mods if folder]
    sources: list[Source] = []
    if remote.is_url(run_path):  # a run at an fsspec URL: listed and sniffed through its filesystem (traceql.remote)
        sources = _discover_url(remote.locate(run_path) if isinstance(run_path, str) else run_path, mods, folder_mods)
    elif (run_path := Path(run_path)).is_file():
        sources = _sniff_file(run_path, mods)
    else:
        root = _real(run_path) or run_path.absolute()
        seen: set[Path] = {root}
        stack = [run_path]
        links: list[Path] = []  # links inside the run dir: taken after every real name, so a target keeps its own
        while stack or links:
            if not stack:
                p = links.pop(0)
                real = _real(p)
                if real is None or real in seen:
                    continue
                seen.add(real)
                if p.is_dir():
                    stack.append(p)
                else:
                    sources.extend(_sniff_file(p, mods))
                continue
            d = stack.pop()
            try:
                entries = sorted(d.iterdir(), key=lambda p: p.name)
            except OSError as e:
                sources.append(Source(d, "unknown", status="error", detail=f"cannot list folder: {e.strerror or e}"))
                continue
            subdirs = []
            for p in entries:
                if p.name.startswith(".") or p.name in _SKIP_DIRS:
                    continue
                real = _real(p)
                if p.is_symlink():
                    if real is None:
                        why = "a symbolic link that loops" if p.exists() or _is_loop(p) else "a broken symbolic link"
                        sources.append(Source(p, "unknown", status="skipped", detail=f"{why}: not followed", meta={"shown": True}))
                        continue
                    if not real.is_relative_to(root):
                        sources.append(Source(p, "unknown", status="skipped", detail=(
                            f"symbolic link to {real}, outside the run dir: not followed (a run dir is untrusted; "
                            "copy the file into it to analyse it)"), meta={"shown": True}))
                        continue
                    if real not in seen:
                        links.append(p)
                    continue
                if real is None or real in seen:
                    continue  # reached before (a bind mount, a hard-linked folder): each real path is read once
                seen.add(real)
                if p.is_dir():
                    taken = next((kind for kind, sniff in folder_mods if sniff(p, b"")), None)
                    if taken is not None:
                        r = rank_from_name(p)
                        src = Source(p, taken, rank=r, rank_origin="file name" if r is not None else "")
                        out = _link_out(p, root)
                        if out is not None:
                            src.status, src.detail = "skipped", (
                                f"holds a symbolic link out of the run dir ({out}): not read (a run dir is untrusted)")
                        sources.append(src)
                    else:
                        subdirs.append(p)
                elif p.is_file():
                    sources.extend(_sniff_file(p, mods))
            stack.extend(reversed(subdirs))
    sources.extend(extra or [])
    sources.sort(key=lambda s: (str(s.path), s.kind))
    for i, s in enumerate(sources):
        s.id = i
    return sources


def _is_loop(p: Path) -> bool:
    try:
        p.stat()
        return False
    except OSError as e:
        return e.errno == 40  # ELOOP
    except RuntimeError:
        return True


# ------------------------------------------------------------------------------------------------ runs at URLs


def _discover_url(run, mods, folder_mods) -> list[Source]:
    """The sources of a run at an fsspec URL (a URLDir or URLPath, traceql.remote): the prefix listed once, each
    object's head read bounded, both classified by the rules of a local run dir."""
    from concurrent.futures import ThreadPoolExecutor

    fs, root = remote.filesystem(str(run))
    root = root.rstrip("/") or root
    if not run.is_dir():
        found = _sniff(fs, run, root, fs.info(root), mods, str(run))
        for s in found:
            if s.detail.startswith("an archive inside the run dir"):  # nothing at a URL is expanded
                s.detail = "an archive at a URL: not expanded; copy it here and check the copy (traceql check FILE)"
        return found
    try:
        listing = fs.find(root, withdirs=True, detail=True)
    except Exception as e:  # noqa: BLE001
        return [Source(run, "unknown", status="error", detail=f"cannot list it ({type(e).__name__}: {remote.first_line(e)})")]
    local = _is_local(fs)
    real_root = os.path.realpath(root) if local else None
    sources: list[Source] = []
    taken: list[str] = []  # folders that are one source (TORCH_COMPILE_DEBUG): their members are not sniffed
    files = []
    for name in sorted(listing, key=lambda n: (n.count("/"), n)):  # folders before what they hold
        info = listing[name]
        if name.rstrip("/") == root:
            continue
        rel = remote.member(root, name)
        if rel is None:
            if info.get("type") == "directory":
                continue  # the files listed below it are refused one by one
            shown = name.rsplit("/", 1)[-1] or name
            sources.append(Source(run / shown, "unknown", status="error", detail=(
                f"listing entry {name!r} is not inside the run's prefix {root!r}: not read (a run dir is untrusted)"),
                meta={"shown": True}))
            continue
        parts = rel.split("/")
        if any(p.startswith(".") or p in _SKIP_DIRS for p in parts):
            continue
        if any(rel.startswith(t + "/") for t in taken):
            continue
        url = remote.URLPath(*run.parts, *parts)
        if local and info.get("islink"):
            real = os.path.realpath(name)
            if not (real + "/").startswith(real_root.rstrip("/") + "/"):
                sources.append(Source(url, "unknown", status="skipped", detail=(
                    f"symbolic link to {real}, outside the run dir: not followed (a run dir is untrusted; copy the "
                    "file into it to analyse it)"), meta={"shown": True}))
            continue  # inside: its target is listed in its own right
        if info.get("type") == "directory":
            d = remote.URLDir(*url.parts)
            kind = next((k for k, sniff in folder_mods if sniff(d, b"")), None)
            if kind is not None:
                taken.append(rel)
                held = [(n, i) for n, i in listing.items() if n.startswith(name.rstrip("/") + "/")
                        and i.get("type") != "directory"]
                vers = [remote.version(i) for _, i in held]
                ver = None if any(v is None for v in vers) else "|".join(
                    f"{n[len(name):]}:{v}" for (n, _), v in sorted(zip(held, vers)))
                r = rank_from_name(d)
                sources.append(Source(d, kind, rank=r, rank_origin="file name" if r is not None else "",
                                      meta={"remote": remote.listing_meta(d, str(run), name.rstrip("/"), sum(i.get("size") or 0 for _, i in held),
                                                            ver, folder=True)}))
            continue
        files.append((url, name, info))
    heads = {}
    with ThreadPoolExecutor(max_workers=max(1, min(remote.THREADS, len(files)))) as ex:
        for (url, _, _), (found, head) in zip(files, ex.map(lambda f: _sniff(fs, *f, mods, str(run), True), files)):
            sources.extend(found)
            if _TRACE_LOG.search(url.name):
                heads[url] = head
    _ranks_of_debug_folders(sources, heads)
    return sources


_TRACE_LOG = re.compile(r"^dedicated_log_torch_trace_rank_(\d+)")
_GLOG_PID = re.compile(rb"^[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +(\d+) ")
_PID = re.compile(r"-pid_(\d+)")


def _ranks_of_debug_folders(sources: list[Source], heads: dict) -> None:
    """A TORCH_COMPILE_DEBUG folder's rank from the TORCH_TRACE log of the same pid within three levels up, as its
    reader finds it in a local run dir (ingest/compile_debug.py): a worker reading the folder at a URL has only the
    folder's own copy, so discovery, which read every log's head, names the rank here."""
    for s in sources:
        m = _PID.search(s.path.name)
        if s.kind != "compile_debug" or s.rank is not None or not m:
            continue
        for up in list(s.path.parents)[:3]:
            hit = None
            for log in sorted(u for u in heads if up in u.parents):
                pm = _GLOG_PID.match(heads[log].split(b"\n", 1)[0][:4096])
                if pm and int(pm.group(1)) == int(m.group(1)):
                    hit = int(_TRACE_LOG.search(log.name).group(1))
                    break
            if hit is not None:
                s.rank, s.rank_origin = hit, "TORCH_TRACE log of the same pid"
                break


def _is_local(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _sniff(fs, url: remote.URLPath, fspath: str, info: dict, mods, root_url: str, with_head: bool = False):
    size = int(info.get("size") or 0)
    try:
        raw = fs.cat_file(fspath, start=0, end=min(size, HEAD_BYTES)) if size else b""
        head = raw
        if raw[:2] == b"\x1f\x8b":
            head = read_head(fspath, HEAD_BYTES, opener=lambda p: _Bounded(fs.open(p, "rb", block_size=HEAD_BYTES)))
    except Exception as e:  # noqa: BLE001 - a plugin's own error: this object is unreadable, the others go on
        bad = [Source(url, "unknown", status="error", detail=(
            f"cannot read it ({type(e).__name__}: {remote.first_line(e)}); check access (credentials come from the environment "
            "or fsspec's configuration)"))]
        return (bad, b"") if with_head else bad
    archive = _archive_like(url, raw, head)
    found = classify(url, size, head, mods, raw2=raw[:2], archive=archive)
    for s in found:
        s.meta["remote"] = remote.listing_meta(url, root_url, fspath, size, remote.version(info))
    return (found, head) if with_head else found


class _Bounded:
    """A remote file object read for a head: at most remote.HEAD_GZ_MAX compressed bytes, then it reads as ended."""

    def __init__(self, f):
        self.f, self.left = f, remote.HEAD_GZ_MAX

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = self.f.read(n) if n > 0 else b""
        self.left -= len(out)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _archive_like(url: remote.URLPath, raw: bytes, head: bytes) -> bool:
    from traceql import archive

    if raw[:4] in (b"PK\x03\x04", b"PK\x05\x06") or url.name.lower().endswith(archive.NAME_SUFFIXES):
        return True
    return archive._is_tar_header(head)
