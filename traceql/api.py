"""The notebook API: a run's tables as polars DataFrames, and its findings as a list.

    import traceql

    run = traceql.load("runs/job-1234")          # a run dir, or a single trace file
    run.kernels                                    # a canonical table (polars DataFrame)
    run["collective_instances"]                    # a derived one, built on first use
    run.tables                                     # {name: what it holds}
    run.query("SELECT rank, count(*) AS n FROM kernels GROUP BY rank")
    run.summary()                                  # the numbers of `traceql summary`

    findings = traceql.check("runs/job-1234", select=["TQL3"])
    findings.to_polars()                           # one row per finding
    findings.rules                                 # what each rule did: ran, skipped (why), error

Everything here is what `traceql check`, `query` and `summary` compute, through the same code: a query goes through
the same guard (only the run's tables, no file access), findings are the same findings.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from traceql.model import Run as _ModelRun
    from traceql.model.result import CheckResult

__all__ = ["Findings", "QueryError", "RuleOutcome", "Run", "check", "load"]

# What each canonical table holds (DESIGN.md's list; the schemas are traceql.model.tables.SCHEMAS).
CANONICAL_DOCS = {
    "kernels": "GPU activity: kernels, memcpy, memset (device, stream, name, kind compute|comm|memcpy|memset, correlation)",
    "host_ops": "CPU-side ops and annotations: aten ops, user annotations, ProfilerStep#N, compiled regions, NVTX ranges",
    "runtime": "CUDA runtime and driver calls: launches, syncs, copies, event record/wait (correlation joins kernels)",
    "syncs": "GPU-side synchronization records: stream, device, event and context syncs, stream waits on events",
    "collectives": "one row per collective call per rank: group, sequence number, op, size, dtype, its host op and kernels",
    "steps": "training steps per rank (ProfilerStep#N, NVTX ranges or markers)",
    "flows": "explicit edges: CPU->GPU launches (ac2g), forward->backward, others",
    "compile_events": "torch.compile per rank and compile id: graph breaks, recompiles, cache hits/misses and keys, compile time",
    "nccl_comms": "NCCL communicators as their init lines describe them (commId, rank, nranks, host, busId, transport)",
    "nccl_events": "warnings, errors, watchdog timeouts and desync reports from NCCL, ProcessGroupNCCL and Flight Recorder",
}


class QueryError(ValueError):
    """A query that cannot run (refused, unknown table or column); the message names the valid ones."""


@dataclass(frozen=True)
class RuleOutcome:
    """What one rule did on the run: status 'ran', 'skipped' (reason says why: an input the run lacks) or 'error'."""

    id: str
    name: str
    severity: str
    status: str
    reason: str
    findings: int


def _derived_doc(name: str, builder: Any) -> str:
    """The first sentence of the builder's docstring, else the line of its module's docstring that names it."""
    doc = (builder.__doc__ or "").strip()
    if doc:
        return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    mod = inspect.getmodule(builder)
    text = (mod.__doc__ or "") if mod else ""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, s in enumerate(lines):
        if s.startswith(f"- {name}:"):
            more = []  # the item's continuation lines, up to the next item or paragraph
            for nxt in lines[i + 1:]:
                if not nxt or nxt.startswith("- "):
                    break
                more.append(nxt)
            return " ".join([s[len(name) + 3:].strip(), *more]).split(". ")[0].rstrip(".")
    # else what its module is about (link.clock: "Clock alignment per rank, from matched collectives")
    first = " ".join(text.strip().split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    return f"{first} ({name})" if first else "derived table (built on first use)"


class Run:
    """One analysed run: its sources, ranks and every table, canonical and derived, as polars DataFrames.

    `run.kernels` or `run["kernels"]` gives a table; derived tables (collective_instances, step_metrics, ...) are
    built the first time they are asked for, exactly as the rules see them. Times are int64 nanoseconds on each
    rank's own clock (`ts`, `end`, `dur`); derived cross-rank tables say where they are on the aligned clock.
    """

    def __init__(self, run: _ModelRun):
        self._run = run

    # -- what the run is -----------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The run dir (or file) that was analysed."""
        return self._run.path

    @property
    def ranks(self) -> list[int]:
        """Ranks with at least one source read."""
        return self._run.ranks

    @property
    def sources(self) -> list[dict]:
        """Every file found: path (relative to the run dir), kind, rank, status (ok, partial, skipped, error), detail."""
        root = self.path if self.path.is_dir() else self.path.parent
        return [s.to_json(root) for s in self._run.sources]

    @property
    def notes(self) -> list[str]:
        """Run-level facts worth knowing before trusting a number: clock alignment residuals, sources matched, gaps."""
        return list(self._run.notes)

    @property
    def tables(self) -> dict[str, str]:
        """Every table name, canonical then derived, with what it holds."""
        from traceql import link
        from traceql.model import SCHEMAS

        out = {n: CANONICAL_DOCS.get(n, "canonical table") for n in SCHEMAS}
        for n, builder in sorted(link.derived_tables().items()):
            out.setdefault(n, _derived_doc(n, builder))
        return out

    # -- tables --------------------------------------------------------------------------------------------
    def table(self, name: str) -> pl.DataFrame:
        """The table `name` (see `tables`); KeyError naming the valid tables for any other name."""
        from traceql import link
        from traceql.model import SCHEMAS

        if name in SCHEMAS or name in self._run.tables:
            return self._run.table(name)
        if name in link.derived_tables():
            return link.ensure(self._run, name)
        raise KeyError(f"no table {name!r}; valid tables: {', '.join(self.tables)}")

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.table(name)

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.table(name)
        except KeyError as e:
            raise AttributeError(e.args[0]) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.tables

    def __dir__(self) -> list[str]:  # tab completion in notebooks lists the tables
        return sorted(set(super().__dir__()) | set(self.tables))

    def __repr__(self) -> str:
        ok = sum(1 for s in self._run.sources if s.status in ("ok", "partial"))
        return f"<traceql.Run {self.path}: ranks {self.ranks}, {ok} source(s) read, {len(self.tables)} tables>"

    # -- questions -----------------------------------------------------------------------------------------
    def query(self, sql: str) -> pl.DataFrame:
        """polars SQL over the run's tables, under `traceql query`'s guard (only the run's tables, no file access).
        Derived tables are built when the query names them. QueryError says what is wrong and what is valid."""
        from traceql.report import query as q

        try:
            return q.query(self._run, sql)
        except q.QueryError as e:
            raise QueryError(str(e)) from None

    def summary(self) -> dict:
        """The numbers of `traceql summary --format json`: {'ranks': {rank: {column: value}}, 'columns': {column: definition}, ...}."""
        from traceql.report.summary import summarize

        return summarize(self._run)


class Findings(list):
    """The findings of a check (a list of traceql Finding: rule, name, severity, message, ranks, step, evidence,
    fingerprint, cost_ms_per_step, cost_pct, caused_by), with what every rule did (`rules`, `errors`) and the run."""

    def __init__(self, result: CheckResult):
        super().__init__(result.findings)
        self.result = result
        self.run = Run(result.run)
        self.suppressed = result.suppressed

    @property
    def rules(self) -> list[RuleOutcome]:
        """Every rule chosen, with its status: ran, skipped (the reason names the input the run lacks), error."""
        return [RuleOutcome(r.rule.id, r.rule.name, r.rule.severity, r.status, r.reason, len(r.findings)) for r in self.result.results]

    @property
    def errors(self) -> list[RuleOutcome]:
        """Rules that failed: where this is not empty, the findings are incomplete."""
        return [r for r in self.rules if r.status == "error"]

    def to_polars(self) -> pl.DataFrame:
        """One row per finding: rule, name, severity, ranks, step, message, fingerprint, cost_ms_per_step, cost_pct,
        caused_by, evidence (JSON text)."""
        import orjson
        import polars as pl

        schema = {"rule": pl.Utf8, "name": pl.Utf8, "severity": pl.Utf8, "ranks": pl.List(pl.Int64), "step": pl.Int64,
                  "message": pl.Utf8, "fingerprint": pl.Utf8, "cost_ms_per_step": pl.Float64, "cost_pct": pl.Float64,
                  "caused_by": pl.Utf8, "evidence": pl.Utf8}
        rows = [{"rule": f.rule, "name": f.name, "severity": f.severity, "ranks": list(f.ranks), "step": f.step,
                 "message": f.message, "fingerprint": f.fingerprint, "cost_ms_per_step": f.cost_ms_per_step,
                 "cost_pct": f.cost_pct, "caused_by": f.caused_by,
                 "evidence": orjson.dumps(f.evidence, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()}
                for f in self]
        return pl.DataFrame(rows, schema=schema)

    def to_json(self) -> dict:
        """The document of `traceql check --format json`."""
        return self.result.to_json()

    def __repr__(self) -> str:
        by = {s: sum(1 for f in self if f.severity == s) for s in ("error", "warning", "info")}
        return (f"<traceql.Findings {len(self)} finding(s): {by['error']} error, {by['warning']} warning, {by['info']} info"
                + (f"; {len(self.errors)} rule(s) failed" if self.errors else "") + ">")


def load(path: str | Path, *, cache: bool = True) -> Run:
    """Read a run dir (or a single trace/log file) as `traceql check` does, and return its tables.

    cache: reuse (and fill) the Parquet cache of parsed inputs. FileNotFoundError where `path` does not exist;
    ValueError where nothing in it can be analysed.
    """
    from traceql import pipeline

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    try:
        return Run(pipeline.load_run(p, use_cache=cache))
    except pipeline.NothingToAnalyse as e:
        raise ValueError(str(e)) from None


def check(path: str | Path, *, select: Iterable[str] | None = None, ignore: Iterable[str] | None = None,
          params: Mapping[str, Mapping[str, Any]] | None = None, rules: str | Path | Iterable[str | Path] | None = None,
          cache: bool = True) -> Findings:
    """Run the rule pack on a run dir (or file), as `traceql check` does, and return its findings.

    select / ignore: rule ids or prefixes ("TQL3", "TQL101"). params: threshold overrides,
    {"TQL101": {"min_exposed_ms": 5}}. rules: rule folder(s) to use instead of the bundled pack. No configuration
    file is read: pass what you want explicitly. ValueError for an unknown rule, parameter or value.
    """
    from traceql import pipeline
    from traceql.rules.config import ConfigError
    from traceql.rules.loader import RuleError

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    try:
        result = pipeline.check(p, select=_list(select), ignore=_list(ignore), sets=_sets(params),
                                rules_dirs=_dirs(rules), use_cache=cache)
    except (ConfigError, RuleError, pipeline.NothingToAnalyse) as e:
        raise ValueError(str(e)) from None
    return Findings(result)


def _list(v: Iterable[str] | None) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):  # select="TQL1" is one selector, not four
        v = [v]
    return [p.strip() for s in v for p in s.split(",") if p.strip()]


def _sets(params: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """{"TQL101": {"min_exposed_ms": 5}} as the command line's RULE.param=value."""
    out = []
    for rid, kv in (params or {}).items():
        if not isinstance(kv, Mapping):
            raise TypeError(f"params[{rid!r}]: expected a mapping of parameter to value, e.g. {{'min_exposed_ms': 5}}")
        out += [f"{rid}.{k}={_value(v)}" for k, v in kv.items()]
    return out


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _dirs(rules: str | Path | Iterable[str | Path] | None) -> list[Path] | None:
    if rules is None:
        return None
    if isinstance(rules, (str, Path)):
        rules = [rules]
    return [Path(r) for r in rules] or None
