"""Derived tables: what link/ builds from the canonical tables (model/tables.py), declared here with their schemas.

Rules read derived tables like canonical ones; the rule loader validates a rule's tables and columns against these
declarations without building anything, and `traceql query` and `traceql rules explain` show them. One entry per
table, grouped by area (each area's section is edited by whoever owns those tables):

- doc: one paragraph, what a row is;
- columns: {name: (dtype, doc)}, exactly the frame the builder returns (tests/test_derived.py builds every table
  on the fixtures and compares);
- builder: "module:function" of link/ that builds it (link.ensure is the registry that calls it);
- scope: "rank" when a rank's rows come from that rank's tables alone, "run" when building them reads other ranks
  (matching, majorities, medians across ranks);
- reads: the canonical and derived tables the builder reads directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceql.model.tables import BOOL, F64, I32, I64, SCHEMAS, STR

U32 = pl.UInt32
RANKS = pl.List(pl.Int32)  # a list of global ranks


@dataclass(frozen=True)
class Derived:
    name: str
    doc: str
    columns: dict[str, tuple[pl.DataType, str]]
    builder: str
    scope: str
    reads: tuple[str, ...]

    @property
    def schema(self) -> dict[str, pl.DataType]:
        return {c: t for c, (t, _) in self.columns.items()}


DERIVED: dict[str, Derived] = {}
SCOPES = ("rank", "run")


def _table(name: str, doc: str, builder: str, scope: str, reads: list[str], columns: dict) -> None:
    # checked here, at import, so that a bad entry fails every test rather than one rule at run time
    assert name not in DERIVED and name not in SCHEMAS, f"model/derived.py: {name}: declared twice"
    assert scope in SCOPES, f"model/derived.py: {name}: scope {scope!r}; valid: {SCOPES}"
    assert ":" in builder, f"model/derived.py: {name}: builder {builder!r} is not module:function"
    DERIVED[name] = Derived(name, doc, columns, builder, scope, tuple(reads))

# communication ---------------------------------------------------------------------------------------------------
_table(
    "collective_matches",
    doc=(
        "One row per collective call and rank, on the rank's own clock: the group it was matched in, its match key "
        "(seq, or call order per step) and the match id shared by the same call on every rank. One source per rank "
        "(the one on the profiler clock)."
    ),
    builder="traceql.link.collectives:collective_matches",
    # run: the match id is a dense rank of the match keys over every rank's calls, and the grouping compares ranks'
    # process-group names (a rank cut off early has fewer keys: built alone, its ids would shift)
    scope="run",
    reads=["collectives"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "id": (I64, "the row's id in collectives"),
        "group": (STR, "matching group (pg name, or description plus rank list)"),
        "pg": (STR, "process group key the match used"),
        "pg_name": (STR, "process group name"),
        "members": (STR, "JSON list of the group's global ranks where known"),
        "group_size": (I32, "ranks in the process group"),
        "seq": (I64, "sequence number within the group"),
        "seq_origin": (STR, "trace (the trace's seq), step (call order per step) or order (call order)"),
        "match_step": (I64, "step the match key counts calls in"),
        "call": (I64, "call order within the group (and step)"),
        "match_id": (I64, "the same id for the same call on every rank"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "backend": (STR, "nccl, gloo, ... where known"),
        "dtype": (STR, "element type"),
        "in_nelems": (I64, "input elements"),
        "out_nelems": (I64, "output elements"),
        "bytes": (I64, "message size in bytes"),
        "step": (I64, "training step (null outside any step)"),
        "ts": (I64, "start, ns on the rank's clock"),
        "end": (I64, "end, ns on the rank's clock"),
        "kernel_ts": (I64, "first kernel's start (null for host-only backends)"),
        "kernel_end": (I64, "first kernel's end"),
        "host_only": (BOOL, "no GPU kernel carried it (gloo)"),
        "grouping": (STR, "how sure the group is: trace (the call names it), single group (the traces say the run has "
                          "one), assumed (nothing says which group: older traces of multi-group jobs)"),
    },
)
_table(
    "collective_instances",
    doc=(
        "One row per matched collective call and rank, on the aligned clock (link.clock): when the rank arrived, when"
        " the collective started and ended, the wait the later ranks caused it, the skew across ranks and the last "
        "arriver."
    ),
    builder="traceql.link.collectives:collective_instances",
    scope="run",
    reads=["clock_offsets", "collective_matches"],
    columns={
        "rank": (I32, "global rank"),
        "pg": (STR, "process group key the match used"),
        "pg_name": (STR, "process group name"),
        "group": (STR, "matching group (pg name, or description plus rank list)"),
        "seq": (I64, "sequence number within the group"),
        "seq_origin": (STR, "trace (the trace's seq), step (call order per step) or order (call order)"),
        "match_id": (I64, "the same id for the same call on every rank"),
        "step": (I64, "training step (null outside any step)"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "backend": (STR, "nccl, gloo, ... where known"),
        "dtype": (STR, "element type"),
        "bytes": (I64, "message size in bytes"),
        "in_nelems": (I64, "input elements"),
        "out_nelems": (I64, "output elements"),
        "host_only": (BOOL, "no GPU kernel carried it (gloo)"),
        "arrival": (I64, "when the rank entered the collective (aligned ns)"),
        "start": (I64, "when the data transfer started, once every rank had arrived (aligned ns)"),
        "end": (I64, "when the collective ended (aligned ns)"),
        "dur_ms": (F64, "the rank's time in the collective (ms)"),
        "wait_ms": (F64, "time this rank waited for the last arriver (ms)"),
        "wait_end": (I64, "end of the wait: the last rank's arrival (aligned ns)"),
        "skew_ms": (F64, "last arrival minus first arrival across ranks (ms)"),
        "last_arriver": (I32, "the rank that arrived last"),
        "is_last": (BOOL, "this rank arrived last"),
        "n_ranks": (I32, "ranks compared"),
        "group_size": (I32, "ranks in the process group"),
        "missing_ranks": (I32, "group members with no matching call"),
    },
)
_table(
    "collective_gaps",
    doc=(
        "Ranks of a process group that left no collectives in the run dir (status missing), or whose collectives stop"
        " before the others' (status stopped_early)."
    ),
    builder="traceql.link.collectives:collective_gaps",
    scope="run",
    reads=["collective_matches"],
    columns={
        "pg": (STR, "process group key the match used"),
        "group": (STR, "matching group (pg name, or description plus rank list)"),
        "rank": (I32, "global rank"),
        "status": (STR, "missing or stopped_early"),
        "n_collectives": (I64, "collectives counted"),
        "n_expected": (I64, "collectives the other ranks of the group made"),
        "last_seq": (I64, "the rank's last seq"),
        "last_step": (I64, "the rank's last step"),
        "detail": (STR, "what the rank is missing, in words"),
    },
)
_table(
    "collective_waits",
    doc=(
        "Who waited for whom: one row per rank and each rank it waited for (the last arriver of the calls), over "
        "collectives matched on two or more ranks: the union of those waits (collectives in flight together count "
        "once) and at how many calls. Only waits of positive length appear."
    ),
    builder="traceql.link.collectives:collective_waits",
    scope="run",
    reads=["collective_instances"],
    columns={
        "rank": (I32, "global rank (the one waiting)"),
        "waited_for": (I32, "the rank it waited for: the last arriver of those calls"),
        "wait_ms": (F64, "union of its wait intervals at those calls (ms)"),
        "calls": (I64, "calls at which it waited for that rank"),
    },
)
_table(
    "clock_offsets",
    doc=(
        "One row per rank: the offset that puts its clock on the reference rank's, from matched collectives' kernel "
        "ends, with the residual and how it was found."
    ),
    builder="traceql.link.clock:clock_offsets",
    scope="run",
    reads=["collective_matches"],
    columns={
        "rank": (I32, "global rank"),
        "offset_ns": (I64, "subtract from the rank's timestamps to reach the reference clock (ns)"),
        "residual_us": (F64, "median disagreement left after alignment (us)"),
        "n_matched": (I64, "matched collectives used"),
        "method": (STR, "how the offset was found (kernel ends, host ends, same source, unaligned ...)"),
        "reference": (I32, "the rank whose clock is the reference"),
    },
)
_table(
    "step_balance",
    doc=(
        "One row per rank and step: the step's time, the union of the rank's waits for later ranks in that step's "
        "collectives, and the rest (its own work)."
    ),
    builder="traceql.link.balance:step_balance",
    scope="run",
    reads=["collective_instances", "step_times"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "wait_ms": (F64, "time spent waiting for later ranks in matched collectives (ms)"),
        "busy_ms": (F64, "time not spent waiting (ms)"),
    },
)
_table(
    "clock_error",
    doc=(
        "One row per rank: how far a wait measured between this rank and another can be off because of clock "
        "alignment: the rank's alignment residual plus the largest residual among the other ranks."
    ),
    builder="traceql.link.clock:clock_error_ms",
    scope="run",
    reads=["clock_offsets"],
    columns={
        "rank": (I32, "global rank"),
        "clock_error_ms": (F64, "how far cross-rank waits can be off from clock alignment (ms; null where unaligned)"),
    },
)
_table(
    "exposed_comm",
    doc=(
        "One row per rank and step: communication time, the part hidden under compute, the exposed rest and its share"
        " of the step (what TQL101 measures)."
    ),
    builder="traceql.link.critical_path:exposed_comm",
    scope="run",
    reads=["step_metrics"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "comm_ms": (F64, "union of communication intervals (ms)"),
        "overlap_ms": (F64, "communication hidden under compute (ms)"),
        "exposed_comm_ms": (F64, "communication not hidden under compute (ms)"),
        "exposed_pct_of_step": (F64, "exposed_comm_ms over step_ms (%)"),
        "side": (STR, "gpu (NCCL kernels) or host (collectives without kernels)"),
    },
)
_table(
    "microbatches",
    doc=(
        "One row per micro-batch: each outermost forward of a data-parallel wrapper (DistributedDataParallel, "
        "FullyShardedDataParallel) in a step, until the next one (or the step's end), with the gradient collectives "
        "(all_reduce, reduce_scatter and their coalesced forms) that started in it."
    ),
    builder="traceql.link.microbatch:microbatches",
    scope="rank",
    reads=["collectives", "host_ops", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step"),
        "mb": (I64, "the micro-batch's order in the step (0 first)"),
        "ts": (I64, "its forward's start (ns, the rank's clock)"),
        "until": (I64, "the next micro-batch's forward, else the step's end (ns)"),
        "grad_collectives": (U32, "gradient collectives that started in it"),
    },
)

_table(
    "collective_bandwidth",
    doc=(
        "One row per matched collective (on two or more ranks): its algorithm and bus bandwidth by the nccl-tests "
        "formulas from the last arriver's time, and the link its communicator used with that link's nominal speed."
    ),
    builder="traceql.link.bandwidth:collective_bandwidth",
    scope="run",
    reads=["collective_instances", "nccl_comms"],
    columns={
        "group": (STR, "matching group (pg name, or description plus rank list)"),
        "match_id": (I64, "the same id for the same call on every rank"),
        "step": (I64, "training step (null outside any step)"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "backend": (STR, "nccl, gloo, ... where known"),
        "n_ranks": (I32, "ranks the call was matched on"),
        "ranks": (RANKS, "those ranks"),
        "bytes": (I64, "message size per rank as recorded"),
        "size_bytes": (I64, "S of nccl-tests: the whole array (all_gather: its output)"),
        "time_ms": (F64, "the last arriver's time in the call (the others' includes waiting for it)"),
        "algbw_gbps": (F64, "size_bytes / time (GB/s)"),
        "bus_factor": (F64, "nccl-tests' bus factor of the op for n_ranks (all_reduce 2(n-1)/n, ...)"),
        "busbw_gbps": (F64, "algbw_gbps x bus_factor (GB/s)"),
        "n_hosts": (I32, "hosts the ranks ran on, where the NCCL logs say"),
        "inter_node": (BOOL, "the ranks span more than one host"),
        "link": (STR, "nvlink/p2p, shm, ib, socket: what the communicator used"),
        "nominal_gbps": (F64, "the link's nominal bus bandwidth (GB/s), the slowest common generation"),
        "pct_of_link": (F64, "busbw_gbps over nominal_gbps (%)"),
    },
)

# host and GPU ----------------------------------------------------------------------------------------------------
_table(
    "step_times",
    doc="One row per rank and step: the step's host range, its GPU span and step_ms, the longer of the two.",
    builder="traceql.link.steps:step_times",
    scope="rank",
    reads=["kernels", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "host_ms": (F64, "the step's host range (ms)"),
        "gpu_span_ms": (F64, "first GPU operation start to last end in the step (ms)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
    },
)
_table(
    "warmup_steps",
    doc=(
        "One row per rank, source and step that loads CUDA modules (lazy loading in the first steps): steps whose "
        "time is start-up, not the training loop."
    ),
    builder="traceql.link.steps:warmup_steps",
    scope="rank",
    reads=["runtime", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "step": (I64, "training step (null outside any step)"),
        "load_ms": (F64, "time spent loading CUDA modules in the step (ms)"),
        "reason": (STR, "why the step counts as warm-up"),
    },
)
_table(
    "activity",
    doc=(
        "One row per compute or communication interval per rank, on the side that carries the facts: GPU kernels "
        "where the rank has communication kernels, else host-side collectives and CPU ops, cut at the step "
        "boundaries they cross (a gloo collective that runs on past its step counts in each step it ran in)."
    ),
    builder="traceql.link.activity:activity",
    scope="rank",
    reads=["collectives", "host_ops", "kernels", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "step": (I64, "training step (null outside any step)"),
        "ts": (I64, "start, ns on the rank's clock"),
        "end": (I64, "end, ns on the rank's clock"),
        "name": (STR, "name of the operation"),
        "kind": (STR, "what the row is (see the table doc)"),
        "side": (STR, "gpu (NCCL kernels) or host (collectives without kernels)"),
    },
)
_table(
    "comm_coverage",
    doc=(
        "One row per rank and step: the activity table's communication against its compute on the rank's side "
        "(TQL101's exposed measure), from the rank's source with the most communication. step_metrics' per-rank "
        "half: the activity intervals never leave a rank task."
    ),
    builder="traceql.link.metrics:comm_coverage",
    scope="rank",
    reads=["activity", "step_times"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step; -1: the whole trace of a rank without steps)"),
        "side": (STR, "gpu (NCCL kernels) or host (collectives without kernels)"),
        "comm_ms": (F64, "union of communication intervals (ms)"),
        "compute_ms": (F64, "union of compute intervals (ms)"),
        "overlap_ms": (F64, "communication hidden under compute (ms)"),
        "exposed_comm_ms": (F64, "communication not hidden under compute (ms)"),
        "comm_comp_overlap_pct": (F64, "overlap_ms over comm_ms (%)"),
    },
)
_table(
    "step_metrics",
    doc=(
        "One row per rank and step: the numbers every report shows, one definition each (step time, communication "
        "against compute, waits, GPU busy and idle)."
    ),
    builder="traceql.link.metrics:step_metrics",
    scope="run",
    reads=["comm_coverage", "step_balance", "step_breakdown", "step_times"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "host_ms": (F64, "the step's host range (ms)"),
        "gpu_span_ms": (F64, "first GPU operation start to last end in the step (ms)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "side": (STR, "gpu (NCCL kernels) or host (collectives without kernels)"),
        "comm_ms": (F64, "union of communication intervals (ms)"),
        "compute_ms": (F64, "union of compute intervals (ms)"),
        "overlap_ms": (F64, "communication hidden under compute (ms)"),
        "exposed_comm_ms": (F64, "communication not hidden under compute (ms)"),
        "comm_comp_overlap_pct": (F64, "overlap_ms over comm_ms (%)"),
        "wait_ms": (F64, "time spent waiting for later ranks in matched collectives (ms)"),
        "busy_ms": (F64, "time not spent waiting (ms)"),
        "gpu_busy_ms": (F64, "union of all kernels in the step (ms)"),
        "gpu_idle_ms": (F64, "GPU span minus gpu_busy_ms (ms)"),
        "kernel_time_ms": (F64, "summed duration of compute and communication kernels (ms)"),
        "kernels": (I64, "compute and communication kernels counted"),
    },
)
_table(
    "step_breakdown",
    doc=(
        "One row per rank and step: where the GPU time went (compute, communication, exposed communication, idle), as"
        " Holistic Trace Analysis defines them."
    ),
    builder="traceql.link.breakdown:step_breakdown",
    scope="rank",
    reads=["gpu_idle_gaps", "kernels", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "gpu_span_ms": (F64, "first GPU operation start to last end in the step (ms)"),
        "busy_ms": (F64, "time not spent waiting (ms)"),
        "compute_ms": (F64, "union of compute intervals (ms)"),
        "comm_ms": (F64, "union of communication intervals (ms)"),
        "overlap_ms": (F64, "communication hidden under compute (ms)"),
        "exposed_comm_ms": (F64, "communication not hidden under compute (ms)"),
        "comm_comp_overlap_pct": (F64, "overlap_ms over comm_ms (%)"),
        "idle_ms": (F64, "device idle time in the step's GPU span plus its lead gap (ms)"),
        "kernel_time_ms": (F64, "summed duration of compute and communication kernels (ms)"),
        "kernels": (I64, "compute and communication kernels counted"),
    },
)
_table(
    "gpu_idle_gaps",
    doc=(
        "One row per idle gap on a device's timeline: its span, the step it delays, whether it leads the step, the "
        "operations around it, what the host was doing and how much of it was a batch fetch."
    ),
    builder="traceql.link.breakdown:gpu_idle_gaps",
    scope="rank",
    reads=["host_ops", "kernels", "runtime", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "device": (I32, "CUDA device index"),
        "step": (I64, "training step (null outside any step)"),
        "gap_ts": (I64, "gap start (ns, rank's clock)"),
        "gap_end": (I64, "gap end (ns, rank's clock)"),
        "gap_ms": (F64, "gap length (ms)"),
        "lead": (BOOL, "the gap leads its step (before the step's first GPU operation)"),
        "prev_name": (STR, "GPU operation before the gap"),
        "next_name": (STR, "GPU operation after the gap"),
        "host_op": (STR, "what the host was doing at the gap's midpoint"),
        "input_wait_ms": (F64, "part of the gap spent fetching a batch (ms)"),
    },
)
_table(
    "gpu_step_gaps",
    doc="One row per rank, source and step with GPU work: the step's longest GPU idle gap (0 where it has none).",
    builder="traceql.link.breakdown:gpu_step_gaps",
    scope="rank",
    reads=["gpu_idle_gaps", "kernels"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "step": (I64, "training step"),
        "max_gap_ms": (F64, "the step's longest idle gap (ms; 0 where it has none)"),
    },
)
_table(
    "path_kernels",
    doc=(
        "One row per timed kernel, on the rank's own clock: the columns the critical-path walk reads, with its launch "
        "call's start and end. The per-rank half of critical_path: built where the rank was read, so that kernels "
        "and runtime calls never leave a rank task."
    ),
    builder="traceql.link.critical_path:path_kernels",
    scope="rank",
    reads=["kernels", "runtime"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "device": (I32, "CUDA device index"),
        "name": (STR, "kernel name"),
        "kind": (STR, "compute, comm, memcpy or memset"),
        "ts": (I64, "start, ns on the rank's clock"),
        "end": (I64, "end, ns on the rank's clock"),
        "step": (I64, "training step (null outside any step)"),
        "launch_ts": (I64, "start of the runtime call that launched it (ns on the rank's clock; null: none recorded)"),
        "launch_end": (I64, "end of that launch call (ns on the rank's clock)"),
    },
)
_table(
    "host_cover",
    doc=(
        "One row per rank, kind of host activity and disjoint segment, on the rank's own clock: DataLoader fetches "
        "(loader), blocking syncs (sync), recorded ops below the step ranges and runtime calls (ops), host-side "
        "collectives (host_comm). The per-rank half of critical_path's host gaps: host ops and runtime calls never "
        "leave a rank task."
    ),
    builder="traceql.link.critical_path:host_cover",
    scope="rank",
    reads=["collectives", "host_ops", "runtime", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "cover": (STR, "loader, sync, ops or host_comm"),
        "seg_ts": (I64, "segment start, ns on the rank's clock"),
        "seg_end": (I64, "segment end, ns on the rank's clock"),
    },
)
_table(
    "critical_path",
    doc=(
        "One row per step (on the rank that ended it): the step's critical path across ranks, host included, split "
        "into compute, exposed communication and the GPU's waits for the host (launching, blocking syncs, DataLoader "
        "waits, host-side collectives, time outside any recorded op) and idle time."
    ),
    builder="traceql.link.critical_path:critical_path",
    scope="run",
    reads=["clock_offsets", "collective_instances", "collective_matches", "collectives", "host_cover", "path_kernels",
           "steps"],
    columns={
        "step": (I64, "training step (null outside any step)"),
        "rank": (I32, "the rank that ended the step"),
        "ranks_on_path": (RANKS, "ranks the path passed through"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "compute_ms": (F64, "compute on the path (ms)"),
        "exposed_comm_ms": (F64, "communication on the path (ms)"),
        "host_launch_ms": (F64, "the GPU waiting for the host to launch its next kernel (ms)"),
        "idle_ms": (F64, "idle on the path, the host's waits apart (ms)"),
        "host_sync_ms": (F64, "the host blocked in a synchronising runtime call (ms)"),
        "input_wait_ms": (F64, "the host waiting for the DataLoader's next batch (ms)"),
        "host_comm_ms": (F64, "the host inside a host-side (gloo) collective (ms)"),
        "host_other_ms": (F64, "the host outside any recorded op: a sleep, unprofiled Python (ms)"),
        "exposed_comm_pct": (F64, "exposed_comm_ms over step_ms (%)"),
        "host_launch_pct": (F64, "host_launch_ms over step_ms (%)"),
        "path_kernels": (I64, "kernels on the path"),
        "rank_jumps": (I64, "times the path moved to another rank"),
        "host_jumps": (I64, "times the path moved to the host"),
        "last_kernel": (STR, "the kernel that ended the step"),
    },
)
_table(
    "launch_bound",
    doc=(
        "One row per rank and step: how much of the step the GPU sat idle because the next kernel had not been "
        "launched yet."
    ),
    builder="traceql.link.critical_path:launch_bound",
    scope="rank",
    reads=["host_ops", "kernels", "runtime", "step_times"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "kernels": (I64, "compute and communication kernels counted"),
        "median_kernel_us": (F64, "median kernel duration (us)"),
        "busy_ms": (F64, "union of kernels in the step (ms)"),
        "gap_ms": (F64, "idle time between kernels in the step (ms)"),
        "launch_gap_ms": (F64, "idle time with the next kernel not launched yet (ms)"),
        "launch_gap_pct": (F64, "launch_gap_ms over step_ms (%)"),
        "launch_gaps": (I64, "gaps counted in launch_gap_ms"),
        "busy_pct": (F64, "busy_ms over step_ms (%)"),
        "typical_launch_gap_pct": (F64, "median launch_gap_pct over the rank's steps (%)"),
    },
)
_table(
    "gpu_time_util",
    doc=(
        "One row per rank, device and chunk: the device's time utilisation in equal chunks of its active span (nsys "
        "gpu_time_util's shape)."
    ),
    builder="traceql.link.gpu_util:gpu_time_util",
    scope="rank",
    reads=["kernels", "warmup_steps"],
    columns={
        "rank": (I32, "global rank"),
        "device": (I32, "CUDA device index"),
        "chunk": (I64, "chunk index (0 .. CHUNKS-1)"),
        "ts": (I64, "chunk start (ns)"),
        "end": (I64, "chunk end (ns)"),
        "chunk_ms": (F64, "chunk length (ms)"),
        "busy_ms": (F64, "GPU operations' time inside the chunk, summed (ms)"),
        "util_pct": (F64, "busy_ms over chunk_ms (%; concurrent work can pass 100)"),
        "step": (I64, "step the chunk starts in"),
    },
)
_table(
    "blocking_calls",
    doc=(
        "One row per blocking runtime call (synchronisation or synchronous copy): how long it blocked the host and "
        "the host op that caused it."
    ),
    builder="traceql.link.host_sync:blocking_calls",
    scope="rank",
    reads=["host_ops", "runtime", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "step": (I64, "training step (null outside any step)"),
        "ts": (I64, "start, ns on the rank's clock"),
        "end": (I64, "end, ns on the rank's clock"),
        "tid": (I64, "host thread"),
        "call": (STR, "the blocking runtime call"),
        "host_op": (STR, "innermost host op that caused it"),
        "blocked_ms": (F64, "host time blocked (ms)"),
    },
)
_table(
    "host_syncs",
    doc=(
        "One row per rank, step, call and causing host op: how many blocking calls and how long the host was blocked."
    ),
    builder="traceql.link.host_sync:host_syncs",
    scope="rank",
    reads=["blocking_calls", "warmup_steps"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "call": (STR, "the blocking runtime call"),
        "host_op": (STR, "innermost host op that caused it"),
        "region": (STR, "host_op without its trailing F/A compile id"),
        "n": (U32, "blocking calls"),
        "blocked_ms": (F64, "host time blocked (ms)"),
        "warmup": (BOOL, "the step is a warm-up step"),
    },
)
_table(
    "gemm_classes",
    doc=(
        "One row per rank and precision class of its GEMM kernels, read from the kernel names (low: bf16/fp16/fp8/"
        "int8; fp32: fp32/tf32 and nothing narrower; unknown: no type in the name, e.g. Triton): launches, GPU time, "
        "and the class's most launched kernel."
    ),
    builder="traceql.link.precision:gemm_classes",
    scope="rank",
    reads=["kernels"],
    columns={
        "rank": (I32, "global rank"),
        "precision": (STR, "low, fp32 or unknown"),
        "kernels": (I64, "launches of GEMM kernels of the class"),
        "dur": (I64, "their summed GPU time (ns)"),
        "example": (STR, "the class's most launched kernel (name without parameter list; ties: the first name)"),
    },
)

# compile ---------------------------------------------------------------------------------------------------------
_table(
    "compile_evidence",
    doc=(
        "compile_events from the best source per rank and kind of event (TORCH_TRACE, then TORCH_LOGS, then "
        "TORCH_COMPILE_DEBUG), rows from logs that name no compile id adopted into the compile id they belong to, and "
        "the detail fields rules read as columns: every compile fact per rank and compile id."
    ),
    builder="traceql.link.compile:compile_evidence",
    scope="rank",
    reads=["compile_events"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "compile_id": (STR, "torch.compile id frame/attempt"),
        "frame_id": (I64, "dynamo frame id"),
        "attempt": (I64, "compile attempt"),
        "kind": (STR, "as compile_events.kind"),
        "ts": (I64, "when the event was logged (ns)"),
        "dur": (I64, "its duration (ns)"),
        "function": (STR, "co_name of the compiled frame"),
        "filename": (STR, "file of the compiled frame"),
        "line": (I64, "line number in the log"),
        "reason": (STR, "the reason the log gives"),
        "guard": (STR, "the failed guard"),
        "user_frame": (STR, "file:line of the user code"),
        "cache_key": (STR, "FX graph cache key"),
        "components": (STR, "JSON: cache-key component -> hash"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "op_index": (I64, "index of the op in its graph"),
        "detail": (STR, "JSON with whatever else the record held"),
        "phase": (STR, "a compile record's phase: forward or backward (detail.phase)"),
        "recompile_limit": (I64, "the recompile limit a cache_limit event names (detail.limit)"),
        "backend": (STR, "a failed compile's backend (detail.backend)"),
        "category": (STR, "a failed compile's class of failure (detail.category)"),
        "cache": (STR, "a cache event's cache: fx_graph, aot_autograd, ... (detail.cache)"),
        "graph": (STR, "a graph op's graph: post_grad (what inductor runs), aot or dynamo (detail.graph)"),
        "graph_no": (I64, "which copy of that graph the op is in, in log order (detail.graph_no)"),
        "source_kind": (STR, "the kind of log the row comes from: torch_trace, torch_logs or compile_debug"),
        "suppress_errors": (BOOL, "a failed compile: suppress_errors was on, the frame ran eager (true), or the error "
                                  "reached the program (false); from the failure's record or a WON'T CONVERT report "
                                  "of the same function on the rank; null where no log says"),
    },
)
_table(
    "compiled_regions",
    doc="One row per rank, step and compiled region or FX graph call: how often it ran and for how long.",
    builder="traceql.link.compile:compiled_regions",
    scope="rank",
    reads=["compile_events", "compile_evidence", "host_ops"],
    columns={
        "rank": (I32, "global rank"),
        "step": (I64, "training step (null outside any step)"),
        "compile_id": (STR, "torch.compile id frame/attempt"),
        "cache_key": (STR, "FX graph cache key"),
        "what": (STR, "region (Torch-Compiled Region) or fx_graph (Call CompiledFxGraph)"),
        "calls": (U32, "times it ran in the step"),
        "total_ms": (F64, "their summed host time (ms)"),
    },
)
_table(
    "compile_cache_divergence",
    doc=(
        "One row per rank and graph whose FX graph cache key differs from the majority's, with the key components "
        "that differ."
    ),
    builder="traceql.link.compile:compile_cache_divergence",
    scope="run",
    reads=["compile_evidence"],
    columns={
        "rank": (I32, "global rank"),
        "compile_id": (STR, "torch.compile id frame/attempt"),
        "divergence": (STR, "the kind of difference (components, missing graph, ...)"),
        "graphs": (STR, "graphs named"),
        "n_graphs": (I64, "graphs compared"),
        "cache_key": (STR, "FX graph cache key"),
        "majority_key": (STR, "the majority's cache key"),
        "majority_ranks": (STR, "ranks holding the majority value"),
        "n_ranks": (U32, "ranks compared"),
        "n_differing": (I64, "key components that differ"),
        "differing": (STR, "the components that differ"),
        "differing_values": (STR, "their values here and on the majority"),
        "graphs_here": (I64, "graphs compiled on this rank"),
        "graphs_majority": (I64, "graphs compiled on the majority"),
        "present_on": (STR, "ranks that compiled the graph"),
        "missing_on": (STR, "ranks that did not"),
        "note": (STR, "the sentence the rule's message prints"),
    },
)
_table(
    "compile_divergence_groups",
    doc=(
        "compile_cache_divergence with the odd ranks grouped as people read them: one row per group of odd ranks and "
        "kind of difference."
    ),
    builder="traceql.link.compile:compile_divergence_groups",
    scope="run",
    reads=["compile_cache_divergence"],
    columns={
        "ranks": (RANKS, "the ranks of the row"),
        "ranks_text": (STR, "the ranks as people read them (0-2,5)"),
        "divergence": (STR, "the kind of difference (components, missing graph, ...)"),
        "compile_id": (STR, "torch.compile id frame/attempt"),
        "compile_ids": (STR, "the compile ids concerned"),
        "n_compile_ids": (U32, "how many"),
        "graphs": (STR, "graphs named"),
        "n_graphs": (I64, "graphs compared"),
        "cache_key": (STR, "FX graph cache key"),
        "majority_key": (STR, "the majority's cache key"),
        "majority_ranks": (STR, "ranks holding the majority value"),
        "n_ranks": (U32, "ranks compared"),
        "n_differing": (I64, "key components that differ"),
        "differing": (STR, "the components that differ"),
        "differing_values": (STR, "their values here and on the majority"),
        "graphs_here": (I64, "graphs compiled on this rank"),
        "graphs_majority": (I64, "graphs compiled on the majority"),
        "present_on": (STR, "ranks that compiled the graph"),
        "missing_on": (STR, "ranks that did not"),
        "truncated": (BOOL, "more groups than shown"),
        "note": (STR, "the sentence the rule's message prints"),
    },
)
_table(
    "graph_collectives",
    doc=(
        "One row per collective inside a compiled graph, with the wait that consumes it and the compute ops between "
        "them."
    ),
    builder="traceql.link.compile:graph_collectives",
    scope="rank",
    reads=["compile_evidence"],
    columns={
        "rank": (I32, "global rank"),
        "compile_id": (STR, "torch.compile id frame/attempt"),
        "graph": (STR, "the graph (compile id or FX key)"),
        "graph_no": (I64, "graph order within the compile id"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "op_index": (I64, "index of the op in its graph"),
        "wait_index": (I64, "op index of the wait_tensor that consumes it"),
        "ops_between": (I64, "ops between the collective and its wait"),
        "compute_between": (I64, "compute ops among them (views, copies and other collectives are not compute); null where no wait consumes it"),
        "function": (STR, "co_name of the compiled frame"),
    },
)

# nccl and flight recorder ----------------------------------------------------------------------------------------
# Facts only (what the logs and dumps state, and what no single row holds); each rule's logic is in its YAML.
_COMM = {
    "rank": (I32, "global rank"),
    "source": (I32, "source id (run.sources) the row comes from"),
    "comm_id": (STR, "NCCL communicator id"),
    "comm_rank": (I32, "rank within the communicator"),
    "nranks": (I32, "ranks in the communicator"),
    "nnodes": (I32, "nodes in the communicator, where NCCL prints nNodes"),
    "host": (STR, "host name"),
    "pid": (I64, "host process"),
    "cuda_dev": (I32, "CUDA device of the communicator"),
    "bus_id": (STR, "PCI bus id of the GPU"),
    "version": (STR, "NCCL version"),
    "network": (STR, "NCCL network (IB, Socket)"),
    "transports": (STR, 'JSON list of transports, e.g. ["P2P/CUMEM", "SHM"]'),
    "channels": (I32, "NCCL coll channels"),
    "trees": (STR, "tree topology text"),
    "rings": (STR, "ring topology text"),
    "env": (STR, "JSON object of the NCCL_* echoes"),
    "init_ms": (F64, "communicator init time (ms)"),
}
_EVENT = {
    "rank": (I32, "global rank"),
    "source": (I32, "source id (run.sources) the row comes from"),
    "kind": (STR, "as nccl_events.kind (error, ib_error, watchdog_timeout, dump_signal, pg_env, ...)"),
    "ts": (I64, "wall-clock ns where the log carries a time, else null"),
    "line": (I64, "line number in the log"),
    "level": (STR, "log level (I, W, E, INFO, WARN)"),
    "comm_id": (STR, "NCCL communicator id"),
    "pg_name": (STR, "process group name"),
    "seq": (I64, "sequence number within the group"),
    "op": (STR, "collective op as the log names it"),
    "numel_in": (I64, "input elements"),
    "numel_out": (I64, "output elements"),
    "timeout_ms": (I64, "the collective timeout (ms)"),
    "ran_ms": (I64, "how long the op ran before the timeout (ms)"),
    "text": (STR, "the log line's text"),
    "detail": (STR, "JSON with the rest of the record"),
}
_table(
    "nccl_comm_info",
    doc=(
        "One row per nccl_comms row (a communicator on a rank, or a process's NCCL version line), numbered by comm_row, "
        "with its JSON detail parsed and the communicator's node count across ranks."
    ),
    builder="traceql.link.nccl:nccl_comm_info",
    scope="run",
    reads=["nccl_comms"],
    columns={
        "comm_row": (I64, "the row's number; nccl_comm_env and nccl_comm_ifs rows name it"),
        **_COMM,
        "process_only": (BOOL, "a process's NCCL version line, no communicator"),
        "n_hosts": (U32, "distinct hosts seen for the communicator id"),
        "nodes": (I64, "nodes the communicator spans: nnodes or n_hosts, whichever is larger (1 where unknown)"),
        "n_ib_devices": (U32, "InfiniBand/RoCE devices NCCL lists (NET/IB)"),
        "bootstrap_if": (STR, "the bootstrap interface NCCL names"),
        "plugin": (STR, "the net plugin (internal, or the plugin's name)"),
        "gdr_off_why": (STR, "NCCL's reason on the first NIC without GPUDirect RDMA ('disabled' where none)"),
        "p2p_disabled_pairs": (U32, "GPU pairs NCCL reports P2P disabled between"),
        **{f"timing_{p}_s": (F64, f"Init timings (NCCL >= 2.22): {p} (s)") for p in
           ("kernels", "alloc", "bootstrap", "allgathers", "topo", "graphs", "connections", "rest")},
    },
)
_table(
    "nccl_comm_env",
    doc="One row per NCCL_* variable a communicator's lines echo (nccl_comms.env), by comm_row.",
    builder="traceql.link.nccl:nccl_comm_env",
    scope="run",
    reads=["nccl_comm_info"],
    columns={
        "comm_row": (I64, "nccl_comm_info.comm_row"),
        "rank": (I32, "global rank"),
        "comm_id": (STR, "NCCL communicator id"),
        "var": (STR, "the variable (NCCL_ALGO, NCCL_P2P_DISABLE, ...)"),
        "value": (STR, "its value as echoed"),
    },
)
_table(
    "nccl_comm_ifs",
    doc="One row per network interface a communicator's lines name: its sockets' interfaces in order, and bootstrap's.",
    builder="traceql.link.nccl:nccl_comm_ifs",
    scope="run",
    reads=["nccl_comms"],
    columns={
        "comm_row": (I64, "nccl_comm_info.comm_row"),
        "rank": (I32, "global rank"),
        "comm_id": (STR, "NCCL communicator id"),
        "role": (STR, "socket (NET/Socket's interfaces) or bootstrap"),
        "pos": (I64, "order within the role, as NCCL lists them"),
        "interface": (STR, "interface name (eth0, ib0, docker0, lo, ...)"),
    },
)
_table(
    "nccl_pg_env",
    doc=(
        "One row per setting of a ProcessGroupNCCL 'environments' or 'initialization options' line: "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING, TIMEOUT(ms), size, PG Name, ..."
    ),
    builder="traceql.link.nccl:nccl_pg_env",
    scope="rank",
    reads=["nccl_events"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "line": (I64, "line number in the log"),
        "ts": (I64, "wall-clock ns where the log carries a time, else null"),
        "what": (STR, "ProcessGroupNCCL environments or ProcessGroupNCCL initialization options"),
        "pg_name": (STR, "process group name"),
        "var": (STR, "the setting's name as printed"),
        "value": (STR, "its value as printed"),
    },
)
_table(
    "nccl_event_info",
    doc=(
        "nccl_events with their detail parsed, which ranks only detected a timeout (they signalled the dump), and the "
        "root-cause candidate: the earliest timestamped error (error, ib_error, net_error, duplicate_gpu, "
        "collective_mismatch) of a rank that did not merely detect, else the only rank's first error."
    ),
    builder="traceql.link.nccl:nccl_event_info",
    scope="run",
    reads=["nccl_events"],
    columns={
        **_EVENT,
        "trail": (STR, "NCCL's return-code trail of the error"),
        "retcode": (I64, "NCCL return code"),
        "role": (STR, "of a dump signal: detector (the rank detected the timeout) or the other side"),
        "stuck_s": (STR, "of a heartbeat timeout: seconds the watchdog was stuck"),
        "ranks": (RANKS, "the ranks the event names (a duplicate GPU's ranks)"),
        "host": (STR, "the host the event names"),
        "bus_id": (STR, "the GPU bus id the event names"),
        "detector": (BOOL, "the rank signalled the dump after detecting a timeout: it reports, it did not cause"),
        "root_cause": (BOOL, "the run's root-cause candidate error"),
    },
)
_table(
    "nccl_watchdog",
    doc=(
        "One row per process group (unnamed: '0') and rank: the rank's first watchdog timeout, with the collective "
        "most reporting ranks of the group time out in (ties: the lower seq)."
    ),
    builder="traceql.link.nccl:nccl_watchdog",
    scope="run",
    reads=["nccl_events"],
    columns={
        "pg_name": (STR, "process group name ('0' where the line names none)"),
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "ts": (I64, "wall-clock ns where the log carries a time, else null"),
        "line": (I64, "line number in the log"),
        "seq": (I64, "SeqNum of the collective the rank timed out in"),
        "op": (STR, "its OpType"),
        "timeout_ms": (I64, "the collective timeout (ms)"),
        "ran_ms": (I64, "how long it ran before timing out (ms)"),
        "majority_seq": (I64, "SeqNum most reporting ranks of the group time out in"),
        "majority_op": (STR, "its OpType"),
        "majority_ranks": (STR, "the ranks timing out in it, comma-separated"),
        "n_variants": (I64, "distinct (seq, op) the group's ranks time out in"),
        "n_reporting": (I64, "ranks of the group reporting a watchdog timeout"),
    },
)
_table(
    "nccl_world",
    doc=(
        "The job's ranks as the run states its world size (ProcessGroupNCCL 'size' of the default group, NCCL's "
        "nranks, a traced collective's group size: the largest), one row per rank; none where nothing states it."
    ),
    builder="traceql.link.nccl:nccl_world",
    scope="run",
    reads=["collectives", "nccl_comms", "nccl_events"],
    columns={
        "world_rank": (I32, "a rank of the job"),
        "world_size": (I64, "the job's world size"),
        "origin": (STR, "where it is stated"),
        "logged": (BOOL, "the rank left a line in the NCCL/ProcessGroupNCCL logs here (false: died first, or its log "
                         "was not collected)"),
    },
)
_table(
    "nccl_desync_reports",
    doc="What PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG) says of which ranks, one row per claim.",
    builder="traceql.link.nccl:nccl_desync_reports",
    scope="run",
    reads=["nccl_events"],
    columns={
        "what": (STR, "never joined any collective, joined but did not finish, finished but did not join the next"),
        "rank": (RANKS, "the ranks the report names"),
        "seq": (I64, "the collective's number"),
        "pg_name": (STR, "process group name (the default group, '0')"),
        "text": (STR, "the report line"),
        "detail": (STR, "the claim in words: what, and collective #seq"),
    },
)
_table(
    "fr_entries",
    doc="Flight Recorder entries: collectives rows from dumps, one per entry (a dump read as pickle and JSON counts once).",
    builder="traceql.link.nccl:fr_entries",
    scope="rank",
    reads=["collectives"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "id": (I64, "the entry's id in collectives"),
        "op": (STR, "canonical collective op (all_reduce, ...)"),
        "backend": (STR, "nccl, gloo, ..."),
        "pg_name": (STR, "process group name"),
        "pg_desc": (STR, "process group description"),
        "pg_ranks": (STR, "JSON list of the group's global ranks"),
        "group_size": (I32, "ranks in the process group"),
        "seq": (I64, "sequence number within the group"),
        "in_nelems": (I64, "input elements"),
        "out_nelems": (I64, "output elements"),
        "dtype": (STR, "element type"),
        "bytes": (I64, "message size in bytes"),
        "ts": (I64, "start (ns)"),
        "end": (I64, "end (ns)"),
        "dur": (I64, "duration (ns)"),
        "host_op_id": (I64, "the host op that issued it"),
        "kernel_ts": (I64, "its kernel's start (ns)"),
        "kernel_end": (I64, "its kernel's end (ns)"),
        "step": (I64, "training step"),
        "state": (STR, "the entry's state (scheduled, started, completed)"),
    },
)
_table(
    "fr_group_members",
    doc=(
        "The ranks each Flight Recorder group holds as the dumps state them: the group's pg_ranks, else (the default "
        "group) the ranks below its size."
    ),
    builder="traceql.link.nccl:fr_group_members",
    scope="run",
    reads=["fr_entries"],
    columns={
        "pg_name": (STR, "process group name"),
        "rank": (I32, "a rank of the group"),
    },
)
_table(
    "nccl_comm_collectives",
    doc=(
        "One row per rank and communicator: the collectives it carried and their bytes, with its transports and "
        "channels."
    ),
    builder="traceql.link.nccl:nccl_comm_collectives",
    scope="rank",
    reads=["collectives", "nccl_comms"],
    columns={
        "rank": (I32, "global rank"),
        "comm_id": (STR, "NCCL communicator id"),
        "nranks": (I32, "ranks in the communicator"),
        "pg_name": (STR, "process group name"),
        "pg_desc": (STR, "process group description"),
        "n_collectives": (U32, "collectives counted"),
        "bytes": (I64, "message size in bytes"),
        "transports": (STR, "JSON list of transports"),
        "channels": (I32, "NCCL channels"),
    },
)

# inputs ----------------------------------------------------------------------------------------------------------
_table(
    "input_stall",
    doc=(
        "One row per rank, source and step: how long the training loop waited for its next batch, what it cost the "
        "GPU, and the pinning and host-to-device copies beside it."
    ),
    builder="traceql.link.input_pipeline:input_stall",
    scope="rank",
    reads=["host_ops", "kernels", "steps"],
    columns={
        "rank": (I32, "global rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "step": (I64, "training step (null outside any step)"),
        "step_ms": (F64, "the step's time: the longer of its host range and its GPU span (ms)"),
        "loader_ms": (F64, "union of the DataLoader __next__ ranges in the step (ms)"),
        "loader_calls": (I64, "__next__ calls in the step"),
        "stall_ms": (F64, "what the wait cost: GPU idle inside the ranges, or the whole loader time without GPU (ms)"),
        "stall_pct": (F64, "stall_ms over step_ms (%)"),
        "gpu_side": (BOOL, "the source has GPU activity"),
        "iterator": (STR, "DataLoader iterator class"),
        "workers": (STR, "worker setting, in words"),
        "pin_ms": (F64, "pin_memory host time in the step (ms)"),
        "h2d_ms": (F64, "host-to-device memcpy GPU time in the step (ms)"),
        "h2d_pageable": (I64, "of those copies, from pageable memory"),
    },
)
_table(
    "source_problems",
    doc=(
        "One row per source problem found while resolving ranks: two sources that claim one rank, copies of one file "
        "(rank-collision), ranks the run's world size names that no source holds (missing-rank, one row per run)."
    ),
    builder="traceql.link.ranks:source_problems",
    scope="run",
    reads=[],
    columns={
        "rank": (I32, "global rank (null for missing-rank)"),
        "kind": (STR, "the source's kind"),
        "problem": (STR, "rank-collision or missing-rank"),
        "source": (I32, "source id (run.sources) the row comes from"),
        "path": (STR, "the source's file"),
        "origin": (STR, "where the source's rank came from"),
        "kept_source": (I32, "the source kept for the rank"),
        "kept": (STR, "its file"),
        "kept_origin": (STR, "where its rank came from"),
        "detail": (STR, "what happened, in words"),
        "world_size": (I64, "missing-rank: the world size the source states"),
        "missing": (STR, "missing-rank: the ranks no source holds, as ranges (1-7, 9)"),
        "n_missing": (I64, "missing-rank: how many ranks no source holds"),
        "n_present": (I64, "missing-rank: how many of the world's ranks some source holds"),
    },
)
_table(
    "source_errors",
    doc=(
        "One row per source that could not be read at all (status error): damaged or empty traces, a file named like "
        "a trace whose content is none, a source past its time or memory budget, a read or rank task that failed on a "
        "Dask cluster. Built from the run's sources once every read has finished."
    ),
    builder="traceql.link.ranks:source_errors",
    scope="run",
    reads=[],
    columns={
        "rank": (I32, "the rank the source holds or its file name says, if any"),
        "kind": (STR, "the source's kind (unknown when not even that could be told)"),
        "source": (I32, "source id (run.sources)"),
        "path": (STR, "the source's file, relative to the run dir"),
        "detail": (STR, "why it could not be read and what to do"),
    },
)
_table(
    "source_partials",
    doc=(
        "One row per source read only in part (status partial): a trace cut short (a gzip stream or JSON that ends "
        "early keeps its complete events), an nsys export or a TORCH_TRACE log with damaged stretches. Built from "
        "the run's sources once every read has finished."
    ),
    builder="traceql.link.ranks:source_partials",
    scope="run",
    reads=[],
    columns={
        "rank": (I32, "the rank the source holds or its file name says, if any"),
        "kind": (STR, "the source's kind"),
        "source": (I32, "source id (run.sources)"),
        "path": (STR, "the source's file, relative to the run dir"),
        "detail": (STR, "what was kept and where the read stopped"),
    },
)



def schema(name: str) -> dict[str, pl.DataType]:
    """The columns and dtypes of a canonical or derived table; KeyError for any other name."""
    if name in SCHEMAS:
        return SCHEMAS[name]
    return DERIVED[name].schema


def empty(name: str) -> pl.DataFrame:
    """An empty frame of a canonical or derived table's schema (what load-time validation runs SQL on)."""
    return pl.DataFrame(schema=schema(name))


def canonical_reads(name: str) -> set[str]:
    """The canonical tables a table is built from, following derived tables down to them."""
    if name in SCHEMAS:
        return {name}
    out: set[str] = set()
    for r in DERIVED[name].reads:
        out |= canonical_reads(r)
    return out
