#!/usr/bin/env python3
"""A Mixture-of-Experts layer's routed experts, forward + backward: tessera.moe_experts against
transformers' experts backends (torch's grouped_mm, the same compiled, the per-expert eager loop)
and Liger-Kernel's LigerExperts, at the five families' expert shapes, balanced and skewed routing.

    python benchmarks/moe.py [--families all] [--tokens 8192] [--routing balanced,zipf]
        [--runs tessera,grouped_mm,grouped_mm_compile,eager,liger] [--rounds 3] [--kernels N] [--out DIR]
    python benchmarks/moe.py --render RUN/moe.json [...]

Per family (experts E, top-k, hidden H, expert ffn F from grouped_mm.py's table), T tokens of
bfloat16 hidden states; routing: each token's k distinct experts drawn uniformly (balanced) or
with Zipf(1.2) probabilities over the experts (skewed), weights a softmax over the k. One call is
``out = experts(x, index, weights); out.backward(g)`` with the experts' weights as transformers
stores them ([E, 2F, H] and [E, H, F]; gpt-oss's transposed, with biases and its clamped gate).
Times: triton's do_bench (L2 flushed, median), the median of --rounds interleaved rounds; the
GPU's kernel time of one call from torch.profiler (the host's launch cost left out), and the
peak memory above the inputs of one call. Liger's run is left out with a note where liger_kernel
does not import, or for gpt-oss (its experts are not SwiGLU). Each run's output is checked
against the grouped_mm backend's. Written as moe.json / moe.md under --out.
"""
import argparse
import importlib

import torch

import tessera
from common import bench_ms, peak_gib, timer_name, write_results
from grouped_mm import FAMILIES
from llama_report import kernel_lines, profile_step

RUNS = ("tessera", "grouped_mm", "grouped_mm_compile", "eager", "liger")
# family -> (transformers' model type for its experts module, its config's names)
MODULES = {"qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen3_moe", "mixtral": "qwen3_moe", "deepseek_v3": "qwen3_moe",
           "gpt_oss": "gpt_oss"}


def routing(tokens, experts, k, skew, gen):
    p = torch.tensor([1.0 / (i + 1) ** 1.2 if skew else 1.0 for i in range(experts)], device="cuda")
    index = torch.multinomial(p.expand(tokens, -1), k, replacement=False, generator=gen)
    weights = torch.softmax(torch.randn(tokens, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    return index, weights


def config(family):
    e, k, h, f = FAMILIES[family]
    if MODULES[family] == "gpt_oss":
        from transformers import GptOssConfig
        return GptOssConfig(hidden_size=h, intermediate_size=f, num_local_experts=e, num_experts_per_tok=k)
    from transformers import Qwen3MoeConfig
    return Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=f, num_experts=e, num_experts_per_tok=k)


def experts_module(family, impl, params):
    """The family's transformers experts module on `params` (shared by every run), backend `impl`."""
    kind = MODULES[family]
    name = "GptOssExperts" if kind == "gpt_oss" else "Qwen3MoeExperts"
    cls = getattr(importlib.import_module(f"transformers.models.{kind}.modeling_{kind}"), name)
    cfg = config(family)
    if impl == "liger":
        from liger_kernel.transformers import LigerExperts
        cls = LigerExperts
    with torch.device("meta"):
        m = cls(cfg)
    for n, p in params.items():
        setattr(m, n, p)
    if impl != "liger":
        m.config._experts_implementation = impl
    return m


def make_params(family):
    e, _, h, f = FAMILIES[family]
    bf = dict(device="cuda", dtype=torch.bfloat16)

    def p(*shape, scale):
        return torch.nn.Parameter(torch.randn(*shape, **bf) * scale)
    if MODULES[family] == "gpt_oss":
        return {"gate_up_proj": p(e, h, 2 * f, scale=h ** -0.5), "gate_up_proj_bias": p(e, 2 * f, scale=0.02),
                "down_proj": p(e, f, h, scale=f ** -0.5), "down_proj_bias": p(e, h, scale=0.02)}
    return {"gate_up_proj": p(e, 2 * f, h, scale=h ** -0.5), "down_proj": p(e, h, f, scale=f ** -0.5)}


def tessera_call(family, params):
    if MODULES[family] == "gpt_oss":
        return lambda x, i, w: tessera.moe_experts(x, params["gate_up_proj"], params["down_proj"], i, w,
                                                   activation="gpt_oss", transposed=True,
                                                   gate_up_bias=params["gate_up_proj_bias"],
                                                   down_bias=params["down_proj_bias"])
    return lambda x, i, w: tessera.moe_experts(x, params["gate_up_proj"], params["down_proj"], i, w)


def calls(family, runs, params, notes):
    out = {}
    for run in runs:
        if run == "tessera":
            out[run] = tessera_call(family, params)
            continue
        if run == "liger" and MODULES[family] == "gpt_oss":
            notes.append(f"{family}: Liger's LigerExperts is SwiGLU only; left out")
            continue
        try:
            m = experts_module(family, "grouped_mm" if run.startswith("grouped_mm") else run, params)
        except Exception as e:  # noqa: BLE001 - a peer that does not build is left out with a note
            notes.append(f"{family} {run}: left out ({type(e).__name__}: {str(e)[:120]})")
            continue
        out[run] = torch.compile(m) if run.endswith("compile") else m
    return out


def gpu_ms(fn, top=0):
    """The kernels' GPU time of one call (torch.profiler), the host's launch gaps left out, and
    the `top` kernels by time as lines (ms, calls, name)."""
    rows = profile_step(fn)
    return sum(ms for _, ms, _ in rows), kernel_lines(rows, top)


def measure(family, skew, tokens, runs, rounds, notes, kernels=0):
    e, k, h, f = FAMILIES[family]
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = make_params(family)
    index, weights = routing(tokens, e, k, skew, gen)
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    g = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    fns = calls(family, runs, params, notes)
    steps, rows, want = {}, {}, None
    name = f"{family} {'zipf' if skew else 'balanced'}"
    for run, fn in fns.items():  # each run's memory and GPU time as soon as it runs (a slow autotune after)
        def step(fn=fn):
            out = fn(x, index, weights)
            out.backward(g)
            x.grad = None
            for p in params.values():
                p.grad = None
            return out.detach()
        try:
            out = step()  # first call: compile, autotune
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001
            notes.append(f"{family} {run}: failed ({type(err).__name__}: {str(err)[:120]})")
            continue
        if run == "grouped_mm":
            want = out
        steps[run] = (step, out)
        r = rows[run] = {"ms": [], "check": ""}
        r["peak_gib"] = peak_gib(step)
        r["gpu_ms"], lines = gpu_ms(step, kernels)
        print(f"{name} {run}: GPU {r['gpu_ms']:.3f} ms, peak {r['peak_gib']:.2f} GiB", *lines, sep="\n", flush=True)
    for run, (step, out) in steps.items():
        if want is not None and run != "grouped_mm":
            err = (out.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
            rows[run]["check"] = f"{err:.1e}"
    for _ in range(rounds):
        for run, (step, _) in steps.items():
            rows[run]["ms"].append(bench_ms(step))
    flops = 18.0 * tokens * k * h * f  # gate_up 4 T k H F, down 2 T k H F; the backward twice the forward
    for run, r in rows.items():
        r["ms"] = sorted(r["ms"])[len(r["ms"]) // 2]
        r["tflops"] = flops / r["ms"] / 1e9
    return rows


def table(results, notes) -> str:
    """One row per family and routing: each run's GPU ms (the bar's measure) and wall ms, tessera's
    peak memory beside the least of the peers', and the fastest peer's GPU time over tessera's."""
    runs = [r for r in RUNS if any(x["run"] == r for x in results)]
    lines = ["| family | routing | " + " | ".join(f"{r} GPU ms (ms)" for r in runs)
             + " | tessera peak GiB | least peer peak GiB | best peer / tessera (GPU) |",
             "| --- | --- |" + " ---: |" * (len(runs) + 3)]
    keys = list(dict.fromkeys((x["family"], x["routing"]) for x in results))
    for family, routing in keys:
        rows = {x["run"]: x for x in results if (x["family"], x["routing"]) == (family, routing)}
        cells = [f"{rows[r]['gpu_ms']:.2f} ({rows[r]['ms']:.2f})" if r in rows else "" for r in runs]
        peers = [x for r, x in rows.items() if r != "tessera"]
        t = rows.get("tessera")
        peak = min((x["peak_gib"] for x in peers), default=None)
        best = min((x["gpu_ms"] for x in peers), default=None)
        tail = [f"{t['peak_gib']:.2f}" if t else "", f"{peak:.2f}" if peak is not None else "",
                f"{best / t['gpu_ms']:.2f}" if t and best is not None else ""]
        lines.append(f"| {family} | {routing} | " + " | ".join(cells + tail) + " |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="all")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--routing", default="balanced,zipf")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", type=int, default=0, help="print each run's N longest kernels of one call")
    ap.add_argument("--out", default="bench_out/moe")
    ap.add_argument("--render", nargs="+", metavar="JSON", help="print the table of earlier runs' moe.json")
    args = ap.parse_args()
    families = list(FAMILIES) if args.families == "all" else args.families.split(",")
    runs = [r for r in args.runs.split(",") if r]
    if any(r not in RUNS for r in runs) or any(f not in FAMILIES for f in families):
        ap.error(f"--runs of {RUNS}, --families of {list(FAMILIES)}")
    if args.render:  # the table again from earlier runs' JSON (their rows in the order given)
        import json
        runs_json = [json.load(open(p)) for p in args.render]
        results = [r for d in runs_json for r in d["rows"]]
        print(table(results, [n for d in runs_json for n in d["meta"].get("notes", [])]))
        return
    notes, results = [], []
    for family in families:
        for routing_name in args.routing.split(","):
            rows = measure(family, routing_name == "zipf", args.tokens, runs, args.rounds, notes, args.kernels)
            for run, r in rows.items():
                results.append({"family": family, "routing": routing_name, "run": run, **r})
                print(f"{family} {routing_name} {run}: {r['ms']:.3f} ms, GPU {r['gpu_ms']:.3f} ms, "
                      f"{r['tflops']:.0f} TFLOP/s, peak {r['peak_gib']:.2f} GiB, check {r['check']}", flush=True)
            torch.cuda.empty_cache()
    text = table(results, notes)
    print(text)
    write_results(args.out, "moe", {"tokens": args.tokens, "timer": timer_name(), "notes": notes}, results, text)


if __name__ == "__main__":
    main()
