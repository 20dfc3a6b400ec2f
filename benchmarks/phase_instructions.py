"""Instructions per phase of one `check`, by callgrind: repeatable on a loaded box, where CPU seconds of a small run
move by 20-40% between runs of the same code.

    python benchmarks/phase_instructions.py RUN_DIR [--also MODULE:FUNC,MODULE:CLASS.METHOD,...] [--top 40]

The check runs in-process (pipeline.check, then the text report) under `valgrind --tool=callgrind
--dump-before=os_getppid`: every phase boundary calls os.getppid(), so callgrind writes the instructions since the
last boundary to a file of its own, and each file is charged to the innermost phase open at that time. Phases: the
start with every import, discover, ingest, link_run, load_rules, each derived table (link.derived_tables), each
rule's evaluation, each SQL rule's preparation (the tables it reads are built there, and charged to them), the SQL
rules run side by side, the costing (attribute), the report; --also adds functions of your choice.

Read it as a map, not as an A/B: what a phase pays the first time polars or Python does something (a regex compiled,
a code path's first call) moves to another phase when the order changes, so a change that shrinks its own phase can
leave the whole command as it was (2026-12, the list-based parent walk: its phase 35.6 -> 16.6 M instructions, the
whole command on trace_filter +9 M). Compare whole commands (callgrind's total of `python -m traceql check`) for
that. One trap it shows at once: editing a file in rules.manifest's code list makes the manifest stale, and the check
then validates every rule in full (load_rules 58 M -> 900 M): rewrite it (`traceql rules check --write-manifest`).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _inner(run_dir: Path, labels: Path, also: list[str]) -> None:
    """The check, with a boundary (os.getppid) at every phase's start and end; the label of each segment to `labels`."""
    out = open(labels, "w")
    stack = ["start and imports"]

    def boundary(push: str | None = None) -> None:
        out.write(stack[-1] + "\n")
        out.flush()
        os.getppid()  # callgrind dumps here (--dump-before)
        if push is None:
            stack.pop()
        else:
            stack.append(push)

    def phase(label: str, f):
        def g(*a, **k):
            boundary(label)
            try:
                return f(*a, **k)
            finally:
                boundary()
        return g

    from traceql.cli.check import _size_polars_pool

    _size_polars_pool(run_dir)  # as the command does: the polars pool sized, the check's modules imported
    import importlib

    from traceql import link, pipeline
    from traceql.report import render
    from traceql.rules import engine

    for name, build in list(link.derived_tables().items()):
        link._REGISTRY[name] = phase(f"derived {name}", build)
    evaluate = engine._evaluate
    engine._evaluate = lambda run, rule, values, job=None: phase(f"rule {rule.id}", evaluate)(run, rule, values, job)
    prepare = engine._SqlRun.__init__
    engine._SqlRun.__init__ = lambda self, run, rule: phase(f"SQL prepare {rule.id}", prepare)(self, run, rule)
    engine._run_side_by_side = phase("SQL rules side by side", engine._run_side_by_side)
    for name in ("discover", "ingest", "load_rules", "attribute"):
        setattr(pipeline, name, phase(name, getattr(pipeline, name)))
    link.link_run = phase("link_run", link.link_run)
    for spec in also:
        mod, _, attr = spec.partition(":")
        owner = importlib.import_module(mod)
        *path, last = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        setattr(owner, last, phase(spec, getattr(owner, last)))
    boundary("check (the rest)")
    result = pipeline.check(run_dir, use_cache=False)
    boundary()
    boundary("report")
    render(result, "text", color=False, verbose=False, width=None)
    boundary()
    os._exit(0)  # as the command ends (no teardown)


def _summed(prefix: Path, labels: Path) -> tuple[int, collections.Counter]:
    """(total, instructions per label) from callgrind's dump files PREFIX.N (segment N ends at boundary N)."""
    names = labels.read_text().split("\n")[:-1]
    per: collections.Counter = collections.Counter()
    total = 0
    for f in prefix.parent.glob(prefix.name + "*"):
        m = re.search(r"\.(\d+)$", f.name)
        n = next((int(line.split()[1]) for line in f.open(errors="replace") if line.startswith("summary:")), 0)
        total += n
        label = names[int(m.group(1)) - 1] if m and int(m.group(1)) <= len(names) else "after the last boundary"
        per[label] += n
    return total, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--also", default="", help="more phases: MODULE:FUNC or MODULE:CLASS.METHOD, comma-separated")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    also = [s for s in a.also.split(",") if s]
    if a.inner:
        _inner(a.run_dir.resolve(), a.inner, also)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found")
    with tempfile.TemporaryDirectory() as tmp:
        prefix, labels = Path(tmp) / "cg", Path(tmp) / "labels"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=os_getppid", f"--callgrind-out-file={prefix}",
                        sys.executable, __file__, str(a.run_dir.resolve()), "--also", a.also, "--inner", str(labels)],
                       cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        total, per = _summed(prefix, labels)
    print(f"{a.run_dir}: {total / 1e6:.1f} M instructions in all (callgrind, every thread)")
    for label, n in per.most_common(a.top):
        print(f"{n / 1e6:9.1f} M  {label}")


if __name__ == "__main__":
    main()
