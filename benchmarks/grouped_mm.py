#!/usr/bin/env python3
"""Grouped GEMM (tessera.grouped_mm) against torch._grouped_mm (cuBLAS / CUTLASS) at the
Mixture-of-Experts families' expert shapes, balanced and skewed routing.

    python benchmarks/grouped_mm.py [--rounds R] [--tokens 8192] [--families all] [--out DIR]

Per family (experts E, top-k, hidden H, expert ffn F), T tokens routed to k experts each give
T*k rows grouped by expert (offsets int32 on the GPU); the three products of one expert layer:
- gate_up forward: x [T k, H] @ W [E, H, 2F] (rows form), W stored as torch's experts keep it
  ([E, 2F, H], K contiguous, the weight given as its transposed view);
- down forward (the dgrad form is the same rows form): h [T k, F] @ W [E, F, H];
- gate_up wgrad: x^T [H, T k] @ dy [T k, 2F], offsets over K (depth form) -> [E, H, 2F].
Routing: balanced (T k / E rows each) or skewed (Zipf with exponent 1.2 over the experts, the
counts rounded to sum to T k). Each call is timed with triton's do_bench (L2 flushed, median),
the median of R interleaved rounds; TFLOP/s from 2 * rows * K * N. Each result is checked against
torch's first. Where torch refuses an operand's layout, it gets a row-major A and a column-major B,
copied before the timing (not timed). Written as grouped_mm.json / grouped_mm.md under --out.
"""
import argparse

import torch

import tessera
from common import interleaved_ms, write_results

# family: (experts, top-k, hidden, expert ffn)
FAMILIES = {
    "qwen3_moe": (128, 8, 2048, 768),
    "mixtral": (8, 2, 4096, 14336),
    "deepseek_v3": (256, 8, 7168, 2048),
    "gpt_oss": (32, 4, 2880, 2880),
    "qwen2_moe": (60, 4, 2048, 1408),
}


def group_sizes(rows: int, experts: int, skew: bool) -> list:
    if not skew:
        base = [rows // experts] * experts
        for i in range(rows - sum(base)):
            base[i] += 1
        return base
    w = [1.0 / (i + 1) ** 1.2 for i in range(experts)]
    sizes = [int(rows * x / sum(w)) for x in w]
    sizes[0] += rows - sum(sizes)
    return sizes


def offsets(sizes) -> torch.Tensor:
    return torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)


def cases(family: str, tokens: int, skew: bool):
    e, k, h, f = FAMILIES[family]
    rows = tokens * k
    offs = offsets(group_sizes(rows, e, skew))
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, h, **bf)
    w_gu = torch.randn(e, 2 * f, h, **bf) / h ** 0.5  # [E, 2F, H]: used as [E, H, 2F], K contiguous
    hid = torch.randn(rows, f, **bf)
    w_down = torch.randn(e, h, f, **bf) / f ** 0.5
    dy = torch.randn(rows, 2 * f, **bf)
    return [("gate_up", x, w_gu.transpose(-2, -1), offs, 2 * rows * h * 2 * f),
            ("down", hid, w_down.transpose(-2, -1), offs, 2 * rows * f * h),
            ("gate_up_wgrad", x.t(), dy, offs, 2 * rows * h * 2 * f)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--families", default="all", help=f"comma-separated of {', '.join(FAMILIES)}, or all")
    p.add_argument("--out", default="report/grouped_mm")
    args = p.parse_args()
    fams = list(FAMILIES) if args.families == "all" else args.families.split(",")
    rows_out, lines = [], []
    for fam in fams:
        for skew in (False, True):
            for name, a, b, offs, flops in cases(fam, args.tokens, skew):
                ta, tb = a, b
                try:
                    ref = torch._grouped_mm(a, b, offs)
                except RuntimeError:  # a layout torch refuses: it gets row- and column-major copies
                    ta, tb = a.contiguous(), b.t().contiguous().t()
                    ref = torch._grouped_mm(ta, tb, offs)
                got = tessera.grouped_mm(a, b, offs)
                # in the outputs' dtype, a float32 copy of DeepSeek-V3's weight gradient being 30 GB
                err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
                if not err < 2e-2:
                    raise SystemExit(f"{fam} {name}: tessera differs from torch by {err:.3g} of the largest value")
                del ref, got
                t = interleaved_ms({"torch": lambda: torch._grouped_mm(ta, tb, offs),
                                    "tessera": lambda: tessera.grouped_mm(a, b, offs)}, args.rounds)
                routing = "zipf" if skew else "balanced"
                row = {"family": fam, "routing": routing, "product": name, "shape": list(a.shape) + [b.shape[-1]],
                       "torch_ms": t["torch"], "tessera_ms": t["tessera"],
                       "tessera_tflops": flops / t["tessera"] / 1e9, "torch_tflops": flops / t["torch"] / 1e9,
                       "torch_over_tessera": t["torch"] / t["tessera"]}
                rows_out.append(row)
                lines.append(f"| {fam} | {routing} | {name} | {row['shape']} | {t['torch'] * 1e3:.1f} | "
                             f"{t['tessera'] * 1e3:.1f} | {row['torch_tflops']:.0f} | {row['tessera_tflops']:.0f} | "
                             f"{row['torch_over_tessera']:.2f} |")
                print(lines[-1], flush=True)
    import math
    geo = math.exp(sum(math.log(r["torch_over_tessera"]) for r in rows_out) / len(rows_out))
    table = "\n".join(["| family | routing | product | rows, K, N | torch (us) | tessera (us) | torch TFLOP/s | "
                       "tessera TFLOP/s | torch / tessera |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
                      + lines + [f"\ngeomean torch / tessera: {geo:.3f}"])
    print(table)
    write_results(args.out, "grouped_mm", {"tokens": args.tokens, "rounds": args.rounds}, rows_out, table)


if __name__ == "__main__":
    main()
