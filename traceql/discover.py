"""Discovery: a run directory (or one file) -> sources, recognised by content, not by extension alone."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

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
    from traceql import remote

    if remote.is_url(run_path):  # a run at an fsspec URL: listed and sniffed through its filesystem (traceql.remote)
        sources = remote.discover(remote.locate(run_path) if isinstance(run_path, str) else run_path, mods, folder_mods)
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
