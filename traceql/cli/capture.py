"""`traceql capture`: `traceql capture list` and `traceql capture SCENARIO --out DIR ...` (also `capture run SCENARIO`).

Importing this module never imports torch: only the rank processes do.
"""

from __future__ import annotations

from pathlib import Path

import click

from traceql.capture.scenarios import SCENARIOS


def _run_options(f):
    f = click.option("--out", "out", required=True, type=click.Path(path_type=Path),
                     help="Run dir to write (must be new or empty; see --force).")(f)
    f = click.option("--ranks", type=click.IntRange(1, 64), default=None,
                     help="Rank processes to launch (default: the scenario's).")(f)
    f = click.option("--steps", type=click.IntRange(1, 50), default=3, show_default=True,
                     help="Profiled (active) steps; one wait and one warm-up step come before them.")(f)
    f = click.option("--backend", type=click.Choice(["cuda", "cpu"]), default="cpu", show_default=True,
                     help="Device: cpu uses gloo; cuda uses NCCL (gloo when ranks outnumber GPUs).")(f)
    f = click.option("--nsys", is_flag=True, help="Also record each rank under Nsight Systems and export SQLite.")(f)
    f = click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
                     help="Seconds before the rank processes are killed.")(f)
    f = click.option("--force", is_flag=True, help="Replace a non-empty --out.")(f)
    return f


def _do_run(scenario, out, ranks, steps, backend, nsys, timeout_s, force):
    from traceql.capture.runner import CaptureError, capture
    from traceql.cli._common import _fail

    if out.exists() and not out.is_dir():
        _fail(f"--out {out}: is a file; capture writes a run folder there: name a new folder")
    try:
        res = capture(scenario, out, ranks=ranks, steps=steps, backend=backend, nsys=nsys, timeout_s=timeout_s,
                      force=force, log=lambda m: click.echo(m, err=True))
    except CaptureError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # the folder cannot be made or written (a file on the way, no permission, a full disk)
        _fail(f"--out {out}: cannot write the run there: {e.strerror or e}")
        return
    codes = res.exit_codes
    click.echo(f"{scenario}: wrote {out} ({res.manifest['ranks']} ranks, exit codes {codes}, "
               f"{res.manifest['duration_s']}s)")
    if not res.ok:
        hint = "it was meant to fail" if SCENARIOS[scenario].fails else "see rank*.stderr.log"
        raise click.ClickException(f"{scenario}: the run did not end as planned (exit codes {codes}); {hint}")


def _scenario_command(name: str) -> click.Command:
    sc = SCENARIOS[name]

    @click.command(name=name, help=sc.summary)
    @_run_options
    def cmd(**kw):
        _do_run(name, **kw)

    return cmd


class CaptureGroup(click.Group):
    """A group whose unknown subcommands are scenario names: `traceql capture straggler --out DIR`."""

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in SCENARIOS:
            return _scenario_command(cmd_name)
        return cmd

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name and name not in self.commands and name not in SCENARIOS and not name.startswith("-"):
            ctx.fail(f"unknown scenario or command {name!r}; scenarios: {', '.join(SCENARIOS)} "
                     "(`traceql capture list` describes them)")
        return super().resolve_command(ctx, args)


@click.group(name="capture", cls=CaptureGroup)
def capture_group():
    """Run a small real workload that plants one known pathology and write its run dir."""


@capture_group.command(name="list")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def list_cmd(fmt):
    """List the scenarios, their ranks and the findings each must produce."""
    if fmt == "json":
        rows = [{"scenario": s.name, "summary": s.summary, "compiled": s.compiled, "default_ranks": s.default_ranks,
                 "min_ranks": s.min_ranks, "expected": [r for r, _ in s.expected], "clean": s.clean}
                for s in SCENARIOS.values()]
        import json

        click.echo(json.dumps(rows, indent=2))
        return
    w = max(len(n) for n in SCENARIOS)
    for s in SCENARIOS.values():
        rules = ",".join(r for r, _ in s.expected) or "clean"
        flags = f"ranks>={s.min_ranks}" + (" compiled" if s.compiled else "")
        click.echo(f"{s.name:<{w}}  {rules:<13} {flags:<19} {s.summary}")


@capture_group.command(name="run")
@click.argument("scenario", type=click.Choice(list(SCENARIOS)))
@_run_options
def run_cmd(scenario, **kw):
    """Run SCENARIO (same as `traceql capture SCENARIO`)."""
    _do_run(scenario, **kw)
