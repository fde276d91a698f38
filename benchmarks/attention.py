#!/usr/bin/env python3
"""Attention forward (or backward) against torch's SDPA backends, in TFLOP/s, as a user calls it.

    python benchmarks/attention.py [--rounds R] [--dims 128,64] [--quick] [--backward]
                                   [--deterministic] [--gqa] [--out DIR]

Providers, timed in the same run and interleaved within each of R rounds (each case reports the
median over rounds): tessera.scaled_dot_product_attention; F.scaled_dot_product_attention under
sdpa_kernel(CUDNN_ATTENTION), (FLASH_ATTENTION) (FlashAttention-2) and (EFFICIENT_ATTENTION);
and "cudnn2", cuDNN timed a second time, so cudnn2 / cudnn is the harness's own noise. Timing is
triton's do_bench (L2 flushed before each call, median of the calls). FLOPs: 4 b h s^2 d per
forward, half of that under the causal mask.

--backward times the backward instead, through autograd as training meets it: the forward once,
then torch.autograd.grad(out, (q, k, v), grad, retain_graph=True) per call; FLOPs 2.5 times the
forward's (five products of the forward's size against its two). --deterministic adds the provider
"tessera_det": tessera with deterministic=True (dq summed in a fixed order).

Shapes (the attention issue's): batch x heads = 4 x 32 at seq 4096, 16 x 16 at 1024, 1 x 32 at
16384; head_dim 128 and 64; bf16; causal and not. Each output is checked against cuDNN's first.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tessera
from common import bench_ms, interleaved_ms, write_results

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


def backward_of(fn, q, k, v, causal, grad):
    """A call that runs fn's backward for `grad` (its forward done once, outside the timing)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def kernels_of(fn) -> list:
    """The CUDA kernels one call of fn launches (names), from torch's profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()]


def extras(rounds: int) -> list:
    """The GQA and varlen bars: 32 query heads on 8 KV heads against 32 on 32 (4 x 4096, d 128),
    and 64 packed sequences of random lengths in [1, 4096] against the padded batch (32 heads, d
    128); each as TFLOP/s of the FLOPs the call must do (varlen: the sum over its sequences)."""
    lines = []
    g = torch.Generator().manual_seed(0)
    x = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    q, k8, v8, k32, v32 = x(4, 32, 4096, 128), x(4, 8, 4096, 128), x(4, 8, 4096, 128), x(4, 32, 4096, 128), x(4, 32, 4096, 128)
    t = {"gqa": [], "mha": []}
    for _ in range(rounds):
        t["gqa"].append(bench_ms(lambda: tessera.scaled_dot_product_attention(q, k8, v8, enable_gqa=True)))
        t["mha"].append(bench_ms(lambda: tessera.scaled_dot_product_attention(q, k32, v32)))
    flops = 4.0 * 4 * 32 * 4096 * 4096 * 128
    gqa, mha = (flops / statistics.median(t[n]) / 1e9 for n in ("gqa", "mha"))
    lines.append(f"| GQA 32/8 vs MHA, 4 x 4096, d 128 | {gqa:.0f} | {mha:.0f} | {gqa / mha:.3f} |")
    del q, k8, v8, k32, v32
    lens = torch.randint(1, 4097, (64,), generator=g)
    cu = torch.zeros(65, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    cu = cu.cuda()
    total, mx = int(lens.sum()), int(lens.max())
    qp, kp, vp = x(total, 32, 128), x(total, 32, 128), x(total, 32, 128)
    pq, pk, pv = x(64, mx, 32, 128), x(64, mx, 32, 128), x(64, mx, 32, 128)
    t = {"varlen": [], "padded": []}
    for _ in range(rounds):
        t["varlen"].append(bench_ms(lambda: tessera.flash_attention_varlen(qp, kp, vp, cu, cu, mx, mx)))
        t["padded"].append(bench_ms(lambda: tessera.flash_attention(pq, pk, pv)))
    useful = sum(4.0 * 32 * int(n) ** 2 * 128 for n in lens)
    varlen = useful / statistics.median(t["varlen"]) / 1e9
    padded = 4.0 * 64 * 32 * mx * mx * 128 / statistics.median(t["padded"]) / 1e9
    lines.append(f"| varlen 64 x [1, 4096] vs padded, 32 heads, d 128 | {varlen:.0f} | {padded:.0f} | "
                 f"{varlen / padded:.3f} |")
    # Decode: one query against a 32768-key cache, batch 1, 32 heads; bytes K and V once.
    q1, kc, vc = x(1, 32, 1, 128), x(1, 32, 32768, 128), x(1, 32, 32768, 128)
    t = {"tessera": [], "torch": []}
    for _ in range(rounds):
        t["tessera"].append(bench_ms(lambda: tessera.scaled_dot_product_attention(q1, kc, vc)))
        t["torch"].append(bench_ms(lambda: F.scaled_dot_product_attention(q1, kc, vc)))
    nbytes = 2.0 * 32 * 32768 * 128 * 2
    ours, theirs = (nbytes / statistics.median(t[n]) / 1e6 for n in ("tessera", "torch"))
    lines.append(f"| decode 1 x 32 x 32768, d 128 (GB/s; baseline: torch's SDPA) | {ours:.0f} | {theirs:.0f} | "
                 f"{ours / theirs:.3f} |")
    # GQA decode: batch 8, 32 query heads on 8 KV heads, 8192 keys; bytes K and V once.
    qg, kg, vg = x(8, 32, 1, 128), x(8, 8, 8192, 128), x(8, 8, 8192, 128)
    t = {"tessera": [], "torch": []}
    for _ in range(rounds):
        t["tessera"].append(bench_ms(lambda: tessera.scaled_dot_product_attention(qg, kg, vg, enable_gqa=True)))
        t["torch"].append(bench_ms(lambda: F.scaled_dot_product_attention(qg, kg, vg, enable_gqa=True)))
    gbytes = 2.0 * 8 * 8 * 8192 * 128 * 2
    ours_g, theirs_g = (gbytes / statistics.median(t[n]) / 1e6 for n in ("tessera", "torch"))
    lines.append(f"| decode GQA 8 x 32/8 x 8192, d 128 (GB/s; baseline: torch's SDPA) | {ours_g:.0f} | "
                 f"{theirs_g:.0f} | {ours_g / theirs_g:.3f} |")
    del qg, kg, vg
    # The same decode from a paged cache (blocks of 256 and 16 keys, handed out shuffled) against
    # the contiguous cache (flash_attention_with_kvcache both): the cost of the block table.
    q1 = q1.transpose(1, 2)
    kc, vc = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    lens = torch.full((1,), 32768, dtype=torch.int32, device="cuda")
    for bs in (256, 16):
        perm = torch.randperm(32768 // bs, generator=g).cuda()
        kp, vp = kc.view(-1, bs, 32, 128)[perm].contiguous(), vc.view(-1, bs, 32, 128)[perm].contiguous()
        table = torch.argsort(perm).to(torch.int32)[None]  # block i of the sequence is at kp[table[0, i]]
        want = tessera.flash_attention_with_kvcache(q1, kc, vc, lens)
        got = tessera.flash_attention_with_kvcache(q1, kp, vp, lens, block_table=table)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        t = {"paged": [], "contiguous": []}
        for _ in range(rounds):
            t["paged"].append(bench_ms(lambda: tessera.flash_attention_with_kvcache(q1, kp, vp, lens, block_table=table)))
            t["contiguous"].append(bench_ms(lambda: tessera.flash_attention_with_kvcache(q1, kc, vc, lens)))
        paged, contiguous = (nbytes / statistics.median(t[n]) / 1e6 for n in ("paged", "contiguous"))
        lines.append(f"| decode, paged cache (blocks of {bs}) vs contiguous, 1 x 32 x 32768 (GB/s) | {paged:.0f} | "
                     f"{contiguous:.0f} | {paged / contiguous:.3f} |")
    return lines


GQA_HEADS = ((16, 4), (32, 8))


def gqa(args) -> list:
    """The GQA bars (the Llama-step issue's): query/KV heads 16/4 and 32/8, head_dim 128, causal,
    seq 2048 to 8192, batch 1 to 4; tessera against cuDNN (SDPA with enable_gqa under the cuDNN
    backend; where that backend refuses GQA, on K and V repeated per query head, as a user would
    call it: its backward then includes the sum over each group), forward or backward."""
    rows = []
    seqs = [4096] if args.quick else [2048, 4096, 8192]
    batches = [2] if args.quick else [1, 2, 4]
    for hq, hkv in GQA_HEADS:
        for s in seqs:
            for b in batches:
                x = lambda h: torch.randn(b, h, s, 128, device="cuda", dtype=torch.bfloat16)
                q, k, v = x(hq), x(hkv), x(hkv)

                def cudnn(q, k, v, causal):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        try:
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                        except RuntimeError:
                            r = q.shape[1] // k.shape[1]
                            return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                                                                  is_causal=causal)

                fns = {"tessera": lambda q, k, v, c: tessera.scaled_dot_product_attention(q, k, v, is_causal=c, enable_gqa=True),
                       "cudnn": cudnn, "cudnn2": cudnn}
                if args.backward:
                    grad = torch.randn_like(q)
                    calls = {p: backward_of(fn, q, k, v, True, grad) for p, fn in fns.items()}
                    want, got = calls["cudnn"](), calls["tessera"]()
                    for name, w, g in zip("qkv", want, got):
                        err = ((g.float() - w.float()).norm() / w.float().norm()).item()
                        assert err < 2e-2, f"tessera's d{name} differs from cuDNN's by {err} at {(b, hq, hkv, s)}"
                    flops = 2.5 * 2.0 * b * hq * s * s * 128
                else:
                    calls = {p: (lambda fn=fn: fn(q, k, v, True)) for p, fn in fns.items()}
                    err = (calls["tessera"]().float() - calls["cudnn"]().float()).abs().max().item()
                    assert err < 2e-2, f"tessera differs from cuDNN by {err} at {(b, hq, hkv, s)}"
                    flops = 2.0 * b * hq * s * s * 128
                med = interleaved_ms(calls, args.rounds)
                row = {"b": b, "hq": hq, "hkv": hkv, "s": s, **{p + "_tflops": flops / med[p] / 1e9 for p in calls}}
                rows.append(row)
                print(f"{b}x{hq}/{hkv}x{s}: " + "  ".join(f"{p} {row[p + '_tflops']:.0f}" for p in calls) +
                      f"  | tessera/cudnn {med['cudnn'] / med['tessera']:.3f}  cudnn2/cudnn {med['cudnn'] / med['cudnn2']:.3f}",
                      flush=True)
                del q, k, v, calls
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--quick", action="store_true", help="the 4 x 32 x 4096 shape only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--extras", action="store_true", help="also the GQA and varlen bars")
    ap.add_argument("--backward", action="store_true", help="time the backward (through autograd)")
    ap.add_argument("--deterministic", action="store_true", help="also tessera with deterministic=True")
    ap.add_argument("--gqa", action="store_true", help="the GQA bars only (16/4 and 32/8 heads, causal, d 128)")
    args = ap.parse_args()
    if args.gqa:
        rows = gqa(args)
        lines = ["| b x heads x s | tessera | cuDNN | tessera / cuDNN | cuDNN vs itself |", "|" + " --- |" * 5]
        lines += [f"| {r['b']} x {r['hq']}/{r['hkv']} x {r['s']} | {r['tessera_tflops']:.0f} | {r['cudnn_tflops']:.0f} | "
                  f"{r['tessera_tflops'] / r['cudnn_tflops']:.2f} | {r['cudnn2_tflops'] / r['cudnn_tflops']:.2f} |" for r in rows]
        table = "\n".join(lines)
        kind = "backward" if args.backward else "forward"
        print(f"==== final table (GQA {kind}, causal, d 128, bf16, TFLOP/s, median of interleaved rounds)")
        print(table)
        if args.out:
            write_results(args.out, f"attention_gqa_{kind}", {"rounds": args.rounds}, rows, table)
        return
    if args.deterministic:
        PROVIDERS["tessera_det"] = lambda q, k, v, causal: tessera.flash_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, deterministic=True).transpose(1, 2)
    shapes = [(4, 32, 4096)] if args.quick else [(4, 32, 4096), (16, 16, 1024), (1, 32, 16384)]
    rows = []
    for d in [int(x) for x in args.dims.split(",")]:
        for b, h, s in shapes:
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                if args.backward:
                    grad = torch.randn_like(q)
                    calls = {p: backward_of(fn, q, k, v, causal, grad) for p, fn in PROVIDERS.items()}
                    names = kernels_of(calls["tessera"])
                    assert any("attention_bwd_sm90" in n for n in names), f"tessera's kernel did not run: {names}"
                    want, got = calls["cudnn"](), calls["tessera"]()
                    for name, w, g in zip("qkv", want, got):
                        err = ((g.float() - w.float()).norm() / w.float().norm()).item()
                        assert err < 2e-2, f"tessera's d{name} differs from cuDNN's by {err} (relative) at {(b, h, s, d, causal)}"
                    flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                else:
                    calls = {p: (lambda fn=fn: fn(q, k, v, causal)) for p, fn in PROVIDERS.items()}
                    names = kernels_of(calls["tessera"])
                    assert any("attention_sm90" in n for n in names), f"tessera's kernel did not run: {names}"
                    want, got = calls["cudnn"](), calls["tessera"]()
                    err = (got.float() - want.float()).abs().max().item()
                    assert err < 2e-2, f"tessera differs from cuDNN by {err} at {(b, h, s, d, causal)}"
                    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                med = interleaved_ms(calls, args.rounds)
                row = {"b": b, "h": h, "s": s, "d": d, "causal": causal,
                       **{p + "_tflops": flops / med[p] / 1e9 for p in PROVIDERS}}
                rows.append(row)
                print(f"{b}x{h}x{s} d{d} {'causal' if causal else 'full  '}: " +
                      "  ".join(f"{p} {row[p + '_tflops']:.0f}" for p in PROVIDERS) +
                      f"  | tessera/cudnn {med['cudnn'] / med['tessera']:.3f}"
                      f"  tessera/flash2 {med['flash2'] / med['tessera']:.3f}"
                      f"  cudnn2/cudnn {med['cudnn'] / med['cudnn2']:.3f}", flush=True)
                del q, k, v, calls
    header = "| b x h x s | d | causal | tessera | cuDNN | FA2 | efficient | tessera / cuDNN | tessera / FA2 | cuDNN vs itself |"
    lines = [header, "|" + " --- |" * 10]
    for r in rows:
        lines.append(f"| {r['b']} x {r['h']} x {r['s']} | {r['d']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['tessera_tflops']:.0f} | {r['cudnn_tflops']:.0f} | {r['flash2_tflops']:.0f} | "
                     f"{r['efficient_tflops']:.0f} | {r['tessera_tflops'] / r['cudnn_tflops']:.2f} | "
                     f"{r['tessera_tflops'] / r['flash2_tflops']:.2f} | "
                     f"{r['cudnn2_tflops'] / r['cudnn_tflops']:.2f} |")
    if args.deterministic:
        lines += ["", "| b x h x s | d | causal | tessera | tessera, deterministic | ratio |", "|" + " --- |" * 6]
        lines += [f"| {r['b']} x {r['h']} x {r['s']} | {r['d']} | {'yes' if r['causal'] else 'no'} | "
                  f"{r['tessera_tflops']:.0f} | {r['tessera_det_tflops']:.0f} | "
                  f"{r['tessera_det_tflops'] / r['tessera_tflops']:.2f} |" for r in rows]
    if args.extras:
        lines += ["", "| case | tessera | baseline | ratio |", "| --- | --- | --- | --- |"] + extras(args.rounds)
    table = "\n".join(lines)
    print(f"==== final table ({'backward' if args.backward else 'forward'}, bf16, TFLOP/s, median of interleaved rounds)")
    print(table)
    if args.out:
        write_results(args.out, "attention_backward" if args.backward else "attention", {"rounds": args.rounds},
                      rows, table)


if __name__ == "__main__":
    main()
