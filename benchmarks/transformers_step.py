#!/usr/bin/env python3
"""A Hugging Face transformers training step, plain and patched: transformers eager,
torch.compile, Liger-Kernel's apply_liger_kernel_to_<family>, and tessera.transformers'
apply_tessera (eager and compiled): step time, tokens/s, peak memory above the weights, step-0 loss.

    python benchmarks/transformers_step.py [--family llama[,gemma2,...] | all] [--layers 8 --hidden 2048
        --heads 16 --kv-heads 4 --intermediate 5632 --vocab 128256] [--batch 2 --seq 4096] [--steps 8]
        [--warmup 3] [--rounds 2] [--runs "eager,compile,liger,tessera,tessera compile,tessera sdpa,..."]
        (float8: --runs "compile,tessera,tessera fp8 rowwise,tessera fp8 rowwise head,torchao tensorwise compile,...")
        [--attn sdpa] [--fit] [--profile] [--out DIR]
    python benchmarks/transformers_step.py --family qwen3_moe --layers 4 --heads 32 --kv-heads 4 --head-dim 128
        --experts 128 --top-k 8 --moe-intermediate 768 --vocab 151936 [--experts-impl grouped_mm]

The model: <family>ForCausalLM from its config with random init (the sizes above, bf16 weights),
``attn_implementation`` --attn (sdpa; "tessera" is tessera's FlashAttention). The "tessera" runs
patch it with apply_tessera's defaults, which put it on tessera's attention too; the "tessera
sdpa" runs with ``attention=False``, keeping --attn; "tessera fp8 <recipe>" with fp8=<recipe>, and
"... head" with the output head converted too (the fused loss's GEMMs in float8); "torchao <recipe>
compile" with torchao's convert_to_float8_training on every Linear but the head ("torchao <recipe>
head compile": the head too), under torch.compile. A step is
``model(input_ids=x, labels=x).loss.backward()`` then zero_grad(set_to_none=True), no optimizer:
what the patches change. Each run builds the same model (one seed) and sees the same batch;
each run's model is built (and compiled) once and kept; the runs are interleaved within each of
--rounds rounds, and each reports the median over rounds of its median step (CUDA events around
each step, the host running ahead). Peak memory: torch's allocator peak over the timed steps, less
the memory held before them (the weights of every model kept).
With several families (a list, or "all"), each is run in turn (its models freed before the next),
its table printed; the report is a table of each patched run compiled against uncompiled.
The Mixture-of-Experts families (--family moe, or by name) take their experts' shapes from
--experts, --top-k and --moe-intermediate (Mixtral's and gpt-oss's intermediate size; Qwen2-MoE's shared expert
takes --intermediate), every layer sparse; the runs tessera does not patch use
experts_implementation --experts-impl (transformers' "grouped_mm", torch._grouped_mm).
Liger's run is left out, with a note, where liger_kernel does not import. Writes
transformers_step.json, .md and .svg (step time and peak memory; the first family's) into --out.
"""
import argparse
import gc
import json
import os
import statistics
import sys

import torch
import transformers

from common import step_ms
from llama_report import COLORS, by_category, category_table, profile_step, svg_bars, top_kernels

CONFIGS = {  # family -> (config class, the family's own defaults that the flags do not set)
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": ("Gemma2Config", {}),
    "gemma3_text": ("Gemma3TextConfig", {}),
    "phi3": ("Phi3Config", {}),
    "granite": ("GraniteConfig", {}),
    # a vision-language model (its text config's defaults here), trained on text alone: what the
    # patch changes, its language model; the vision tower a small one, as it is not run
    "qwen2_vl": ("Qwen2VLConfig", {}),
    # Mixture of Experts: the experts' shapes from --experts, --top-k and --moe-intermediate
    "qwen3_moe": ("Qwen3MoeConfig", {"norm_topk_prob": True, "decoder_sparse_step": 1}),
    "qwen2_moe": ("Qwen2MoeConfig", {"decoder_sparse_step": 1}),
    "mixtral": ("MixtralConfig", {}),
    "gpt_oss": ("GptOssConfig", {}),
    "deepseek_v3": ("DeepseekV3Config", {"first_k_dense_replace": 0}),  # MLA: a key head per query head
}
MOE = {"qwen3_moe": "num_experts", "qwen2_moe": "num_experts", "mixtral": "num_local_experts",
       "gpt_oss": "num_local_experts", "deepseek_v3": "n_routed_experts"}
VLMS = {"qwen2_vl": dict(depth=1, hidden_size=64, embed_dim=64, num_heads=2, intermediate_size=128)}
DEFAULT_RUNS = ("eager", "compile", "liger", "tessera", "tessera compile", "tessera sdpa", "tessera sdpa compile")
# float8 training: tessera's recipes through apply_tessera(fp8=), torchao's (the linears but the
# head converted by convert_to_float8_training; "head": the head too) under torch.compile, as
# torchao is meant to run
RUNS = DEFAULT_RUNS + tuple(f"tessera fp8 {r}" for r in ("tensorwise", "rowwise", "blockwise")) + tuple(
    f"tessera fp8 {r} head" for r in ("tensorwise", "rowwise", "blockwise")) + tuple(
    f"torchao {r}{head} compile" for r in ("tensorwise", "rowwise") for head in ("", " head"))
# --fit: the model for a GPU under FIT_GIB (the model's eager run peaks near 20 GiB above
# the weights of the runs kept).
FIT_GIB = 40
SMALL = dict(layers=4, hidden=1024, heads=8, kv_heads=2, intermediate=2816, vocab=32000, batch=1, seq=2048)


def config_of(args, family):
    name, extra = CONFIGS[family]
    extra = dict(extra)
    if family in MOE:
        extra.update({MOE[family]: args.experts, "num_experts_per_tok": args.top_k})
        if family in ("qwen3_moe", "qwen2_moe", "deepseek_v3"):
            extra.update(moe_intermediate_size=args.moe_intermediate)
        if family == "qwen2_moe":
            extra.update(shared_expert_intermediate_size=args.intermediate)
    text = dict(
        vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=args.moe_intermediate if family in ("mixtral", "gpt_oss") else args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads if family == "deepseek_v3" else args.kv_heads,
        head_dim=args.head_dim or args.hidden // args.heads, max_position_embeddings=max(args.seq, 4096),
        pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    if family == "qwen2_vl":  # Qwen2-VL's split of the rotary frequencies, [16, 24, 24] at head_dim 128
        q = text["head_dim"] // 16
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [2 * q, 3 * q, 3 * q]}
    if family in VLMS:  # the image token the vocabulary's last id, which the batch never holds
        return getattr(transformers, name)(text_config=text, vision_config=dict(
            VLMS[family], out_hidden_size=args.hidden), image_token_id=args.vocab - 1)
    return getattr(transformers, name)(**text)


def liger_apply(family):
    """Liger's apply function for the family, or None (with why) where it does not import."""
    try:
        from liger_kernel import transformers as lt
    except Exception as e:  # noqa: BLE001 - any import failure leaves the run out
        return None, f"liger_kernel does not import: {type(e).__name__}: {e}"
    fn = getattr(lt, f"apply_liger_kernel_to_{family}", None)
    return (fn, "") if fn else (None, f"Liger has no apply_liger_kernel_to_{family}")


def build(run, args, family):
    if run == "liger":
        apply, why = liger_apply(family)
        if apply is None:
            raise RuntimeError(why)
    torch.manual_seed(args.seed)
    with torch.device("cuda"):  # random init on the GPU: seconds, not a minute of CPU time per model
        moe = {"experts_implementation": args.experts_impl} if family in MOE else {}
        auto = transformers.AutoModelForImageTextToText if family in VLMS else transformers.AutoModelForCausalLM
        model = auto.from_config(config_of(args, family), attn_implementation=args.attn, dtype=torch.bfloat16,
                                 **moe).train()
    if run == "liger":
        apply(model=model)
    elif run.startswith("tessera"):
        import tessera.transformers as tt
        tt.apply_tessera(model, attention=" sdpa" not in run, fp8=run.split()[2] if " fp8 " in run else None,
                         fp8_head=run.endswith(" head"))
    elif run.startswith("torchao"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(run.split()[1]),
                                   module_filter_fn=None if " head " in run else lambda module, fqn: fqn != "lm_head")
    return model


class Run:
    """One run's model, built (and compiled, and warmed up) at its first measure() and kept for the
    later rounds, so that each round times the same model without a second compilation."""

    def __init__(self, run, args, family, ids):
        self.model = build(run, args, family)
        self.fn = torch.compile(self.model) if run.endswith("compile") else self.model
        self.ids = ids
        for _ in range(args.warmup):
            self.step()

    def step(self):
        loss = self.fn(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        return loss.detach()

    def measure(self, steps) -> dict:
        torch.cuda.synchronize()
        gc.collect()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        ms, loss = step_ms(self.step, steps)
        return dict(ms=ms, tokens_per_s=self.ids.numel() / ms * 1e3,
                    peak=(torch.cuda.max_memory_allocated() - base) / 2**30, loss=loss.item())


def run_family(family, runs, args, ids) -> dict:
    """The runs of one family in --rounds interleaved rounds: {results, errors, profiles, table}."""
    per_round = {r: [] for r in runs}
    errors, held, profiles = {}, {}, {}
    for k in range(args.rounds):
        for run in runs:
            if run in errors:
                continue
            try:
                if run not in held:
                    held[run] = Run(run, args, family, ids)
                per_round[run].append(held[run].measure(args.steps))
                if args.profile and k == 0:
                    profiles[run] = profile_step(held[run].step)
            except Exception as e:  # noqa: BLE001 - one failed run is reported, the others go on
                errors[run] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                torch.cuda.empty_cache()
            if run in per_round and len(per_round[run]) == k + 1:
                r = per_round[run][-1]
                print(f"{family} round {k + 1}/{args.rounds} {run}: {r['ms']:.2f} ms/step, peak {r['peak']:.2f} GiB, "
                      f"loss {r['loss']:.5f}", flush=True)
    held.clear()
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    results = {}
    for run, rs in per_round.items():
        if rs:
            mid = sorted(rs, key=lambda r: r["ms"])[len(rs) // 2]
            results[run] = dict(mid, ms=statistics.median(r["ms"] for r in rs))
            results[run]["tokens_per_s"] = ids.numel() / results[run]["ms"] * 1e3
    ref = results.get("eager")
    lines = ["| run | step (ms) | tokens/s | peak above the weights (GiB) | step-0 loss | loss - eager's |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for run in runs:
        if run not in results:
            lines.append(f"| {run} | failed: {errors.get(run, '?')} | | | | |")
            continue
        r = results[run]
        gap = f"{r['loss'] - ref['loss']:+.2e}" if ref else "-"
        lines.append(f"| {run} | {r['ms']:.2f} | {r['tokens_per_s']:.0f} | {r['peak']:.2f} | {r['loss']:.5f} | {gap} |")
    table = "\n".join(lines)
    peers = [r for r in ("compile", "liger") if r in results]
    if "tessera" in results and peers:
        best = min(peers, key=lambda r: results[r]["ms"])
        table += (f"\n\ntessera against the faster of {' and '.join(peers)} ({best}): "
                  f"{results[best]['ms'] / results['tessera']['ms']:.3f}x the tokens/s, "
                  f"{results['tessera']['peak'] / results[best]['peak']:.3f}x the peak memory")
    return dict(results=results, errors=errors, profiles=profiles, table=table)


def compiled_summary(by_family) -> str:
    """Per family, each patched run's step uncompiled and under torch.compile, and their ratio
    (uncompiled over compiled: at least 1 where compiling does not slow the patched model)."""
    pairs = ("tessera", "tessera sdpa")
    lines = ["| family | " + " | ".join(f"{r} (ms) | {r} compile (ms) | ratio" for r in pairs) + " |",
             "| --- |" + " ---: | ---: | ---: |" * len(pairs)]
    for family, out in by_family.items():
        res, cells = out["results"], []
        for run in pairs:
            a, b = res.get(run, {}).get("ms"), res.get(f"{run} compile", {}).get("ms")
            cells += [f"{a:.2f}" if a else "-", f"{b:.2f}" if b else "-", f"{a / b:.3f}" if a and b else "-"]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="llama", help=f"a family, a comma-separated list, all (the dense ones) or "
                    f"moe (the Mixture-of-Experts ones): {', '.join(CONFIGS)}")
    for flag, default in (("layers", 8), ("hidden", 2048), ("heads", 16), ("kv-heads", 4), ("intermediate", 5632),
                          ("vocab", 128256), ("batch", 2), ("seq", 4096), ("steps", 8), ("warmup", 3), ("rounds", 2),
                          ("seed", 0), ("head-dim", 0), ("experts", 128), ("top-k", 8), ("moe-intermediate", 768)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, tessera, ...)")
    ap.add_argument("--experts-impl", default="grouped_mm",
                    help="the MoE families' experts_implementation in the runs tessera does not patch")
    ap.add_argument("--fit", action="store_true", help=f"where the GPU has under {FIT_GIB} GiB, the small model: "
                    + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in SMALL.items()))
    ap.add_argument("--profile", action="store_true", help="one more step of each run (first round) under "
                    "torch.profiler: its top CUDA kernels and GPU ms per category")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    families = ([f for f in CONFIGS if f not in MOE] if args.family == "all" else list(MOE) if args.family == "moe"
                else [f.strip() for f in args.family.split(",") if f.strip()])
    if not families or any(f not in CONFIGS for f in families):
        ap.error(f"--family: expected all or names of {', '.join(CONFIGS)}, got {args.family!r}")
    if args.fit and torch.cuda.get_device_properties(0).total_memory < FIT_GIB * 2**30:
        print(f"the small model: the GPU has under {FIT_GIB} GiB")
        vars(args).update(SMALL)
    runs = [r.strip().replace("_", " ") for r in args.runs.split(",") if r.strip()]
    if any(r not in RUNS for r in runs):
        ap.error(f"--runs: expected names of {', '.join(RUNS)}, got {runs}")
    if args.attn == "tessera" or any(r.startswith("tessera") for r in runs):
        import tessera.transformers  # noqa: F401 - registers attn_implementation="tessera"
    ids = torch.randint(3, args.vocab - 1, (args.batch, args.seq), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(args.seed))
    by_family = {}
    for family in families:
        family_runs = list(runs)
        if "liger" in family_runs and liger_apply(family)[0] is None:
            print(f"note: {family}'s liger run is left out: {liger_apply(family)[1]}")
            family_runs.remove("liger")
        by_family[family] = run_family(family, family_runs, args, ids)
    if len(families) == 1:
        table = by_family[families[0]]["table"]
    elif not any(r.startswith("tessera") and r.endswith("compile") for r in runs):  # each family's table
        table = "\n\n".join(f"{family}\n\n{out['table']}" for family, out in by_family.items())
    else:
        for family, out in by_family.items():
            print(f"\n{family}\n\n{out['table']}")
        table = ("Each patched run's step uncompiled and under torch.compile (ratio: uncompiled over compiled; "
                 "the runs of each family in the JSON)\n\n" + compiled_summary(by_family))
    print(table)
    first = by_family[families[0]]
    profiles = first["profiles"]
    for run, rows in profiles.items():
        print(f"\n{run}: one profiled step\n{top_kernels(rows)}")
    if profiles:
        table += "\n\nGPU ms per category in one profiled step of each run\n\n" + category_table(
            {r: {"categories": by_category(rows)} for r, rows in profiles.items()}, runs)
        print(table[table.index("GPU ms per category"):])
    errors = {f"{family} {run}": why for family, out in by_family.items() for run, why in out["errors"].items()}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = dict(vars(args), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    transformers=transformers.__version__)
        results = first["results"] if len(families) == 1 else {f: out["results"] for f, out in by_family.items()}
        with open(os.path.join(args.out, "transformers_step.json"), "w") as f:
            json.dump(dict(meta=meta, results=results, errors=errors), f, indent=1)
        with open(os.path.join(args.out, "transformers_step.md"), "w") as f:
            f.write(table + "\n")
        results = first["results"]
        colour = {run: COLORS[i % len(COLORS)] for i, run in enumerate(runs)}
        panels = [(heading, unit, [(run, [(results[run][key], colour[run], f"{run}: {results[run][key]:.2f} {unit}")]
                                   if run in results else []) for run in runs], None)
                  for heading, key, unit in (("step time, median", "ms", "ms"),
                                             ("peak memory above the weights", "peak", "GiB"))]
        title = f"{families[0]}: {args.layers} layers of {args.hidden}, {args.batch} x {args.seq} tokens"
        with open(os.path.join(args.out, "transformers_step.svg"), "w") as f:
            f.write(svg_bars(title, panels))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
