#!/usr/bin/env python3
"""TRL's post-training losses through Liger-Kernel's module signature: tessera.post_training's
modules against Liger's (liger_kernel.chunked_loss) on the same inputs, forward + backward.

    python benchmarks/post_training.py [--losses all] [--hidden 4096] [--vocab 128256] [--pairs 8]
        [--tokens 1024] [--completions 8] [--rounds 3] [--kernels N] [--out DIR]

The preference losses (DPO with a reference model, ORPO, CPO, SimPO, KTO) take --pairs pairs of
--tokens tokens (2 x pairs sequences, chosen first; a quarter of each sequence a prompt, ignored);
GRPO takes --completions completions with reference and old per-token log-probabilities; the
distillation losses (JSD, cosine similarity) a student and a teacher head over the pairs' tokens. bfloat16 hidden states and
output projection ([vocab, hidden]), the gradients of both. Times: triton's do_bench (L2 flushed,
median) of the median of --rounds interleaved rounds; the GPU's kernel time of one call
(torch.profiler), the bar's measure; the peak memory above the inputs of one call. Each tessera
loss is checked against Liger's. Liger's run is left out with a note where liger_kernel does not
import. Written as post_training.json / post_training.md under --out.
"""
import argparse

import torch

import tessera.post_training as tp
from common import bench_ms, peak_gib, timer_name, write_results
from llama_report import kernel_lines, profile_step

# loss -> (tessera's module and Liger's class name, the constructor's keywords)
LOSSES = {
    "dpo": ("FusedLinearDPOLoss", dict(beta=0.1, use_ref_model=True)),
    "orpo": ("FusedLinearORPOLoss", dict(beta=0.1)),
    "cpo": ("FusedLinearCPOLoss", dict(beta=0.1)),
    "simpo": ("FusedLinearSimPOLoss", dict(beta=0.1)),
    "kto": ("FusedLinearKTOLoss", dict(beta=0.1, use_ref_model=True)),
    "grpo": ("FusedLinearGRPOLoss", dict(beta=0.04, use_ref_model=True)),
    "jsd": ("FusedLinearJSDLoss", dict(beta=0.5, temperature=1.0)),
    "cosine": ("FusedLinearCosineSimilarityLoss", dict(beta=0.5, temperature=1.0)),
}
DISTILLATION = ("jsd", "cosine")  # a student's and a teacher's hidden states and heads


def inputs(loss, args, gen):
    """(positional arguments of forward, the tensors whose gradients the call computes)."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, v = args.hidden, args.vocab

    def hidden(*shape):
        return (torch.randn(*shape, h, **bf, generator=gen) / 4).requires_grad_()
    weight = (torch.randn(v, h, **bf, generator=gen) / h ** 0.5).requires_grad_()
    if loss == "grpo":
        c, t = args.completions, args.tokens
        x = hidden(c, t)
        ids = torch.randint(0, v, (c, t), device="cuda", generator=gen)
        mask = torch.ones(c, t, device="cuda", dtype=torch.long)
        mask[:, -t // 8:] = 0  # padding after the shorter completions
        adv = torch.randn(c, device="cuda", generator=gen)
        ref = -torch.rand(c, t, device="cuda", generator=gen) * 5
        old = -torch.rand(c, t, device="cuda", generator=gen) * 5
        return (x, weight, ids, mask, adv, None, ref, old), (x, weight)
    b, t = 2 * args.pairs, args.tokens
    target = torch.randint(0, v, (b, t), device="cuda", generator=gen)
    target[:, :t // 4] = -100  # the prompt
    if loss in DISTILLATION:
        x, teacher = hidden(b * t), torch.randn(b * t, h, **bf, generator=gen) / 4
        teacher_w = torch.randn(v, h, **bf, generator=gen) / h ** 0.5
        return (x, weight, teacher, teacher_w, target.reshape(-1)), (x, weight)
    x = hidden(b, t)
    ref = torch.randn(b, t, h, **bf, generator=gen) / 4
    if loss == "dpo":
        return (weight, x, target, None, ref, weight.detach()), (x, weight)
    if loss == "kto":
        labels = torch.arange(b, device="cuda") % 2 == 0
        return (x, weight, target, None, labels, ref, weight.detach()), (x, weight)
    return (weight, x, target), (x, weight)


def modules(loss, notes):
    name, kwargs = LOSSES[loss]
    out = {"tessera": getattr(tp, name)(**kwargs)}
    try:
        import liger_kernel.chunked_loss as lc
        out["liger"] = getattr(lc, "Liger" + name)(**kwargs)
    except ImportError as e:
        notes.append(f"liger: left out ({e})")
    return out


def measure(loss, args, notes):
    gen = torch.Generator(device="cuda").manual_seed(0)
    call, leaves = inputs(loss, args, gen)
    steps, rows, want = {}, {}, None
    for run, module in modules(loss, notes).items():
        def step(module=module):
            out = module(*call)
            value = out[0] if isinstance(out, tuple) else out
            value.backward()
            for t in leaves:
                t.grad = None
            return value.detach()
        try:
            value = step()  # first call: compile, autotune
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - a run that fails is left out with a note
            notes.append(f"{loss} {run}: failed ({type(err).__name__}: {str(err)[:160]})")
            continue
        steps[run] = step
        rows[run] = {"ms": [], "value": value.float().item()}
        want = rows[run]["value"] if run == "liger" else want
    for run, step in steps.items():
        rows[run]["peak_gib"] = peak_gib(step)
        kernels = profile_step(step)
        rows[run]["gpu_ms"] = sum(ms for _, ms, _ in kernels)
        if args.kernels:
            print(f"{loss} {run}: the kernels of one call", *kernel_lines(kernels, args.kernels), sep="\n")
    for _ in range(args.rounds):
        for run, step in steps.items():
            rows[run]["ms"].append(bench_ms(step))
    for run, r in rows.items():
        r["ms"] = sorted(r["ms"])[len(r["ms"]) // 2]
        r["check"] = "" if want is None or run == "liger" else f"{abs(r['value'] - want) / max(abs(want), 1e-6):.1e}"
    return rows


def table(results, notes) -> str:
    lines = ["| loss | tessera GPU ms (ms) | liger GPU ms (ms) | liger / tessera (GPU) | tessera peak GiB | "
             "liger peak GiB | loss vs Liger's |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for loss in dict.fromkeys(r["loss"] for r in results):
        rows = {r["run"]: r for r in results if r["loss"] == loss}
        t, lg = rows.get("tessera"), rows.get("liger")
        cell = [f"{r['gpu_ms']:.2f} ({r['ms']:.2f})" if r else "" for r in (t, lg)]
        ratio = f"{lg['gpu_ms'] / t['gpu_ms']:.2f}" if t and lg else ""
        peaks = [f"{r['peak_gib']:.2f}" if r else "" for r in (t, lg)]
        lines.append(f"| {loss} | {cell[0]} | {cell[1]} | {ratio} | {peaks[0]} | {peaks[1]} | "
                     f"{t['check'] if t else ''} |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--losses", default="all")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", type=int, default=0, help="print each run's N longest kernels of one call")
    ap.add_argument("--out", default="bench_out/post_training")
    args = ap.parse_args()
    losses = list(LOSSES) if args.losses == "all" else args.losses.split(",")
    if any(loss not in LOSSES for loss in losses):
        ap.error(f"--losses of {list(LOSSES)}")
    notes, results = [], []
    for loss in losses:
        for run, r in measure(loss, args, notes).items():
            results.append({"loss": loss, "run": run, **r})
            print(f"{loss} {run}: {r['ms']:.3f} ms, GPU {r['gpu_ms']:.3f} ms, peak {r['peak_gib']:.2f} GiB, "
                  f"loss {r['value']:.5f} {r['check']}", flush=True)
        torch.cuda.empty_cache()
    text = table(results, notes)
    print(text)
    meta = {"hidden": args.hidden, "vocab": args.vocab, "pairs": args.pairs, "tokens": args.tokens,
            "completions": args.completions, "timer": timer_name(), "notes": notes}
    write_results(args.out, "post_training", meta, results, text)


if __name__ == "__main__":
    main()
