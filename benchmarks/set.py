#!/usr/bin/env python3
"""isin against torch.isin, in one run, by one method; and the crossovers of tessera's paths.

    python benchmarks/set.py [--out DIR] [--quick] [--no-crossover]

Cases (the issue's table): int32 elements x test_elements = 2^10 x 2^10, 2^20 x 2^10,
2^20 x 2^20, 2^24 x 2^16, 2^24 x 2^24; int64 and float32 at 2^24 x 2^24. Values are integers
drawn uniformly from a range 4x the larger size, so about a quarter of the elements are found.
Providers: tessera.isin (automatic path, out=) and torch.isin. Before timing, tessera's result is
compared with torch's for equality. Every size is timed without CUDA graphs (torch.isin cannot be
captured: it synchronizes), the L2 flushed before each repetition. GB/s counts the bytes that must move: both inputs read once
and one bool written per element.

Crossover scan (int32; elements 2^20 and 2^24, test_elements 2^4 .. 2^22): every explicit path
timed by the same method; the fastest per size is printed, which is what IsinOptions' defaults
are set from (docs/PERF.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import tessera
from common import Suite, fmt_size
from tessera.bench import do_bench

CASES = [("int32", 10, 10), ("int32", 20, 10), ("int32", 20, 20), ("int32", 24, 16), ("int32", 24, 24),
         ("int64", 24, 24), ("float32", 24, 24)]
QUICK = [("int32", 10, 10), ("int32", 20, 20), ("int32", 24, 24)]
EXACT = {d: dict(rtol=0, atol=0) for d in (torch.int32, torch.int64, torch.float32)}


def inputs(dtype, m, n):
    span = 4 * max(m, n)
    e = torch.randint(-span // 2, span // 2, (m,), device="cuda").to(dtype)
    t = torch.randint(-span // 2, span // 2, (n,), device="cuda").to(dtype)
    return e, t


def bench_case(suite: Suite, dtype_name: str, lm: int, ln: int) -> None:
    dtype = getattr(torch, dtype_name)
    m, n = 1 << lm, 1 << ln
    e, t = inputs(dtype, m, n)
    out = torch.empty(m, dtype=torch.bool, device="cuda")
    providers = {
        "tessera": lambda: tessera.isin(e, t, out=out),
        "torch": lambda: torch.isin(e, t),
    }
    size = e.element_size()
    found = torch.isin(e, t).float().mean().item()
    suite.note(f"isin {dtype_name} 2^{lm} x 2^{ln}: path {tessera.set.isin_path(dtype_name, m, n)}, "
               f"{100 * found:.1f}% of elements found")
    suite.run("isin", dtype, m, (m + n) * size + m, providers, shape=(m, n),
              tolerances={dtype: dict(rtol=0, atol=0)}, timing=dict(cuda_graph=False, flush_l2=True))


def crossover(out_dir: Path) -> str:
    lines = ["crossover scan, int32 (median us per call; * = fastest)",
             f"{'elements':>9} {'test':>7} " + " ".join(f"{p:>12}" for p in ("brute_force", "sort", "hash"))
             + "  automatic picks"]
    for lm in (20, 24):
        for ln in range(4, 23, 2):
            m, n = 1 << lm, 1 << ln
            if lm == 24 and ln < 8:
                continue
            e, t = inputs(torch.int32, m, n)
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
    p.add_argument("--out", default="report", type=Path)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-crossover", action="store_true")
    args = p.parse_args()
    suite = Suite("benchmarks/set.py")
    suite.note("torch.isin allocates its result (and sorts) on every call; tessera.isin writes to "
               "a preallocated bool tensor")
    for dtype_name, lm, ln in (QUICK if args.quick else CASES):
        suite.attempt(f"isin {dtype_name} 2^{lm} x 2^{ln}", lambda: bench_case(suite, dtype_name, lm, ln))
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    text = "" if args.no_crossover else crossover(args.out)
    failures = suite.finish(args.out, best_peer=True, peers=["torch"])
    if text:
        print()
        print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
