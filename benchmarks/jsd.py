#!/usr/bin/env python3
"""tessera.jsd (the generalized Jensen-Shannon divergence, or either KL, of a student's distribution
from a teacher's) forward + backward against torch, torch.compile and Liger-Kernel's LigerJSD.

    python benchmarks/jsd.py [--rows 8192] [--vocab 128256] [--betas 0,0.5,1] [--rounds 3] [--out DIR]

One call = the loss of bf16 student log-probabilities (rows x vocab) against the teacher's, a
quarter of the rows ignored by their label, then torch.autograd.grad(loss, student). Providers:
- torch: tessera.loss.divergence_rows (torch's log_softmax and kl_div in float32) over the rows,
  the mean over those not ignored;
- compile: torch.compile of the torch provider;
- liger: LigerJSD (liger_kernel.transformers), where liger_kernel imports; it takes log-probabilities,
  as every provider here is given;
- tessera: tessera.jsd.
Times: triton's do_bench (L2 flushed, median), the median of --rounds interleaved rounds. Extra
memory: the peak over one call above what was allocated before it (the returned gradient
included). Floor: one read of each input and one write of the gradient at the copy rate measured
on this GPU (ANCHORS.md: 4226 GB/s). Each provider's loss and gradient are checked against torch's.
LigerJSD differentiates its inputs as free values, not as log-probabilities (beta 0: -p where the
others give q - p); its gradient is checked after log_softmax's backward, which maps the one to the
other, so the gradient a model receives through its log_softmax is what is compared.
Written as jsd.json / jsd.md under --out.
"""
import argparse
import statistics

import torch

import tessera
from common import bench_ms, peak_gib, write_results
from tessera.loss import divergence_rows

COPY_GBPS = 4226.0


def providers(beta):
    def torch_jsd(s, t, y):
        keep = y != -100
        return (divergence_rows(torch, s, t, beta) * keep).sum() / keep.sum()

    out = {"torch": torch_jsd, "compile": torch.compile(torch_jsd),
           "tessera": lambda s, t, y: tessera.jsd(s, t, y, beta=beta)}
    try:
        from liger_kernel.transformers import LigerJSD
        liger = LigerJSD(beta=beta)
        out["liger"] = lambda s, t, y: liger(s, t, y)
    except Exception as err:  # noqa: BLE001 - a peer that does not import is left out with a note
        print(f"liger left out: {type(err).__name__}: {err}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--betas", default="0,0.5,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench_out/jsd")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.rows, args.vocab)
    student = torch.randn(shape, device="cuda", generator=gen).log_softmax(-1).to(torch.bfloat16)
    teacher = torch.randn(shape, device="cuda", generator=gen).log_softmax(-1).to(torch.bfloat16)
    labels = torch.randint(0, args.vocab, (args.rows,), device="cuda", generator=gen)
    labels[: args.rows // 4] = -100
    floor_us = 3 * student.numel() * student.element_size() / (COPY_GBPS * 1e3)
    rows, lines = [], []
    for beta in (float(b) for b in args.betas.split(",")):
        calls = {}
        for name, fn in providers(beta).items():
            leaf = student.clone().requires_grad_()  # each provider's own (the gradient is returned, not kept)

            def call(fn=fn, leaf=leaf):
                loss = fn(leaf, teacher, labels)
                return loss, torch.autograd.grad(loss, leaf)[0]
            calls[name] = call
        want, want_grad = calls["torch"]()
        for name, call in calls.items():
            loss, grad = call()
            if name == "liger":  # log_softmax's backward at the student's log-probabilities
                grad = grad.float() - student.float().exp() * grad.float().sum(-1, keepdim=True)
            err = ((grad.float() - want_grad.float()).norm() / want_grad.float().norm()).item()
            assert abs(loss.item() - want.item()) <= 2e-2 * abs(want.item()) + 1e-4 and err < 2e-2, (name, beta, err)
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(bench_ms(call))
        for name, call in calls.items():
            ms = statistics.median(times[name])
            rows.append({"beta": beta, "provider": name, "ms": ms, "peak_gib": peak_gib(call),
                         "floor_fraction": floor_us / (ms * 1e3)})
        t = {r["provider"]: r for r in rows if r["beta"] == beta}
        best = min((r["ms"], p) for p, r in t.items() if p != "tessera")
        cells = [f"{beta:g}", *(f"{t[p]['ms']:.3f}" if p in t else "" for p in ("torch", "compile", "liger", "tessera")),
                 f"{best[1]} {best[0] / t['tessera']['ms']:.2f}x", f"{t['tessera']['peak_gib']:.2f}",
                 f"{t['liger']['peak_gib']:.2f}" if "liger" in t else "", f"{t['tessera']['floor_fraction']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    table = "\n".join([f"bf16 log-probabilities {args.rows} x {args.vocab}, a quarter of the rows ignored; "
                       "forward + backward, ms", "",
                       "| beta | torch | compile | liger | tessera | best peer / tessera | tessera peak GiB | "
                       "liger peak GiB | tessera at the floor |",
                       "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |", *lines])
    print(table)
    write_results(args.out, "jsd", {"rows": args.rows, "vocab": args.vocab}, rows, table)


if __name__ == "__main__":
    main()
