#!/usr/bin/env python3
"""matmul against torch.matmul (cuBLAS), in one run, by one method, in interleaved rounds.

    python benchmarks/matrix.py [--out DIR] [--quick] [--ops LIST] [--dtypes LIST] [--rounds R]
                                [--self-check] [--layouts] [--sweep] [--narrow] [--epilogue]
                                [--accumulate] [--fp32] [--no-sizes]

Cases: matmul's description (tessera.bench.ops, what `tessera bench matmul` times): square
problems M = N = K of its bench sizes (--quick: the smallest, a middle and the largest), input
row-major and other = W^T of a row-major W (K contiguous: the layout of a linear layer), FLOPs
2 M N K as the description gives them; dtypes --dtypes (default bfloat16,float16,float32).
Providers: tessera.matmul(out=) and torch.matmul(out=), float32 in exact arithmetic on both sides
(torch.backends.cuda.matmul.allow_tf32 is turned off for the run). Outputs are compared first.
Timing: the L2 flushed before each repetition; each size timed in --rounds rounds (default 5),
the providers in turn within a round, and per provider the round with the median median. With
--self-check a second torch provider ("torch2") shows what the method reads on identical calls.

Layouts are named as torch users meet them, for C = A @ B: the first letter says whether A is a
transposed view (column-major, M contiguous), the second whether B is (K contiguous, W^T):
NT is x @ W^T. --layouts adds matmul_nn (both row-major) and matmul_tn (A column-major, B
row-major) at 4096 and 8192 in bfloat16 and float16. --sweep adds linear-layer shapes in bfloat16: M in
{1, 16, 128, 1024, 8192} against the (N, K) of Llama-3-8B's projections {(4096, 4096),
(14336, 4096), (4096, 14336), (128256, 4096)}, and prints their geometric mean ratio.
--narrow adds, at 4096 and 8192 (those of --sizes where given; other = W^T): float32 with TF32 allowed on both sides
(matmul_tf32, torch.set_float32_matmul_precision("high") around those calls; at 8192 also in the
layouts NN, TN and TT), float8 e4m3
(scaled_mm against torch._scaled_mm with use_fast_accum=True, the same accumulation, and False as
a second peer; per-tensor scales, and row-wise ones as scaled_mm_rowwise: scale_a [M, 1],
scale_b [1, N]). --epilogue adds bias + GELU fused at 8192 x 8192 x 4096 bfloat16
(matmul_bias_gelu against torch.matmul, + bias, gelu; and addmm then gelu), and the same layer
under autograd, forward and backward (linear_gelu_fwd_bwd: tessera.linear(activation="gelu")
against F.gelu(F.linear)). --fp32 adds float32 in every layout (NT, NN, TN, TT) at 4096 and 8192,
exact (matmul_fp32_<layout>) and with TF32 allowed on both sides (matmul_tf32_<layout>): the table
that shows a regression of the float32 tiers.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import tessera
from common import (Suite, add_selection_args, case, describe, dtype_name, dtypes_of, fmt_size,
                    ratio_table, resolve_selection, sizes_of)

OPS = ["matmul"]
# Both sides accumulate in float32 over K terms; the outputs differ by rounding order, growing
# with sqrt(K) relative to the output's scale: an exact float32 output near zero takes the partial
# sums' rounding (their scale, about max|ref|, times 2^-24 per addition), up to a few thousandths
# at K = 8192 on randn operands, hence the absolute tolerance on max|ref|'s scale (atol_rel).
TOLERANCES = {
    torch.float32: dict(rtol=1e-4, atol=1e-3, atol_rel=2e-5),
    torch.float16: dict(rtol=1e-2, atol=2e-2),
    torch.bfloat16: dict(rtol=1.6e-2, atol=5e-2),
}

# TF32 keeps 10 mantissa bits of each input: both sides' products carry errors near 2^-11 of
# their size, summed over K terms; an output near zero may differ by a few tenths at K = 8192.
TF32_TOLERANCE = dict(rtol=2e-2, atol=1.0)
# float8 with fast accumulation (the tensor cores' narrower accumulator) against cuBLAS's promoted
# one: sums of 8192 products of size ~0.3 differ by up to ~1 between the two, and the difference
# grows about as K^1.5 (up to ~20 at K = 57344: each addition's error is a fraction of the running
# sum, of size ~sqrt(K), and they do not cancel): fp8_tolerance(k).
FP8_TOLERANCE = dict(rtol=2e-2, atol=2.0)


def fp8_tolerance(k: int) -> dict:
    return dict(FP8_TOLERANCE, atol=FP8_TOLERANCE["atol"] * max(1.0, (k / 8192) ** 1.5))

LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
# --fp8-sweep: Llama-3 8B's and 70B's linear layers (N, K: q/k/v fused, o, gate/up fused, down),
# each GEMM of a training step at FP8_TOKENS tokens: forward (T, N, K), dgrad (T, K, N), wgrad
# (N, K, T); float8 operands are quantized K-major for each, so the three are these shapes.
LLAMA_FP8_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
FP8_TOKENS = 8192
SWEEP_M = [1, 16, 128, 1024, 8192]


def operands(m: int, n: int, k: int, dtype, layout: str):
    """input [m, k] and other [k, n] in `layout` (NN, NT, TN or TT): a T makes that operand a
    transposed view, so NT is x @ W^T (K contiguous in both)."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)
    a = randn(k, m).t() if layout[0] == "T" else randn(m, k)
    b = randn(n, k).t() if layout[1] == "T" else randn(k, n)
    return a, b


def bench_case(suite: Suite, dtype, size: int, rounds: int, self_check: bool) -> None:
    bench = case(describe("matmul"), dtype, size)
    (m, k), (_, n) = bench.shapes[0], bench.shapes[1]
    bench_gemm(suite, "matmul", dtype, m, n, k, "NT", rounds, self_check, size=size)


def bench_gemm(suite: Suite, op: str, dtype, m: int, n: int, k: int, layout: str, rounds: int,
               self_check: bool, size: int = 0) -> None:
    a, b = operands(m, n, k, dtype, layout)
    out_t = torch.empty(m, n, device="cuda", dtype=dtype)
    out_c = torch.empty(m, n, device="cuda", dtype=dtype)
    providers = {
        "tessera": lambda: tessera.matmul(a, b, out=out_t),
        "torch": lambda: torch.matmul(a, b, out=out_c),
    }
    if self_check:
        out_c2 = torch.empty(m, n, device="cuda", dtype=dtype)
        providers["torch2"] = lambda: torch.matmul(a, b, out=out_c2)
    nbytes = float((m * k + k * n + m * n) * a.element_size())
    suite.run(op, dtype, size or m, nbytes, providers, flops=2.0 * m * n * k,
              shape=(m, n, k), tolerances=TOLERANCES, rounds=rounds,
              timing=dict(cuda_graph=False, flush_l2=True))


def bench_tf32(suite: Suite, size: int, rounds: int, self_check: bool, layout: str = "NT",
               named: bool = False) -> None:
    """float32 with TF32 allowed on both sides; named: the op carries its layout, NT included."""
    a, b = operands(size, size, size, torch.float32, layout)
    out_t, out_c = (torch.empty(size, size, device="cuda") for _ in range(2))

    def tf32(fn):
        torch.set_float32_matmul_precision("high")
        try:
            return fn()
        finally:
            torch.set_float32_matmul_precision("highest")

    def torch_tf32(out):
        return tf32(lambda: torch.matmul(a, b, out=out))

    def tessera_tf32():
        return tf32(lambda: tessera.matmul(a, b, out=out_t))

    providers = {"tessera": tessera_tf32, "torch": lambda: torch_tf32(out_c)}
    if self_check:
        out_c2 = torch.empty(size, size, device="cuda")
        providers["torch2"] = lambda: torch_tf32(out_c2)
    op = "matmul_tf32" if layout == "NT" and not named else "matmul_tf32_" + layout.lower()
    suite.run(op, torch.float32, size, float(3 * size * size * 4), providers,
              flops=2.0 * size ** 3, shape=(size, size, size),
              tolerances={torch.float32: TF32_TOLERANCE}, rounds=rounds,
              timing=dict(cuda_graph=False, flush_l2=True))


def bench_fp8(suite: Suite, size: int, rounds: int, self_check: bool, scales: str = "tensor",
              mnk: tuple = (), columns: bool = False) -> None:
    """scaled_mm of size^3 (or M x N x K = mnk) with unit per-tensor scales; (row) scale_a [M, 1]
    and scale_b [1, N]; or (block) scale_a [M, K / 128] (M-major) and scale_b [K / 128, N / 128]
    (``columns``: [K / 128, N], one per 1 x 128 block of each column, as wgrad's right operand
    takes them): block scales equal along each row and 128 columns, so that tessera's row-wise
    call (the bar's peer) computes the same values, and torch._scaled_mm's block-wise call beside
    it where this torch takes one."""
    dt = torch.float8_e4m3fn
    m, n, k = mnk or (size, size, size)
    a = (torch.rand(m, k, device="cuda") * 2 - 1).to(dt)
    b = (torch.rand(n, k, device="cuda") * 2 - 1).to(dt).t()
    one = torch.tensor(1.0, device="cuda")
    row_a = torch.rand(m, 1, device="cuda") + 0.5
    blocks_b = torch.rand(1, -(-n // 128), device="cuda") + 0.5
    row_b = blocks_b.repeat_interleave(128, dim=1)[:, :n].contiguous()
    if scales == "block":
        kb = -(-k // 128)
        sa = row_a.expand(m, kb).t().contiguous().t()  # M-major, as torch's 1 x 128 scales are
        sb = (row_b if columns else blocks_b).expand(kb, -1).contiguous()
        providers = {"tessera": lambda: tessera.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
                     "tessera_rowwise": lambda: tessera.scaled_mm(a, b, row_a, row_b, out_dtype=torch.bfloat16)}
        try:
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            providers["torch"] = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        except Exception as e:  # noqa: BLE001 - this torch has no block-wise _scaled_mm here
            print(f"scaled_mm_blockwise {size}: torch._scaled_mm refuses block-wise scales: {str(e)[:120]}")
    else:
        sa, sb = (row_a, row_b) if scales == "row" else (one, one)
        providers = {
            "tessera": lambda: tessera.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16),
            "torch": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                              use_fast_accum=True),
            "torch_accurate": lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                                       use_fast_accum=False),
        }
        if self_check:
            providers["torch2"] = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,
                                                           use_fast_accum=True)
    scale_bytes = 4 * (sa.numel() + sb.numel()) if scales != "tensor" else 0
    # block-wise: checked against tessera's row-wise call (the same values), torch's only where
    # this torch takes block scales
    suite.run({"tensor": "scaled_mm", "row": "scaled_mm_rowwise", "block": "scaled_mm_blockwise"}[scales], dt,
              size if not mnk else m, float(m * k + n * k + 2 * m * n + scale_bytes), providers,
              reference="tessera_rowwise" if scales == "block" else "torch",
              flops=2.0 * m * n * k, shape=(m, n, k),
              tolerances={dt: fp8_tolerance(k)},
              rounds=rounds, timing=dict(cuda_graph=False, flush_l2=True))


def bench_bias_gelu(suite: Suite, rounds: int, self_check: bool) -> None:
    m, n, k = 8192, 8192, 4096
    a, b = operands(m, n, k, torch.bfloat16, "NT")
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional
    # The bar's peer: cuBLAS, then torch's bias add and GELU; addmm (bias in cuBLASLt's epilogue,
    # then GELU) as a second one.
    providers = {
        "tessera": lambda: tessera.matmul(a, b, bias=bias, activation="gelu"),
        "torch": lambda: F.gelu(torch.matmul(a, b) + bias),
        "torch_addmm": lambda: F.gelu(torch.addmm(bias, a, b)),
    }
    if self_check:
        providers["torch2"] = lambda: F.gelu(torch.matmul(a, b) + bias)
    suite.run("matmul_bias_gelu", torch.bfloat16, m, float((m * k + k * n + 2 * m * n) * 2),
              providers, flops=2.0 * m * n * k, shape=(m, n, k), tolerances=TOLERANCES,
              rounds=rounds, timing=dict(cuda_graph=False, flush_l2=True))


def bench_bias_gelu_autograd(suite: Suite, rounds: int, self_check: bool) -> None:
    """A linear layer with bias and GELU under autograd, forward and backward: tessera.linear
    (the forward one kernel storing the pre-activation too) against torch's linear, then GELU."""
    m, n, k = 8192, 8192, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional

    def step(layer):
        return lambda: torch.autograd.grad(layer(x, w, bias), (x, w, bias), dy)

    providers = {
        "tessera": step(lambda x, w, b: tessera.linear(x, w, b, activation="gelu")),
        "torch": step(lambda x, w, b: F.gelu(F.linear(x, w, b))),
    }
    if self_check:
        providers["torch2"] = step(lambda x, w, b: F.gelu(F.linear(x, w, b)))
    suite.run("linear_gelu_fwd_bwd", torch.bfloat16, m, float((3 * (m * k + k * n) + 4 * m * n) * 2),
              providers, flops=3 * 2.0 * m * n * k, shape=(m, n, k), tolerances=TOLERANCES,
              rounds=rounds, timing=dict(cuda_graph=False, flush_l2=True))


def bench_accumulate(suite: Suite, beta: float, rounds: int, self_check: bool) -> None:
    """The linear cross-entropy's d_weight step: out (V x H) += G^T (V x chunk, V contiguous) @ h
    (chunk x H): the epilogue reads the output (beta 1) as well as writing it. The outputs drift
    apart over the repetitions, so nothing is compared here (the tests check beta)."""
    v, h, chunk = 128256, 4096, 2048
    g = torch.randn(chunk, v, device="cuda", dtype=torch.bfloat16).t()
    x = torch.randn(chunk, h, device="cuda", dtype=torch.bfloat16)
    outs = {name: torch.randn(v, h, device="cuda", dtype=torch.bfloat16) for name in ("tessera", "torch", "torch2")}
    providers = {
        "tessera": lambda: tessera.matmul(g, x, out=outs["tessera"], beta=beta),
        "torch": (lambda: outs["torch"].addmm_(g, x)) if beta else (lambda: torch.matmul(g, x, out=outs["torch"])),
    }
    if self_check:
        providers["torch2"] = (lambda: outs["torch2"].addmm_(g, x)) if beta else \
            (lambda: torch.matmul(g, x, out=outs["torch2"]))
    suite.run(f"matmul_beta{beta:g}", torch.bfloat16, v, float((v * chunk + chunk * h + (1 + (beta != 0)) * v * h) * 2),
              providers, flops=2.0 * v * h * chunk, shape=(v, h, chunk), reference=None,
              rounds=rounds, timing=dict(cuda_graph=False, flush_l2=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS, dtypes="bfloat16,float16,float32")
    p.add_argument("--out", default="report", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--self-check", action="store_true")
    p.add_argument("--layouts", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--narrow", action="store_true")
    p.add_argument("--epilogue", action="store_true", help="bias + GELU fused, and under autograd")
    p.add_argument("--accumulate", action="store_true", help="the linear cross-entropy's d_weight GEMM, beta 0 and 1")
    p.add_argument("--fp8-sweep", action="store_true", help="float8 row- and block-wise at Llama-3 8B and 70B's "
                   "linear shapes, forward, dgrad and wgrad")
    p.add_argument("--fp8-scales", default="row,block", help="the --fp8-sweep's scalings, of row and block")
    p.add_argument("--fp32", action="store_true", help="float32, exact and TF32, every layout at 4096 and 8192")
    p.add_argument("--no-sizes", action="store_true", help="skip the size sweep: only the extra cases asked for")
    args = p.parse_args()
    resolve_selection(p, args, OPS)
    torch.backends.cuda.matmul.allow_tf32 = False
    suite = Suite("benchmarks/matrix.py")
    suite.note(f"each size in {args.rounds} interleaved rounds, the L2 flushed before each "
               "repetition; other = W^T (K contiguous); float32 without TF32 on both sides")
    if "matmul" in args.ops and not args.no_sizes:
        desc = describe("matmul")
        for dtype in dtypes_of(desc, args.dtypes):
            for size in sizes_of(desc, args.quick, args.sizes):
                what = f"matmul {dtype_name(dtype)} {fmt_size(size)}"
                suite.attempt(what, lambda: bench_case(suite, dtype, size, args.rounds,
                                                       args.self_check))
                torch.cuda.empty_cache()
    if args.layouts:
        for dtype in (torch.bfloat16, torch.float16):
            for op, layout in (("matmul_nn", "NN"), ("matmul_tn", "TN")):
                for size in (4096, 8192):
                    suite.attempt(f"{op} {dtype_name(dtype)} {size}", lambda: bench_gemm(
                        suite, op, dtype, size, size, size, layout, args.rounds, args.self_check))
                    torch.cuda.empty_cache()
    if args.sweep:
        for n, k in LLAMA_NK:
            for m in SWEEP_M:
                suite.attempt(f"linear bfloat16 {m}x{n}x{k}", lambda: bench_gemm(
                    suite, "linear", torch.bfloat16, m, n, k, "NT", args.rounds, args.self_check))
                torch.cuda.empty_cache()
    if args.narrow:
        for size in [x for x in (4096, 8192) if not args.sizes or x in args.sizes]:
            suite.attempt(f"matmul_tf32 {size}", lambda: bench_tf32(suite, size, args.rounds,
                                                                    args.self_check))
            suite.attempt(f"scaled_mm e4m3 {size}", lambda: bench_fp8(suite, size, args.rounds,
                                                                      args.self_check))
            for scales in ("row", "block"):
                suite.attempt(f"scaled_mm {scales}-wise e4m3 {size}", lambda: bench_fp8(
                    suite, size, args.rounds, args.self_check, scales))
            torch.cuda.empty_cache()
        for layout in ("NN", "TN", "TT"):
            suite.attempt(f"matmul_tf32 {layout} 8192", lambda: bench_tf32(
                suite, 8192, args.rounds, args.self_check, layout))
            torch.cuda.empty_cache()
    if args.fp8_sweep:
        for n, k in LLAMA_FP8_NK:
            t = FP8_TOKENS
            for mnk in ((t, n, k), (t, k, n), (n, k, t)):  # forward, dgrad, wgrad
                for scales in args.fp8_scales.split(","):
                    suite.attempt(f"scaled_mm {scales}-wise e4m3 {mnk}", lambda: bench_fp8(
                        suite, 0, args.rounds, args.self_check, scales, mnk, columns=mnk[2] == t))
                torch.cuda.empty_cache()
    if args.fp32:
        for size in (4096, 8192):
            for layout in ("NT", "NN", "TN", "TT"):
                op = "matmul_fp32_" + layout.lower()
                suite.attempt(f"{op} {size}", lambda: bench_gemm(
                    suite, op, torch.float32, size, size, size, layout, args.rounds, args.self_check))
                suite.attempt(f"matmul_tf32 {layout} {size}", lambda: bench_tf32(
                    suite, size, args.rounds, args.self_check, layout, named=True))
                torch.cuda.empty_cache()
    if args.epilogue:
        suite.attempt("matmul bias+gelu", lambda: bench_bias_gelu(suite, args.rounds,
                                                                  args.self_check))
        suite.attempt("linear gelu autograd", lambda: bench_bias_gelu_autograd(suite, args.rounds,
                                                                               args.self_check))
    if args.accumulate:
        for beta in (0.0, 1.0):
            suite.attempt(f"matmul beta {beta:g}", lambda: bench_accumulate(suite, beta, args.rounds,
                                                                            args.self_check))
            torch.cuda.empty_cache()
    failures = suite.finish(args.out, best_peer=True, peers=["torch"])
    if args.sweep:
        print()
        print(sweep_summary(suite, copy_rate()))
    if args.self_check:
        print()
        print("harness self-check: torch2 / torch (identical calls)")
        print(ratio_table(suite.report, "torch2", "torch", by_shape=True))
    return 1 if failures else 0


def copy_rate(nbytes: int = 2 << 30) -> float:
    """GB/s of a device-to-device copy moving `nbytes` (half read, half written; median of
    do_bench, the L2 flushed before each repetition): by default 1 GiB each way, the ceiling; at a
    weight's size, what a kernel moving that many bytes reaches, launch and ramp included."""
    from triton.testing import do_bench
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / ms / 1e6


def sweep_summary(suite: Suite, copy_gbps: float) -> str:
    """The linear sweep's geometric mean of tessera/torch and its lowest ratio; for M <= 16, the
    weight's bytes over tessera's time against the copy rate."""
    times: dict = {}
    skinny = []
    for r in suite.report.rows():
        if r["op"] == "linear":
            times.setdefault(str(r["shape"]), {})[r["provider"]] = r["gbps"]
            m, n, k = (int(d) for d in str(r["shape"]).replace(",", "x").strip("()[] ").split("x"))
            if r["provider"] == "tessera" and m <= 16:
                weight_gbps = r["gbps"] * (n * k) / (m * k + k * n + m * n)
                same = copy_rate(2 * n * k)
                skinny.append(f"  {m}x{n}x{k}: {weight_gbps:.0f} GB/s on the weight, "
                              f"{weight_gbps / copy_gbps:.0%} of the copy rate ({copy_gbps:.0f} GB/s); "
                              f"a copy of the weight's bytes: {same:.0f} GB/s")
    ratios = {s: t["tessera"] / t["torch"] for s, t in times.items()
              if t.get("torch") and "tessera" in t}
    if not ratios:
        return "linear sweep: no shape measured"
    geo = math.exp(sum(math.log(x) for x in ratios.values()) / len(ratios))
    low = min(ratios, key=ratios.get)
    return "\n".join([f"linear sweep, bfloat16, {len(ratios)} shapes: geometric mean tessera/torch "
                      f"{geo:.2f}, lowest {ratios[low]:.2f} at {low} (M, N, K)"] + skinny)


if __name__ == "__main__":
    sys.exit(main())
