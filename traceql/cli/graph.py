"""`traceql graph RUN_DIR --out FILE [--graphml]`: write the run's dependency graph (node-link JSON or GraphML)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("graph")
@click.argument("run_dir", type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="File to write.")
@click.option("--graphml", is_flag=True, help="Write GraphML instead of node-link JSON.")
@click.option("--no-cache", is_flag=True, help="Re-read every source instead of using the Parquet cache.")
def graph_command(run_dir: Path, out: Path, graphml: bool, no_cache: bool) -> None:
    """Write the dependency graph of RUN_DIR: steps, host ops that launch work, launches, kernels, collectives."""
    from traceql.cli._common import _check_out, _fail
    from traceql.link.graph import build_graph, write_graph
    from traceql.pipeline import NothingToAnalyse, load_run

    _check_out(out)
    try:
        run = load_run(run_dir, use_cache=not no_cache)
    except NothingToAnalyse as e:
        _fail(str(e))
        return
    g = build_graph(run)
    try:
        write_graph(g, out, graphml=graphml)
    except OSError as e:
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
        return
    kinds: dict[str, int] = {}
    for _, _, k in g.edges(data="kind"):
        kinds[k] = kinds.get(k, 0) + 1
    click.echo(f"{out}: {g.number_of_nodes()} nodes, {g.number_of_edges()} edges "
               f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})", err=True)
