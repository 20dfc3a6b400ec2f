"""Discovery: a run directory (or one file) -> sources, recognised by content, not by extension alone."""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from traceql.ingest import formats
from traceql.model import Source

HEAD_BYTES = 64 * 1024
_SKIP_DIRS = {".git", "__pycache__", ".traceql-cache", "node_modules"}
# rank-3, rank_3, rank3, RANK3 as a name token; also the ranks of torch's own files (..._rank_3_...).
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """First n bytes of a file, gunzipped where it is gzip. A broken gzip stream yields what decompressed."""
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = b""
        try:
            with open(path, "rb") as f:
                while len(out) < n:
                    chunk = f.read(65536)
                    if not chunk:
                        break
                    out += d.decompress(chunk, n - len(out))
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
    if size == 0:
        return [Source(path, "unknown", status="skipped", detail="empty file (0 bytes)")]
    kinds = []
    for mod in mods:
        if getattr(mod, "FOLDER", False):
            continue
        try:
            hit = mod.sniff(path, head)
        except Exception:  # a sniffer must never take discovery down
            hit = False
        if hit:
            kinds.append(mod.KIND)
            # Text logs can carry both NCCL and TORCH_LOGS lines; every other format claims the file alone.
            if mod.KIND not in ("nccl_log", "torch_logs"):
                break
    if not kinds:
        return [Source(path, "unknown", status="skipped", detail=_unrecognised(path, head))]
    rank = rank_from_name(path)
    return [Source(path, k, rank=rank, rank_origin="file name" if rank is not None else "") for k in kinds]


def _unrecognised(path: Path, head: bytes) -> str:
    """Why a file is not an input, naming the neighbours of the inputs that users most often point traceql at."""
    text = head.lstrip()
    if text[:1] == b"{" and b'"nodes"' in head and b'"schema"' in head:
        return ("PyTorch execution trace (ExecutionTraceObserver): operator graph without timings; traceql reads the "
                "Kineto trace (torch.profiler export_chrome_trace) recorded beside it")
    if path.name.startswith("memory_timeline") or (text[:1] == b"[" and b"[[" in head[:64] and b'"ph"' not in head):
        return ("torch.profiler memory timeline (export_memory_timeline): allocations only; traceql reads the Kineto "
                "trace recorded beside it")
    with open(path, "rb") as f:
        raw2 = f.read(2)
    if raw2 == b"\x1f\x8b" and not head:
        return "gzip file that does not decompress; copy it again"
    return ("not a recognised input (not a Kineto trace, nsys SQLite export, TORCH_TRACE log, NCCL log or Flight "
            "Recorder dump)")


def discover(run_path: Path) -> list[Source]:
    """Every input under run_path (a directory or a single file), in a stable order, with ids assigned."""
    run_path = Path(run_path)
    mods = formats()
    folder_mods = [m for m in mods if getattr(m, "FOLDER", False)]
    sources: list[Source] = []
    if run_path.is_file():
        sources = _sniff_file(run_path, mods)
    else:
        stack = [run_path]
        while stack:
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
                if p.is_symlink() and not p.exists():
                    continue
                if p.is_dir():
                    taken = next((m for m in folder_mods if m.sniff(p, b"")), None)
                    if taken is not None:
                        r = rank_from_name(p)
                        sources.append(Source(p, taken.KIND, rank=r, rank_origin="file name" if r is not None else ""))
                    else:
                        subdirs.append(p)
                elif p.is_file():
                    sources.extend(_sniff_file(p, mods))
            stack.extend(reversed(subdirs))
    sources.sort(key=lambda s: (str(s.path), s.kind))
    for i, s in enumerate(sources):
        s.id = i
    return sources


def open_maybe_gzip(path: Path):
    """A binary file object over the file's content, gunzipping transparently."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")
