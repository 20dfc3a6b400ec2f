"""Small untrusted YAML files (rule files, view files): size-capped, safe-loaded, aliases refused."""

from __future__ import annotations

import functools
from pathlib import Path
# A rule file is a page of text: the largest in the pack is about 5 KB. The cap keeps a hostile --rules folder from
# making the parser read gigabytes; aliases are refused below (a 600-byte "billion laughs" file expands to 10^9 nodes
# when its values are turned into strings).
MAX_RULE_BYTES = 256 << 10
MAX_RULE_NODES = 100_000


class RuleError(ValueError):
    """A rule file is invalid. The message names the file and the field."""


@functools.cache
def _yaml():
    """PyYAML and its safe loader, imported when a file must be parsed (a command whose rule pack matches its
    manifest parses none): libyaml's CSafeLoader where PyYAML was built with it, else the pure-Python SafeLoader."""
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_tree(path: Path, root) -> None:
    """Refuse YAML aliases (*name, <<: *name): rules never need them, and a node reached twice is how a tiny file
    becomes an exponential value. The composed node graph shares one node object per alias, so a node seen twice is
    an alias; the walk stops at the first one, so it costs at most MAX_RULE_NODES steps."""
    yaml = _yaml()[0]
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


def read_capped(path: Path, what: str = "rule file", max_bytes: int = MAX_RULE_BYTES) -> bytes:
    """The bytes of a small untrusted file, refused (one line) beyond max_bytes or where it cannot be read."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RuleError(f"{path}: {size} bytes is too large for a {what} (limit {max_bytes >> 10} KB); "
                            "check that this is the file you meant")
        return path.read_bytes()
    except OSError as e:
        raise RuleError(f"{path}: cannot read {what}: {e}") from None


def decode(raw: bytes, path: Path, what: str = "rule file") -> str:
    """The text of a file's bytes as Path.read_text gives it: UTF-8, universal newlines."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RuleError(f"{path}: cannot read {what}: {e}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def load_yaml(path: Path, what: str = "rule file", max_bytes: int = MAX_RULE_BYTES):
    """Plain data from a small untrusted YAML file: size-capped, safe-loaded, aliases refused before construction."""
    return parse_yaml(decode(read_capped(path, what, max_bytes), path, what), path)


def parse_yaml(text: str, path: Path):
    """load_yaml of text already read (and size-checked) from path."""
    yaml, safe_loader = _yaml()
    loader = safe_loader(text)
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
