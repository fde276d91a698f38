#!/usr/bin/env python3
"""The Llama step's fused ops one at a time, at the model's sizes, forward + backward through
autograd: tessera's public functions against torch.compile of the same math and Liger-Kernel.

    python benchmarks/llama_ops.py [--small] [--ops LIST] [--rounds R] [--out DIR] [--kernels]

Sizes are llama_step's (FULL, or SMALL with --small): tokens = batch x seq. Each timed call runs
the forward on inputs that require grad and torch.autograd.grad of its outputs (a fixed gradient
per output): what a training step pays for the op. Providers: tessera; compile, torch.compile
(default mode) of the plain torch function; compile2, the same compiled function timed again (the
harness read against itself: compile2 / compile should be 1.00); liger, Liger-Kernel's autograd
Function for the op (rms_norm, add_rms_norm, rotary, silu_mul, geglu, cross_entropy,
linear_ce), where liger_kernel imports (otherwise left out, with a note printed;
benchmarks/peers.py says how each is called and what Liger writes in place: it gets inputs and
gradients of its own). Interleaved within each of R rounds; each case reports the median over
rounds of bench_ms (triton's do_bench: L2 flushed, median) and, since at these sizes a memory-bound
call's wall time is mostly the host's, its GPU time: the kernels' durations summed from
torch.profiler over single calls, each after an L2 flush (median of 5). Before timing, tessera's
and Liger's outputs and gradients are checked against the torch function's, eager (Liger's on fresh
copies of the inputs; a Liger that fails or disagrees is left out of the case, and the row says
why). The best peer of a case is the faster of compile and liger, by wall time and (separately) by
GPU time; the last table gives tessera against each.

Cases (what the compiled side computes):
  rms_norm        F.rms_norm(x, (dim,), w)                                     memory-bound
  add_rms_norm    s = x + r; (F.rms_norm(s, (dim,), w), s)                     memory-bound
  rotary          q, k (batch, seq, heads, head_dim) rotated by cos/sin (seq, head_dim / 2),
                  NeoX halves, in float32, cast back (Liger: on transposed views,
                  (batch, heads, seq, head_dim), cos/sin as Hugging Face's (1, seq, head_dim))
                                                                                memory-bound
  silu_mul        F.silu(g) * u on (tokens, ffn)                                memory-bound
  geglu   F.gelu(g, approximate="tanh") * u on (tokens, ffn): GeGLU     memory-bound
  mlp             the feed-forward with one w13 (gate and up interleaved in blocks of 64):
                  F.linear(swiglu(F.linear(x, w13)), w2); tessera.mlp           GEMM-bound
  linear_ce       F.cross_entropy(F.linear(h, W).float(), t); tessera.linear_cross_entropy
  cross_entropy   F.cross_entropy(logits.float(), t, weight=class weights, label_smoothing=0.1)
                  on bf16 logits of (tokens / 2, vocab)                         memory-bound
  alibi           causal GQA attention with ALiBi slopes (-slope * (i - j)): torch.compile of
                  flex_attention with that score_mod and a causal block mask; tessera.flash_attention
Memory-bound cases also report GB/s of their compulsory traffic (inputs read and outputs written,
forward and backward) over the GPU time, against the copy rate measured in the same run (a 1 GiB
clone) and against a copy at the op's size (of its first input's bytes, GPU time taken as the
op's); GEMM-bound and attention cases report TFLOP/s.
"""
import argparse
import statistics
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import peers
import tessera
from common import bench_ms, interleaved_ms, write_results
from llama_report import profile_step
from llama_step import FULL, SMALL

OPS = ("rms_norm", "add_rms_norm", "rotary", "silu_mul", "geglu", "mlp", "linear_ce", "cross_entropy",
       "alibi")
BF = torch.bfloat16
SMALL_BELOW_GIB = 60  # linear_ce's eager check holds float32 logits of 8192 x 128256 and their gradient


def randn(*shape, scale=1.0, dtype=BF):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def rope_math(q, k, cos, sin):
    def rot(x):
        x1, x2 = x.float().chunk(2, -1)
        c, s = cos[None, :, None], sin[None, :, None]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), -1).to(x.dtype)
    return rot(q), rot(k)


def swiglu_mlp(x, w13, w2):
    z = F.linear(x, w13).unflatten(-1, (-1, 2, 64))
    return F.linear((F.silu(z[..., 0, :]) * z[..., 1, :]).flatten(-2), w2)


def case(op, c):
    """(inputs, how many of them are differentiable, tessera's function, torch's, bytes or None,
    FLOPs or None): the byte count is the compulsory traffic of forward and backward."""
    t, d, f, v = c.batch * c.seq, c.dim, c.ffn, c.vocab
    e = 2  # bf16
    if op == "rms_norm":
        return ([randn(t, d), 1 + 0.1 * randn(d)], 2, lambda x, w: tessera.rms_norm(x, (d,), w, c.eps),
                lambda x, w: F.rms_norm(x, (d,), w, c.eps), 5 * t * d * e, None)
    if op == "add_rms_norm":
        def torch_fn(x, r, w):
            s = x + r
            return F.rms_norm(s, (d,), w, c.eps), s
        return ([randn(t, d), randn(t, d), 1 + 0.1 * randn(d)], 3,
                lambda x, r, w: tessera.add_rms_norm(x, r, w, c.eps), torch_fn, 8 * t * d * e, None)
    if op == "rotary":
        angles = torch.outer(torch.arange(c.seq, device="cuda").float(),
                             c.rope_theta ** -(torch.arange(0, c.head_dim, 2, device="cuda").float() / c.head_dim))
        q, k = randn(c.batch, c.seq, c.heads, c.head_dim), randn(c.batch, c.seq, c.kv_heads, c.head_dim)
        n = q.numel() + k.numel()
        return ([q, k, angles.cos(), angles.sin()], 2,
                lambda q, k, cs, sn: tessera.rotary_embedding(q, k, cs, sn, layout="bshd"), rope_math,
                4 * n * e, None)
    if op == "silu_mul":
        return ([randn(t, f), randn(t, f)], 2, tessera.silu_mul, lambda g, u: F.silu(g) * u, 8 * t * f * e, None)
    if op == "geglu":
        return ([randn(t, f), randn(t, f)], 2, tessera.geglu,
                lambda g, u: F.gelu(g, approximate="tanh") * u, 8 * t * f * e, None)
    if op == "mlp":
        return ([randn(t, d), randn(2 * f, d, scale=d ** -0.5), randn(d, f, scale=f ** -0.5)], 3,
                lambda x, w13, w2: tessera.mlp(x, w13, w2, activation="swiglu"), swiglu_mlp, None,
                3 * 2 * t * d * 3 * f)
    if op == "linear_ce":
        return ([randn(t, d), randn(v, d, scale=d ** -0.5), torch.randint(0, v, (t,), device="cuda")], 2,
                tessera.linear_cross_entropy, lambda h, w, tg: F.cross_entropy(F.linear(h, w).float(), tg),
                None, 3 * 2 * t * v * d)
    if op == "cross_entropy":
        rows = t // 2
        weight = torch.rand(v, device="cuda") + 0.5
        return ([randn(rows, v, scale=2.0), torch.randint(0, v, (rows,), device="cuda"), weight], 1,
                lambda x, tg, wt: tessera.cross_entropy(x, tg, wt, label_smoothing=0.1),
                lambda x, tg, wt: F.cross_entropy(x.float(), tg, weight=wt, label_smoothing=0.1),
                3 * rows * v * e, None)
    if op == "alibi":
        return alibi_case(c)
    raise ValueError(op)


def alibi_case(c):
    """Both sides take (batch, seq, heads, head_dim) tensors: tessera as FlashAttention does,
    flex_attention on transposed views (its layout is (batch, heads, seq, head_dim))."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    slopes = torch.tensor([2 ** (-8 * (i + 1) / c.heads) for i in range(c.heads)], device="cuda")
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, c.seq, c.seq, device="cuda")

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def torch_fn(q, k, v):
        o = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=alibi,
                           block_mask=mask, enable_gqa=True)
        return o.transpose(1, 2)

    shape_q = (c.batch, c.seq, c.heads, c.head_dim)
    shape_kv = (c.batch, c.seq, c.kv_heads, c.head_dim)
    flops = 3.5 * 2 * 2 * c.batch * c.heads * c.seq * c.seq * c.head_dim / 2  # causal: half
    return ([randn(*shape_q), randn(*shape_kv), randn(*shape_kv)], 3,
            lambda q, k, v: tessera.flash_attention(q, k, v, causal=True, alibi_slopes=slopes),
            torch_fn, None, flops)


def outputs(o):
    return tuple(o) if isinstance(o, (tuple, list)) else (o,)


def fwd_bwd(fn, leaves, rest, grads):
    def call():
        return torch.autograd.grad(outputs(fn(*leaves, *rest)), leaves, grads)
    return call


def check(op, got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        if not err <= 3e-2 * max(scale, 1e-6):
            raise AssertionError(f"{op}: result {i} differs from torch's by {err} (largest value {scale})")


def liger_call(op, c, leaves, rest, grads, want):
    """(the timed call of Liger's function for `op`, "") on inputs and gradients of Liger's own
    (it writes over them), after its outputs and gradients are checked against `want` on a first
    call (which also compiles its kernels); (None, why) where it fails or disagrees, (None, "")
    where Liger has no such op or does not import."""
    case = peers.llama_case(op, c, rest)
    if case is None:
        return None, ""
    fn, lrest = case
    try:
        mine = [x.detach().clone().requires_grad_() for x in leaves]
        out = outputs(fn(*mine, *lrest))
        lgrads = [g.to(o.dtype, copy=True) for g, o in zip(grads, out)]  # Liger's loss: bf16
        got = [o.detach().clone() for o in out]
        check(f"{op} (liger)", got + list(torch.autograd.grad(out, mine, lgrads)), want)
    except Exception as e:  # noqa: BLE001 - a peer that fails or disagrees is left out, not fatal
        why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        print(f"  WARNING: {op}: liger left out ({why})", flush=True)
        return None, why
    return fwd_bwd(fn, mine, lrest, lgrads), ""


def gpu_us(fn, reps=5) -> float:
    """The median over reps of one call's kernel time (us), each call after an L2 flush."""
    flush = torch.empty(1 << 28, device="cuda", dtype=torch.int8)
    times = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        times.append(sum(ms for _, ms, _ in profile_step(fn)) * 1e3)
    return statistics.median(times)


def kernel_rows(fn) -> list:
    """profile_step's (name, ms, calls) of one call after an L2 flush."""
    torch.empty(1 << 28, device="cuda", dtype=torch.int8).zero_()
    torch.cuda.synchronize()
    return profile_step(fn)


def same_size_copy_gbs(x: torch.Tensor) -> float:
    """The copy rate at the op's size: a copy of x's bytes (the op's first input), its GPU time
    taken as the op's is."""
    y = torch.empty_like(x)
    return 2 * x.numel() * x.element_size() / gpu_us(lambda: y.copy_(x)) / 1e3


def copy_rate_gbs() -> float:
    x = torch.empty(1 << 29, device="cuda", dtype=BF)  # 1 GiB
    y = torch.empty_like(x)
    ms = statistics.median(bench_ms(lambda: y.copy_(x)) for _ in range(3))
    return 2 * x.numel() * x.element_size() / ms / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="llama_step's small model")
    ap.add_argument("--ops", default=",".join(OPS), help=f"of: {', '.join(OPS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="also list each provider's kernels of one call (after an L2 flush), with their GPU times")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    if any(o not in OPS for o in ops):
        ap.error(f"--ops: expected names of {', '.join(OPS)}, got {ops}")
    gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    if not args.small and gib < SMALL_BELOW_GIB:
        print(f"llama_ops: the small model, the GPU having {gib:.0f} GiB", flush=True)
        args.small = True
    c = SimpleNamespace(**(SMALL if args.small else FULL))
    torch.manual_seed(0)
    copy = copy_rate_gbs()
    print(f"llama_ops on {torch.cuda.get_device_name()}: tokens {c.batch * c.seq}, dim {c.dim}, "
          f"ffn {c.ffn}, vocab {c.vocab}; copy rate {copy:.0f} GB/s; liger: {peers.describe()}", flush=True)
    rows = []
    for op in ops:
        inputs, n_diff, ours, theirs, nbytes, flops = case(op, c)
        leaves = [x.requires_grad_() for x in inputs[:n_diff]]
        rest = inputs[n_diff:]
        want = outputs(theirs(*leaves, *rest))
        grads = [torch.randn_like(o) for o in want]
        eager = fwd_bwd(theirs, leaves, rest, grads)
        calls = {"tessera": fwd_bwd(ours, leaves, rest, grads),
                 "compile": fwd_bwd(torch.compile(theirs), leaves, rest, grads)}
        got = [o.detach() for o in outputs(ours(*leaves, *rest))]
        want = [o.detach() for o in want] + list(eager())
        check(op, got + list(calls["tessera"]()), want)
        calls["compile"]()  # compiles forward and backward
        calls["compile2"] = calls["compile"]
        liger, liger_why = liger_call(op, c, leaves, rest, grads, want)
        if liger is not None:
            calls["liger"] = liger
        med = {k: v * 1e3 for k, v in interleaved_ms(calls, args.rounds).items()}
        gpu = {k: gpu_us(calls[k]) for k in ("tessera", "compile", "liger") if k in calls}
        if args.kernels:
            for k in ("tessera", "compile", "liger"):
                if k in calls:
                    print(f"  {op} {k} kernels:", flush=True)
                    for name, ms, n in kernel_rows(calls[k]):
                        print(f"    {ms * 1e3:9.1f} us  x{n}  {name[:150]}", flush=True)
        peer = min((k for k in ("compile", "liger") if k in calls), key=med.get)
        gpu_peer = min((k for k in ("compile", "liger") if k in calls), key=gpu.get)
        row = dict(op=op, **{k: round(v, 1) for k, v in med.items()},
                   speedup=round(med["compile"] / med["tessera"], 3),
                   harness=round(med["compile2"] / med["compile"], 3),
                   **{"gpu_" + k: round(v, 1) for k, v in gpu.items()},
                   gpu_speedup=round(gpu["compile"] / gpu["tessera"], 3),
                   peer=peer, peer_speedup=round(med[peer] / med["tessera"], 3),
                   gpu_peer=gpu_peer, gpu_peer_speedup=round(gpu[gpu_peer] / gpu["tessera"], 3))
        if liger_why:
            row["liger_left_out"] = liger_why
        if nbytes:
            row["gbs"] = round(nbytes / gpu["tessera"] / 1e3, 0)
            row["of_copy"] = round(row["gbs"] / copy, 3)
            row["copy_same_gbs"] = round(same_size_copy_gbs(inputs[0]), 0)
            row["of_copy_same"] = round(row["gbs"] / row["copy_same_gbs"], 3)
        if flops:
            row["tflops"] = round(flops / med["tessera"] / 1e6, 1)
        rows.append(row)
        rate = (f"{row['gbs']:.0f} GB/s ({row['of_copy']:.0%} of copy, {row['of_copy_same']:.0%} of a same-size copy)" if nbytes
                else f"{row['tflops']:.0f} TFLOP/s")
        lig = (f"liger {med['liger']:9.1f} us  " if "liger" in med else "")
        print(f"{op:14s} tessera {med['tessera']:9.1f} us  compile {med['compile']:9.1f} us  {lig}"
              f"{peer}/tessera {row['peer_speedup']:.3f}  (compile2/compile {row['harness']:.3f})  "
              f"GPU {gpu['tessera']:.1f} against {gpu_peer} {gpu[gpu_peer]:.1f} us ({row['gpu_peer_speedup']:.3f})  {rate}",
              flush=True)
        del inputs, leaves, rest, want, grads, calls, liger
        torch.cuda.empty_cache()
    lines = ["| op | tessera (us) | torch.compile (us) | Liger (us) | compile again (us) | best peer | "
             "best peer / tessera | again / compile | GPU: tessera (us) | GPU: torch.compile (us) | "
             "GPU: Liger (us) | GPU: best peer | GPU: best peer / tessera | tessera rate (GPU time) |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in rows:
        rate = (f"{r['gbs']:.0f} GB/s, {r['of_copy']:.0%} of copy, {r['of_copy_same']:.0%} of a same-size copy"
                if "gbs" in r else f"{r['tflops']:.0f} TFLOP/s")
        lig, gpu_lig = (f"{r[k]:.1f}" if k in r else "-" for k in ("liger", "gpu_liger"))
        lines.append(f"| {r['op']} | {r['tessera']:.1f} | {r['compile']:.1f} | {lig} | {r['compile2']:.1f} | "
                     f"{r['peer']} | {r['peer_speedup']:.3f} | {r['harness']:.3f} | {r['gpu_tessera']:.1f} | "
                     f"{r['gpu_compile']:.1f} | {gpu_lig} | {r['gpu_peer']} | {r['gpu_peer_speedup']:.3f} | {rate} |")
    table = "\n".join(lines)
    left_out = [f"{r['op']}: {r['liger_left_out']}" for r in rows if r.get("liger_left_out")]
    print(f"==== final table: forward + backward, median of {args.rounds} rounds; copy {copy:.0f} GB/s; "
          f"best peer: the faster of torch.compile and Liger ({peers.describe()})")
    print(table)
    if left_out:
        print("Liger left out: " + "; ".join(left_out))
    if args.out:
        write_results(args.out, "llama_ops", {"rounds": args.rounds, "copy_gbs": copy, "model": vars(c),
                                              "liger": peers.describe()}, rows, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
