"""Importers: one module per input format, each turning one source into canonical tables.

A format module exposes:

    KIND: str                                   the Source.kind it reads
    SUPPORTED: bool                             False while the format is only recognised
    sniff(path: Path, head: bytes) -> bool      content test on the first bytes (decompressed) of a file;
                                                 folder formats get head=b"" and a directory path
    read(path: Path, source: Source) -> dict[str, pl.DataFrame]
                                                 canonical tables (subsets of columns are fine: conform()
                                                 completes them); sets source.rank/ranks/status/detail/meta.
                                                 Raises IngestError with a one-line, actionable message.

Modules know nothing about rules or other formats.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import polars as pl

from traceql.model import Source, conform


class IngestError(Exception):
    """A source could not be read. The message is one line: what is wrong and what the user can do."""


# Order matters for sniffing: the most specific formats first.
_MODULES = {
    "manifest": "traceql.ingest.manifest",
    "nsys": "traceql.ingest.nsys",
    "nsys_report": "traceql.ingest.nsys_report",
    "flight_recorder": "traceql.ingest.flight_recorder",
    "kineto": "traceql.ingest.kineto",
    "torch_trace": "traceql.ingest.compile_trace",
    "compile_debug": "traceql.ingest.compile_debug",
    "nccl_log": "traceql.ingest.nccl_log",
    "torch_logs": "traceql.ingest.torch_logs",
}


def formats() -> list[ModuleType]:
    out = []
    for name in _MODULES.values():
        try:
            out.append(importlib.import_module(name))
        except ImportError:  # a format module may be absent in a trimmed install; discovery then skips it
            continue
    return out


def sniffers() -> list[tuple[str, object, bool]]:
    """(kind, content test, takes folders) of every installed format, in sniffing order, without importing the readers
    (traceql.ingest.sniff says why)."""
    from traceql.ingest.sniff import SNIFFERS

    return [(kind, *SNIFFERS[kind]) for kind, name in _MODULES.items() if _installed(name)]


def _installed(name: str) -> bool:
    """Whether a format module is present (a trimmed install may lack one; discovery then skips its format)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module_for(kind: str) -> ModuleType | None:
    name = _MODULES.get(kind)
    return importlib.import_module(name) if name else None


def read_source(source: Source, lazy: bool = False) -> dict[str, pl.DataFrame]:
    """Read one source into conformed canonical tables, stamping rank and source id where the importer left them.
    lazy: a table may be a model.run.Pending (in a model.run.Tables), built when read (kineto's flows only)."""
    mod = module_for(source.kind)
    if mod is None or not getattr(mod, "SUPPORTED", False):
        raise IngestError(f"{source.kind} input is recognised but not yet supported")
    tables = mod.read(source.path, source, lazy=True) if lazy and source.kind == "kineto" else mod.read(source.path, source)
    out = {}
    for name, df in tables.items():
        if df is None:
            continue
        if not isinstance(df, pl.DataFrame):  # a Pending: stamped and conformed as it is read
            from traceql.model.run import Pending, Tables

            out = Tables(out)
            dict.__setitem__(out, name, Pending(df.rows, lambda name=name, df=df: _stamped(source, name, df.read())))
            continue
        out[name] = _stamped(source, name, df)
    return out


def _stamped(source: Source, name: str, df: pl.DataFrame) -> pl.DataFrame:
    if "source" not in df.columns or df["source"].null_count() == df.height:
        df = df.with_columns(pl.lit(source.id, dtype=pl.Int32).alias("source"))
    if ("rank" not in df.columns or df["rank"].null_count() == df.height) and source.rank is not None:
        df = df.with_columns(pl.lit(source.rank, dtype=pl.Int32).alias("rank"))
    return conform(name, df)
