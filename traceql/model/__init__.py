from traceql.model.finding import SEVERITIES, SEVERITY_ORDER, Finding
from traceql.model.run import Run
from traceql.model.source import KINDS, Source
from traceql.model.tables import SCHEMAS, concat, conform, empty

__all__ = ["SCHEMAS", "SEVERITIES", "SEVERITY_ORDER", "KINDS", "Finding", "Run", "Source", "concat", "conform", "empty"]
