"""The bundled rule pack's validation manifest: rules/manifest.json, beside the rule files it describes.

Validating a rule in full runs its selection or SQL on empty frames of the declared schemas to learn its output
columns (rules.schema): about a second for the pack, on every command. The results only change when a rule file,
a view, the code that validates or the polars that runs it changes, so `traceql rules check --write-manifest`
records them once: per rule file the sha256 of its bytes, its parsed data (where JSON holds it exactly) and its
inferred output columns; for the pack the sha256 of every view file, the version of the validating code (a hash of
its source files) and polars' version.

What it is trusted for, and no more: it is part of the installed package, like the code that reads it, so it is
read only for the bundled pack's own folder, never from a --rules folder (a user pack is validated in full, a
manifest.json in it ignored). An entry applies only to a file whose bytes hash to it, while the views, the code and
polars are those it was written with; anything else (an edited or added file, a changed view) is validated in full.
Where an entry applies, the structural checks still run on the rule's data and its message, evidence, condition,
location, collapse and step/ranks columns are still checked against the recorded outputs; only the run on empty
frames is skipped (and the YAML parse, the data being the file's). Recorded outputs that fail those checks are not
believed: the rule is validated in full, so a wrong entry can neither pass a rule the inference would refuse for an
edited file nor refuse a good one. Nothing in it is executed: it is JSON, and every SQL statement is still checked
by sql_guard where it runs. tests/test_rule_manifest.py fails when the shipped manifest is stale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path

FILE = "manifest.json"
FORMAT = 1
REFRESH = "traceql rules check --write-manifest"
# the source files whose code decides whether a rule validates and what its outputs are
_CODE = ("rules/loader.py", "rules/schema.py", "rules/sql_guard.py", "rules/views.py", "rules/yamlfile.py",
         "rules/manifest.py", "rules/engine.py", "rules/compose.py", "rules/condition.py", "model/tables.py",
         "model/derived.py", "intervals.py", "link/context.py", "link/ranks.py")


@functools.cache
def code_version() -> str | None:
    """A hash of the validating code and polars' version; None where a source file cannot be read (then no manifest
    is trusted)."""
    import polars as pl

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"format {FORMAT}\0polars {pl.__version__}\0".encode())
    try:
        for rel in _CODE:
            h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    except OSError:
        return None
    return h.hexdigest()


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def views_digest(dirs: list[Path]) -> dict[str, str] | None:
    """views/NAME -> sha256 of its bytes, over the views of every folder of the load; None where one cannot be read."""
    out = {}
    try:
        for d in dirs:
            folder = Path(d) / "views"
            if folder.is_dir():
                for p in sorted(folder.iterdir()):
                    if p.suffix in (".sql", ".yaml", ".yml"):
                        key = f"views/{p.name}"
                        out[key if key not in out else f"{d}/{key}"] = sha256(p.read_bytes())
    except OSError:
        return None
    return out


def bundled(d: Path) -> bool:
    from traceql.rules.loader import default_rules_dir

    try:
        return Path(d).resolve() == default_rules_dir().resolve()
    except OSError:
        return False


def trusted(dirs: list[Path]) -> tuple[dict[str, dict], dict[Path, dict]]:
    """What of the bundled pack's manifest may be used for this load: its rule entries (file name -> entry) and its
    views' data (path -> data); ({}, {}) unless the load reads the bundled folder, the manifest is well formed, and
    the code, polars and the views of the whole load are those it was written with."""
    dirs = [Path(d) for d in dirs]
    d = next((d for d in dirs if bundled(d)), None)
    if d is None:
        return {}, {}
    try:
        man = _loads((d / FILE).read_bytes())
    except (OSError, ValueError):  # absent, unreadable, not UTF-8 or not JSON: validate in full
        return {}, {}
    if not isinstance(man, dict) or man.get("format") != FORMAT or not isinstance(man.get("rules"), dict):
        return {}, {}
    if man.get("code") is None or man.get("code") != code_version() or man.get("views") != views_digest(dirs):
        return {}, {}
    vdata = man.get("view_data") if isinstance(man.get("view_data"), dict) else {}
    return ({k: v for k, v in man["rules"].items() if isinstance(v, dict)},
            {d / k: v for k, v in vdata.items() if isinstance(v, dict)})


def _loads(raw: bytes):
    """json.loads of the manifest's bytes, by orjson (a fifth of the CPU on its 236 KB: 0.02 G instructions of the
    demo's check); where orjson refuses what json takes (NaN, an integer past 64 bits, a lone surrogate), by json, so
    that both read every manifest alike."""
    import orjson

    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw.decode("utf-8"))


def recorded(entry: dict) -> tuple[list[str], list[str] | None] | None:
    """An entry's outputs (schema.outputs' shape) where they are well formed, else None."""
    cols, out = entry.get("columns"), entry.get("output")
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
        return None
    if out is not None and (not isinstance(out, list) or not all(isinstance(c, str) for c in out)):
        return None
    return cols, out


def _plain(x) -> bool:
    """Data JSON gives back exactly as YAML gave it: mappings with string keys, lists, strings, finite numbers,
    booleans, null. Anything else (a date, a boolean key) is parsed from the file each time."""
    if x is None or isinstance(x, (str, bool, int)):
        return True
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    return False


def build(d: Path) -> dict:
    """The manifest of the rule folder d, from a full validation of every rule in it (RuleError where one fails)."""
    from traceql.rules import schema
    from traceql.rules.loader import load_rules, parse_rule, views_of
    from traceql.rules.yamlfile import decode, parse_yaml, read_capped

    d = Path(d)
    rules = {}
    for r in load_rules([d], trust_manifest=False):
        raw = read_capped(r.path)
        cols, out = schema.outputs(r)
        entry: dict = {"sha256": sha256(raw), "columns": cols, "output": out}
        data = parse_yaml(decode(raw, r.path), r.path)
        parse_rule(data, r.path, r.views, validate=False)  # as the loader normalises it (a bare `on:` key -> "on")
        if _plain(data) and json.loads(json.dumps(data)) == data:
            entry["data"] = data
        rules[r.path.name] = entry
    view_data = {}
    for v in views_of([d]).values():
        if v.path.suffix != ".sql":
            data = parse_yaml(decode(read_capped(v.path, "view file"), v.path, "view file"), v.path)
            if _plain(data) and json.loads(json.dumps(data)) == data:
                view_data[f"views/{v.path.name}"] = data
    return {"format": FORMAT, "refresh": REFRESH, "code": code_version(), "views": views_digest([d]),
            "view_data": dict(sorted(view_data.items())), "rules": dict(sorted(rules.items()))}


def dumps(man: dict) -> str:
    return json.dumps(man, indent=1) + "\n"


def write(d: Path) -> Path:
    p = Path(d) / FILE
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(dumps(build(d)), encoding="utf-8")
    tmp.replace(p)
    return p


def stale(d: Path) -> str | None:
    """Why the folder's manifest is not what `rules check --write-manifest` would write now, or None."""
    p = Path(d) / FILE
    try:
        have = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{p}: cannot be read ({type(e).__name__})"
    from traceql.rules.yamlfile import RuleError

    try:
        want = build(d)
    except RuleError as e:
        return f"the pack does not validate ({e})"
    for k in ("format", "code", "views", "view_data"):
        if have.get(k) != want[k]:
            return f"{p}: {k!r} differs from the pack and code of now"
    hr = have.get("rules") if isinstance(have.get("rules"), dict) else {}
    for name in sorted(set(hr) | set(want["rules"])):
        if hr.get(name) != want["rules"].get(name):
            return f"{p}: the entry of {name} differs from its file"
    return None
