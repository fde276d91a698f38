#!/usr/bin/env python3
"""The fused linear cross-entropy's kernels per chunk size (torch.profiler, one forward + backward
after a warm-up), tessera against Liger-Kernel, at the Llama step's sizes.
    python dev/lce_profile.py [--rows 8192 --hidden 2048 --vocab 128256] [--chunks 256,1024,4096]"""
import argparse
import sys

import torch

sys.path.insert(0, "benchmarks")
import peers  # noqa: E402
import tessera  # noqa: E402
from llama_report import profile_step  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=8192)
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--vocab", type=int, default=128256)
ap.add_argument("--chunks", default="256,1024,4096")
a = ap.parse_args()
x = (torch.randn(a.rows, a.hidden, device="cuda", dtype=torch.bfloat16) / 8).requires_grad_()
w = (torch.randn(a.vocab, a.hidden, device="cuda", dtype=torch.bfloat16) / 8).requires_grad_()
t = torch.randint(0, a.vocab, (a.rows,), device="cuda")
calls = {f"tessera chunk {c}": (lambda c=c: tessera.linear_cross_entropy(x, w, t, chunk_size=c))
         for c in map(int, a.chunks.split(","))}
if peers.LIGER is not None:
    calls["liger"] = lambda: peers.linear_cross_entropy(x, w, t)
for name, fn in calls.items():
    def step():
        return torch.autograd.grad(fn(), (x, w))
    step()
    rows = profile_step(step)
    print(f"== {name}: {sum(r[1] for r in rows):.2f} ms of kernels")
    for k, ms, n in rows[:8]:
        print(f"  {ms:8.3f} ms {n:5d}  {k[:150]}")
