"""One process that shows, on any torch from 2.1 on, the three compile facts traceql reads per torch version:
two graph breaks in forward (Tensor.item, print), a recompile storm (dynamic=False fed 12 shapes; the recompile
limit, 8, is hit), and a compile failure (a backend that raises, suppressed to eager by suppress_errors=True).
Run: TORCH_TRACE=$PWD/tt TORCH_LOGS=recompiles,graph_breaks python probe.py
MODE=raise: the failing backend is not suppressed (BackendCompilerFailed reaches the caller, which catches it).
"""
import os

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        s = h.sum().item()  # graph break: Tensor.item()
        print("hsum", round(s, 3))  # graph break: print
        if s > 0:
            h = h * 2
        return self.l2(h)


def storm(x, w):
    return torch.nn.functional.gelu(x @ w).sum(dim=-1)


def broken(x):
    return torch.sin(x) + 1


def failing_backend(gm, example_inputs):
    raise RuntimeError("failing_backend: refusing to compile this graph (planted failure)")


torch.manual_seed(0)
cm = torch.compile(MLP())
x = torch.randn(4, 16)
cm(x).sum().backward()

cs = torch.compile(storm, dynamic=False)
w = torch.randn(8, 8)
for n in range(1, 13):
    cs(torch.randn(n, 8), w)

cb = torch.compile(broken, backend=failing_backend)
if os.environ.get("MODE") == "raise":
    try:
        cb(torch.randn(4))
    except Exception as e:  # BackendCompilerFailed
        print("caught", type(e).__name__)
else:
    torch._dynamo.config.suppress_errors = True
    cb(torch.randn(4))  # falls back to eager
print("torch", torch.__version__)
