#!/usr/bin/env python3
"""Elementwise operators against their peers, in one run, by one method.

    python benchmarks/elementwise.py [--quick] [--out DIR]

  add  float32          tessera.add(out=)  torch.add(out=)  a Triton vector-add kernel (out)
  gelu, gelu_tanh bf16  tessera.gelu(out=) F.gelu           torch.compile(F.gelu)
  gelu_backward, gelu_tanh_backward bf16
                        tessera.gelu_backward(out=)  torch.ops.aten.gelu_backward

Sizes 2^16 .. 2^28 elements (every second power; --quick: 2^16, 2^20, 2^24), random normal
inputs. Before timing a size, every provider's output is checked against torch's; a mismatch
aborts the run. All the bandwidth figures count the bytes the op must move: add 3n*4 (two reads,
one write), gelu 2n*2, gelu backward 3n*2 (reads grad and x, writes grad_in).

Output: the full table, CSV, JSON and one SVG per (op, dtype) in --out, and a ratio table
(tessera against torch, and tessera's share of the copy bandwidth measured in the same run).
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.nn.functional as F

import tessera
from common import Suite, parse_args

FULL_SIZES = [1 << k for k in range(16, 29, 2)]  # 2^16, 2^18, ..., 2^24, 2^26, 2^28
QUICK_SIZES = [1 << 16, 1 << 20, 1 << 24]

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


def randn(n, dtype, **kw):
    return torch.randn(n, device="cuda", dtype=dtype, **kw)


def bench_add(suite: Suite, n: int) -> None:
    dtype = torch.float32
    a, b = randn(n, dtype), randn(n, dtype)
    outs = [torch.empty_like(a) for _ in range(3)]
    providers = {
        "tessera": lambda: tessera.add(a, b, out=outs[0]),
        "torch": lambda: torch.add(a, b, out=outs[1]),
    }
    if triton is not None:
        providers["triton"] = lambda: triton_add(a, b, outs[2])
    suite.run("add", dtype, n, 3 * n * a.element_size(), providers)


def bench_gelu(suite: Suite, n: int, approximate: str, compiled) -> None:
    dtype = torch.bfloat16
    x = randn(n, dtype)
    out = torch.empty_like(x)
    providers = {
        "tessera": lambda: tessera.gelu(x, approximate, out=out),
        "torch": lambda: F.gelu(x, approximate=approximate),
        "torch.compile": lambda: compiled(x),
    }
    op = "gelu" if approximate == "none" else "gelu_tanh"
    suite.run(op, dtype, n, 2 * n * x.element_size(), providers)


def bench_gelu_backward(suite: Suite, n: int, approximate: str) -> None:
    # The backward kernels themselves, each writing grad_in: tessera.gelu_backward(out=) against
    # aten.gelu_backward, the kernel torch's autograd runs. (Autograd's own per-call overhead is
    # the same for both and is left out.)
    dtype = torch.bfloat16
    x, g = randn(n, dtype), randn(n, dtype)
    out = torch.empty_like(x)
    providers = {
        "tessera": lambda: tessera.gelu_backward(g, x, approximate=approximate, out=out),
        "torch": lambda: torch.ops.aten.gelu_backward(g, x, approximate=approximate),
    }
    op = "gelu_backward" if approximate == "none" else "gelu_tanh_backward"
    suite.run(op, dtype, n, 3 * n * x.element_size(), providers)


def _gelu_erf(x):
    return F.gelu(x, approximate="none")


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], FULL_SIZES, QUICK_SIZES)
    suite = Suite("benchmarks/elementwise.py")
    suite.note("F.gelu and torch.compile'd F.gelu have no out=: they are timed as they are, each "
               "call taking its output from torch's caching allocator (no cudaMalloc once warm); "
               "tessera and torch.add/Triton write to preallocated outputs")
    suite.note("GELU backward: tessera.gelu_backward(out=) against torch.ops.aten.gelu_backward "
               "(the kernel torch's autograd runs; it allocates grad_in from the caching allocator)")
    if triton is None:
        suite.note("Triton is not installed: no Triton provider for add")
    else:
        suite.note(f"Triton {triton.__version__}: the vector-add kernel of Triton's tutorial, "
                   "BLOCK=1024, one program per block")

    # One compiled function per approximation, recompiled for every size (static shapes).
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    compiled = {"none": torch.compile(_gelu_erf, dynamic=False),
                "tanh": torch.compile(_gelu_tanh, dynamic=False)}

    for n in args.sizes:
        bench_add(suite, n)
        for approximate in ("none", "tanh"):
            bench_gelu(suite, n, approximate, compiled[approximate])
        for approximate in ("none", "tanh"):
            bench_gelu_backward(suite, n, approximate)
        gc.collect()
        torch.cuda.empty_cache()

    suite.finish(args.out)


if __name__ == "__main__":
    sys.exit(main())
