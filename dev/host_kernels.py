#!/usr/bin/env python3
"""What one differentiable call costs the host, op by op: the forward on 64 x 256 float32 inputs
that require grad, then its backward (or, for the *_nograd cases, the forward alone) (benchmarks/overhead.py's autograd cases), under
torch.profiler for tessera and torch. Per provider: the CUDA kernels launched per call, and the
host events (runtime calls, aten ops, autograd nodes) with their count and CPU time per call.

    python dev/host_kernels.py [--ops rms_norm,layer_norm,gelu,log_softmax] [--calls 50]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tessera


def cases():
    d = "cuda"
    x = torch.randn(64, 256, device=d, requires_grad=True)
    w = torch.randn(256, device=d, requires_grad=True)
    b = torch.randn(256, device=d, requires_grad=True)
    g = torch.randn(64, 256, device=d)
    y = torch.randn(64, 256, device=d)
    m = torch.randn(256, 256, device=d)
    t = torch.randint(0, 256, (64,), device=d)

    def no_grad(f):
        return torch.no_grad()(f)

    def fb(f):
        return lambda: torch.autograd.backward(f(), g)
    return {
        "rms_norm": (fb(lambda: tessera.rms_norm(x, (256,), w, 1e-6)), fb(lambda: F.rms_norm(x, (256,), w, 1e-6))),
        "layer_norm": (fb(lambda: tessera.layer_norm(x, (256,), w, b)), fb(lambda: F.layer_norm(x, (256,), w, b))),
        "gelu": (fb(lambda: tessera.gelu(x)), fb(lambda: F.gelu(x))),
        "log_softmax": (fb(lambda: tessera.log_softmax(x, -1)), fb(lambda: torch.log_softmax(x, -1))),
        "silu": (fb(lambda: tessera.silu(x)), fb(lambda: F.silu(x))),
        "add": (fb(lambda: tessera.add(x, y)), fb(lambda: torch.add(x, y))),
        "dropout": (fb(lambda: tessera.dropout(x, 0.1)), fb(lambda: F.dropout(x, 0.1))),
        "cross_entropy": (lambda: tessera.cross_entropy(x, t).backward(), lambda: F.cross_entropy(x, t).backward()),
        "cross_entropy_nograd": (no_grad(lambda: tessera.cross_entropy(x, t)), no_grad(lambda: F.cross_entropy(x, t))),
        "matmul_nograd": (no_grad(lambda: tessera.matmul(x, m)), no_grad(lambda: torch.matmul(x, m))),
    }


def show(name, fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.count < calls:  # the profiler's own and one-off events
            continue
        rows.append((e.cpu_time_total / calls, e.count / calls, e.key, e.device_time_total / calls))
    rows.sort(reverse=True)
    print(f"-- {name}: per call (host us, count, event, device us)")
    for cpu, count, key, dev in rows[:28]:
        print(f"   {cpu:8.1f} {count:5.1f}  {key[:90]:90s} {dev:7.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="rms_norm,layer_norm,gelu,log_softmax")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    all_cases = cases()
    for op in args.ops.split(","):
        ours, theirs = all_cases[op]
        show(f"{op} tessera", ours, args.calls)
        show(f"{op} torch", theirs, args.calls)


if __name__ == "__main__":
    main()
