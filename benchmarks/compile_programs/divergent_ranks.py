"""N-rank gloo torch.compile on CPU where some ranks compile differently (the last ODD ranks, default 2).

MODE=graph:    the odd ranks feed batches of 6 (the others 8) and take a rank-conditional graph break (print): their
               compile ids, cache keys and tensor shapes differ from the majority's.
MODE=schedule: the same batches everywhere, but on the odd ranks the compiled step also all_reduces the loss inside
               the graph, before the all_gather; the other ranks all_reduce it in eager code first, so every rank
               still issues all_reduce then all_gather at run time, while the compiled graphs' collective schedules
               differ (all_reduce, all_gather on the odd ranks vs all_gather on the others).
MODE=same:     every rank runs the same code (the quiet twin; run it twice with one rank's cache dir wiped in between
               to get a different FX graph cache hit/miss pattern on that rank).
Run: MODE=graph TORCH_TRACE=$PWD/tt torchrun --nproc_per_node 5 divergent_ranks.py
"""
import os

# one inductor cache dir per rank, so that each rank's hits and misses are its own
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
    os.environ.get("CACHE_ROOT", "/tmp/tq_inductor"), f"rank{os.environ.get('RANK', '0')}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

MODE = os.environ.get("MODE", "graph")
dist.init_process_group("gloo")
RANK, WORLD = dist.get_rank(), dist.get_world_size()
ODD = RANK >= WORLD - int(os.environ.get("ODD", "2"))
IN_GRAPH_REDUCE = MODE == "schedule" and ODD


def step(x, w):
    h = torch.relu(x @ w)
    loss = h.sum().reshape(1)
    if IN_GRAPH_REDUCE:  # a rank-dependent global: dynamo traces a different graph on the odd ranks
        loss = funcol.all_reduce(loss, "sum", dist.group.WORLD)
    if MODE == "graph" and ODD:
        print("rank", RANK, "takes a graph break here")
    gathered = funcol.all_gather_tensor(h.mean(dim=0), 0, dist.group.WORLD)
    return loss, gathered.sum()


cstep = torch.compile(step)
torch.manual_seed(0)
w = torch.randn(16, 16)
bs = 6 if MODE == "graph" and ODD else 8
for _ in range(2):
    x = torch.randn(bs, 16)
    if MODE == "schedule" and not ODD:
        dist.all_reduce(torch.ones(1))  # the all_reduce the odd ranks run inside their graph
    loss, g = cstep(x, w)
print(f"rank{RANK} mode {MODE} loss {float(loss):.3f} gathered {float(g):.3f}", flush=True)
dist.barrier()
dist.destroy_process_group()
