#!/usr/bin/env python3
"""Host cost per call of tessera's public functions against torch's own, every op.

    python benchmarks/overhead.py [--calls N] [--rounds R] [--out DIR]

A tiny tensor (64 x 256 float32; matmul 64 x 256 @ 256 x 256) keeps the GPU work far below the
host's, so a loop of N calls with one synchronize at the end measures what each call costs the
CPU: argument handling, dispatch, allocation, launch. Each case is timed as the median over R
rounds, the providers interleaved within a round (torch, tessera, torch again as "torch2": the
harness's own reading of torch against itself, which should be 1.00). tessera / torch is the
median over the rounds of tessera's time over the mean of the two torch readings around it.
"host" is the enqueue cost alone: 300 calls timed before the synchronize, too few to fill the
launch queue, so a provider whose kernels take the GPU longer than the host reads the same there.

Without autograd: each op under torch.no_grad(). With autograd: the forward on inputs that
require grad, then backward of the output with a given gradient (torch.autograd.backward), the
user's full cost of a differentiable call.

Prints a table (us per call, tessera / torch) and writes overhead.json and overhead.md to --out.
"""
import argparse
import inspect
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tessera
from common import write_results


def cases():
    """(name, autograd, {provider: call}) for every op; calls take no arguments."""
    d = "cuda"
    x = torch.randn(64, 256, device=d)
    y = torch.randn(64, 256, device=d)
    w = torch.randn(256, device=d)
    b = torch.randn(256, device=d)
    m = torch.randn(256, 256, device=d)
    g = torch.randn(64, 256, device=d)
    sm = torch.softmax(x, -1)
    e = torch.randint(0, 1000, (64 * 256,), device=d, dtype=torch.int32)
    t = torch.randint(0, 1000, (256,), device=d, dtype=torch.int32)
    target = torch.randint(0, 256, (64,), device=d)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, (256,), w, b, 1e-5)
    lead_mean, lead_rstd = mean.view(64), rstd.view(64)
    _, rms_rstd = torch.ops.aten._fused_rms_norm(x, (256,), w, 1e-6)
    lead_rms_rstd = rms_rstd.view(64)
    aten = torch.ops.aten
    plain = [
        ("add", lambda: tessera.add(x, y), lambda: torch.add(x, y)),
        ("add (scalar)", lambda: tessera.add(x, 2.0), lambda: torch.add(x, 2.0)),
        ("gelu", lambda: tessera.gelu(x), lambda: F.gelu(x)),
        ("gelu_backward", lambda: tessera.gelu_backward(g, x), lambda: aten.gelu_backward(g, x)),
        ("silu", lambda: tessera.silu(x), lambda: F.silu(x)),
        ("silu_backward", lambda: tessera.silu_backward(g, x), lambda: aten.silu_backward(g, x)),
        ("dropout", lambda: tessera.dropout(x, 0.1), lambda: F.dropout(x, 0.1)),
        ("softmax", lambda: tessera.softmax(x, -1), lambda: torch.softmax(x, -1)),
        ("log_softmax", lambda: tessera.log_softmax(x, -1), lambda: torch.log_softmax(x, -1)),
        ("softmax_backward", lambda: tessera.softmax_backward(g, sm, -1),
         lambda: aten._softmax_backward_data(g, sm, -1, torch.float32)),
        ("layer_norm", lambda: tessera.layer_norm(x, (256,), w, b), lambda: F.layer_norm(x, (256,), w, b)),
        ("layer_norm_backward",
         # (a build before layer_norm_backward took bias computes grad_bias without it)
         (lambda: tessera.layer_norm_backward(g, x, (256,), lead_mean, lead_rstd, w, b))
         if "bias" in inspect.signature(tessera.layer_norm_backward).parameters else
         (lambda: tessera.layer_norm_backward(g, x, (256,), lead_mean, lead_rstd, w)),
         lambda: aten.native_layer_norm_backward(g, x, (256,), mean, rstd, w, b, (True, True, True))),
        ("rms_norm", lambda: tessera.rms_norm(x, (256,), w, 1e-6), lambda: F.rms_norm(x, (256,), w, 1e-6)),
        ("rms_norm_backward",
         lambda: tessera.rms_norm_backward(g, x, (256,), lead_rms_rstd, w),
         lambda: aten._fused_rms_norm_backward(g, x, (256,), rms_rstd, w, (True, True))),
        ("add_layer_norm", lambda: tessera.add_layer_norm(x, y, w, b),
         lambda: (lambda s: (F.layer_norm(s, (256,), w, b), s))(x + y)),
        ("add_rms_norm", lambda: tessera.add_rms_norm(x, y, w, 1e-6),
         lambda: (lambda s: (F.rms_norm(s, (256,), w, 1e-6), s))(x + y)),
        ("cross_entropy", lambda: tessera.cross_entropy(x, target), lambda: F.cross_entropy(x, target)),
        ("isin", lambda: tessera.isin(e, t), lambda: torch.isin(e, t)),
        ("matmul", lambda: tessera.matmul(x, m), lambda: torch.matmul(x, m)),
        ("linear", lambda: tessera.linear(x, m, w), lambda: F.linear(x, m, w)),
    ]
    out = [(name, False, {"torch": p, "tessera": q, "torch2": p}) for name, q, p in plain]

    xg = x.clone().requires_grad_()
    wg, bg, mg = w.clone().requires_grad_(), b.clone().requires_grad_(), m.clone().requires_grad_()

    yg = y.clone().requires_grad_()

    def fb(f):
        return lambda: torch.autograd.backward(f(), g)

    def fb2(f):  # both outputs of an add norm carry a gradient, as in a residual stream
        return lambda: torch.autograd.backward(list(f()), [g, g])

    def fb0(f):  # a loss
        return lambda: torch.autograd.backward(f())
    grad = [
        ("add", fb(lambda: tessera.add(xg, y)), fb(lambda: torch.add(xg, y))),
        ("gelu", fb(lambda: tessera.gelu(xg)), fb(lambda: F.gelu(xg))),
        ("silu", fb(lambda: tessera.silu(xg)), fb(lambda: F.silu(xg))),
        ("dropout", fb(lambda: tessera.dropout(xg, 0.1)), fb(lambda: F.dropout(xg, 0.1))),
        ("softmax", fb(lambda: tessera.softmax(xg, -1)), fb(lambda: torch.softmax(xg, -1))),
        ("log_softmax", fb(lambda: tessera.log_softmax(xg, -1)), fb(lambda: torch.log_softmax(xg, -1))),
        ("layer_norm", fb(lambda: tessera.layer_norm(xg, (256,), wg, bg)),
         fb(lambda: F.layer_norm(xg, (256,), wg, bg))),
        ("rms_norm", fb(lambda: tessera.rms_norm(xg, (256,), wg, 1e-6)),
         fb(lambda: F.rms_norm(xg, (256,), wg, 1e-6))),
        ("add_layer_norm", fb2(lambda: tessera.add_layer_norm(xg, yg, wg, bg)),
         fb2(lambda: (lambda s: (F.layer_norm(s, (256,), wg, bg), s))(xg + yg))),
        ("add_rms_norm", fb2(lambda: tessera.add_rms_norm(xg, yg, wg, 1e-6)),
         fb2(lambda: (lambda s: (F.rms_norm(s, (256,), wg, 1e-6), s))(xg + yg))),
        ("cross_entropy", fb0(lambda: tessera.cross_entropy(xg, target)),
         fb0(lambda: F.cross_entropy(xg, target))),
        ("matmul", fb(lambda: tessera.matmul(xg, mg)), fb(lambda: torch.matmul(xg, mg))),
        ("linear", fb(lambda: tessera.linear(xg, mg, wg)), fb(lambda: F.linear(xg, mg, wg))),
    ]
    out += [(name, True, {"torch": p, "tessera": q, "torch2": p}) for name, q, p in grad]
    return out


def per_call(fn, calls):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def host_per_call(fn, calls=300):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def measure(providers, calls, rounds, autograd):
    ctx = torch.enable_grad if autograd else torch.no_grad
    with ctx():
        for fn in providers.values():  # warm-up: caches, lazy loading, allocator
            per_call(fn, max(calls // 10, 10))
        times = {k: [] for k in providers}
        host = {k: [] for k in providers}
        for _ in range(rounds):
            for k, fn in providers.items():
                times[k].append(per_call(fn, calls))
                host[k].append(host_per_call(fn))
    r = {k: statistics.median(v) for k, v in times.items()}
    r.update({"host_" + k: statistics.median(v) for k, v in host.items()})
    # tessera runs between torch and torch2 in every round: its ratio to their mean cancels the
    # round's drift; the median over rounds of that ratio, and of torch2 / torch.
    r["ratio"] = statistics.median(t / ((a + b) / 2)
                                   for t, a, b in zip(times["tessera"], times["torch"], times["torch2"]))
    r["harness"] = statistics.median(b / a for a, b in zip(times["torch"], times["torch2"]))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name, autograd, providers in cases():
        r = measure(providers, args.calls, args.rounds, autograd)
        rows.append({"op": name, "autograd": autograd, **{k: round(v, 2) for k, v in r.items()}})
        print(f"{name:22s} {'fwd+bwd' if autograd else 'no grad':8s} tessera {r['tessera']:7.2f} us"
              f"  torch {r['torch']:7.2f} us  ratio {rows[-1]['ratio']:.2f}"
              f"  (torch2/torch {rows[-1]['harness']:.2f}; host {r['host_tessera']:.2f} / "
              f"{r['host_torch']:.2f})", flush=True)
    lines = ["| op | mode | tessera (us) | torch (us) | torch2 (us) | tessera / torch | "
             "host: tessera (us) | host: torch (us) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['op']} | {'forward + backward' if r['autograd'] else 'no grad'} | "
                     f"{r['tessera']:.2f} | {r['torch']:.2f} | {r['torch2']:.2f} | {r['ratio']:.2f} | "
                     f"{r['host_tessera']:.2f} | {r['host_torch']:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        write_results(args.out, "overhead", {"calls": args.calls, "rounds": args.rounds}, rows,
                      table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
