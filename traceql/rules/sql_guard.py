"""Rule SQL and `traceql query` read traceql's tables only: a statement is checked before polars sees it.

polars' SQLContext serves table functions (read_csv, read_parquet, read_ipc, read_json, ...) from any FROM clause and
has no switch to turn them off, so a rule file could read a private file and put its rows in a report. polars does
not expose its SQL parser either, so the statement is tokenized here (comments, string literals, quoted identifiers
and case handled as SQL does) and refused unless:

- it is one SELECT (or WITH ... SELECT) statement;
- no function named read_* or scan_* is called anywhere (whatever polars adds under those names later);
- every table position (after FROM, JOIN, or a comma of a FROM list) holds a subquery or a plain name that is one of
  the run's tables or a CTE of the statement: a name followed by "(" there is a table function and is refused, except
  UNNEST, which reads only its argument.

A refused statement is never executed, so its error cannot carry any file's content.
"""

from __future__ import annotations

import functools
import re


class SqlRefused(ValueError):
    """The statement is not a query over traceql's tables. The message is one line and quotes no file content."""


_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      | (?P<line>--[^\n]*)
      | (?P<block>/\*)
      | (?P<estr>[Ee]')
      | (?P<str>[XxBbNn]?'(?:[^']|'')*')
      | (?P<dollar>\$(?P<tag>[A-Za-z_]*)\$)
      | (?P<qid>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
      | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
      | (?P<num>\d[\d.]*(?:[eE][+-]?\d+)?)
      | (?P<punct>.)""",
    re.VERBOSE | re.DOTALL,
)
_CLAUSES = {"select", "from", "where", "group", "having", "order", "limit", "offset", "on", "using", "qualify",
            "window", "union", "except", "intersect", "join", "values", "fetch"}
_TABLE_FUNCTIONS_OK = {"unnest"}


# _TOKEN's tokens in one findall: whitespace and -- comments skipped in front of each token, \Z ending the text.
# Block comments, E'' strings and $$ strings need the token-by-token loop (_tokenize_loop); where one starts, the
# text is read by that loop instead, so both give the same tokens (tests/test_sql_sandbox.py compares them).
_FAST = re.compile(
    r"""(?:\s|--[^\n]*)*
      (?: (?P<special>/\*|[Ee]'|\$[A-Za-z_]*\$)
        | (?P<str>[XxBbNn]?'(?:[^']|'')*')
        | (?P<qid>"(?:[^"]|"")*"|`(?:[^`]|``)*`)
        | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
        | (?P<num>\d[\d.]*(?:[eE][+-]?\d+)?)
        | (?P<punct>.)
        | \Z)""",
    re.VERBOSE | re.DOTALL,
)


def _tokenize(sql: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for special, st, qid, word, num, punct in _FAST.findall(sql):
        if word:
            out.append(("word", word.lower()))
        elif punct:
            if punct in "'\"`":
                raise SqlRefused(f"unterminated quote {punct}")
            out.append(("punct", punct))
        elif qid:
            q = qid[0]
            out.append(("qid", qid[1:-1].replace(q * 2, q)))
        elif st:
            out.append(("str", st))
        elif num:
            out.append(("num", num))
        elif special:
            return _tokenize_loop(sql)
    return out


def _tokenize_loop(sql: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i, n = 0, len(sql)
    while i < n:
        m = _TOKEN.match(sql, i)
        kind = m.lastgroup if m.lastgroup != "tag" else "dollar"
        if kind == "block":  # block comments nest in sqlparser's dialects: count them
            depth, j = 1, m.end()
            while depth and j < n:
                if sql.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if depth:
                raise SqlRefused("unterminated /* comment")
            i = j
            continue
        if kind == "estr":  # backslash escapes: where such a string ends is read differently by different parsers
            raise SqlRefused("E'...' escape strings are not supported; write '...' with '' for a quote")
        if kind == "dollar":
            end = sql.find(m.group(0), m.end())
            if end < 0:
                raise SqlRefused("unterminated $$ string")
            out.append(("str", ""))
            i = end + len(m.group(0))
            continue
        text = m.group(0)
        if kind == "str" and (len(text) < 2 or text[-1] != "'"):
            raise SqlRefused("unterminated string literal")
        if kind == "punct" and text in "'\"`":
            raise SqlRefused(f"unterminated quote {text}")
        i = m.end()
        if kind in ("ws", "line"):
            continue
        if kind == "word":
            out.append(("word", text.lower()))
        elif kind == "qid":
            q = text[0]
            inner = text[1:-1]
            out.append(("qid", inner.replace(q * 2, q) if q in "\"`" else inner))
        else:
            out.append((kind, text))
    return out


def _name(tok: tuple[str, str]) -> str | None:
    return tok[1] if tok[0] in ("word", "qid") else None


def _cte_names(toks: list[tuple[str, str]]) -> set[str]:
    """Names defined as `name AS (` or `name (cols) AS (`: the statement's CTEs."""
    names = set()
    for i in range(1, len(toks) - 1):
        if toks[i] != ("word", "as") or toks[i + 1] != ("punct", "("):
            continue
        j = i - 1
        if toks[j] == ("punct", ")"):  # skip the column list back to its "("
            depth = 0
            while j >= 0:
                if toks[j] == ("punct", ")"):
                    depth += 1
                elif toks[j] == ("punct", "("):
                    depth -= 1
                    if depth == 0:
                        break
                j -= 1
            j -= 1
        if j >= 0 and (nm := _name(toks[j])):
            names.add(nm.lower())
    return names


_RAW_READ = re.compile(r"(?i)(?<![a-z0-9_$])(read|scan)_[a-z0-9_$]*")
_GAP = re.compile(r"(?:\s+|[\"`]|/\*.*?\*/|--[^\n]*(?:\n|$))*", re.DOTALL)


def _raw_read_call(sql: str) -> str | None:
    """A read_*/scan_* name followed by "(" anywhere in the raw text, strings and comments included: a second check that
    does not depend on tokenizing exactly as polars does."""
    for m in _RAW_READ.finditer(sql):
        gap = _GAP.match(sql, m.end())
        if sql[gap.end():gap.end() + 1] == "(":
            return m.group(0).lower()
    return None


def read_tables(sql: str) -> set[str]:
    """The names (lower-cased) the statement reads in table positions, less its own CTEs: the tables and views to
    hand polars. Raises SqlRefused where check would."""
    found: set[str] = set()
    check(sql, None, found)
    return found


_READ_NAME = re.compile(r"(?i)(read|scan)_")


def check(sql: str, tables: set[str] | list[str] | None = None, found: set[str] | None = None) -> None:
    """Raise SqlRefused unless `sql` is one SELECT over `tables` (names, any case) and its own CTEs. With tables=None
    the names are not checked (at rule load, before a run exists); table functions are refused all the same.
    found, where given, receives the table names read (CTEs left out).

    The statement is read once per process (_plan, memoised by its text); every call then checks the names it reads
    against `tables`, in statement order, so the first problem is the one reported, as if it were read again."""
    steps, ctes = _plan(sql)
    allowed = None if tables is None else {t.lower() for t in tables} | ctes
    for kind, arg in steps:
        if kind == "refuse":
            raise SqlRefused(arg)
        low = arg.lower()
        if allowed is not None and low not in allowed:
            raise SqlRefused(f"unknown table {arg!r}; valid tables: {', '.join(sorted(tables))}")
        if found is not None and low not in ctes:
            found.add(low)


@functools.lru_cache(maxsize=1024)
def _plan(sql: str) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """What check needs of a statement, whatever the tables: in order, the names in table positions ("table", name)
    up to the first refusal ("refuse", message), and the statement's CTE names. Pure in the text, hence memoised: a
    rule's SQL is checked at load, by the executor, and again each time the engine runs it."""
    steps: list[tuple[str, str]] = []
    named: list[frozenset[str]] = []  # the CTE names, known before the walk may refuse: they are no unknown tables
    try:
        ctes = _walk(sql, steps, named)
    except SqlRefused as e:
        steps.append(("refuse", str(e)))
        ctes = named[0] if named else frozenset()
    return tuple(steps), ctes


def _walk(sql: str, steps: list[tuple[str, str]], named: list[frozenset[str]]) -> frozenset[str]:
    if (fn := _raw_read_call(sql)) is not None:
        raise SqlRefused(f"{fn}(...) reads files; rule SQL and queries read only traceql's tables")
    toks = _tokenize(sql)
    while toks and toks[-1] == ("punct", ";"):
        toks.pop()
    if not toks:
        raise SqlRefused("empty statement")
    if ("punct", ";") in toks:
        raise SqlRefused("one statement only (found ';' between statements)")
    first = next((t for t in toks if t != ("punct", "(")), None)
    if first not in (("word", "select"), ("word", "with")):
        raise SqlRefused(f"only SELECT (or WITH ... SELECT) statements run here, not {(first or ('', '?'))[1].upper()}")
    # defence in depth: _raw_read_call has refused these on the raw text already; this holds if that check changes
    for tok, nxt in zip(toks, toks[1:]):
        if nxt == ("punct", "(") and tok[0] in ("word", "qid") and _READ_NAME.match(tok[1]):
            raise SqlRefused(f"{tok[1]}(...) reads files; rule SQL and queries read only traceql's tables")
    ctes = frozenset(_cte_names(toks))
    named.append(ctes)
    clause = ["select"]  # the current clause keyword at each parenthesis depth
    expect_table = False
    for i, tok in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if expect_table:
            if tok == ("word", "lateral"):
                continue
            expect_table = False
            if tok == ("punct", "("):  # a subquery, or a parenthesized table/join: its first name is a table too
                clause.append("from")
                expect_table = nxt not in (("word", "select"), ("word", "with"), ("word", "values"))
                continue
            nm = _name(tok)
            if nm is None:
                raise SqlRefused(f"expected a table name after FROM/JOIN, found {tok[1]!r}")
            if nxt == ("punct", "("):
                if tok[0] == "word" and nm in _TABLE_FUNCTIONS_OK:
                    continue
                raise SqlRefused(f"table function {nm}(...) is not allowed; rule SQL and queries read only traceql's "
                                 "tables")
            if nxt == ("punct", "."):
                raise SqlRefused(f"qualified table name {nm}.… is not allowed; name one of traceql's tables")
            steps.append(("table", nm))
            continue
        if tok == ("punct", "("):
            clause.append("expr")
        elif tok == ("punct", ")"):
            if len(clause) > 1:
                clause.pop()
        elif tok[0] == "word" and tok[1] in _CLAUSES:
            if tok[1] == "from" and (clause[-1] == "expr" or (i and toks[i - 1] == ("word", "distinct"))):
                continue  # EXTRACT(x FROM y), SUBSTRING(s FROM 1), TRIM(... FROM s), a IS DISTINCT FROM b
            clause[-1] = "from" if tok[1] == "join" else tok[1]
            expect_table = tok[1] in ("from", "join")
        elif tok == ("punct", ",") and clause[-1] == "from":
            expect_table = True
    if expect_table:
        raise SqlRefused("FROM/JOIN without a table")
    return ctes
