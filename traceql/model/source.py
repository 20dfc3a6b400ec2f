"""A source: one input file (or folder) of a run, what kind it is, which rank(s) it holds, and how reading it went."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Kinds that discovery recognises. `supported` ones have an importer in traceql.ingest.
KINDS = (
    "kineto",  # torch.profiler / Chrome trace JSON (.json, .json.gz)
    "nsys",  # Nsight Systems SQLite export
    "nsys_report",  # .nsys-rep / .qdrep: needs `nsys export --type sqlite` first
    "torch_trace",  # TORCH_TRACE structured JSONL log
    "compile_debug",  # TORCH_COMPILE_DEBUG run folder
    "torch_logs",  # TORCH_LOGS text (recompiles, graph_breaks) in a stdout/stderr log
    "nccl_log",  # NCCL_DEBUG=INFO and ProcessGroupNCCL lines
    "flight_recorder",  # ProcessGroupNCCL Flight Recorder dump (pickle or JSON)
    "manifest",  # traceql capture manifest.json
    "unknown",
)

STATUSES = ("ok", "partial", "skipped", "error")


@dataclass
class Source:
    path: Path
    kind: str
    id: int = 0
    rank: int | None = None  # the single rank the source holds, where it holds one
    ranks: list[int] = field(default_factory=list)  # every rank it holds (nsys files can hold several)
    host: str | None = None
    status: str = "ok"
    detail: str = ""
    rank_origin: str = ""  # distributedInfo, file name, process order, ..., "assumed" (link.ranks: nothing names it)
    meta: dict = field(default_factory=dict)  # small per-source facts (schemaVersion, device props, versions)
    cache_key: str | None = None  # the Parquet cache entry of its tables (content + kind + importer version)

    def to_json(self, root: Path | None = None) -> dict:
        path = self.path
        if root is not None:
            try:
                path = self.path.relative_to(root) if self.path != root else Path(self.path.name)
            except ValueError:
                pass
        return {
            "path": str(path),
            "kind": self.kind,
            "rank": self.rank,
            "ranks": sorted(self.ranks) if self.ranks else ([self.rank] if self.rank is not None else []),
            "rank_origin": self.rank_origin,  # distributedInfo, file name, ..., or "assumed" (a lone rankless source)
            "status": self.status,
            "detail": self.detail,
        }
