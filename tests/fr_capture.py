"""Captures the Flight Recorder fixtures (fixtures/nccl-fr-*) with real torch.distributed on CPU (gloo).

Run: python tests/fr_capture.py OUT_ROOT   (needs torch; not a test). Each scenario spawns WORLD processes that run a
few collectives, plant one pathology, and dump their Flight Recorder buffer as torch does (pickle) and as JSON.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

WORLD = 3


def _worker(rank: int, scenario: str, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="64")
    import torch
    import torch.distributed as dist
    import torch._C._distributed_c10d as c10d

    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=3))
    t = torch.ones(256)
    try:
        for _ in range(3):
            dist.all_reduce(t)
        if scenario == "op_mismatch" and rank == 1:
            dist.broadcast(t, 0)  # the others all_reduce here
        elif scenario == "size_mismatch":
            # rank 2 posts a larger buffer than the root sends (gloo aborts the process on the opposite mismatch)
            dist.broadcast(torch.ones(512) if rank == 2 else t, 0)
        elif scenario == "dead_rank" and rank == 2:
            os._exit(0)  # dies (quietly, so that spawn leaves its peers alone) before the 4th collective and leaves no dump behind
        elif scenario == "missing_rank" and rank == 2:
            pass  # rank 2 skips this collective and goes on
        else:
            dist.all_reduce(t)
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the planted fault makes gloo time out or fail; dump regardless
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
    dump = c10d._dump_fr_trace(True, False, False)
    Path(out, f"nccl_trace_rank_{rank}").write_bytes(dump)
    if scenario == "op_mismatch":  # the same dumps in torch's JSON form, as a run dir of their own
        Path(out + "-json").mkdir(exist_ok=True)
        Path(out + "-json", f"nccl_trace_rank_{rank}.json").write_bytes(c10d._dump_fr_trace_json(True, False))
    os._exit(0)  # skip destroy_process_group: peers of a broken job may be gone


def main() -> None:
    import torch
    import torch.multiprocessing as mp

    root = Path(sys.argv[1])
    todo = sys.argv[2:] or ["ok", "op_mismatch", "size_mismatch", "missing_rank", "dead_rank"]
    for i, scenario in enumerate(todo):
        out = root / f"nccl-fr-{scenario.replace('_', '-')}"
        out.mkdir(parents=True, exist_ok=True)
        mp.start_processes(_worker, args=(scenario, str(out), 29600 + i), nprocs=WORLD, join=True, start_method="spawn")
        for d in [out] + ([Path(str(out) + "-json")] if scenario == "op_mismatch" else []):
            (d / "manifest.json").write_text(json.dumps({
                "scenario": f"fr-{scenario}", "hand_made": False, "world_size": WORLD, "backend": "gloo",
                "torch": torch.__version__, "captured_by": "tests/fr_capture.py",
                "note": "real Flight Recorder dumps from torch.distributed gloo on CPU (collective timeout 3 s)",
            }, indent=1) + "\n")


if __name__ == "__main__":
    main()
