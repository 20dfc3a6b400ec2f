"""Command-line entry points. Only argument handling and output here: the work happens in the packages.

One module per command family, registered below by one line each; a module is imported only when its command runs
(or `--help` lists them all), and none imports polars or the analysis packages at import time, so `traceql --help`
and `--version` answer at once and `traceql check` does not load the service's or the capture's options."""

from __future__ import annotations

import importlib

import click

from traceql import __version__
from traceql.cli._common import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE  # noqa: F401  (the contract)

# registration: command name -> its module, which adds it to `main` itself (@main.command: check, summary, rules,
# cache), or module:attribute of the command it exports
COMMANDS = {
    "check": "traceql.cli.check",
    "summary": "traceql.cli.check",
    "rules": "traceql.cli.rules",
    "cache": "traceql.cli.cache",
    "annotate": "traceql.cli.report:annotate",
    "diff": "traceql.cli.report:diff",
    "query": "traceql.cli.report:query",
    "graph": "traceql.cli.graph:graph_command",
    "capture": "traceql.cli.capture:capture_group",
    "serve": "traceql.cli.serve:serve",
    "whatif": "traceql.cli.whatif:whatif_command",
}


class _Commands(click.Group):
    """A group whose commands load on first use (COMMANDS)."""

    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx, cmd_name):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            loaded = importlib.import_module(module)
            if attr:
                self.add_command(getattr(loaded, attr), cmd_name)
        return self.commands.get(cmd_name)

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
