"""A recompile storm: torch.compile(dynamic=False) fed 12 batch sizes -> recompile_limit (8) hit, eager fallback.

MODE=auto keeps torch's default (dynamic=None): one recompile marks dim 0 dynamic, then none (the quiet twin).
Run: MODE=static TORCH_TRACE=$PWD/tt TORCH_LOGS=recompiles,graph_breaks python recompile_storm.py
"""
import os

import torch


def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(dim=-1)


mode = os.environ.get("MODE", "static")
cf = torch.compile(f, dynamic=False if mode == "static" else None)
w = torch.randn(8, 8)
for n in range(1, 13):
    cf(torch.randn(n, 8), w)
print("mode", mode, "recompile_limit", torch._dynamo.config.recompile_limit)
