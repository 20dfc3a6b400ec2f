"""Rule selection and threshold overrides: from traceql.toml / [tool.traceql] and the command line."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from traceql.rules.loader import Rule, matches


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


def find_config(start: Path) -> Path | None:
    start = start.resolve()
    for d in [start if start.is_dir() else start.parent, *(start if start.is_dir() else start.parent).parents]:
        for name in ("traceql.toml", "pyproject.toml"):
            p = d / name
            if p.is_file() and (name == "traceql.toml" or b"[tool.traceql]" in p.read_bytes()):
                return p
    return None


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read configuration: {e}") from None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("traceql", {})
    cfg = Config(path=path)
    cfg.select = list(data.get("select", []))
    cfg.ignore = list(data.get("ignore", []))
    cfg.fail_on = data.get("fail-on", data.get("fail_on", "warning"))
    cfg.suppress = list(data.get("suppress", []))
    for rid, params in (data.get("rules") or {}).items():
        if not isinstance(params, dict):
            raise ConfigError(f"{path}: [rules.{rid}] must be a table of param = value")
        cfg.params.setdefault(rid.upper(), {}).update(params)
    return cfg


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
        out.setdefault(rule.id, {})[param] = coerce(value, rule.params[param].get("default"))
    return out


def coerce(value: str, default):
    if isinstance(default, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{value!r} is not a boolean")
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            return float(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, list):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def choose(rules: list[Rule], select: list[str], ignore: list[str]) -> list[Rule]:
    chosen = [r for r in rules if (not select or matches(r.id, select) or r.name in select)]
    return [r for r in chosen if not (matches(r.id, ignore) or r.name in ignore)]
