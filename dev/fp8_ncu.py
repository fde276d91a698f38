#!/usr/bin/env python3
"""The fp8 kernels once each inside a profiler range, for ncu: float8_quantize's tile passes (row
granularity, rows and columns) and its block kernel (1 x 128 and 128 x 1) on [tokens, in], then
scaled_mm row-wise and block-wise at [tokens, in] @ [in, out], and wgrad's block-wise
[out, tokens] @ [tokens, in]; or (--rowwise-vs-torch) the row-wise GEMM, tessera's per-tensor one
and torch._scaled_mm's row-wise.

    ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        python dev/fp8_ncu.py [--tokens 8192] [--in 4096] [--out 4096]
"""
import argparse

import torch

import tessera.float8 as f8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--in", dest="inp", type=int, default=4096)
    ap.add_argument("--out", type=int, default=4096)
    ap.add_argument("--rowwise-vs-torch", action="store_true", help="only the row-wise GEMM: tessera's "
                    "row-wise, its per-tensor and torch._scaled_mm's row-wise, each once")
    args = ap.parse_args()
    x = torch.randn(args.tokens, args.inp, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(args.out, args.inp, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(args.tokens, args.out, device="cuda", dtype=torch.bfloat16)

    def gemms():  # the row-wise scales' cost in tessera's epilogue against torch's kernel
        qa, sa, _, _ = f8._quantize_both(x, "row", False)
        qb, sb, _, _ = f8._quantize_both(w, "row", False)
        f8._scaled(qa, sa, qb.t(), f8._as_right(sb, "row"), torch.bfloat16)
        one = torch.ones((), device="cuda")
        f8._scaled(qa, one, qb.t(), one, torch.bfloat16)
        torch._scaled_mm(qa, qb.t(), sa, f8._as_right(sb, "row"), out_dtype=torch.bfloat16, use_fast_accum=True)

    def run():
        if args.rowwise_vs_torch:
            return gemms()
        f8._kernel_quantize(x, "row", columns=True)
        f8._kernel_quantize(x, "block", columns=True)
        qa, sa, _, _ = f8._quantize_both(x, "row", False)
        qb, sb, _, _ = f8._quantize_both(w, "row", False)
        f8._scaled(qa, sa, qb.t(), f8._as_right(sb, "row"), torch.bfloat16)
        qa, sa, _, _ = f8._quantize_both(x, "block", False)
        qb, sb, _, _ = f8._quantize_both(w, "block2d", False)
        f8._scaled(qa, sa, qb.t(), f8._as_right(sb, "block2d"), torch.bfloat16)
        # wgrad's block-wise GEMM: both operands' columns by 1 x 128 blocks along the tokens
        _, _, qg_t, sg_t = f8._quantize_both(g, "block", True)
        _, _, qx_t, sx_t = f8._quantize_both(x, "block", True)
        f8._scaled(qg_t, sg_t.t(), qx_t.t(), sx_t, torch.bfloat16)

    for _ in range(2):  # tuning and first-call costs outside the range
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
