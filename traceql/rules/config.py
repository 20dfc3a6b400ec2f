"""Rule selection and threshold overrides: from traceql.toml / [tool.traceql] and the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from traceql.rules.loader import INPUT_RULES, Rule, matches


class ConfigError(ValueError):
    pass


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    params: dict[str, dict] = field(default_factory=dict)  # rule id -> {param: value}
    fail_on: str = "warning"
    suppress: list[str] = field(default_factory=list)  # finding fingerprints
    path: Path | None = None


def _config_in(d: Path) -> Path | None:
    for name in ("traceql.toml", "pyproject.toml"):
        p = d / name
        try:
            if p.is_file() and (name == "traceql.toml" or b"[tool.traceql]" in p.read_bytes()):
                return p
        except OSError:
            continue
    return None


def find_config(start: Path, untrusted: Path | None = None) -> Path | None:
    """The nearest traceql.toml (or pyproject.toml with [tool.traceql]) from `start` upwards, passing over any inside
    `untrusted` (the analysed run dir: configuration changes the verdict, so it comes from the user's checkout)."""
    start = start.resolve()
    top = start if start.is_dir() else start.parent
    root = untrusted.resolve() if untrusted is not None else None
    for d in [top, *top.parents]:
        if root is not None and d.is_relative_to(root):
            continue
        p = _config_in(d)
        if p is not None:
            return p
    return None


def run_config(run_dir: Path) -> Path | None:
    """A configuration file inside the run dir itself, which `check` ignores unless --trust-run-config."""
    return _config_in(run_dir) if run_dir.is_dir() else None


_KEYS = ("select", "ignore", "fail-on", "fail_on", "suppress", "rules")


MAX_CONFIG_BYTES = 1 << 20  # a real configuration is a few hundred bytes


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    import tomllib  # only where there is a configuration file to read

    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {path.stat().st_size} bytes is too large for a configuration file "
                              f"(at most {MAX_CONFIG_BYTES}); is it the right file?")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read configuration: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: cannot read configuration: nested too deeply; a traceql configuration is a few "
                          "flat tables") from None
    where = ""
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("traceql", {})
        where = "[tool.traceql] "
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: [tool.traceql] must be a table")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], _KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{path}: {where}{unknown[0]}: unknown key; {hint}valid keys: select, ignore, fail-on, "
                          "suppress, [rules.ID]")
    cfg = Config(path=path)
    cfg.select = _str_list(path, "select", data.get("select", []))
    cfg.ignore = _str_list(path, "ignore", data.get("ignore", []))
    cfg.fail_on = data.get("fail-on", data.get("fail_on", "warning"))
    if cfg.fail_on not in FAIL_ON:
        raise ConfigError(f"{path}: fail-on = {cfg.fail_on!r}; valid: {', '.join(FAIL_ON)}")
    cfg.suppress = _str_list(path, "suppress", data.get("suppress", []))
    rules = data.get("rules") or {}
    if not isinstance(rules, dict):
        raise ConfigError(f"{path}: rules must be a table of [rules.ID] tables, e.g. [rules.TQL101] min_exposed_ms = 5")
    for rid, params in rules.items():
        if not isinstance(params, dict):
            raise ConfigError(f"{path}: [rules.{rid}] must be a table of param = value")
        cfg.params.setdefault(rid.upper(), {}).update(params)
    return cfg


FAIL_ON = ("error", "warning", "info", "never")


def _str_list(path: Path, key: str, v) -> list[str]:
    # a bare string is one item: list("TQL1") would be ["T", "Q", "L", "1"]
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{path}: {key} must be a string or a list of strings")
    return list(v)


def check_params(cfg: Config, rules: list[Rule]) -> None:
    """Thresholds in the config file must name a rule and one of its params, with a value of the param's type: a
    typo or a string where a number belongs must not pass silently (or fail later as a rule error)."""
    by_id = {r.id: r for r in rules}
    by_name = {r.name.upper(): r for r in rules}
    for rid, params in list(cfg.params.items()):
        rule = by_id.get(rid) or by_name.get(rid)
        if rule is None:
            raise ConfigError(f"{cfg.path}: [rules.{rid}]: no such rule; see `traceql rules list`")
        for p, v in params.items():
            if p not in rule.params:
                raise ConfigError(f"{cfg.path}: [rules.{rid}] {p}: {rule.id} has no param {p!r}; valid: {', '.join(rule.params) or 'none'}")
            want = _type_name(rule.params[p].get("default"))
            numeric = {want, _type_name(v)} <= {"integer", "number"}
            if want and _type_name(v) != want and not numeric:
                raise ConfigError(f"{cfg.path}: [rules.{rid}] {p} = {v!r}: expected {want} (default {rule.params[p].get('default')!r})")
        if rule.id != rid:  # given by name: key it by id, as the engine looks it up
            cfg.params.setdefault(rule.id, {}).update(cfg.params.pop(rid))


def _type_name(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    return type(v).__name__


def check_selectors(patterns: list[str], rules: list[Rule], where: str) -> None:
    """Every --select/--ignore pattern (or select/ignore entry of a config file) must match a rule: a misspelt id
    would otherwise run everything, or nothing, and still look like a clean check."""
    for p in patterns:
        if not p.strip():
            continue
        if not any(matches(r.id, [p]) or r.name == p.strip() for r in rules):
            raise ConfigError(f"{where} {p.strip()!r}: matches no rule; see `traceql rules list` (ids, prefixes such as TQL1, or names)")


def parse_set(items: list[str], rules: list[Rule]) -> dict[str, dict]:
    """--set TQL101.min_exposed_ms=5 -> {"TQL101": {"min_exposed_ms": 5.0}}, typed like the param's default."""
    by_id = {r.id: r for r in rules}
    by_name = {r.name: r for r in rules}
    out: dict[str, dict] = {}
    for item in items:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set {item!r}: expected RULE.param=value, e.g. TQL101.min_exposed_ms=5")
        lhs, value = item.split("=", 1)
        rid, param = lhs.rsplit(".", 1)
        rule = by_id.get(rid.upper()) or by_name.get(rid)
        if rule is None:
            raise ConfigError(f"--set {item!r}: no rule {rid!r}; see `traceql rules list`")
        if param not in rule.params:
            raise ConfigError(f"--set {item!r}: {rule.id} has no param {param!r}; valid: {', '.join(rule.params) or 'none'}")
        try:
            out.setdefault(rule.id, {})[param] = coerce(value, rule.params[param].get("default"))
        except ConfigError as e:
            raise ConfigError(f"--set {item!r}: {e}") from None
    return out


def coerce(value: str, default):
    if isinstance(default, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{value!r} is not a boolean")
    try:
        if isinstance(default, int):
            try:
                return int(value)
            except ValueError:
                return float(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number") from None
    if isinstance(default, list):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


# The input rules (INPUT_RULES, rules.loader): --select narrows the analysis, not the honesty of its "No findings":
# they run with any selection and leave only by name in --ignore.


def choose(rules: list[Rule], select: list[str], ignore: list[str]) -> list[Rule]:
    chosen = [r for r in rules if (not select or r.id.startswith(INPUT_RULES) or matches(r.id, select) or r.name in select)]
    return [r for r in chosen if not (matches(r.id, ignore) or r.name in ignore)]


def asked_for(chosen: list[Rule], select: list[str]) -> list[Rule]:
    """The chosen rules the selection named (the input rules join any selection; they alone are not a selection)."""
    if not select:
        return chosen
    return [r for r in chosen if matches(r.id, select) or r.name in select]
