#!/usr/bin/env python3
"""Backward through autograd, as a user times it: tessera's public functions against torch's.

    python benchmarks/autograd.py [--rounds R] [--ops softmax,layer_norm] [--out DIR]

For each op, the forward runs once on inputs that require grad; the timed call is
torch.autograd.grad(output, inputs, grad_output, retain_graph=True): the autograd engine, the
backward node's host work and its kernels, what a training step pays. Timing is triton's
do_bench (the L2 flushed before each call, median of the calls) where triton is installed,
tessera.bench.do_bench with the same settings otherwise. Providers are interleaved within each of
R rounds and each case reports the median over rounds; "torch2" times torch a second time, so
torch2 / torch is the harness's own noise.

Sizes: softmax and log_softmax over the row-wise benchmark's sizes from 4096 x 256 up (rows =
min(4096, 2^26 / N)); layer_norm (dx, dw, db) and rms_norm (dx, dw) at 4096 x N for N in 1024,
4096 and 8192. float32 and bfloat16.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import tessera
from common import interleaved_ms, timer_name, write_results

def rows_for(n: int) -> int:
    return min(4096, (1 << 26) // n)


def cases(ops, dtypes):
    """(op, dtype, shape, {provider: forward}) where forward(x, w, b) returns the output."""
    softmax_sizes = [256 << i for i in range(0, 9)]  # 256 .. 65536
    norm_sizes = [1024, 4096, 8192]
    for dt in dtypes:
        if "softmax" in ops:
            for n in softmax_sizes:
                yield "softmax", dt, (rows_for(n), n), {
                    "tessera": lambda x, w, b: tessera.softmax(x, -1),
                    "torch": lambda x, w, b: torch.softmax(x, -1)}
        if "log_softmax" in ops:
            for n in softmax_sizes:
                yield "log_softmax", dt, (rows_for(n), n), {
                    "tessera": lambda x, w, b: tessera.log_softmax(x, -1),
                    "torch": lambda x, w, b: torch.log_softmax(x, -1)}
        if "layer_norm" in ops:
            for n in norm_sizes:
                yield "layer_norm", dt, (4096, n), {
                    "tessera": lambda x, w, b: tessera.layer_norm(x, (x.shape[-1],), w, b),
                    "torch": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)}
        if "rms_norm" in ops:
            for n in norm_sizes:
                yield "rms_norm", dt, (4096, n), {
                    "tessera": lambda x, w, b: tessera.rms_norm(x, (x.shape[-1],), w, 1e-6),
                    "torch": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6)}


def backward_call(op, forward, x, w, b, g):
    """A call of torch.autograd.grad through `forward`'s retained graph, and the inputs it
    differentiates."""
    inputs = [x] + ([w, b] if op == "layer_norm" else [w] if op == "rms_norm" else [])
    y = forward(x, w, b)
    return (lambda: torch.autograd.grad(y, inputs, g, retain_graph=True)), inputs


def check(op, dtype, got, want):
    """Each gradient within a tolerance of torch's, relative to its largest value: the column sums
    of dw and db add thousands of terms in another order."""
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, (a, e) in enumerate(zip(got, want)):
        err = (a.float() - e.float()).abs().max().item()
        scale = e.float().abs().max().item()
        if not err <= tol * max(scale, 1e-6):
            raise AssertionError(f"{op} {dtype}: gradient {i} differs from torch's by {err} "
                                 f"(largest value {scale})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default="softmax,log_softmax,layer_norm,rms_norm")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ops = set(args.ops.split(","))
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    rows = []
    for op, dt, shape, fwd in cases(ops, dtypes):
        x = torch.randn(shape, device="cuda", dtype=dt).requires_grad_()
        w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", dtype=dt)).requires_grad_()
        b = (0.1 * torch.randn(shape[-1], device="cuda", dtype=dt)).requires_grad_()
        g = torch.randn(shape, device="cuda", dtype=dt)
        calls = {k: backward_call(op, f, x, w, b, g)[0] for k, f in fwd.items()}
        check(op, dt, calls["tessera"](), calls["torch"]())
        calls["torch2"] = calls["torch"]
        med = {k: v * 1e3 for k, v in interleaved_ms(calls, args.rounds).items()}
        row = {"op": op, "dtype": str(dt).replace("torch.", ""), "shape": f"{shape[0]}x{shape[1]}",
               **{k: round(v, 2) for k, v in med.items()},
               "speedup": round(med["torch"] / med["tessera"], 3),
               "harness": round(med["torch"] / med["torch2"], 3)}
        rows.append(row)
        print(f"{op:12s} {row['dtype']:9s} {row['shape']:>11s}  tessera {med['tessera']:8.2f} us"
              f"  torch {med['torch']:8.2f} us  torch/tessera {row['speedup']:.2f}"
              f"  (torch/torch2 {row['harness']:.2f})", flush=True)
    lines = ["| op | dtype | shape | tessera (us) | torch (us) | torch2 (us) | torch / tessera | "
             "torch / torch2 |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['tessera']:.2f} | {r['torch']:.2f} | "
              f"{r['torch2']:.2f} | {r['speedup']:.2f} | {r['harness']:.2f} |" for r in rows]
    table = "\n".join(lines)
    print("==== final table (backward through autograd, median of rounds)")
    print(table)
    if args.out:
        write_results(args.out, "autograd", {"rounds": args.rounds, "timer": timer_name()}, rows, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
