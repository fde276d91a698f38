#!/usr/bin/env python3
"""isin against torch.isin, in one run, by one method; and the crossovers of tessera's paths.

    python benchmarks/set.py [--out DIR] [--quick] [--ops LIST] [--dtypes LIST] [--no-crossover]

Cases: isin's description (tessera.bench.ops, what `tessera bench isin` times): elements and
test_elements of its bench sizes each (N x N; --quick: the smallest, a middle and the largest),
their shapes and the bytes that must move (both inputs read once, one bool written per element)
as the description gives them; dtypes --dtypes (default int32,int64,float32). Values are integers
drawn uniformly from a range 4x the larger size, so about a quarter of the elements are found.
Providers: tessera.isin (automatic path, out=) and torch.isin. Before timing, tessera's result is
compared with torch's for equality (the description's tolerance for isin is 0: exact). Every
size is timed without CUDA graphs (torch.isin cannot be captured: it synchronizes), the L2
flushed before each repetition.

Crossover scan (int32; elements 2^20 and 2^24, test_elements 2^4 .. 2^22): every explicit path
timed by the same method; the fastest per size is printed, which is what IsinOptions' defaults
are set from (its last scan's conclusion: dev/worklog.md, section 3). It runs unless --no-crossover, or --ops leaves out isin's variants
(isin_brute_force, isin_sort, isin_hash).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import tessera
from common import (Suite, add_selection_args, case, describe, dtype_name, dtypes_of, fmt_size,
                    resolve_selection, sizes_of)
from tessera.bench import do_bench

OPS = ["isin"]
CROSSOVER_OPS = ["isin_brute_force", "isin_sort", "isin_hash"]


def inputs(dtype, e_shape, t_shape):
    span = 4 * max(math.prod(e_shape), math.prod(t_shape))
    e = torch.randint(-span // 2, span // 2, tuple(e_shape), device="cuda").to(dtype)
    t = torch.randint(-span // 2, span // 2, tuple(t_shape), device="cuda").to(dtype)
    return e, t


def bench_case(suite: Suite, dtype, size: int) -> None:
    desc = describe("isin")
    bench = case(desc, dtype, size)
    e, t = inputs(dtype, *bench.shapes[:2])  # elements, test_elements
    m, n = e.numel(), t.numel()
    out = torch.empty(e.shape, dtype=torch.bool, device="cuda")
    providers = {
        "tessera": lambda: tessera.isin(e, t, out=out),
        "torch": lambda: torch.isin(e, t),
    }
    found = torch.isin(e, t).float().mean().item()
    name = dtype_name(dtype)
    suite.note(f"isin {name} {fmt_size(m)} x {fmt_size(n)}: path "
               f"{tessera.set.isin_path(name, m, n)}, {100 * found:.1f}% of elements found")
    exact = dict(rtol=desc.tolerance(name), atol=0.0)
    suite.run("isin", dtype, m, bench.bytes, providers, shape=(m, n), flops=bench.flops,
              tolerances={dtype: exact}, timing=dict(cuda_graph=False, flush_l2=True))


def crossover(out_dir: Path) -> str:
    lines = ["crossover scan, int32 (median us per call; * = fastest)",
             f"{'elements':>9} {'test':>7} " + " ".join(f"{p:>12}" for p in ("brute_force", "sort", "hash"))
             + "  automatic picks"]
    for lm in (20, 24):
        for ln in range(4, 23, 2):
            m, n = 1 << lm, 1 << ln
            if lm == 24 and ln < 8:
                continue
            e, t = inputs(torch.int32, (m,), (n,))
            out = torch.empty(m, dtype=torch.bool, device="cuda")
            want = torch.isin(e, t)
            times = {}
            for path in ("brute_force", "sort", "hash"):
                if path == "brute_force" and m * n > (1 << 36):
                    continue  # minutes per call; not a candidate
                tessera.isin(e, t, out=out, path=path)
                if not torch.equal(out, want):
                    sys.exit(f"MISMATCH: isin path {path} 2^{lm} x 2^{ln}")
                stats = do_bench(lambda: tessera.isin(e, t, out=out, path=path), flush_l2=True,
                                 cuda_graph=False)
                times[path] = stats["median_ms"] * 1e3
            best = min(times, key=times.get)
            cells = " ".join(f"{(f'{times[p]:.1f}' + ('*' if p == best else ' ')) if p in times else '-':>12}"
                             for p in ("brute_force", "sort", "hash"))
            lines.append(f"{fmt_size(m):>9} {fmt_size(n):>7} {cells}  {tessera.set.isin_path('int32', m, n)}")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    (out_dir / "crossover.txt").write_text(text + "\n", encoding="utf-8")
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS + CROSSOVER_OPS, dtypes="int32,int64,float32")
    p.add_argument("--out", default="report", type=Path)
    p.add_argument("--no-crossover", action="store_true")
    args = p.parse_args()
    resolve_selection(p, args, OPS + CROSSOVER_OPS)
    suite = Suite("benchmarks/set.py")
    suite.note("torch.isin allocates its result (and sorts) on every call; tessera.isin writes to "
               "a preallocated bool tensor")
    if "isin" in args.ops:
        desc = describe("isin")
        for dtype in dtypes_of(desc, args.dtypes):
            for size in sizes_of(desc, args.quick, args.sizes):
                what = f"isin {dtype_name(dtype)} {fmt_size(size)}"
                suite.attempt(what, lambda: bench_case(suite, dtype, size))
                torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    scan = not args.no_crossover and any(o in args.ops for o in CROSSOVER_OPS)
    text = crossover(args.out) if scan else ""
    failures = suite.finish(args.out, best_peer=True, peers=["torch"])
    if text:
        print()
        print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
