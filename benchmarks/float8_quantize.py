#!/usr/bin/env python3
"""tessera's float8_quantize kernel against torch's quantize (tessera.float8.quantize's torch code)
and torch.compile of it, row-wise or 1 x 128 block scales, with and without the transposed copy.

    python benchmarks/float8_quantize.py [--shapes 8192x4096,16384x14336] [--dtype bfloat16]
                                         [--granularity row,block] [--rounds 3] [--no-compile] [--out DIR]
                                         [--gated] [--gated-granularity row]

One call quantizes a [M, K] tensor (randn) to float8_e4m3fn with one scale per row, or per 1 x 128
block of a row ('rows'), or also its columns along M, transposed, q_t [K, M] with a scale per
column or per 128 x 1 block of a column ('rows+columns': what a backward takes, the output
gradient for dgrad and wgrad), or those columns alone ('columns': a weight's copy for dgrad).
Providers:
- torch: tessera.float8._torch_quantize (amax, scale, divide, clamp, cast); for the columns the
  same on x.t().contiguous(), so that q_t is row-major as the kernel writes it;
- compile: torch.compile of the torch provider;
- tessera: tessera.float8._kernel_quantize (rows: one kernel; with the columns: two passes over
  128 x 64 tiles by rows, one pass over 128 x 128 tiles by blocks; the columns alone the same
  passes without the rows' quotients and stores).
With --gated, also SwiGLU's product silu(gate) * up quantized (gate and up [M, K], randn), the
down projection's input in float8 training: torch's silu and product then its quantize (and
compile of the whole), tessera's silu_mul then float8_quantize ('tessera unfused'), and tessera's
float8_quantize_gated (tessera.float8._quantize_gated: the product quantized in the pass that
computes it, where the quantization takes two passes, rows with columns; rows alone and blocks it
composes the two, the faster there); the floor reads gate and up once.
Times: triton's do_bench (L2 flushed, median), the median of --rounds interleaved rounds. GB/s
counts the floor's bytes for every provider: x read once, q (and q_t) written once, the scales;
'of copy' is that rate over the copy rate measured on this GPU (ANCHORS.md: 4226 GB/s on the
H200). torch's q and scales are checked against tessera's, bit for bit, before timing (compile's
too; a difference there, inductor's own rounding, is noted, not fatal).
Written as float8_quantize.json / .md under --out.
"""
import argparse

import torch

import tessera.float8 as f8
from common import interleaved_ms, write_results

COPY_GBPS = 4226.0


def providers(granularity: str, columns: bool, rows: bool, compile_: bool):
    def torch_rows(x):
        return f8._torch_quantize(x, granularity)

    def torch_columns(x):  # scale_t as the kernel lays it out: [1, K] (row), [M / 128, K] (block)
        q_t, s_t = f8._torch_quantize(x.t().contiguous(), granularity)
        return q_t, s_t.reshape(1, -1) if granularity == "row" else s_t.t()

    def torch_both(x):
        return (*torch_rows(x), *torch_columns(x))

    fn = torch_both if columns and rows else torch_columns if columns else torch_rows
    out = {"torch": fn}
    if compile_:
        out["compile"] = torch.compile(fn)
    out["tessera"] = lambda x: f8._kernel_quantize(x, granularity, columns=columns, rows=rows)
    return out


def gated_providers(granularity: str, columns: bool, compile_: bool):
    """silu(gate) * up quantized (rows, or rows and columns)."""
    import tessera

    def torch_exact(g, u):  # the product in float32, rounded once (as silu_mul rounds it)
        p = (torch.nn.functional.silu(g.float()) * u.float()).to(g.dtype)
        return providers(granularity, columns, True, False)["torch"](p)

    out = {"torch": torch_exact}
    if compile_:
        out["compile"] = torch.compile(torch_exact)
    out["tessera unfused"] = lambda g, u: f8._quantize_both(tessera.silu_mul(g, u), granularity, columns)[:4 if columns else 2]
    out["tessera"] = lambda g, u: f8._quantize_gated(g, u, "silu", granularity, columns)[:4 if columns else 2]
    return out


def same_bits(a, b):
    view = torch.uint8 if a.dtype == torch.float8_e4m3fn else torch.int32
    return a.shape == b.shape and torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def measure(calls, floor: int, shape, mode: str, rounds: int, exact, rows: list) -> str:
    """Checks every provider's bytes against tessera's (those not in ``exact`` may differ: noted),
    times them interleaved, appends their rows and returns the table line: tessera's time, GB/s
    over the floor's bytes and share of copy, the best peer's ratio (providers not tessera's), and
    tessera's other providers' ('tessera unfused') in brackets."""
    m, k = shape
    want = calls["tessera"]()
    for name, call in calls.items():
        same = all(same_bits(g, w) for g, w in zip(call(), want))
        assert same or name not in exact, (name, mode, shape)
        if not same:
            print(f"note: {name} {mode} {m}x{k}: not tessera's bits", flush=True)
    floor += 4 * sum(t.numel() for t in want[1::2])  # the scales
    ms = interleaved_ms(calls, rounds)
    for name, t in ms.items():
        gbps = floor / (t * 1e6)
        rows.append({"shape": [m, k], "mode": mode, "provider": name, "ms": t, "gbps": gbps,
                     "copy_fraction": gbps / COPY_GBPS})
    t = ms["tessera"]
    ours = [f"{p} {ms[p] / t:.2f}x" for p in ms if p.startswith("tessera ")]
    cells = [f"{m} x {k}", mode, *(f"{ms[p]:.3f}" if p in ms else "" for p in ("torch", "compile", "tessera")),
             f"{floor / (t * 1e6):.0f}", f"{floor / (t * 1e6) / COPY_GBPS:.0%}",
             f"{min(v for p, v in ms.items() if not p.startswith('tessera')) / t:.2f}x"
             + (f" ({', '.join(ours)})" if ours else "")]
    line = "| " + " | ".join(cells) + " |"
    print(line, flush=True)
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x4096,16384x14336")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--granularity", default="row,block")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--gated", action="store_true", help="also SwiGLU's product quantized (gate and up [M, K])")
    ap.add_argument("--gated-granularity", default="row",
                    help="the gated product's granularities (block: the two ops composed, as tessera.float8 does)")
    ap.add_argument("--out", default="bench_out/float8_quantize")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    grans = args.granularity.split(",")
    rows, lines = [], []
    for text in args.shapes.split(","):
        m, k = (int(v) for v in text.split("x"))
        x = torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0)).to(dtype)
        for granularity, (rows_, columns) in ((g, c) for g in grans for c in ((True, False), (True, True), (False, True))):
            mode = granularity + (" rows+columns" if columns and rows_ else " columns" if columns else " rows")
            calls = {name: (lambda fn=fn: fn(x)) for name, fn in
                     providers(granularity, columns, rows_, not args.no_compile).items()}
            # torch's code is the reference; inductor may round its own way (a division by the
            # constant as a product, say): reported, not fatal
            floor = x.numel() * (x.element_size() + (2 if columns and rows_ else 1))
            lines.append(measure(calls, floor, (m, k), mode, args.rounds, ("torch", "tessera"), rows))
        if not args.gated:
            continue
        gen = torch.Generator(device="cuda").manual_seed(1)
        gate, up = (torch.randn(m, k, device="cuda", generator=gen).to(dtype) for _ in range(2))
        for granularity, columns in ((g, c) for g in args.gated_granularity.split(",") for c in (False, True)):
            mode = "silu gated, " + granularity + (" rows+columns" if columns else " rows")
            calls = {name: (lambda fn=fn: fn(gate, up)) for name, fn in
                     gated_providers(granularity, columns, not args.no_compile).items()}
            # torch's silu rounds its own way (expf, not the fast form): reported, not fatal
            floor = gate.numel() * (2 * gate.element_size() + (2 if columns else 1))
            lines.append(measure(calls, floor, (m, k), mode, args.rounds, ("tessera unfused", "tessera"), rows))
    table = "\n".join([f"float8_quantize, {args.dtype} input, row-wise and 1 x 128 block scales; ms (triton do_bench, median of "
                       f"{args.rounds} rounds), tessera's GB/s over the floor's bytes and its share of the "
                       f"{COPY_GBPS:.0f} GB/s copy rate; in brackets, tessera's other way against tessera's",
                       "",
                       "| shape | outputs | torch | compile | tessera | tessera GB/s | of copy | best peer / tessera |",
                       "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", *lines])
    print(table)
    write_results(args.out, "float8_quantize", {"dtype": args.dtype}, rows, table)


if __name__ == "__main__":
    main()
