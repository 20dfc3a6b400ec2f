"""Gzip sources: the one inflater every reader that gunzips goes through, and the in-process inflate cap.

A gzip file's inflated size is unknown until it is inflated: the trailer's ISIZE is the last member's size modulo
4 GiB, which a hostile file can set to anything. So the size is learned while inflating. A read in this process (not
in a budget worker, budget.py) runs under an Allowance, a number of inflated bytes that every reader charges as it
inflates; past it the read stops at once with OverCap (a BaseException: the readers' own `except Exception` and
`except OSError` let it by) and the loader hands the source to a budget worker, whose memory budget holds whatever the
stream turns out to be. What was inflated up to then is dropped: the cap bounds the bytes this process inflates for
nothing, and size_hint (which trusts ISIZE only to go to a worker at once, never to stay here) sends an honest large
file to a worker without inflating it here first.

Streams of several members (`cat a.gz b.gz`, as gzip(1) reads them) are read to the last member; bytes after the last
member that are not another member (zero padding some copiers add) are ignored, as gzip(1) does.
"""

from __future__ import annotations

import io
import os
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path

try:  # ISA-L's inflate (the `fast` extra): about twice zlib's speed on these files; zlib otherwise
    from isal import isal_zlib as _inflate

    ERRORS: tuple = (zlib.error, _inflate.error)
except ImportError:  # pragma: no cover - depends on the install
    _inflate = zlib
    ERRORS = (zlib.error,)

MAGIC = b"\x1f\x8b"


class OverCap(BaseException):
    """An in-process read inflated past its allowance: the source goes to a budget worker."""


class Allowance:
    """Inflated bytes that reads in this process may still produce (charged from any thread: one reader inflates at
    a time, ahead of its parser)."""

    def __init__(self, left: int):
        self.left = left

    def charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise OverCap()


_HERE = threading.local()


@contextmanager
def capped(allowance: Allowance):
    """Reads on this thread charge `allowance` (a reader's inflating thread is handed it where it opens the file)."""
    was = getattr(_HERE, "allowance", None)
    _HERE.allowance = allowance
    try:
        yield allowance
    finally:
        _HERE.allowance = was


def current() -> Allowance | None:
    """The allowance reads on this thread charge; None where nothing caps them (a budget worker, isolation off)."""
    return getattr(_HERE, "allowance", None)


def gzipped(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == MAGIC
    except OSError:
        return False


# Deflate inflates at most 1032 bytes per compressed byte: a trailer claiming more is no trailer (a cut-off file's last
# bytes are the middle of its stream).
_MAX_RATIO = 1032


def size_hint(path: Path) -> int:
    """What reading the file will inflate, as far as can be told without inflating: its size, or for gzip the
    trailer's ISIZE where that is possible for the file's size. Only a hint: a hostile, cut-off or many-member stream
    inflates to more, which the allowance catches."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) != MAGIC or size < 20:
                return size
            f.seek(size - 4)
            isize = int.from_bytes(f.read(4), "little")
    except OSError:
        return 0
    return isize if size < isize <= _MAX_RATIO * size else size


def inflate(f, notes: list, block: int, progress=None):
    """The inflated bytes of gzip file object f, in pieces of at most `block` bytes, every member to the last,
    charged to this thread's allowance (captured now: the pieces may be pulled from another thread). A broken stream
    ends them with a note in `notes`. progress(done, total): compressed bytes read so far."""
    return _inflate_pieces(f, notes, block, current(), progress)


def _inflate_pieces(f, notes: list, block: int, allowance: Allowance | None, progress):
    total = os.fstat(f.fileno()).st_size
    pos = 0
    d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
    raw = b""
    while True:
        if not raw:
            raw = f.read(1 << 20)
            if not raw:
                break
            pos += len(raw)
            if progress is not None:
                progress(pos, total)
        try:
            out = d.decompress(raw, block)
        except ERRORS as e:
            notes.append(f"gzip stream is corrupt near compressed byte {pos} ({e})")
            return
        if out:
            if allowance is not None:
                allowance.charge(len(out))
            yield out
        if d.eof:
            rest = d.unused_data
            while len(rest) < 2:  # is another member next?
                more = f.read(1 << 20)
                if not more:
                    break
                pos += len(more)
                rest += more
            if rest[:2] != MAGIC:
                return  # the end, or padding after the last member (gzip(1) ignores it too)
            d = _inflate.decompressobj(16 + zlib.MAX_WBITS)
            raw = rest
        else:
            raw = d.unconsumed_tail
    if not d.eof:
        notes.append(f"gzip stream ends early at compressed byte {pos}")


# A reader that parses a whole document at once holds some ten times its size in Python objects: in this process it
# takes documents up to this size (what the 2 MB-of-files rule for in-process reads let through before the cap);
# a larger one goes to a budget worker.
WHOLE_MAX = 16 << 20


def read_all(path: Path) -> tuple[bytes, str]:
    """The file's content (gunzipped, every member), for a reader that parses it whole, and a note when a gzip stream
    broke off (what inflated is kept). Under an allowance, content past WHOLE_MAX raises OverCap."""
    al = current()
    with open(path, "rb") as f:
        if f.read(2) != MAGIC:
            if al is not None and os.fstat(f.fileno()).st_size > WHOLE_MAX:
                raise OverCap()
            f.seek(0)
            return f.read(), ""
        f.seek(0)
        notes: list[str] = []
        data = b"".join(inflate(f, notes, 1 << 24))
    if al is not None and len(data) > WHOLE_MAX:
        raise OverCap()
    return data, notes[0] if notes else ""


class _Capped(io.RawIOBase):
    """A binary stream over another that charges every byte it reads to an allowance."""

    def __init__(self, inner, allowance: Allowance):
        self._inner = inner
        self._allowance = allowance

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._inner.readinto(b)
        if n:
            self._allowance.charge(n)
        return n

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            super().close()


def open_binary(path: Path):
    """A binary file object over the file's content, gunzipping transparently (every member, as gzip(1) does; a
    truncated stream raises EOFError at its end, as the gzip module does), charged to this thread's allowance."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != MAGIC:
        return open(path, "rb")
    import gzip

    inner = gzip.open(path, "rb")
    al = current()
    return inner if al is None else io.BufferedReader(_Capped(inner, al), 1 << 16)


def open_text(path: Path, **kw):
    """open_binary's content as text (io.TextIOWrapper's keywords: encoding, errors, newline)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != MAGIC:
        return open(path, **kw)
    return io.TextIOWrapper(open_binary(path), **kw)
