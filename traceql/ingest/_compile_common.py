"""Helpers shared by the torch.compile importers (TORCH_TRACE, TORCH_COMPILE_DEBUG, TORCH_LOGS): the text of graph
break reports, recompile reasons and printed FX graphs reads the same in all three."""

from __future__ import annotations

import re

import orjson

MAX_VALUE = 240  # characters of a reason or component value kept for messages
# Matched at the phrase's first occurrence only (graph_break): searched, "(.+):" is retried from every occurrence of
# the phrase, quadratic on a long line that repeats it (issue 16).
_GB_AT_PHRASE = "Graph break in user code at "
_GB_AT = re.compile(r"([^\n]+):(\d++)")
_GB_OLD = re.compile(r"Graph break: (.*?)\s*from user code at:")
_GB_FILE = re.compile(r'File "([^"]+)", line (\d+)')
_GB_UNSUPPORTED = re.compile(r"^[ \t]*+torch\._dynamo\.exc\.Unsupported: (.+)$", re.M)

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
    at = text.find(_GB_AT_PHRASE)
    m = _GB_AT.match(text, at + len(_GB_AT_PHRASE)) if at >= 0 else None
    if m:
        user_frame = f"{m.group(1)}:{m.group(2)}"
    lines = text.split("\n")
    reason = None
    old = _GB_OLD.search(text)
    if old and user_frame is None:  # torch <= 2.4: "Graph break: [reason ]from user code at:", a stack, a traceback
        fm = _GB_FILE.search(text, old.end())
        if fm:
            user_frame = f"{fm.group(1)}:{fm.group(2)}"
        unsup = [u.group(1).strip() for u in _GB_UNSUPPORTED.finditer(text)]
        reason = (old.group(1).strip() or (unsup[-1] if unsup else None))
        if reason:
            return {"reason": reason[:MAX_VALUE], "user_frame": user_frame, "detail": {"format": "torch<=2.4"}}
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
    expl = re.search(r"^[ \t]*+Explanation: (.+)$", text, re.M)
    if expl:
        detail["explanation"] = expl.group(1)[:MAX_VALUE]
    hint = re.search(r"^[ \t]*+Hint: (.+)$", text, re.M)
    if hint:
        detail["hint"] = hint.group(1)[:MAX_VALUE]
    return {"reason": reason, "user_frame": user_frame, "detail": detail}




# --- compile failures ---------------------------------------------------------------------------------------------

# fail_type values that are not failures: a frame dynamo chose not to compile (nothing to compile, a skipped file),
# and the recompile limit (read as cache_limit, TQL401's business)
_NOT_FAILURES = {"SkipFrame", "SkipCodeRecursiveException", "RecompileLimitExceeded", "CacheLimitExceeded",
                 "ResumePrologueTracingError"}
_BACKEND_RAISED = re.compile(r"backend='([^']*)' raised:\s*\n?\s*(.+)", re.S)


def failure(fail_type, fail_reason) -> dict | None:
    """A compile failure from compilation_metrics' fail_type/fail_reason (or a WON'T CONVERT report): its type, the
    one-line reason, the backend where it says so, and a category (backend, unsupported, internal); None where
    the record is no failure (no fail_type, a skipped frame, the recompile limit)."""
    if not fail_type:
        return None
    ft = str(fail_type).rsplit(".", 1)[-1]
    reason = str(fail_reason or "").strip()
    if ft in _NOT_FAILURES or (reason and is_cache_limit(reason)):
        return None
    if ft == "Unsupported" and reason.lower().startswith(("skip", "no content")):
        return None  # dynamo skipping a frame it has nothing to compile for
    backend = None
    m = _BACKEND_RAISED.search(reason)
    if m:
        backend = m.group(1)
        reason = m.group(2).strip()
    first = next((ln.strip() for ln in reason.split("\n") if ln.strip()), "")
    category = ("backend" if ft == "BackendCompilerFailed" or backend else
                "unsupported" if ft in ("Unsupported", "UserError", "UncapturedHigherOrderOpError") else "internal")
    return {"fail_type": ft, "fail_reason": first[:MAX_VALUE] or None, "backend": backend, "category": category}


_EXC_LINE = re.compile(r"^(?:[\w\.]+\.)?(\w*(?:Error|Exception|Failed|Unsupported))(?:: (.*))?$")


def wont_convert(text: str) -> dict | None:
    """`WON'T CONVERT fn file line N due to: <traceback>`: the function, its file and line, and the failure (the
    last exception line of the traceback, with the backend where BackendCompilerFailed names one)."""
    m = re.search(r"WON'T CONVERT (\S+) (.+?) line (\d+)", text)
    if not m:
        return None
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    exc = [(i, em) for i, ln in enumerate(lines) if (em := _EXC_LINE.match(ln))]
    ft, reason = "unknown", None
    for i, em in exc:  # BackendCompilerFailed wraps the backend's own exception, on the next line
        if em.group(1) == "BackendCompilerFailed":
            ft = "BackendCompilerFailed"
            rest = " ".join(lines[i:i + 2])
            reason = rest.split(":", 1)[1].strip() if ":" in rest else rest
            break
    else:
        if exc:
            i, em = exc[-1]
            ft, reason = em.group(1), (em.group(2) or "").strip() or None
    f = failure(ft, reason) or {"fail_type": ft, "fail_reason": reason, "backend": None, "category": "internal"}
    return {"function": m.group(1), "filename": m.group(2), "line": int(m.group(3)), **f}


# --- graph inputs -------------------------------------------------------------------------------------------------

_ARG = re.compile(r'\s*([A-Za-z_]\w*)\s*(?::\s*(?:"([^"]*)"|[\w\.\[\]]+))?\s*(?:,|$)')
_ANNOT = re.compile(r"^([a-z]+\d*)\[([^\]]*)\]")  # "f32[4, 16][16, 1]cpu" -> f32, "4, 16"


def graph_inputs(text: str, sizes: dict | None = None) -> list[str]:
    """The inputs of a printed dynamo graph as `name: f32[4, 16]` (dtype and shape from the forward() annotations of
    torch >= 2.4; where those are absent, the shape from the record's `sizes` and no dtype)."""
    sizes = sizes if isinstance(sizes, dict) else {}
    for line in text.split("\n"):
        m = _DEF.match(line)
        if not m:
            continue
        out = []
        for am in _ARG.finditer(m.group(1)):
            name, annot = am.group(1), am.group(2)
            if annot:
                tm = _ANNOT.match(annot)
                out.append(f"{name}: {tm.group(1)}[{tm.group(2)}]" if tm else f"{name}: {annot}")
            else:
                sz = sizes.get(name) or sizes.get(name.lower())
                out.append(f"{name}: ?[{', '.join(str(d) for d in sz)}]" if isinstance(sz, list) else f"{name}: ?")
        return out
    return []
