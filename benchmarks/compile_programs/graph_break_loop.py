"""torch.compile with two graph breaks in forward, run as a small training loop under torch.profiler.

Writes kineto_trace.json (ProfilerStep#N, Torch-Compiled Region, CompiledFxGraph events) into the cwd.
Run: TORCH_TRACE=$PWD/tt TORCH_LOGS=recompiles,graph_breaks python graph_break_loop.py
"""
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(64, 128)
        self.l2 = nn.Linear(128, 8)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        s = h.sum().item()  # graph break: Tensor.item()
        print("hsum", round(s, 3))  # graph break: print
        if s > 0:
            h = h * 2
        return self.l2(h)


torch.manual_seed(0)
m = MLP()
cm = torch.compile(m)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(32, 64)
cm(x).sum().backward()  # compile outside the profiler
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4),
             on_trace_ready=lambda p: p.export_chrome_trace("kineto_trace.json")) as prof:
    for _ in range(5):
        loss = cm(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()
