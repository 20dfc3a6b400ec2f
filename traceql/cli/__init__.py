"""Command-line entry points. Only argument handling and output here: the work happens in the packages.

One module per command family, registered below by one line each; a module is imported only when its command runs
(`--help` lists them from the registration), and none imports polars or the analysis packages at import time, so
`traceql --help` answers at once and `traceql check` does not load the service's or the capture's options. The
console script starts in traceql.__main__.run, which answers a bare `--version` before click is imported."""

from __future__ import annotations

import importlib

import click

from traceql import __version__
from traceql.cli._common import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE  # noqa: F401  (the contract)

# registration: command name -> (its module, which adds it to `main` itself (@main.command: check, summary, rules,
# cache), or module:attribute of the command it exports; the first paragraph of its help, which `traceql --help` lists
# without importing the module: tests/test_startup_imports.py holds it to the command's own)
COMMANDS = {
    "check": ("traceql.cli.check", "Analyse RUN_DIR (a run directory or a single file) and report findings."),
    "summary": ("traceql.cli.check", "Per-rank step time, compute, communication, overlap and idle time."),
    "rules": ("traceql.cli.rules", "List, explain and test the rule pack."),
    "cache": ("traceql.cli.cache", "Where the Parquet cache of parsed traces is, how big it is, and emptying it."),
    "annotate": ("traceql.cli.report:annotate",
                 "Merge RUN_DIR's per-rank traces into one Chrome/Perfetto trace with the findings on it."),
    "diff": ("traceql.cli.report:diff",
             "Compare two runs (eager vs compiled, before vs after): per-rank deltas and findings new and resolved."),
    "query": ("traceql.cli.report:query",
              'Run polars SQL over RUN_DIR\'s tables, e.g. "SELECT rank, count(*) AS n FROM kernels GROUP BY rank".'),
    "graph": ("traceql.cli.graph:graph_command", "Write the dependency graph of RUN_DIR: steps, host ops that launch "
              "work, launches, kernels, collectives."),
    "capture": ("traceql.cli.capture:capture_group",
                "Run a small real workload that plants one known pathology and write its run dir."),
    "serve": ("traceql.cli.serve:serve", "Serve uploads: POST a run dir archive, get the HTML, JSON and SARIF reports "
              "and the annotated trace."),
    "whatif": ("traceql.cli.whatif:whatif_command", "Predict RUN_DIR's step time per rank with each cause removed: "
               "each finding's cause (the cost `check` reports), and the causes the tables measure on every rank "
               "(exposed communication overlapped, GPU idle closed, each late rank on time)."),
}


class _Commands(click.Group):
    """A group whose commands load on first use (COMMANDS); its help lists them from COMMANDS, loading none."""

    _listing = False

    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            if self._listing:  # only its line in the help is wanted: a stand-in with the same first paragraph
                return click.Command(cmd_name, help=COMMANDS[cmd_name][1])
            module, _, attr = COMMANDS[cmd_name][0].partition(":")
            loaded = importlib.import_module(module)
            if attr:
                self.add_command(getattr(loaded, attr), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx, formatter):
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def invoke(self, ctx):
        """As click's; a polars older than traceql needs (traceql.polars_env) is one line and exit 2, not a rule
        file's SQL error or a traceback."""
        from traceql.polars_env import PolarsTooOld

        try:
            return super().invoke(ctx)
        except PolarsTooOld as e:
            from traceql.cli._common import _fail

            _fail(str(e))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """As click's, and where the command line is this process's own (args from sys.argv, click ending the
        process) and the command said it is done (_common.done), the process ends without the interpreter's
        teardown (_common.exit_now). A caller passing args (click's CliRunner, tests) gets click's SystemExit."""
        if args is not None or not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(None, prog_name, complete_var, True, **extra)
        except SystemExit as e:
            from traceql.cli._common import exit_now

            exit_now(e.code)
            raise


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceql")
def main():
    """traceql: find why a distributed PyTorch run is slow, hangs, or got slower after torch.compile."""
