"""Load and validate rule files. Rule files are untrusted data: safe-loaded, checked field by field, then checked
against the declared schemas (traceql.rules.schema): tables, columns, message fields and evidence names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from traceql.model import SEVERITIES
from traceql.rules import manifest, schema, sql_guard
from traceql.rules.compose import ACROSS_FIELDS, JOIN_HOW, STAGES, STEP_AGGS, STEPS_FIELDS
from traceql.rules.views import View, ViewError, load_views
from traceql.rules.yamlfile import MAX_RULE_BYTES, MAX_RULE_NODES, RuleError, decode, load_yaml, parse_yaml, read_capped

__all__ = ["MAX_RULE_BYTES", "MAX_RULE_NODES", "Rule", "RuleError", "load_rule", "load_rules", "load_yaml", "parse_rule"]

ID_RE = re.compile(r"^TQL(?!000)\d\d\d$")  # area 0: the inputs themselves (TQL001)
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MEASURES = ("rows", "count", "sum", "union", "overlap", "exposed", "gaps", "spread", "distinct", "join")
FILTER_OPS = ("eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "regex", "not_regex", "is_null", "not_null")
_TOP_FIELDS = {
    "id", "name", "severity", "summary", "needs", "params", "select", "sql", "cross_rank", "condition", "message",
    "evidence", "ranks_column", "step_column", "location", "collapse", "docs", "fixtures", "tags",
    "fact",  # "module:function" of link/ that builds the rule's fact, where its logic is Python (rules explain)
    "cost",  # how a finding's cost per step is worked out (the root-cause work reads it): a mapping
    "views",  # the named views (rules/views/) the rule's SQL reads
}
_SELECT_FIELDS = {"measure", "table", "where", "against", "per", "column", "agg", "scale", "key", "value", "span",
                  "left", "right", "on", "how", "prefix", *STAGES, "then"}
FACT_RE = re.compile(r"^traceql(\.[a-z_][a-z0-9_]*)+:[a-z_][a-z0-9_]*$")


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
    fact: str | None = None
    cost: dict | None = None
    uses_views: list[str] = field(default_factory=list)  # the rule's `views:` field
    views: dict[str, View] = field(default_factory=dict, repr=False)  # every view of the rule pack it was loaded with

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


def _unknown(path: Path, fld: str, key: str, valid) -> RuleError:
    """An unknown key, with the nearest valid one where there is one (a typo), and every valid choice."""
    import difflib  # only for an error's suggestion

    close = difflib.get_close_matches(str(key), sorted(valid), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return _err(path, fld, f"unknown field; {hint}valid fields: {', '.join(sorted(valid))}")


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


def _str_list(path: Path, fld: str, v, n: int | None = None) -> None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v) or (n is not None and len(v) != n):
        raise _err(path, fld, f"must be a list of {n or ''}{' ' if n else ''}column names")


def _check_stages(path: Path, fld: str, st: dict) -> None:
    comp = st.get("compute")
    if comp is not None and (not isinstance(comp, dict) or not all(isinstance(v, str) for v in comp.values())):
        raise _err(path, f"{fld}.compute", 'must be a mapping of new column -> expression, e.g. {net_ms: "a - b"}')
    if st.get("filter") is not None and not isinstance(st["filter"], str):
        raise _err(path, f"{fld}.filter", "must be an expression (the condition's grammar)")
    w = st.get("steps")
    if w is not None:
        if not isinstance(w, dict):
            raise _err(path, f"{fld}.steps", "must be a mapping: skip_first, skip_warmup, agg, of, per")
        for k in w:
            if k not in STEPS_FIELDS:
                raise _unknown(path, f"{fld}.steps.{k}", k, STEPS_FIELDS)
        if w.get("agg", "median") not in STEP_AGGS:
            raise _err(path, f"{fld}.steps.agg", f"{w.get('agg')!r} is not one of {', '.join(STEP_AGGS)}")
        if w.get("agg") == "worst" and not isinstance(w.get("of"), str):
            raise _err(path, f"{fld}.steps.of", "agg worst needs of: the column whose largest value is the worst step")
        if not isinstance(w.get("skip_first", 0), int) or w.get("skip_first", 0) < 0:
            raise _err(path, f"{fld}.steps.skip_first", "must be a whole number of steps (0 or more)")
        if w.get("per") is not None:
            _str_list(path, f"{fld}.steps.per", w["per"])
    x = st.get("across_ranks")
    if x is not None:
        if not isinstance(x, dict):
            raise _err(path, f"{fld}.across_ranks", "must be a mapping: key: [columns], value: column or [columns]")
        for k in x:
            if k not in ACROSS_FIELDS:
                raise _unknown(path, f"{fld}.across_ranks.{k}", k, ACROSS_FIELDS)
        _str_list(path, f"{fld}.across_ranks.key", x.get("key"))
        v = x.get("value")
        if not (isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(c, str) for c in v))):
            raise _err(path, f"{fld}.across_ranks.value", "must be a column or a list of columns")


def _check_select(path: Path, fld: str, sel) -> None:
    """The shape of a selection (recursively for join sides); columns and tables are checked by rules.schema."""
    if not isinstance(sel, dict):
        raise _err(path, fld, "must be a mapping")
    if True in sel and "on" not in sel:  # YAML 1.1 reads a bare `on:` key as the boolean true
        sel["on"] = sel.pop(True)
    for k in sel:
        if k not in _SELECT_FIELDS:
            raise _unknown(path, f"{fld}.{k}", k, _SELECT_FIELDS)
    m = sel.get("measure")
    if m not in MEASURES:
        raise _err(path, f"{fld}.measure", f"{m!r} is not one of {', '.join(MEASURES)}")
    if m == "join":
        for side in ("left", "right"):
            if not isinstance(sel.get(side), dict):
                raise _err(path, f"{fld}.{side}", "measure join needs left: {measure, table, ...} and right: {...}")
            _check_select(path, f"{fld}.{side}", sel[side])
        if sel.get("on") is not None:
            _str_list(path, f"{fld}.on", sel["on"])
        if sel.get("how", "left") not in JOIN_HOW:
            raise _err(path, f"{fld}.how", f"{sel.get('how')!r} is not one of {', '.join(JOIN_HOW)}")
        pre = sel.get("prefix")
        if pre is not None and not isinstance(pre, str) and not (isinstance(pre, dict) and set(pre) <= {"left", "right"}
                                                                  and all(isinstance(v, str) for v in pre.values())):
            raise _err(path, f"{fld}.prefix", "must be a string (for the right side) or {left: str, right: str}")
        if "table" in sel:
            raise _err(path, f"{fld}.table", "a join reads its tables in left and right, not here")
    else:
        for k in ("left", "right", "on", "how", "prefix"):
            if k in sel:
                raise _err(path, f"{fld}.{k}", "only measure join takes left, right, on, how and prefix")
        if not isinstance(sel.get("table"), str):
            raise _err(path, f"{fld}.table", "is required (a canonical or derived table name, or a view)")
        _check_where(path, f"{fld}.where", sel.get("where"))
        if sel.get("per") is not None:
            _str_list(path, f"{fld}.per", sel["per"])
        if sel.get("span") is not None:
            _str_list(path, f"{fld}.span", sel["span"], 2)
        if m in ("overlap", "exposed"):
            ag = sel.get("against")
            if not isinstance(ag, dict) or "table" not in ag:
                raise _err(path, f"{fld}.against", f"measure {m} needs against: {{table, where}}")
            for k in ag:
                if k not in ("table", "where", "span"):
                    raise _unknown(path, f"{fld}.against.{k}", k, {"table", "where", "span"})
            _check_where(path, f"{fld}.against.where", ag.get("where"))
            if ag.get("span") is not None:
                _str_list(path, f"{fld}.against.span", ag["span"], 2)
        if m == "distinct" and (not sel.get("key") or not sel.get("value")):
            raise _err(path, f"{fld}.key", "measure distinct needs key: [columns] and value: column")
        if m == "spread" and not sel.get("column"):
            raise _err(path, f"{fld}.column", "measure spread needs column")
    _check_stages(path, fld, sel)
    then = sel.get("then")
    if then is not None:
        if not isinstance(then, list):
            raise _err(path, f"{fld}.then", f"must be a list of stages, each one of {', '.join(STAGES)}")
        for i, st in enumerate(then):
            if not isinstance(st, dict) or len(st) != 1 or next(iter(st)) not in STAGES:
                raise _err(path, f"{fld}.then[{i}]", f"each stage is a mapping with one key: {', '.join(STAGES)}")
            _check_stages(path, f"{fld}.then[{i}]", st)


def parse_rule(data, path: Path, views: dict[str, View] | None = None, validate: bool = True,
               guard: bool = True) -> Rule:
    """A Rule from a rule file's data, checked field by field; with validate, also against the declared schemas
    and the views (rules.schema): a rule that loads can only fail at evaluation on the data, not on its names.
    guard=False leaves the SQL guard to where the statement runs (the engine checks every statement before polars
    sees it): for a bundled file whose bytes its manifest vouches for, which passed the same guard code when the
    manifest was written, so a rule that never runs (its inputs absent) never pays for reading its SQL."""
    if not isinstance(data, dict):
        raise RuleError(f"{path}: a rule file must hold one mapping (id, name, severity, ...), got {type(data).__name__}")
    for k in sorted(data, key=str):
        if k not in _TOP_FIELDS:
            raise _unknown(path, str(k), k, _TOP_FIELDS)
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
        _check_select(path, "select", sel)
    if "sql" in data and not isinstance(data["sql"], str):
        raise _err(path, "sql", "must be a string holding one SELECT")
    if "sql" in data and guard:
        try:  # table functions (read_csv, ...) would let a rule read files; table names are checked in rules.schema
            sql_guard.check(data["sql"])
        except sql_guard.SqlRefused as e:
            raise _err(path, "sql", str(e)) from None
    for listf in ("evidence", "location", "collapse", "needs", "tags", "views"):
        v = data.get(listf)
        if v is not None and not isinstance(v, list):
            raise _err(path, listf, "must be a list")
    for strf in ("message", "summary", "condition", "ranks_column", "step_column"):
        v = data.get(strf)
        if v is not None and not isinstance(v, str):
            raise _err(path, strf, "must be a string")
    fact = data.get("fact")
    if fact is not None and (not isinstance(fact, str) or not FACT_RE.match(fact)):
        raise _err(path, "fact", f"{fact!r} is not module:function of traceql, e.g. traceql.link.nccl:nccl_errors")
    cost = data.get("cost")
    if cost is not None and not isinstance(cost, dict):
        raise _err(path, "cost", "must be a mapping")
    if cost is not None:
        from traceql.link.whatif import CostSpecError, check_spec

        try:
            check_spec(cost)
        except CostSpecError as e:
            raise _err(path, "cost", str(e)) from None
    fixtures = data.get("fixtures") or {}
    if not isinstance(fixtures, dict):
        raise _err(path, "fixtures", "must be a mapping with 'fire' and 'quiet' lists")
    for k in fixtures:
        if k not in ("fire", "quiet"):
            raise _unknown(path, f"fixtures.{k}", k, {"fire", "quiet"})
    rule = Rule(
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
        fact=fact,
        cost=cost,
        uses_views=data.get("views") or [],
        views=views if views is not None else {},
    )
    if validate:
        from_file = "step_column" in data
        schema.validate(rule, step_column_given=from_file)
    return rule


_VIEWS: dict[tuple, dict[str, View]] = {}


def views_of(dirs: list[Path], infer: bool = True, data: dict[Path, dict] | None = None) -> dict[str, View]:
    """The views under views/ of the rule folders, loaded once per set of folders and their files' mtimes. Where the
    bundled pack's manifest vouches for them, infer=False leaves their schemas to first use and data holds the YAML
    files' data (views.load_views)."""
    key = []
    for d in dirs:
        folder = Path(d) / "views"
        try:
            files = sorted(p for p in folder.iterdir() if p.suffix in (".sql", ".yaml", ".yml")) if folder.is_dir() else []
            key.append((str(Path(d).resolve()), tuple((p.name, p.stat().st_mtime_ns) for p in files)))
        except OSError as e:
            raise RuleError(f"{folder}: cannot read the views folder: {e}") from None
    key = tuple(key)
    try:
        if key not in _VIEWS:
            _VIEWS[key] = load_views(list(dirs), infer=infer, data=data)
        elif infer:  # loaded before without inference: a full validation checks every view now
            for v in _VIEWS[key].values():
                v.schema  # noqa: B018 (inferred and checked on first use)
    except ViewError as e:
        raise RuleError(str(e)) from None
    return _VIEWS[key]


def load_rule(path: Path, views: dict[str, View] | None = None) -> Rule:
    """One rule file, with the views of its own folder unless others are given."""
    path = Path(path)
    return parse_rule(load_yaml(path), path, views if views is not None else views_of([path.parent]))


def default_rules_dir() -> Path:
    """rules/ beside the package (a source checkout or an editable install), else the copy shipped in the package."""
    import sys

    here = Path(__file__).resolve().parents[2] / "rules"
    if here.is_dir() and any(here.glob("TQL*.yaml")):
        return here
    return Path(sys.prefix) / "share" / "traceql" / "rules"


def _load_vouched(path: Path, entry: dict | None, views: dict[str, View]) -> Rule:
    """One rule file; where the manifest's entry is for exactly these bytes, its data and outputs spare the YAML parse
    and the run on empty frames (rules.manifest says what is still checked), else validated in full."""
    raw = read_capped(path)
    if entry is not None and entry.get("sha256") == manifest.sha256(raw) and (outs := manifest.recorded(entry)):
        data = entry["data"] if isinstance(entry.get("data"), dict) else parse_yaml(decode(raw, path), path)
        rule = parse_rule(data, path, views, validate=False, guard=False)
        schema.check_needs(rule)
        try:
            if rule.collapse and outs[1] is None:  # a collapse rule's names are checked against its collapsed output
                raise RuleError("no recorded output after collapse")
            schema.check_reads(rule, *outs, step_column_given="step_column" in data)
        except RuleError:  # recorded outputs the rule's names do not fit are not believed: infer them
            schema.validate(rule, step_column_given="step_column" in data)
        return rule
    return parse_rule(parse_yaml(decode(raw, path), path), path, views)


def load_rules(dirs: list[Path] | None = None, trust_manifest: bool = True) -> list[Rule]:
    """Every rule of the folders, validated; a bundled-pack file its manifest vouches for (rules.manifest) is not
    re-inferred unless trust_manifest is False (`traceql rules check`)."""
    dirs = [Path(d) for d in (dirs or [default_rules_dir()])]
    entries, view_data = manifest.trusted(dirs) if trust_manifest else ({}, {})
    views = views_of(dirs, infer=not entries, data=view_data)
    rules: dict[str, Rule] = {}
    for d in dirs:
        vouched = entries if entries and manifest.bundled(d) else {}
        for p in sorted(d.glob("*.y*ml")):
            r = _load_vouched(p, vouched.get(p.name), views)
            if r.id in rules:
                raise RuleError(f"{p}: field 'id': {r.id} is already used by {rules[r.id].path}")
            rules[r.id] = r
    return sorted(rules.values(), key=lambda r: r.id)


# The rules about the inputs themselves (TQL001 rank-collision, TQL002 missing-rank, TQL003 unreadable-source,
# TQL004 partial-source): whether the run was understood at all (rules.config.choose keeps them in any selection).
INPUT_RULES = "TQL00"


def with_input_rules(rules: list[Rule]) -> list[Rule]:
    """A user's pack (`--rules DIR`) with the bundled input rules it does not define itself: without them a run with
    an unreadable or a missing rank would pass a check against that pack with "No findings" and exit 0."""
    d = default_rules_dir()
    have = {r.id for r in rules}
    paths = [p for p in sorted(d.glob(f"{INPUT_RULES}*.y*ml")) if p.name.split("-", 1)[0] not in have]
    if not paths:
        return rules
    entries, view_data = manifest.trusted([d])
    views = views_of([d], infer=not entries, data=view_data)
    extra = [_load_vouched(p, entries.get(p.name), views) for p in paths]
    return sorted(rules + [r for r in extra if r.id not in have], key=lambda r: r.id)


def matches(rule_id: str, patterns: list[str]) -> bool:
    """--select/--ignore: a pattern is an id or an id prefix (TQL1, TQL10), or a rule name."""
    return any(rule_id.startswith(p.strip().upper()) for p in patterns if p.strip())
