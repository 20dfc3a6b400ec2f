"""Renderers: one module per output format. Each takes a CheckResult and returns text."""


def render(result, fmt: str, color: bool = False, verbose: bool = False, width: int | None = None) -> str:
    """The check's report in `fmt` (text, json, sarif, html); each renderer is imported only when asked for."""
    if fmt == "json":
        from traceql.report import json as r
        return r.render(result)
    if fmt == "sarif":
        from traceql.report import sarif as r
        return r.render(result)
    if fmt == "html":
        from traceql.report import html as r
        return r.render(result)
    from traceql.report import text as r
    return r.render(result, color=color, verbose=verbose, width=width)
