"""Load and validate rule files. Rule files are untrusted data: safe-loaded, checked field by field."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from traceql.model import SEVERITIES
from traceql.rules import sql_guard

ID_RE = re.compile(r"^TQL(?!000)\d\d\d$")  # area 0: the inputs themselves (TQL001)
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MEASURES = ("rows", "count", "sum", "union", "overlap", "exposed", "gaps", "spread", "distinct")
FILTER_OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "regex", "not_regex", "is_null", "not_null")
_TOP_FIELDS = {
    "id", "name", "severity", "summary", "needs", "params", "select", "sql", "cross_rank", "condition", "message",
    "evidence", "ranks_column", "step_column", "location", "collapse", "docs", "fixtures", "tags",
}
_SELECT_FIELDS = {"measure", "table", "where", "against", "per", "column", "agg", "scale", "key", "value"}


# A rule file is a page of text: the largest in the pack is about 5 KB. The cap keeps a hostile --rules folder from
# making the parser read gigabytes; aliases are refused below (a 600-byte "billion laughs" file expands to 10^9 nodes
# when its values are turned into strings).
MAX_RULE_BYTES = 256 << 10
MAX_RULE_NODES = 100_000


class RuleError(ValueError):
    """A rule file is invalid. The message names the file and the field."""


@dataclass
class Rule:
    id: str
    name: str
    severity: str
    summary: str
    message: str
    path: Path
    needs: list = field(default_factory=list)
    params: dict = field(default_factory=dict)  # name -> {"default": v, "doc": str}
    select: dict | None = None
    sql: str | None = None
    cross_rank: bool = False
    condition: str | None = None
    evidence: list[str] = field(default_factory=list)
    ranks_column: str = "rank"
    step_column: str = "step"
    location: list[str] = field(default_factory=list)
    collapse: list[str] = field(default_factory=list)
    docs: dict = field(default_factory=dict)
    fixtures: dict = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)

    def defaults(self) -> dict:
        return {k: v.get("default") for k, v in self.params.items()}

    def need_sets(self) -> list[list[str]]:
        if not self.needs:
            return [[]]
        if all(isinstance(n, list) for n in self.needs):
            return self.needs
        return [self.needs]


def _err(path: Path, fld: str, msg: str) -> RuleError:
    return RuleError(f"{path}: field '{fld}': {msg}")


def _check_where(path: Path, fld: str, where) -> None:
    if where is None:
        return
    if not isinstance(where, dict):
        raise _err(path, fld, "must be a mapping of column -> value, list or {op: value}")
    for col, cond in where.items():
        if isinstance(cond, dict):
            for op in cond:
                if op not in FILTER_OPS:
                    raise _err(path, f"{fld}.{col}", f"unknown operator {op!r}; valid: {', '.join(FILTER_OPS)}")


def parse_rule(data, path: Path) -> Rule:
    if not isinstance(data, dict):
        raise RuleError(f"{path}: a rule file must hold one mapping (id, name, severity, ...), got {type(data).__name__}")
    unknown = set(data) - _TOP_FIELDS
    if unknown:
        raise _err(path, sorted(unknown)[0], f"unknown field; valid fields: {', '.join(sorted(_TOP_FIELDS))}")
    for req in ("id", "name", "severity", "summary", "message", "docs"):
        if req not in data:
            raise _err(path, req, "is required")
    rid, name, sev = data["id"], data["name"], data["severity"]
    if not isinstance(rid, str) or not ID_RE.match(rid):
        raise _err(path, "id", f"{rid!r} is not of the form TQL<area digit><two digits>, e.g. TQL101")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(path, "name", f"{name!r} is not kebab-case")
    if sev not in SEVERITIES:
        raise _err(path, "severity", f"{sev!r} is not one of {', '.join(SEVERITIES)}")
    if ("select" in data) == ("sql" in data):
        raise _err(path, "select", "a rule needs exactly one of 'select' (vocabulary) or 'sql'")
    docs = data["docs"]
    if not isinstance(docs, dict) or not docs.get("why") or not docs.get("fix"):
        raise _err(path, "docs", "needs 'why' and 'fix' (and preferably 'references')")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise _err(path, "params", "must be a mapping of name -> {default, doc}")
    norm_params = {}
    for k, v in params.items():
        if not isinstance(v, dict) or "default" not in v:
            raise _err(path, f"params.{k}", "must be a mapping with 'default' (and 'doc')")
        norm_params[k] = v
    sel = data.get("select")
    if sel is not None:
        if not isinstance(sel, dict):
            raise _err(path, "select", "must be a mapping")
        bad = set(sel) - _SELECT_FIELDS
        if bad:
            raise _err(path, f"select.{sorted(bad)[0]}", f"unknown field; valid: {', '.join(sorted(_SELECT_FIELDS))}")
        if sel.get("measure") not in MEASURES:
            raise _err(path, "select.measure", f"{sel.get('measure')!r} is not one of {', '.join(MEASURES)}")
        if not isinstance(sel.get("table"), str):
            raise _err(path, "select.table", "is required (a canonical or derived table name)")
        _check_where(path, "select.where", sel.get("where"))
        if sel["measure"] in ("overlap", "exposed"):
            ag = sel.get("against")
            if not isinstance(ag, dict) or "table" not in ag:
                raise _err(path, "select.against", f"measure {sel['measure']} needs against: {{table, where}}")
            _check_where(path, "select.against.where", ag.get("where"))
        if sel["measure"] == "distinct" and (not sel.get("key") or not sel.get("value")):
            raise _err(path, "select.key", "measure distinct needs key: [columns] and value: column")
        if sel["measure"] == "spread" and not sel.get("column"):
            raise _err(path, "select.column", "measure spread needs column")
    if "sql" in data and not isinstance(data["sql"], str):
        raise _err(path, "sql", "must be a string holding one SELECT")
    if "sql" in data:
        try:  # table functions (read_csv, ...) would let a rule read files; the table names are checked at run time
            sql_guard.check(data["sql"])
        except sql_guard.SqlRefused as e:
            raise _err(path, "sql", str(e)) from None
    for listf in ("evidence", "location", "collapse", "needs", "tags"):
        v = data.get(listf)
        if v is not None and not isinstance(v, list):
            raise _err(path, listf, "must be a list")
    fixtures = data.get("fixtures") or {}
    if not isinstance(fixtures, dict):
        raise _err(path, "fixtures", "must be a mapping with 'fire' and 'quiet' lists")
    return Rule(
        id=rid,
        name=name,
        severity=sev,
        summary=str(data["summary"]),
        message=str(data["message"]),
        path=path,
        needs=data.get("needs") or [],
        params=norm_params,
        select=sel,
        sql=data.get("sql"),
        cross_rank=bool(data.get("cross_rank", False)),
        condition=data.get("condition"),
        evidence=data.get("evidence") or [],
        ranks_column=data.get("ranks_column", "rank"),
        step_column=data.get("step_column", "step"),
        location=data.get("location") or [],
        collapse=data.get("collapse") or [],
        docs=docs,
        fixtures=fixtures,
        tags=data.get("tags") or [],
    )


def _check_tree(path: Path, root) -> None:
    """Refuse YAML aliases (*name, <<: *name): rules never need them, and a node reached twice is how a tiny file
    becomes an exponential value. The composed node graph shares one node object per alias, so a node seen twice is
    an alias; the walk stops at the first one, so it costs at most MAX_RULE_NODES steps."""
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            line = node.start_mark.line + 1 if getattr(node, "start_mark", None) else "?"
            raise RuleError(f"{path}: line {line}: YAML aliases and anchors (&name / *name) are not allowed in rule "
                            "files; write the value out")
        seen.add(id(node))
        if len(seen) > MAX_RULE_NODES:
            raise RuleError(f"{path}: more than {MAX_RULE_NODES} YAML nodes; a rule file is one small mapping")
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend((k, v))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def load_yaml(path: Path, what: str = "rule file", max_bytes: int = MAX_RULE_BYTES):
    """Plain data from a small untrusted YAML file: size-capped, safe-loaded, aliases refused before construction."""
    import yaml  # here, not at import: a command whose rule pack is in the compiled-rule cache never parses YAML

    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RuleError(f"{path}: {size} bytes is too large for a {what} (limit {max_bytes >> 10} KB); "
                            "check that this is the file you meant")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(f"{path}: cannot read {what}: {e}") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()  # composes nodes only: an alias is one shared node, nothing expanded yet
        if node is None:
            return None
        _check_tree(path, node)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())  # one line, whatever PyYAML says
        raise RuleError(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise RuleError(f"{path}: YAML nested too deeply; a rule file is one small mapping") from None
    finally:
        loader.dispose()


def load_rule(path: Path) -> Rule:
    return parse_rule(load_yaml(path), path)


def default_rules_dir() -> Path:
    """rules/ beside the package (a source checkout or an editable install), else the copy shipped in the package."""
    import sys

    here = Path(__file__).resolve().parents[2] / "rules"
    if here.is_dir() and any(here.glob("TQL*.yaml")):
        return here
    return Path(sys.prefix) / "share" / "traceql" / "rules"


def load_rules(dirs: list[Path] | None = None) -> list[Rule]:
    """Every rule file of the folders, checked. A pack already checked (same file names and bytes, same traceql
    version and loader code) comes from the compiled-rule cache instead: safe-loading and checking 49 files took
    ~40 ms of every command, unpickling them takes ~2 ms."""
    paths = [p for d in dirs or [default_rules_dir()] for p in sorted(Path(d).glob("*.y*ml"))]
    key = _pack_key(paths)
    hit = _cached_pack(key) if key else None
    if hit is not None:
        return hit
    rules: dict[str, Rule] = {}
    for p in paths:
        r = load_rule(p)
        if r.id in rules:
            raise RuleError(f"{p}: field 'id': {r.id} is already used by {rules[r.id].path}")
        rules[r.id] = r
    out = sorted(rules.values(), key=lambda r: r.id)
    if key:
        _store_pack(key, out)
    return out


# The compiled-rule cache: one pickle of the checked Rule list per rule pack, under the Parquet cache's folder
# (TRACEQL_CACHE_DIR), in rules/. Its key covers every byte the result depends on: the files' paths (they appear in
# the rules and their messages) and contents, this module and the version. It is the user's own cache folder, as trusted
# as the Parquet entries beside it; a damaged or unreadable entry is a miss, and a failed write is silent.
_PACK_KEEP = 8  # packs kept (the shipped pack and a few --rules folders); older ones are deleted on a write


def _pack_key(paths: list[Path]) -> str | None:
    import hashlib

    from traceql import __version__

    h = hashlib.blake2b(digest_size=16)
    h.update(f"{__version__}|{MAX_RULE_BYTES}|{MAX_RULE_NODES}".encode())
    try:
        h.update(Path(__file__).read_bytes())
        h.update(Path(sql_guard.__file__).read_bytes())
        for p in paths:
            if p.stat().st_size > MAX_RULE_BYTES:
                return None  # the checked load says what is wrong with it
            h.update(f"{p}\0{p.resolve()}\0".encode())  # as spelled (rules keep it) and where it is
            data = p.read_bytes()
            h.update(len(data).to_bytes(8, "little") + data)
    except OSError:
        return None  # the checked load names the unreadable file
    return h.hexdigest()


def _pack_dir() -> Path:
    from traceql.cache import cache_dir

    return cache_dir() / "rules"


def _cached_pack(key: str) -> list[Rule] | None:
    import pickle

    try:
        data = (_pack_dir() / f"{key}.pickle").read_bytes()
        rules = pickle.loads(data)
    except Exception:  # noqa: BLE001  (absent, damaged, or written by another layout: a miss, whatever it raises)
        return None
    if not isinstance(rules, list) or not all(isinstance(r, Rule) for r in rules):
        return None
    return rules


def _store_pack(key: str, rules: list[Rule]) -> None:
    import os
    import pickle

    d = _pack_dir()
    tmp = d / f"{key}.pickle.tmp{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(pickle.dumps(rules, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, d / f"{key}.pickle")  # whole or absent: a reader never sees half a file
        old = sorted(d.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)[_PACK_KEEP:]
        for p in old:
            p.unlink(missing_ok=True)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def matches(rule_id: str, patterns: list[str]) -> bool:
    """--select/--ignore: a pattern is an id or an id prefix (TQL1, TQL10), or a rule name."""
    return any(rule_id.startswith(p.strip().upper()) for p in patterns if p.strip())
