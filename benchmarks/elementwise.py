#!/usr/bin/env python3
"""Elementwise operators against their peers, in one run, by one method.

    python benchmarks/elementwise.py [--quick] [--ops LIST] [--dtypes LIST] [--out DIR]

  add                   tessera.add(out=)  torch.add(out=)  a Triton vector-add kernel (out)
  gelu, gelu_tanh       tessera.gelu(out=) F.gelu           torch.compile(F.gelu)
  gelu_backward, gelu_tanh_backward
                        tessera.gelu_backward(out=)  torch.ops.aten.gelu_backward
  silu                  tessera.silu(out=) F.silu           torch.compile(F.silu)
  silu_backward         tessera.silu_backward(out=)  torch.ops.aten.silu_backward
  copy                  tessera.copy(src, dst)  dst.copy_(src)  torch.compile(dst.copy_(src)), src
                        a transposed view (rows x cols, the .t() of a contiguous cols x rows
                        tensor; rows = 2^floor(k/2) for a size of 2^k elements), dst contiguous

Sizes, input shapes, bytes and FLOPs are each op's description (tessera.bench.ops, the one
`tessera bench` times): its bench sizes, in elements (--quick: the smallest, a middle one and the
largest). dtypes: --dtypes (default float32,bfloat16) where the description supports them.
Random normal inputs. Before timing a case, every provider's output is checked against torch's; a
mismatch aborts the run. The bandwidth figures all count the bytes the description says the op
must move.

Output: the full table, CSV, JSON and one SVG per (op, dtype) in --out, and a ratio table
(tessera against torch, and tessera's share of the copy bandwidth measured in the same run).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tessera
from common import (Suite, add_selection_args, case, describe, dtype_name, dtypes_of, resolve_selection,
                    sizes_of)

OPS = ["add", "gelu", "gelu_tanh", "gelu_backward", "gelu_tanh_backward", "silu", "silu_backward",
       "copy"]

try:
    import triton
    import triton.language as tl
except ImportError:  # the Triton provider is left out, and the report says so
    triton = None


if triton is not None:
    @triton.jit
    def _vector_add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # One program per BLOCK elements; the mask covers the tail.
        start = tl.program_id(axis=0) * BLOCK
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n
        a = tl.load(a_ptr + offsets, mask=mask)
        b = tl.load(b_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, a + b, mask=mask)


def triton_add(a, b, out, block=1024):
    n = out.numel()
    _vector_add_kernel[(triton.cdiv(n, block),)](a, b, out, n, BLOCK=block)
    return out


def randn(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=dtype)


def bench_add(suite: Suite, bench, dtype, n: int) -> None:
    a, b = (randn(shape, dtype) for shape in bench.shapes[:2])
    outs = [torch.empty_like(a) for _ in range(3)]
    providers = {
        "tessera": lambda: tessera.add(a, b, out=outs[0]),
        "torch": lambda: torch.add(a, b, out=outs[1]),
    }
    if triton is not None:
        providers["triton"] = lambda: triton_add(a, b, outs[2])
    suite.run("add", dtype, n, bench.bytes, providers, flops=bench.flops)


def bench_copy(suite: Suite, bench, dtype, n: int, compiled) -> None:
    # A transpose: the layout change copy exists for (a contiguous pair is one cudaMemcpy).
    rows = 1 << (n.bit_length() - 1) // 2
    src = randn((n // rows, rows), dtype).t()
    outs = [torch.empty(src.shape, device="cuda", dtype=dtype) for _ in range(3)]
    providers = {
        "tessera": lambda: tessera.copy(src, outs[0]),
        "torch": lambda: outs[1].copy_(src),
    }
    suite.optional(providers, "torch.compile", lambda: compiled["copy"](outs[2], src),
                   f"copy {dtype_name(dtype)} {tuple(src.shape)}")
    suite.run("copy", dtype, n, bench.bytes, providers, flops=bench.flops, shape=tuple(src.shape))


def bench_activation(suite: Suite, op: str, bench, dtype, n: int, compiled) -> None:
    x = randn(bench.shapes[0], dtype)
    out = torch.empty_like(x)
    if op == "silu":
        ours, theirs = (lambda: tessera.silu(x, out=out)), (lambda: F.silu(x))
    else:
        approximate = "tanh" if op == "gelu_tanh" else "none"
        ours = lambda: tessera.gelu(x, approximate, out=out)  # noqa: E731
        theirs = lambda: F.gelu(x, approximate=approximate)  # noqa: E731
    providers = {"tessera": ours, "torch": theirs, "torch.compile": lambda: compiled[op](x)}
    suite.run(op, dtype, n, bench.bytes, providers, flops=bench.flops)


def bench_activation_backward(suite: Suite, op: str, bench, dtype, n: int) -> None:
    # The backward kernels themselves, each writing grad_in: tessera's <op>_backward(out=) against
    # the aten kernel torch's autograd runs. (Autograd's own per-call overhead is the same for both
    # and is left out.)
    g, x = (randn(shape, dtype) for shape in bench.shapes[:2])  # grad_out, x: the op's order
    out = torch.empty_like(x)
    if op == "silu_backward":
        ours = lambda: tessera.silu_backward(g, x, out=out)  # noqa: E731
        theirs = lambda: torch.ops.aten.silu_backward(g, x)  # noqa: E731
    else:
        approximate = "tanh" if op == "gelu_tanh_backward" else "none"
        ours = lambda: tessera.gelu_backward(g, x, approximate=approximate, out=out)  # noqa: E731
        theirs = lambda: torch.ops.aten.gelu_backward(g, x, approximate=approximate)  # noqa: E731
    suite.run(op, dtype, n, bench.bytes, {"tessera": ours, "torch": theirs}, flops=bench.flops)


def _gelu_erf(x):
    return F.gelu(x, approximate="none")


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _silu(x):
    return F.silu(x)


def _copy_into(dst, src):
    return dst.copy_(src)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS)
    p.add_argument("--out", default="report", type=Path,
                   help="directory for the CSV, JSON and SVG files (default: ./report)")
    args = p.parse_args()
    resolve_selection(p, args, OPS)
    return args


def main() -> int:
    args = parse_args()
    suite = Suite("benchmarks/elementwise.py")
    suite.note("F.gelu, F.silu and their torch.compile'd forms have no out=: they are timed as they are, each "
               "call taking its output from torch's caching allocator (no cudaMalloc once warm); "
               "tessera and torch.add/Triton write to preallocated outputs")
    suite.note("GELU and SiLU backward: tessera's <op>_backward(out=) against "
               "torch.ops.aten.<op>_backward (the kernel torch's autograd runs; it allocates "
               "grad_in from the caching allocator)")
    suite.note("copy: src the transposed view of a contiguous tensor, dst contiguous (shape rows x cols); "
               "tessera.copy against dst.copy_(src) and torch.compile of it, all writing to "
               "preallocated outputs")
    suite.note("bytes: every provider is credited with what the op's description says it must "
               "move, so GB/s ratios are time ratios")
    if triton is None:
        suite.note("Triton is not installed: no Triton provider for add")
    else:
        suite.note(f"Triton {triton.__version__}: the vector-add kernel of Triton's tutorial, "
                   "BLOCK=1024, one program per block")

    # One compiled function per op, recompiled for every size and dtype (static shapes).
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    compiled = {"gelu": torch.compile(_gelu_erf, dynamic=False),
                "gelu_tanh": torch.compile(_gelu_tanh, dynamic=False),
                "silu": torch.compile(_silu, dynamic=False),
                "copy": torch.compile(_copy_into, dynamic=False)}

    plan = {}  # size -> [(op, dtype)], so that one size's buffers go before the next is made
    for op in args.ops:
        desc = describe(op)
        for n in sizes_of(desc, args.quick, args.sizes):
            plan.setdefault(n, []).extend((op, dtype) for dtype in dtypes_of(desc, args.dtypes))
    for n in sorted(plan):
        for op, dtype in plan[n]:
            bench = case(describe(op), dtype, n)
            if op == "add":
                bench_add(suite, bench, dtype, n)
            elif op == "copy":
                bench_copy(suite, bench, dtype, n, compiled)
            elif op.endswith("_backward"):
                bench_activation_backward(suite, op, bench, dtype, n)
            else:
                bench_activation(suite, op, bench, dtype, n, compiled)
        gc.collect()
        torch.cuda.empty_cache()

    failed = suite.finish(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
