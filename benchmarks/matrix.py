#!/usr/bin/env python3
"""matmul against torch.matmul (cuBLAS), in one run, by one method, in interleaved rounds.

    python benchmarks/matrix.py [--out DIR] [--quick] [--ops LIST] [--dtypes LIST] [--rounds R]
                                [--self-check]

Cases: matmul's description (tessera.bench.ops, what `tessera bench matmul` times): square
problems M = N = K of its bench sizes (--quick: the smallest, a middle and the largest), input
row-major and other = W^T of a row-major W (K contiguous: the layout of a linear layer), FLOPs
2 M N K as the description gives them; dtypes --dtypes (default bfloat16,float16,float32).
Providers: tessera.matmul(out=) and torch.matmul(out=), float32 in exact arithmetic on both sides
(torch.backends.cuda.matmul.allow_tf32 is turned off for the run). Outputs are compared first.
Timing: the L2 flushed before each repetition; each size timed in --rounds rounds (default 5),
the providers in turn within a round, and per provider the round with the median median. With
--self-check a second torch provider ("torch2") shows what the method reads on identical calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import tessera
from common import (Suite, add_selection_args, case, describe, dtype_name, dtypes_of, fmt_size,
                    ratio_table, resolve_selection, sizes_of)

OPS = ["matmul"]
# Both sides accumulate in float32 over K terms; the outputs differ by rounding order, growing
# with sqrt(K) relative to the output's scale.
TOLERANCES = {
    torch.float32: dict(rtol=1e-4, atol=1e-3),
    torch.float16: dict(rtol=1e-2, atol=2e-2),
    torch.bfloat16: dict(rtol=1.6e-2, atol=5e-2),
}


def bench_case(suite: Suite, dtype, size: int, rounds: int, self_check: bool) -> None:
    bench = case(describe("matmul"), dtype, size)
    (m, k), (_, n) = bench.shapes[0], bench.shapes[1]
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    b = w.t()
    out_t = torch.empty(m, n, device="cuda", dtype=dtype)
    out_c = torch.empty(m, n, device="cuda", dtype=dtype)
    providers = {
        "tessera": lambda: tessera.matmul(a, b, out=out_t),
        "torch": lambda: torch.matmul(a, b, out=out_c),
    }
    if self_check:
        out_c2 = torch.empty(m, n, device="cuda", dtype=dtype)
        providers["torch2"] = lambda: torch.matmul(a, b, out=out_c2)
    suite.run("matmul", dtype, size, bench.bytes, providers, flops=bench.flops,
              shape=(m, n, k), tolerances=TOLERANCES, rounds=rounds,
              timing=dict(cuda_graph=False, flush_l2=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS, dtypes="bfloat16,float16,float32")
    p.add_argument("--out", default="report", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--self-check", action="store_true")
    args = p.parse_args()
    resolve_selection(p, args, OPS)
    torch.backends.cuda.matmul.allow_tf32 = False
    suite = Suite("benchmarks/matrix.py")
    suite.note(f"each size in {args.rounds} interleaved rounds, the L2 flushed before each "
               "repetition; other = W^T (K contiguous); float32 without TF32 on both sides")
    if "matmul" in args.ops:
        desc = describe("matmul")
        for dtype in dtypes_of(desc, args.dtypes):
            for size in sizes_of(desc, args.quick):
                what = f"matmul {dtype_name(dtype)} {fmt_size(size)}"
                suite.attempt(what, lambda: bench_case(suite, dtype, size, args.rounds,
                                                       args.self_check))
                torch.cuda.empty_cache()
    failures = suite.finish(args.out, best_peer=True, peers=["torch"])
    if args.self_check:
        print()
        print("harness self-check: torch2 / torch (identical calls)")
        print(ratio_table(suite.report, "torch2", "torch", by_shape=True))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
