#!/usr/bin/env python3
"""tessera's rms_norm_float8 (RMSNorm, or add_rms_norm with a residual, whose output is also
quantized for the float8 projections after it) against the two ops it fuses and against torch.

    python benchmarks/rms_norm_float8.py [--shapes 4096x4096,8192x8192] [--dtype bfloat16]
                                         [--granularity row] [--rounds 3] [--no-compile] [--out DIR]

One call normalizes x [T, H] (randn; with --residual also adds a residual first, writing the sum)
and quantizes the output with one scale per row ('row') or for the tensor ('tensor'), with the
copy of its columns along T that wgrad takes (q_t [H, T]), as a Float8Linear's forward wants it
under autograd. Providers:
- torch: torch's rms_norm (after the add) then tessera.float8._torch_quantize of the output, rows
  and columns (the columns on its transpose);
- compile: torch.compile of the torch provider;
- tessera unfused: tessera.rms_norm (add_rms_norm) then tessera's float8_quantize (two passes);
- tessera: float8.rms_norm's (add_rms_norm's) kernels (rms_norm_float8: the norm takes the
  output's maxima as it writes it, then float8_quantize's second pass), through its autograd
  Function with the columns asked for, as under autograd.
Times: triton's do_bench (L2 flushed, median), the median of --rounds interleaved rounds; and the
tessera providers' kernels' own time (torch.profiler, 'GPU ms'), which the host's launch gaps do
not enter (the calls take tens of microseconds, near the host's cost of making them). GB/s
counts the floor's bytes: x (and the residual) read once, the output (and the sum) written once,
q and q_t written once, the scales. The fused form moves one more read of the output than that
floor (its second pass, which needs every row's maxima before any column is final), so its best
is 6 / 8 of the copy rate without the residual, 10 / 12 with it. 'of copy' is GB/s over the copy
rate (ANCHORS.md: 4226 GB/s on the H200). tessera's outputs are checked against the unfused
form's, bit for bit, before timing.
Written as rms_norm_float8.json / .md under --out.
"""
import argparse

import torch

import tessera
import tessera.float8 as f8
from common import interleaved_ms, kernel_ms, write_results
from float8_quantize import same_bits
from tessera._float8_producers import norm_function

COPY_GBPS = 4226.0
EPS = 1e-6


def providers(granularity: str, residual: bool, compile_: bool):
    def torch_fn(x, w, r):
        s = x + r if residual else x
        y = torch.nn.functional.rms_norm(s, (x.shape[-1],), w, EPS)
        q, scale = f8._torch_quantize(y, granularity)
        q_t, scale_t = f8._torch_quantize(y.t().contiguous(), granularity)
        return y, q, scale, q_t, scale_t

    def unfused(x, w, r):
        y = tessera.add_rms_norm(x, r, w, EPS)[0] if residual else tessera.rms_norm(x, (x.shape[-1],), w, EPS)
        return (y, *f8._quantize_both(y, granularity, True))

    def fused(x, w, r):  # float8.rms_norm's Function, the copies it leaves for the next projection
        out = norm_function().apply(x, r if residual else None, w, EPS, 0.0, granularity, True)
        return (out[0] if residual else out, *f8._last_x[4])

    out = {"torch": torch_fn}
    if compile_:
        out["compile"] = torch.compile(torch_fn)
    out["tessera unfused"] = unfused
    out["tessera"] = fused
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096,8192x8192")  # Llama-3 8B's and 70B's hidden sizes
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--granularity", default="row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default="bench_out/rms_norm_float8")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows, lines = [], []
    for text in args.shapes.split(","):
        t, h = (int(v) for v in text.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        x, r = (torch.randn(t, h, device="cuda", generator=gen).to(dtype) for _ in range(2))
        w = (torch.rand(h, device="cuda", generator=gen) + 0.5).to(dtype)
        for granularity in args.granularity.split(","):
            for residual in (False, True):
                calls = {name: (lambda fn=fn: fn(x, w, r)) for name, fn in
                         providers(granularity, residual, not args.no_compile).items()}
                with torch.no_grad():
                    want, got = calls["tessera unfused"](), calls["tessera"]()
                    assert all(same_bits(a, b) for a, b in zip(got, want)), (text, granularity, residual)
                    e = x.element_size()
                    floor = t * h * ((3 if residual else 1) * e + e + 2) + 4 * sum(s.numel() for s in got[2::2])
                    ms = interleaved_ms(calls, args.rounds)
                    gpu = {p: kernel_ms(calls[p]) for p in ("tessera unfused", "tessera")}
                mode = granularity + (" add" if residual else "")
                for name, ms_ in ms.items():
                    gbps = floor / (ms_ * 1e6)
                    rows.append({"shape": [t, h], "mode": mode, "provider": name, "ms": ms_, "gbps": gbps,
                                 "copy_fraction": gbps / COPY_GBPS})
                ours = ms["tessera"]
                cells = [f"{t} x {h}", mode, *(f"{ms[p]:.3f}" if p in ms else "" for p in
                                                ("torch", "compile", "tessera unfused", "tessera")),
                         f"{floor / (ours * 1e6):.0f}", f"{floor / (ours * 1e6) / COPY_GBPS:.0%}",
                         f"{ms['tessera unfused'] / ours:.2f}x",
                         f"{min(v for p, v in ms.items() if not p.startswith('tessera')) / ours:.2f}x"]
                gpu_ms = sum(gpu["tessera"].values())
                cells += [f"{gpu_ms:.3f}", f"{sum(gpu['tessera unfused'].values()):.3f}",
                          f"{floor / (gpu_ms * 1e6) / COPY_GBPS:.0%}"]
                line = "| " + " | ".join(cells) + " |"
                print(line, flush=True)
                for p in gpu:
                    print(f"  {p} kernels (GPU ms a call): "
                          + "; ".join(f"{k[:70]} {v:.4f}" for k, v in sorted(gpu[p].items(), key=lambda kv: -kv[1])),
                          flush=True)
                lines.append(line)
    table = "\n".join([f"rms_norm_float8, {args.dtype}: ms (triton do_bench, median of {args.rounds} rounds), "
                       f"tessera's GB/s over the floor's bytes and its share of the {COPY_GBPS:.0f} GB/s copy rate",
                       "",
                       "| T x H | scales | torch | compile | tessera unfused | tessera | GB/s | of copy | "
                       "unfused / tessera | best peer / tessera | tessera GPU ms | unfused GPU ms | GPU of copy |",
                       "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
                       *lines])
    print(table)
    write_results(args.out, "rms_norm_float8", {"dtype": args.dtype}, rows, table)


if __name__ == "__main__":
    main()
