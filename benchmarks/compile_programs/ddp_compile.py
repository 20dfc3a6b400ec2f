"""2-rank gloo DDP + torch.compile on CPU.

DIVERGE=1: rank 1 uses a different batch size -> different FX graph cache keys on rank 1.
OVERLAP=1: the funcol all_reduce in global_grad_norm has a matmul between it and its wait_tensor;
OVERLAP=0: the all_reduce result is used at once (all_reduce immediately followed by wait_tensor).
Each rank gets its own inductor cache dir so both compile cold.
Run: DIVERGE=1 OVERLAP=0 TORCH_TRACE=$PWD/tt TORCH_LOGS=recompiles,graph_breaks \
     torchrun --nproc_per_node 2 ddp_compile.py
"""
import os

os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
    os.environ.get("CACHE_ROOT", "/tmp/tq_inductor"), f"rank{os.environ.get('RANK', '0')}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(3)])
        self.head = nn.Linear(512, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


@torch.compile
def grad_norm_serial(t):
    sq = (t * t).sum().reshape(1)
    return funcol.all_reduce(sq, "sum", dist.group.WORLD).sqrt()


@torch.compile
def grad_norm_overlap(t, a, b):
    sq = (t * t).sum().reshape(1)
    r = funcol.all_reduce(sq, "sum", dist.group.WORLD)
    other = (a @ b).sum().reshape(1)  # independent compute between the collective and its wait
    return r.sqrt() + other * 0


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=1)  # ~1 MiB per 512x512 layer: DDPOptimizer splits per layer
    cmodel = torch.compile(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    bs = 8
    if os.environ.get("DIVERGE") == "1" and rank == 1:
        bs = 6
    for _ in range(3):
        loss = cmodel(torch.randn(bs, 512)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    w = model.head.weight.detach()
    if os.environ.get("OVERLAP") == "1":
        a = torch.randn(64, 64)
        gn = grad_norm_overlap(w, a, a)
    else:
        gn = grad_norm_serial(w)
    print(f"rank{rank} grad norm {gn.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
