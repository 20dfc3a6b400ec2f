"""Rule conditions: a small expression grammar compiled to polars expressions. Nothing is evaluated by Python.

Grammar (a subset of Python's expression syntax, parsed with `ast` and checked node by node):
names (output columns or params), numbers, 'strings', True/False/None, and/or/not, comparisons (== != < <= > >=,
chained), `x is null` / `x is not null` (also `is None`), + - * / and unary minus, abs(x), min(a, b), max(a, b),
len(x) for list columns, `x in ['a', 'b']` or `x in some_list_param`, matches(x, 'regex' or a param),
coalesce(a, b, ...) (the first that is not null), when(test, a, b) (a where test holds, else b).
"""

from __future__ import annotations

import ast
import functools
import re

import polars as pl


class ConditionError(ValueError):
    pass


_NULL_WORD = re.compile(r"\bis\s+(not\s+)?null\b")


def compile_condition(text: str, params: dict[str, object], columns: list[str]) -> pl.Expr:
    """The condition as a polars expression over `columns`, with the params' values in it. Kept per text, params and
    the columns among the text's words (the only names it can read): a rule's condition is compiled at load (against
    its recorded columns) and again at run time, and polars expressions are immutable, so one expression serves both.
    A condition that fails is not kept (its error names every column of the frame at hand)."""
    try:
        words = _words(str(text))
        key = (str(text), _frozen(params), frozenset(c for c in columns if c in words))
    except TypeError:  # a param value that is no plain data: compile it each time
        return _compile(text, params, columns)
    return _cached(key, text, params, columns)


@functools.lru_cache(maxsize=4096)
def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text))


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _frozen(v):
    """A hashable stand-in for a param value that keeps its type (True, 1 and 1.0 compile to different literals)."""
    if isinstance(v, dict):
        return ("dict", tuple(sorted((str(k), _frozen(x)) for k, x in v.items())))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_frozen(x) for x in v))
    hash(v)
    return (type(v).__name__, v)


_CACHE: dict[tuple, pl.Expr] = {}


def _cached(key, text, params, columns) -> pl.Expr:
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= 4096:  # a long-lived process (traceql serve) checking many packs: start over
            _CACHE.clear()
        hit = _CACHE[key] = _compile(text, params, columns)
    return hit


def _compile(text: str, params: dict[str, object], columns: list[str]) -> pl.Expr:
    src = _NULL_WORD.sub(lambda m: "is not None" if m.group(1) else "is None", str(text))
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        raise ConditionError(f"cannot parse condition {text!r}: {e.msg} at column {e.offset}") from None
    return _Compiler(params, columns, text).visit(tree.body)


class _Compiler:
    def __init__(self, params, columns, text):
        self.params = params
        self.columns = set(columns)
        self.text = text

    def fail(self, what: str):
        raise ConditionError(f"condition {self.text!r}: {what}")

    def visit(self, node) -> pl.Expr:
        meth = getattr(self, "v_" + type(node).__name__, None)
        if meth is None:
            self.fail(f"{type(node).__name__} is not allowed (only comparisons, arithmetic, and/or/not, names)")
        return meth(node)

    def v_BoolOp(self, node):
        parts = [self.visit(v) for v in node.values]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(node.op, ast.And) else (out | p)
        return out

    def v_UnaryOp(self, node):
        v = self.visit(node.operand)
        if isinstance(node.op, ast.Not):
            return ~v
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
        self.fail("unsupported unary operator")

    def v_BinOp(self, node):
        a, b = self.visit(node.left), self.visit(node.right)
        ops = {ast.Add: a.__add__, ast.Sub: a.__sub__, ast.Mult: a.__mul__, ast.Div: a.__truediv__}
        fn = ops.get(type(node.op))
        if fn is None:
            self.fail("only + - * / are allowed")
        return fn(b)

    def v_Compare(self, node):
        out = None
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.Is, ast.IsNot)):
                if not (isinstance(right, ast.Constant) and right.value is None):
                    self.fail("`is` only compares with null")
                e = self.visit(left)
                part = e.is_null() if isinstance(op, ast.Is) else e.is_not_null()
            elif isinstance(op, (ast.In, ast.NotIn)):
                if isinstance(right, ast.Name) and isinstance(self.params.get(right.id), (list, tuple)):
                    vals = list(self.params[right.id])
                elif isinstance(right, (ast.List, ast.Tuple)):
                    vals = [self._literal(v) for v in right.elts]
                else:
                    self.fail("`in` needs a literal list or a list param")
                part = self.visit(left).is_in(vals)
                if isinstance(op, ast.NotIn):
                    part = ~part
            else:
                a, b = self.visit(left), self.visit(right)
                table = {ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__", ast.Gt: "__gt__", ast.GtE: "__ge__"}
                part = getattr(a, table[type(op)])(b)
            out = part if out is None else (out & part)
            left = right
        return out

    def _literal(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        self.fail("lists may hold only literals")

    def v_Constant(self, node):
        if node.value is None:
            return pl.lit(None)
        if isinstance(node.value, (int, float, str, bool)):
            return pl.lit(node.value)
        self.fail(f"literal {node.value!r} is not allowed")

    def v_Name(self, node):
        name = node.id
        if name in self.params:
            return pl.lit(self.params[name])
        if name in self.columns:
            return pl.col(name)
        if name in ("true", "false"):
            return pl.lit(name == "true")
        if name == "null":
            return pl.lit(None)
        self.fail(f"unknown name {name!r}; columns: {sorted(self.columns)}; params: {sorted(self.params)}")

    def v_Call(self, node):
        if not isinstance(node.func, ast.Name) or node.keywords:
            self.fail("only abs(), min(), max(), len(), matches(), coalesce(), when() calls are allowed")
        fn = node.func.id
        if fn == "matches" and len(node.args) == 2:
            pat = node.args[1]
            if isinstance(pat, ast.Constant) and isinstance(pat.value, str):
                pattern = pat.value
            elif isinstance(pat, ast.Name) and isinstance(self.params.get(pat.id), str):
                pattern = self.params[pat.id]
            else:
                self.fail("matches(column, pattern) needs a literal or param string pattern")
            if not pattern:
                return pl.lit(False)
            return self.visit(node.args[0]).str.contains(pattern).fill_null(False)
        args = [self.visit(a) for a in node.args]
        if fn == "abs" and len(args) == 1:
            return args[0].abs()
        if fn == "len" and len(args) == 1:
            return args[0].list.len()
        if fn == "coalesce" and args:
            return pl.coalesce(args)
        if fn == "when" and len(args) == 3:
            return pl.when(args[0]).then(args[1]).otherwise(args[2])
        if fn in ("min", "max") and len(args) == 2:
            return pl.min_horizontal(args) if fn == "min" else pl.max_horizontal(args)
        self.fail(f"{fn}() is not allowed or has the wrong number of arguments")
