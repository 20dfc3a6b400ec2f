from traceql.cli.capture import capture_group

capture_group()
