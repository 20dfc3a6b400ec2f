"""Helpers shared by the torch.compile importers (TORCH_TRACE, TORCH_COMPILE_DEBUG, TORCH_LOGS): the text of graph
break reports, recompile reasons and printed FX graphs reads the same in all three."""

from __future__ import annotations

import re

import orjson

MAX_VALUE = 240  # characters of a reason or component value kept for messages
_GB_AT = re.compile(r"Graph break in user code at (.+):(\d+)")

_ASSIGN = re.compile(r"^\s+([A-Za-z_]\w*)(?:: \"[^\"]*\")? = (.+)$")
_CALL = re.compile(r"^([A-Za-z_][\w\.]*)\((.*)\)$", re.S)
_BINOP = re.compile(r"^([A-Za-z_]\w*|\d[\w\.]*) (\*\*|//|[-+*/@%&|^]|<<|>>|==|!=|<=|>=|<|>) ([A-Za-z_]\w*|[\d\.]+)$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_OPSYM = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "**": "pow", "@": "matmul",
          "%": "mod", "&": "and_", "|": "or_", "^": "xor", "<<": "lshift", ">>": "rshift", "==": "eq", "!=": "ne",
          "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_DEF = re.compile(r"^\s*def forward\(self,?(.*)\):\s*$")


def parse_graph_ops(text: str) -> list[dict]:
    """Ops of a printed FX graph (GraphModule.print_readable), in order: op target, output name, input names."""
    ops: list[dict] = []
    known: set[str] = set()
    for line in text.split("\n"):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _DEF.match(line)
        if m:  # a new graph (submodules print their own forward): inputs become known names
            known = {a.split(":")[0].strip() for a in m.group(1).split(",") if a.strip()}
            continue
        m = _ASSIGN.match(line)
        if not m:
            continue
        out, rhs = m.group(1), m.group(2).split(";  ", 1)[0].strip()
        op = None
        args = ""
        cm = _CALL.match(rhs)
        if cm:
            callee, args = cm.group(1), cm.group(2)
            if callee.startswith("torch.ops."):
                op = callee[len("torch.ops."):]
            elif callee.startswith(("torch.", "operator.", "math.", "builtins.")):
                op = callee
            elif callee.startswith("self."):
                op = callee[len("self."):]
            elif "." in callee:
                op = "Tensor." + callee.rsplit(".", 1)[1]
            else:
                op = callee
        else:
            bm = _BINOP.match(rhs)
            if bm:
                op = "operator." + _OPSYM.get(bm.group(2), bm.group(2))
                args = f"{bm.group(1)}, {bm.group(3)}"
        if op is not None:
            ins = [n for n in dict.fromkeys(_NAME.findall(args)) if n in known]
            ops.append({"op": op, "out": out, "in": ins})
        known.add(out)
    return ops



def is_cache_limit(reason: str) -> bool:
    r = reason.lower()
    return "recompile limit" in r or "cache_size_limit" in r or "cache size limit" in r or "recompile_limit" in r


def guard_text(reason: str | None) -> str | None:
    """`0/3: tensor 'x' size mismatch ...` -> `tensor 'x' size mismatch ...` (the failed guard)."""
    if not reason:
        return None
    first = str(reason).strip().split("\n", 1)[0]
    return re.sub(r"^!?[\d/]+: ", "", first).strip() or None


def json_or_lines(text: str) -> list[str]:
    t = text.strip()
    if not t:
        return []
    try:
        v = orjson.loads(t)
        if isinstance(v, list):
            return [str(x) for x in v]
        if isinstance(v, str):
            return [v]
    except orjson.JSONDecodeError:
        pass
    return [ln.strip() for ln in t.split("\n") if ln.strip()]


def graph_break(text: str) -> dict:
    """The reason (its headline), the user frame (file:line) and the docs link of a graph break report."""
    user_frame = None
    m = _GB_AT.search(text)
    if m:
        user_frame = f"{m.group(1)}:{m.group(2)}"
    lines = text.split("\n")
    reason = None
    for i, ln in enumerate(lines):
        if ln.startswith("Graph Break Reason:"):
            # the headline is the first non-empty line after "Graph Break Reason: ...:" (torch >= 2.7), else the rest
            rest = ln[len("Graph Break Reason:"):].strip()
            nxt = next((x.strip() for x in lines[i + 1:i + 4] if x.strip()), "")
            reason = nxt if rest.endswith(":") and nxt else rest
            break
    if reason is None:
        reason = next((ln.strip() for ln in lines if ln.strip() and not ln.startswith("Graph break in user code")), None)
    detail = {}
    gb = re.search(r"/gb/(gb\d+)\.html", text)
    if gb:
        detail["gb_id"] = gb.group(1)
    expl = re.search(r"^\s*Explanation: (.+)$", text, re.M)
    if expl:
        detail["explanation"] = expl.group(1)[:MAX_VALUE]
    hint = re.search(r"^\s*Hint: (.+)$", text, re.M)
    if hint:
        detail["hint"] = hint.group(1)[:MAX_VALUE]
    return {"reason": reason, "user_frame": user_frame, "detail": detail}


