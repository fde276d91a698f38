#!/usr/bin/env python3
"""Cross-entropy forward + backward against torch, torch.compile and Liger-Kernel: time and extra
memory, as training meets it.

    python benchmarks/cross_entropy.py [--rounds R] [--rows 8192] [--vocab 128256] [--out DIR]
    python benchmarks/cross_entropy.py --linear [--hidden 4096] ...   (linear_cross_entropy)

One call = the loss of bf16 logits (rows x vocab) against int64 targets, then
torch.autograd.grad(loss, logits) (the gradient returned, not accumulated). Providers:
- torch: F.cross_entropy(logits.float(), target), as LLM training code calls it;
- torch_bf16: F.cross_entropy(logits, target) on the bf16 logits;
- compile: torch.compile of the torch provider;
- liger: Liger-Kernel's LigerCrossEntropyFunction (benchmarks/peers.py; its loss in the logits'
  dtype, the gradient written over the logits in the forward) where liger_kernel imports;
  otherwise a Triton kernel written here after its design (two passes over each row per program:
  online max and sum, then the gradient written over the logits; its backward skips the scaling
  when the loss gradient is 1, checked on the host). The run prints which, and the JSON's meta
  records it ("liger");
- tessera: tessera.cross_entropy (gradient in a new buffer); tessera_inplace: inplace_grad=True.
Each is timed with triton's do_bench (L2 flushed, median), the median of R interleaved rounds;
"torch2" times torch a second time, so torch2 / torch is the harness's own noise. Extra memory:
the peak of torch.cuda.max_memory_allocated over one call, above what was allocated before it
(the returned gradient included). Floor: one read and one write of the logits at the copy rate
measured on this GPU (ANCHORS.md: 4226 GB/s). Each provider's loss and gradient are checked
against torch's first.

--linear: one call = loss, then the gradients of hidden and weight; providers torch (F.linear,
then F.cross_entropy), torch2 (the same again), tessera (tessera.linear_cross_entropy), liger
(LigerFusedLinearCrossEntropyFunction, where liger_kernel imports) and tessera_chunkN (--chunks);
each one's gradients checked against torch's first; written as linear_cross_entropy.json/.md.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import peers
import tessera
from common import bench_ms, write_results

COPY_GBPS = 4226.0


@triton.jit
def _liger_style_kernel(x_ptr, stride, t_ptr, loss_ptr, valid_ptr, V, ignore, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * stride
    t = tl.load(t_ptr + row)
    valid = tl.load(valid_ptr).to(tl.float32)
    m = float("-inf")
    s = 0.0
    for off in range(0, V, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    keep = t != ignore
    xt = tl.load(x_ptr + tl.where(keep, t, 0)).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(keep, lse - xt, 0.0))
    scale = tl.where(keep, 1.0 / valid, 0.0)
    for off in range(0, V, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
        g = tl.exp(x - lse) - tl.where(cols == t, 1.0, 0.0)
        tl.store(x_ptr + cols, (g * scale).to(x_ptr.dtype.element_ty), mask=cols < V)


class LigerStyle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index=-100):
        n, v = logits.shape
        loss = torch.empty(n, device=logits.device, dtype=torch.float32)
        valid = (target != ignore_index).sum()
        _liger_style_kernel[(n,)](logits, logits.stride(0), target, loss, valid, v, ignore_index,
                                  BLOCK=32768 // logits.element_size(), num_warps=32)
        ctx.save_for_backward(logits)
        return loss.sum() / valid

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        if not torch.equal(grad_output, torch.ones_like(grad_output)):
            grad = grad * grad_output
        return grad, None, None


def liger_style(logits, target):
    return LigerStyle.apply(logits, target)


def torch_fp32(logits, target):
    return F.cross_entropy(logits.float(), target)


PROVIDERS = {
    "torch": torch_fp32,
    "torch2": torch_fp32,
    "torch_bf16": lambda x, t: F.cross_entropy(x, t),
    "compile": torch.compile(torch_fp32),
    "liger": peers.cross_entropy if peers.LIGER is not None else liger_style,
    "tessera": lambda x, t: tessera.cross_entropy(x, t),
    "tessera_inplace": lambda x, t: tessera.cross_entropy(x, t, inplace_grad=True),
}


LIGER_USED = (f"{peers.describe()}: LigerCrossEntropyFunction" if peers.LIGER is not None else
              f"the Liger-style Triton kernel written here ({peers.MISSING})")


def call_of(name, base, target):
    """A timed call of provider `name`: loss and gradient, on a leaf of base's values of its own
    (an in-place provider turns its values into gradients, which time the same as logits)."""
    x = base.clone().requires_grad_()
    fn = PROVIDERS[name]
    return lambda: torch.autograd.grad(fn(x, target), x)


def extra_memory(call) -> float:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / 1e6


def linear_main(args) -> None:
    """--linear: the fused linear cross-entropy (hidden args.hidden, bf16) against torch's F.linear
    then F.cross_entropy, one call = loss, then the gradients of hidden and weight. Memory: the
    peak above what was allocated before the call, less the two gradients the call returns."""
    n, v, h = args.rows, args.vocab, args.hidden
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16) / 8
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / 8
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    providers = {
        "torch": lambda a, b: F.cross_entropy(F.linear(a, b), target),
        "torch2": lambda a, b: F.cross_entropy(F.linear(a, b), target),
        "tessera": lambda a, b: tessera.linear_cross_entropy(a, b, target),
    }
    if peers.LIGER is not None:
        providers["liger"] = lambda a, b: peers.linear_cross_entropy(a, b, target)
    for rows in args.chunks:  # other chunk sizes than the default, side by side
        providers[f"tessera_chunk{rows}"] = lambda a, b, rows=rows: tessera.linear_cross_entropy(
            a, b, target, chunk_size=rows)
    returned = (n * h + v * h) * x.element_size() / 1e6

    def call(name):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        return lambda: torch.autograd.grad(providers[name](a, b), (a, b))
    print(f"liger: {peers.describe() if peers.LIGER is not None else peers.MISSING + ': no liger provider'}",
          flush=True)
    want = call("torch")()
    for name in providers:
        if name.startswith("torch"):
            continue
        for g, r in zip(call(name)(), want):
            err = (g.float() - r.float()).norm() / r.float().norm()
            assert err < 2e-2, (name, err.item())
    del want
    memory = {name: extra_memory(call(name)) - returned for name in providers}
    times = {name: [] for name in providers}
    for _ in range(args.rounds):
        for name in providers:
            times[name].append(bench_ms(call(name)))
    ms = {name: statistics.median(t) for name, t in times.items()}
    flops = 3 * 2.0 * n * h * v
    lines = ["| provider | ms | TFLOP/s (3 GEMMs) | extra MB beyond the returned gradients | tessera / provider time |",
             "| --- | --- | --- | --- | --- |"]
    rows = []
    for name in providers:
        rows.append({"provider": name, "ms": ms[name], "tflops": flops / ms[name] / 1e9, "extra_mb": memory[name]})
        lines.append(f"| {name} | {ms[name]:.2f} | {flops / ms[name] / 1e9:.0f} | {memory[name]:.0f} | "
                     f"{ms['tessera'] / ms[name]:.3f} |")
    table = "\n".join(lines)
    print(f"==== final table (linear cross-entropy fwd + bwd, {n} x {h} -> {v} bf16, median of {args.rounds} rounds)")
    print(table)
    if args.out:
        write_results(args.out, "linear_cross_entropy",
                      {"rows": n, "vocab": v, "hidden": h, "rounds": args.rounds,
                       "liger": f"{peers.describe()}: LigerFusedLinearCrossEntropyFunction"
                       if peers.LIGER is not None else peers.MISSING}, rows, table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--out", default=None)
    ap.add_argument("--linear", action="store_true", help="the fused linear cross-entropy instead")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--chunks", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                    help="--linear: also tessera with these chunk sizes (token rows)")
    args = ap.parse_args()
    if args.linear:
        return linear_main(args)
    n, v = args.rows, args.vocab
    print(f"liger: {LIGER_USED}", flush=True)
    base = torch.randn(n, v, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    # Correctness first: every provider's loss and gradient against torch's.
    want_x = base.clone().requires_grad_()
    want = torch_fp32(want_x, target)
    (want_g,) = torch.autograd.grad(want, want_x)
    for name, fn in PROVIDERS.items():
        x = base.clone().requires_grad_()
        loss = fn(x, target)
        (g,) = torch.autograd.grad(loss, x)
        rtol = 1e-2 if loss.dtype == torch.bfloat16 else 2e-3  # torch_bf16 returns a bf16 loss
        assert torch.allclose(loss.float(), want.float(), rtol=rtol), (name, loss.item(), want.item())
        err = (g.float() - want_g.float()).norm() / want_g.float().norm()
        assert err < 1e-2, (name, err.item())
        del x, g, loss
    memory = {name: extra_memory(call_of(name, base, target)) for name in PROVIDERS}
    times = {name: [] for name in PROVIDERS}
    for _ in range(args.rounds):
        for name in PROVIDERS:
            times[name].append(bench_ms(call_of(name, base, target)))
    ms = {name: statistics.median(t) for name, t in times.items()}
    floor = 2.0 * n * v * base.element_size() / (COPY_GBPS * 1e6)
    rows = []
    lines = [f"| provider | ms | extra MB | tessera speed-up | of the byte floor ({floor:.3f} ms) |",
             "| --- | --- | --- | --- | --- |"]
    for name in PROVIDERS:
        rows.append({"provider": name, "ms": ms[name], "extra_mb": memory[name]})
        lines.append(f"| {name} | {ms[name]:.3f} | {memory[name]:.0f} | {ms[name] / ms['tessera_inplace']:.2f} | "
                     f"{floor / ms[name]:.2f} |")
    table = "\n".join(lines)
    print(f"==== final table (cross-entropy fwd + bwd, {n} x {v} bf16, median of {args.rounds} rounds; "
          "speed-up: the provider's time over tessera_inplace's)")
    print(table)
    if args.out:
        write_results(args.out, "cross_entropy", {"rows": n, "vocab": v, "rounds": args.rounds,
                                                  "liger": LIGER_USED}, rows, table)


if __name__ == "__main__":
    main()
