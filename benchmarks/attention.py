#!/usr/bin/env python3
"""Attention forward against torch's SDPA backends, in TFLOP/s, as a user calls it.

    python benchmarks/attention.py [--rounds R] [--dims 128,64] [--quick] [--out DIR]

Providers, timed in the same run and interleaved within each of R rounds (each case reports the
median over rounds): tessera.scaled_dot_product_attention; F.scaled_dot_product_attention under
sdpa_kernel(CUDNN_ATTENTION), (FLASH_ATTENTION) (FlashAttention-2) and (EFFICIENT_ATTENTION);
and "cudnn2", cuDNN timed a second time, so cudnn2 / cudnn is the harness's own noise. Timing is
triton's do_bench (L2 flushed before each call, median of the calls). FLOPs: 4 b h s^2 d per
forward, half of that under the causal mask.

Shapes (the attention issue's): batch x heads = 4 x 32 at seq 4096, 16 x 16 at 1024, 1 x 32 at
16384; head_dim 128 and 64; bf16; causal and not. Each output is checked against cuDNN's first.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tessera
from common import write_results

try:
    from triton.testing import do_bench as _triton_do_bench
except ImportError:  # pragma: no cover - triton is optional
    _triton_do_bench = None


def bench_ms(fn) -> float:
    if _triton_do_bench is not None:
        return float(_triton_do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return tessera.bench.do_bench(fn, warmup_ms=25, budget_ms=100, flush_l2=True)["median_ms"]


def torch_backend(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


PROVIDERS = {
    "tessera": lambda q, k, v, causal: tessera.scaled_dot_product_attention(q, k, v, is_causal=causal),
    "cudnn": torch_backend(SDPBackend.CUDNN_ATTENTION),
    "cudnn2": torch_backend(SDPBackend.CUDNN_ATTENTION),
    "flash2": torch_backend(SDPBackend.FLASH_ATTENTION),
    "efficient": torch_backend(SDPBackend.EFFICIENT_ATTENTION),
}


def kernels_of(fn) -> list:
    """The CUDA kernels one call of fn launches (names), from torch's profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--quick", action="store_true", help="the 4 x 32 x 4096 shape only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shapes = [(4, 32, 4096)] if args.quick else [(4, 32, 4096), (16, 16, 1024), (1, 32, 16384)]
    rows = []
    for d in [int(x) for x in args.dims.split(",")]:
        for b, h, s in shapes:
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                names = kernels_of(lambda: PROVIDERS["tessera"](q, k, v, causal))
                assert any("attention_sm90" in n for n in names), f"tessera's kernel did not run: {names}"
                want = PROVIDERS["cudnn"](q, k, v, causal)
                got = PROVIDERS["tessera"](q, k, v, causal)
                err = (got.float() - want.float()).abs().max().item()
                assert err < 2e-2, f"tessera differs from cuDNN by {err} at {(b, h, s, d, causal)}"
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                times = {p: [] for p in PROVIDERS}
                for _ in range(args.rounds):
                    for p, fn in PROVIDERS.items():
                        times[p].append(bench_ms(lambda: fn(q, k, v, causal)))
                med = {p: statistics.median(t) for p, t in times.items()}
                row = {"b": b, "h": h, "s": s, "d": d, "causal": causal,
                       **{p + "_tflops": flops / med[p] / 1e9 for p in PROVIDERS}}
                rows.append(row)
                print(f"{b}x{h}x{s} d{d} {'causal' if causal else 'full  '}: " +
                      "  ".join(f"{p} {row[p + '_tflops']:.0f}" for p in PROVIDERS) +
                      f"  | tessera/cudnn {med['cudnn'] / med['tessera']:.3f}"
                      f"  tessera/flash2 {med['flash2'] / med['tessera']:.3f}"
                      f"  cudnn2/cudnn {med['cudnn'] / med['cudnn2']:.3f}", flush=True)
                del q, k, v
    header = "| b x h x s | d | causal | tessera | cuDNN | FA2 | efficient | tessera / cuDNN | tessera / FA2 | cuDNN vs itself |"
    lines = [header, "|" + " --- |" * 10]
    for r in rows:
        lines.append(f"| {r['b']} x {r['h']} x {r['s']} | {r['d']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['tessera_tflops']:.0f} | {r['cudnn_tflops']:.0f} | {r['flash2_tflops']:.0f} | "
                     f"{r['efficient_tflops']:.0f} | {r['tessera_tflops'] / r['cudnn_tflops']:.2f} | "
                     f"{r['tessera_tflops'] / r['flash2_tflops']:.2f} | "
                     f"{r['cudnn2_tflops'] / r['cudnn_tflops']:.2f} |")
    table = "\n".join(lines)
    print("==== final table (forward, bf16, TFLOP/s, median of interleaved rounds)")
    print(table)
    if args.out:
        write_results(args.out, "attention", {"rounds": args.rounds}, rows, table)


if __name__ == "__main__":
    main()
