#!/usr/bin/env python3
"""Where the GPU waits in one training step: the step of benchmarks/transformers_step.py (Llama-3
8B layer shapes, 4 layers, 2 x 2048 tokens) under torch.profiler, the idle stretches between
consecutive kernels, the longest with the kernels on either side, and the idle total against the
step's span.

    python dev/step_gaps.py [--runs "tessera fp8 rowwise,tessera"] [--top 12]
"""
import argparse
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from transformers_step import build  # noqa: E402


def gaps(run, args):
    cfg = SimpleNamespace(layers=4, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, batch=2,
                          seq=2048, seed=0, attn="sdpa", experts_impl="grouped_mm", fit=False, head_dim=None)
    model = build(run, cfg, "llama")
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device="cuda")

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    idle = []
    for (s0, e0, n0), (s1, _, n1) in zip(kernels, kernels[1:]):
        if s1 - e0 > 5:
            idle.append((s1 - e0, n0, n1))
    span = kernels[-1][1] - kernels[0][0]
    busy = sum(e - s for s, e, _ in kernels)
    total = sum(g for g, _, _ in idle)
    print(f"== {run}: span {span / 1e3:.2f} ms, kernels {busy / 1e3:.2f} ms ({len(kernels)}), idle > 5 us "
          f"{total / 1e3:.2f} ms in {len(idle)} stretches, the rest {(span - busy - total) / 1e3:.2f} ms")
    for g, n0, n1 in sorted(idle, reverse=True)[:args.top]:
        print(f"  {g:8.1f} us  after {n0[:70]}  before {n1[:70]}")
    del model
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="tessera fp8 rowwise,tessera")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for run in args.runs.split(","):
        gaps(run, args)


if __name__ == "__main__":
    main()
