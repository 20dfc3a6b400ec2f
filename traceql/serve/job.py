"""One job, in its own process: `python -m traceql.serve.job UPLOAD OUTDIR`.

The check of the upload as `traceql check UPLOAD` does it (the same pipeline, renderers and exit status, per-source
budgets included), read once and written four ways: report.html, report.json, report.sarif and trace.json.gz (the
annotated trace, where the run has trace events). Running `traceql check` three times and `traceql annotate` once
would ingest the upload four times. The last line of stderr is the reason the queue records when it fails."""

from __future__ import annotations

import sys
from pathlib import Path


def main(upload: Path, out: Path) -> int:
    from traceql import pipeline
    from traceql.exit_codes import EXIT_INTERNAL, EXIT_USAGE
    from traceql.report import render
    from traceql.rules.config import ConfigError, load_config
    from traceql.rules.loader import RuleError

    try:
        # the service's configuration is the default pack; a config file inside the upload is never read
        result = pipeline.check(upload, config=load_config(None), progress=False)
    except (ConfigError, RuleError, pipeline.NothingToAnalyse) as e:
        _say(str(e))
        return EXIT_USAGE
    try:
        code, reason = result.verdict(upload, "warning")
        if code != EXIT_USAGE and (result.run.table("kernels").height or result.run.table("host_ops").height):
            from traceql.report.annotate import write

            write(result, out / "trace.json.gz", host=True)
        # report.json last: the queue reads a job whose report.json exists as done, so it must mean every report is
        for fmt, name in (("html", "report.html"), ("sarif", "report.sarif"), ("json", "report.json")):
            tmp = out / (name + ".tmp")
            tmp.write_text(render(result, fmt), encoding="utf-8")
            tmp.replace(out / name)  # a report is there whole or not at all
    except Exception as e:  # a renderer's bug must fail the job with its reason, not pass as "done, findings"
        _say(f"internal error writing the reports ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); "
             "please report it with the run")
        return EXIT_INTERNAL
    if reason:
        _say(reason)
    return code


def _say(msg: str) -> None:
    """One line to stderr, the way the CLI says it (the queue records the job's last stderr line as its reason)."""
    from traceql.model.text_safety import visible

    print(f"traceql: {visible(msg)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
