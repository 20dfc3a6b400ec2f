"""The layout shows the flow: discover -> ingest -> link -> rules -> report, then the commands on top.

Every import between traceql's packages is read from the source (module level and inside functions alike, so no
cycle hides in a function-level import) and must go from a later tier to an earlier one or stay in its tier.
Imports under `if TYPE_CHECKING:` are type names for the reader, never executed, and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "traceql"

# Each package (or top-level module) and its tier; a module may import its own tier and lower ones only.
TIERS = {
    "__init__": 0, "model": 0, "intervals": 0, "cache": 0, "exit_codes": 0, "remote": 0, "polars_env": 0,
    "ingest": 1,
    "discover": 2,  # discovery asks each format module of ingest whether it reads a file
    "link": 3,
    "rules": 4,
    "report": 5,
    "pipeline": 6, "executor": 6,
    "api": 7, "rule_tests": 7, "archive": 1, "capture": 7,
    "serve": 8, "cli": 9, "__main__": 9,
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every traceql import in traceql/."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module(path)
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "traceql":
                if node.module == "traceql":  # from traceql import cache, intervals, ...
                    out.extend((mod, f"traceql.{a.name}", node.lineno) for a in node.names if a.name != "__version__")
                else:
                    out.append((mod, node.module, node.lineno))
            elif isinstance(node, ast.Import):
                out.extend((mod, a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "traceql")
    return out


def test_every_package_has_a_tier():
    packages = {_package(_module(p)) for p in ROOT.rglob("*.py")}
    assert packages <= set(TIERS), f"give these a tier in TIERS: {sorted(packages - set(TIERS))}"


def test_no_import_runs_back_up_the_flow():
    upward = []
    for src, dst, line in _imports():
        if src == "traceql":
            continue  # the package's face: it re-exports the notebook API (traceql.load, traceql.check) on first use
        a, b = _package(src), _package(dst)
        if b not in TIERS:
            continue  # a name exported by traceql/__init__
        if TIERS[b] > TIERS[a]:
            upward.append(f"{src}:{line} imports {dst} ({a} tier {TIERS[a]} -> {b} tier {TIERS[b]})")
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_packages_or_modules():
    g = nx.DiGraph()
    for src, dst, _ in _imports():
        if src == "traceql":
            continue
        a, b = _package(src), _package(dst)
        if a != b and b in TIERS:
            g.add_edge(a, b)
    assert not list(nx.simple_cycles(g)), f"package cycles: {list(nx.simple_cycles(g))}"
    # within a package: module cycles, a package's __init__ re-exporting its modules aside
    m = nx.DiGraph()
    for src, dst, _ in _imports():
        if src != dst and not dst.startswith(src + ".") and not src.startswith(dst + "."):
            m.add_edge(src, dst)
    cycles = [c for c in nx.simple_cycles(m) if len(c) > 1]
    assert not cycles, f"module cycles: {cycles[:5]}"


def test_the_checker_sees_function_level_imports():
    # the checker must read imports inside functions: cli commands import their packages there
    assert any(src == "traceql.cli.check" and dst == "traceql.pipeline" for src, dst, _ in _imports())
