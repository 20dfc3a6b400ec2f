from __future__ import annotations

import orjson

from traceql.model.result import CheckResult


def render(result: CheckResult) -> str:
    return orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
