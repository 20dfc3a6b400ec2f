"""The rule file `traceql rules new ID NAME` writes: every field, with what it does, in a rule that loads as it is."""

from __future__ import annotations

_TEMPLATE = """\
# {rid} {name}: written by `traceql rules new`. Every field is here with what it does; rules/README.md has the rest.
# The rule loads as it is (it counts each rank's communication kernels per step); replace the selection with yours.
id: {rid}                       # stable; never reused once released
name: {name}
severity: warning                 # error | warning | info
summary: One line saying what the rule finds.
needs: [kernels, steps]           # tables that must have rows, else the rule is skipped with the reason
params:                           # named thresholds: --set {rid}.min_kernels=8 or traceql.toml overrides them
  min_kernels:
    default: 4
    doc: Report a step with at least this many communication kernels.

# The logic. A vocabulary selection: a measure over a table (canonical: model/tables.py; derived:
# model/derived.py; views: rules/views/), filtered by `where`, grouped by `per`, then optional stages
# (compute, filter, steps, across_ranks, then) and `measure: join` of two selections. Or replace `select:`
# with `sql: |` (polars SQL, per rank unless `cross_rank: true`).
select:
  measure: count
  table: kernels
  where: {{kind: comm}}
  per: [rank, step]
  compute:
    per_ms: "n / step_ms"         # new columns from expressions over the output and the params
condition: "n >= min_kernels"     # over the output columns and the params
message: >-
  rank {{rank}} step {{step}}: {{n}} communication kernels in a {{step_ms:.1f}} ms step
evidence: [n, step_ms, per_ms]    # output columns copied into the finding
ranks_column: rank                # the column holding the rank(s) a finding is about
# location: [stream]              # extra columns that identify a finding (fingerprint, SARIF location)
# collapse: [rank]                # one finding per value of these columns (numbers: median, _max, _total)
# fact: traceql.link.module:function   # only where the logic is Python: the function that builds the fact
# views: [runtime_kernels]        # the views an SQL rule reads

docs:
  why: >-
    Why it matters: what it costs the run, in the field's words.
  fix: >-
    How to fix it: the change to make, with the API or setting to use.
  example: >-
    rank 0 step 3: 12 communication kernels in a 41.0 ms step
  references:
    - https://pytorch.org/docs/stable/
fixtures:                         # run dirs (fixtures/ or samples/) that must fire, with their ranks, and must stay quiet
  fire: []                        # e.g. - {{path: fixtures/cpu-exposed-allreduce, ranks: [0, 1]}}
  quiet: []                       # e.g. - fixtures/cpu-plain-loop
"""


def skeleton(rid: str, name: str) -> str:
    return _TEMPLATE.format(rid=rid, name=name)
