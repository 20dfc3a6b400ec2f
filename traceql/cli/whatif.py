"""`traceql whatif`: the run's typical step replayed with one cause removed, per rank and per cause (link.whatif)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceql.cli._common import EXIT_INTERNAL, EXIT_OK, _fail


@click.command("whatif")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--finding", "fingerprint", default=None, help="Replay only the finding with this fingerprint (from --format json of check).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path, exists=True, file_okay=False), help="Rule folder(s) to use instead of the bundled pack.")
@click.option("--no-cache", is_flag=True, help="Parse every input again instead of using the Parquet cache.")
def whatif_command(run_dir, fingerprint, fmt, rules_dirs, no_cache):
    """Predict RUN_DIR's step time per rank with each cause removed: each finding's cause (the cost `check`
    reports), and the causes the tables measure on every rank (exposed communication overlapped, GPU idle closed,
    each late rank on time).

    Step times are the median over steps; ranks joined by collectives take the slowest rank's step.
    """
    from traceql import pipeline
    from traceql.link import whatif
    from traceql.rules.causes import cost_specs
    from traceql.rules.config import ConfigError
    from traceql.rules.loader import RuleError, load_rules

    try:
        result = pipeline.check(run_dir, rules_dirs=list(rules_dirs) or None, use_cache=not no_cache)
        specs, keys = cost_specs(load_rules(list(rules_dirs) or None))
    except (ConfigError, pipeline.NothingToAnalyse) as e:
        _fail(str(e))
        return
    except RuleError as e:
        _fail(str(e), EXIT_INTERNAL)
        return
    run = result.run
    findings = result.findings
    if fingerprint:
        findings = [f for f in findings if f.fingerprint == fingerprint]
        if not findings:
            _fail(f"{run_dir}: --finding: no finding with fingerprint {fingerprint!r}; `traceql check {run_dir} "
                  "--format json` lists them")
            return
    measured, per_finding = whatif.whatif_table(run, findings, specs, keys)
    general = [] if fingerprint else whatif.cause_replays(run)
    rows = [{"cause": f"{f.rule} {f.name}", "fingerprint": f.fingerprint, "ranks": f.ranks, "replay": r}
            for f, r in per_finding] + [{"cause": r.label, "fingerprint": None, "ranks": None, "replay": r} for r in general]
    if fmt == "json":
        import orjson

        doc = {"run": str(run.path), "measured": measured.to_dicts(), "causes": [
            {"cause": x["cause"], "fingerprint": x["fingerprint"], "ranks": x["ranks"],
             "measured_ms": x["replay"].measured_ms, "predicted_ms": x["replay"].predicted_ms,
             "cost_ms_per_step": x["replay"].cost_ms_per_step, "cost_pct": x["replay"].cost_pct,
             "per_rank": x["replay"].per_rank.to_dicts()} for x in rows]}
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        sys.exit(EXIT_OK)
    from traceql.model.text_safety import visible

    if measured.height == 0:
        click.echo(f"{visible(run_dir)}: no steps with times in this run: nothing to replay")
        sys.exit(EXIT_OK)
    ranks = measured["rank"].to_list()
    click.echo(f"whatif {visible(run_dir)}: median step time per rank (ms), measured and with each cause removed")
    head = f"{'cause':44} {'saves/step':>10} " + " ".join(f"{'r' + str(r):>8}" for r in ranks)
    click.echo(head)
    # ranks joined by collectives share their slowest rank's step: the row every replay below is compared with
    click.echo(f"{'measured':44} {'':>10} " + " ".join(f"{v:8.2f}" for v in measured["predicted_ms"].to_list()))
    for x in sorted(rows, key=lambda x: -(x["replay"].cost_ms_per_step or 0)):
        r = x["replay"]
        by_rank = dict(zip(r.per_rank["rank"].to_list(), r.per_rank["predicted_ms"].to_list()))
        label = x["cause"] + (f" ({x['fingerprint'][:8]})" if x["fingerprint"] else "")
        cost = f"{r.cost_ms_per_step:7.2f} ms" if r.cost_ms_per_step is not None else f"{'-':>10}"
        click.echo(f"{visible(label)[:44]:44} {cost:>10} " + " ".join(
            f"{by_rank[k]:8.2f}" if by_rank.get(k) is not None else f"{'-':>8}" for k in ranks))
    sys.exit(EXIT_OK)
