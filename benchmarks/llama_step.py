#!/usr/bin/env python3
"""A Llama-style training step (forward + backward, bf16 weights) as a PyTorch user writes it,
torch against tessera's pieces, eager and under torch.compile: step time, tokens/s, peak memory.

    python benchmarks/llama_step.py [--tessera all|none|all,linear|all,-add_norm|rope,loss,...]
        [--runs "torch eager,torch compile,tessera eager,tessera compile"] [--steps 8] [--rounds 2]
        [--warmup 3] [--small] [--quick] [--profile] [--out report/llama_step] [--layers 8 ...]

The model (Llama 3.2 1B's shapes, 8 layers; each size a flag): embedding; blocks of RMSNorm + GQA
attention (RoPE, unscaled, on q, k as (batch, seq, heads, head_dim); causal SDPA) and RMSNorm + SwiGLU
w2(silu(w1 x) * w3 x) (two projections, as HF's LlamaMLP and torchtitan write it); RMSNorm; untied
output projection; cross-entropy on next tokens of random data. bf16 parameters, no autocast; a
step is forward, backward and zero_grad(set_to_none=True), no optimizer. The residual stream is
written as vLLM writes it: a block takes (x, residual), x being the last branch's output, and each
norm after the first adds and normalises in one call, `h, residual = add_norm(x, residual, weight,
eps)` (the final norm too); the first block's residual is the embedding's output. In torch that is
`s = x + residual; F.rms_norm(s, ...), s`: the same ops as `x = x + attn(norm(x))`.

Each piece in --tessera swaps torch's function for tessera's (TORCH and TESSERA below):
  piece      torch                                                   tessera
  rms_norm   F.rms_norm (every norm; the first alone with add_norm)  tessera.rms_norm
  add_norm   x + residual, then the rms_norm piece's norm of it      tessera.add_rms_norm
  rope       HF's rotate_half rope, bf16 (seq, head_dim) tables      tessera.rotary_embedding
                                                                     (float32 (seq, head_dim / 2) tables)
  attention  F.scaled_dot_product_attention                          tessera.scaled_dot_product_attention
  silu_mul   F.silu(gate) * up                                       tessera.silu_mul
  swiglu     (the silu_mul piece, two projections;                   the feed-forward in one call,
             w2 the linear piece's)                                  tessera.mlp(x, w13, w2,
                                                                     activation="swiglu"): w1 and w3 as
                                                                     one weight (rows interleaved), w2's
                                                                     GEMM tessera's too; the hidden
                                                                     activation recomputed in the
                                                                     backward, not kept
  loss       F.cross_entropy(F.linear(h, W).float(), target)         tessera.linear_cross_entropy
                                                                     (holds no logits)
  linear     F.linear of wq, wk, wv, wo, w1, w3, w2 (with swiglu,     tessera.linear
             of wq, wk, wv, wo)
--tessera all (the default) is every piece but linear and swiglu, which are there to be measured:
`--tessera all,linear` adds it, `all,-add_norm` drops one, `none` runs torch's functions alone.

Each run builds the model from the same seed, runs --warmup steps (compilation happens there),
resets the peak-memory counter and times --steps steps with CUDA events (median); the runs take
turns in --rounds rounds, and the median over rounds is reported. Each run's loss (the first timed
step's) and first-layer gradients are compared with torch eager's. A failed run (OOM, an op
missing) is reported with its error's root cause and the others go on; the exit status is 1 if any
failed or disagreed. --quick: one round of 5 steps after 2 warm-up steps (flags given override
it), on the --small model where the GPU has under 32 GiB (the full model's torch eager run peaks
near 18 GiB).

--profile: one more step of each run (first round) under torch.profiler: its top 15 CUDA kernels
(each with its category) and a table of GPU time per category, one column per run. A kernel's
category is the first of CATEGORIES (llama_report.py) whose pattern its lower-cased name matches
(tessera's kernels, torch's ATen and cuBLAS/cuDNN/flash kernels, Inductor's
triton_{poi,red,per,tem}_fused_<ops> kernels): gemm (cuBLAS, CUTLASS, nvjet, tessera's gemm; the
loss's output projection included), attention fwd / bwd, norm (a fused residual add included),
rope, swiglu, loss (cross-entropy kernels, not its GEMMs), embedding, copy/fill, elementwise (other
pointwise and reductions), other. Eager torch splits some pieces into generic kernels (rope's muls
and adds, silu(gate) * up's mul) that land in elementwise. Writes llama_step.json, llama_step.md
(the tables) and llama_step.svg (step time and peak memory per run; with --profile, GPU time per
category) to --out.
"""
import argparse
import gc
import os
import statistics
import sys
import traceback
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from common import FINAL_TABLE_MARK, step_ms, write_results
from llama_report import (GRAD_TOL, LOSS_TOL, by_category, category_table, error_line, profile_step,
                          report, step_svg, top_kernels)

FULL = dict(layers=8, dim=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632, vocab=128256,
            batch=2, seq=4096, rope_theta=500000.0, eps=1e-5)
SMALL = dict(FULL, layers=2, dim=512, heads=8, kv_heads=2, head_dim=64, ffn=1408, vocab=8192,
             seq=512)
PIECES = ("rms_norm", "add_norm", "rope", "attention", "silu_mul", "swiglu", "loss", "linear")
DEFAULT_PIECES = tuple(p for p in PIECES if p not in ("linear", "swiglu"))  # --tessera all
RUNS = ("torch eager", "torch compile", "tessera eager", "tessera compile")
DEFAULT_TIMING = dict(steps=8, warmup=3, rounds=2)
QUICK_TIMING = dict(steps=5, warmup=2, rounds=1)
QUICK_FULL_GIB = 32  # --quick runs the full model on a GPU with this much memory or more


# ---- the two implementations of each piece ------------------------------------------------------

def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def rope_torch(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb, on (batch, seq, heads, head_dim)."""
    cos, sin = cos[:, None], sin[:, None]  # (seq, 1, head_dim): broadcast over heads
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def add_then_norm(rms_norm):
    """add_norm unfused: the residual add, then `rms_norm` (torch's, or tessera's where the
    rms_norm piece is on tessera): (rms_norm(x + residual), x + residual)."""
    def add_norm(x, residual, weight, eps):
        s = x + residual
        return rms_norm(s, (s.shape[-1],), weight, eps), s
    return add_norm


TORCH = dict(rms_norm=F.rms_norm, add_norm=add_then_norm(F.rms_norm), rope=rope_torch,
             attention=F.scaled_dot_product_attention,
             silu_mul=lambda gate, up: F.silu(gate) * up, swiglu=None,  # no fused form
             loss=lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t),
             linear=F.linear)
# Looked up at the call (a lambda), not at import: a function tessera lacks fails only the runs
# that select its piece (build checks TESSERA_NEEDS first, for a clear error).
TESSERA = dict(rms_norm=tessera.rms_norm, attention=tessera.scaled_dot_product_attention,
               add_norm=lambda x, residual, w, eps: tessera.add_rms_norm(x, residual, w, eps),
               rope=lambda q, k, cos, sin: tessera.rotary_embedding(q, k, cos, sin, layout="bshd"),
               silu_mul=tessera.silu_mul,
               swiglu=lambda x, w13, w2: tessera.mlp(x, w13, w2, activation="swiglu"),
               loss=lambda h, w, t: tessera.linear_cross_entropy(h, w, t),  # no logits held
               linear=lambda x, w: tessera.linear(x, w))
TESSERA_NEEDS = dict(rms_norm="rms_norm", add_norm="add_rms_norm", rope="rotary_embedding",
                     attention="scaled_dot_product_attention", silu_mul="silu_mul", swiglu="mlp",
                     loss="linear_cross_entropy", linear="linear")


def rope_tables(c, half: bool):
    """cos and sin of each position's angles: (seq, head_dim / 2) float32 for tessera's rope,
    Hugging Face's (seq, head_dim) (each angle twice) in the model's dtype for torch's."""
    inv = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
    freqs = torch.outer(torch.arange(c.seq, dtype=torch.float32), inv)
    if half:
        return freqs.cos(), freqs.sin()
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


# ---- the model ----------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps, fns):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.fns = eps, fns

    def forward(self, x, residual=None):
        """rms_norm(x); with a residual, (rms_norm(x + residual), x + residual) (add_norm)."""
        if residual is None:
            return self.fns["rms_norm"](x, (x.shape[-1],), self.weight, self.eps)
        return self.fns["add_norm"](x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.wq = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.head_dim, self.fns = c.head_dim, fns

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        linear = self.fns["linear"]  # F.linear(x, w): what nn.Linear (no bias) computes
        q = linear(x, self.wq.weight).view(b, s, -1, self.head_dim)
        k = linear(x, self.wk.weight).view(b, s, -1, self.head_dim)
        v = linear(x, self.wv.weight).view(b, s, -1, self.head_dim)
        q, k = self.fns["rope"](q, k, cos, sin)
        # SDPA takes (batch, heads, seq, head_dim): transposed views, no copies.
        y = self.fns["attention"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  is_causal=True, enable_gqa=True)
        return linear(y.transpose(1, 2).reshape(b, s, -1), self.wo.weight)


class FeedForward(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn, bias=False)  # gate
        self.w3 = nn.Linear(c.dim, c.ffn, bias=False)  # up
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)
        self.fns = fns

    def fuse(self):
        """The swiglu piece: w1 and w3 as one parameter, their rows interleaved in blocks of 64
        (tessera.swiglu_weight), for one GEMM with SwiGLU in its epilogue; w2 stays a Linear (its
        weight is what the piece's call takes)."""
        self.w13 = nn.Parameter(tessera.swiglu_weight(self.w1.weight, self.w3.weight).detach())
        del self.w1, self.w3

    def forward(self, x):
        if hasattr(self, "w13"):  # the swiglu piece: the whole block in one call, w2's GEMM included
            return self.fns["swiglu"](x, self.w13, self.w2.weight)
        linear = self.fns["linear"]
        return linear(self.fns["silu_mul"](linear(x, self.w1.weight), linear(x, self.w3.weight)),
                      self.w2.weight)


class Block(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(c.dim, c.eps, fns), Attention(c, fns)
        self.ffn_norm, self.feed_forward = RMSNorm(c.dim, c.eps, fns), FeedForward(c, fns)

    def forward(self, x, residual, cos, sin):
        """x: the last branch's output (the embedding's for the first block, whose residual is
        None); returns this block's feed-forward output and the residual stream before it. The
        same sums as `x = x + attention(norm(x)); x = x + feed_forward(norm(x))`."""
        if residual is None:
            h, residual = self.attention_norm(x), x
        else:
            h, residual = self.attention_norm(x, residual)
        h, residual = self.ffn_norm(self.attention(h, cos, sin), residual)
        return self.feed_forward(h), residual


class Llama(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c, fns) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps, fns)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)  # untied from the embedding
        self.fns = fns

    def forward(self, tokens, targets):
        x, residual = self.embed(tokens), None
        for layer in self.layers:
            x, residual = layer(x, residual, self.cos, self.sin)
        h, _ = self.norm(x, residual)  # the last residual add, and the final norm
        return self.fns["loss"](h.view(-1, h.shape[-1]), self.output.weight, targets)


def build(c, pieces, seed=0, device="cuda"):
    """The model with `pieces` on tessera's functions, the rest on torch's; same weights for a
    given seed whatever the pieces (initialised on `device`, the current GPU by default, in
    float32, then cast to bf16)."""
    missing = [f"tessera.{TESSERA_NEEDS[p]} (piece {p})" for p in pieces
               if not hasattr(tessera, TESSERA_NEEDS[p])]
    if missing:
        raise AttributeError(f"this tessera has no {', '.join(missing)}")
    fns = {p: (TESSERA if p in pieces else TORCH)[p] for p in PIECES}
    if "add_norm" not in pieces:  # the add, then the norm of the rms_norm piece
        fns["add_norm"] = add_then_norm(fns["rms_norm"])
    torch.manual_seed(seed)
    with torch.device(device):
        model = Llama(c, fns).to(torch.bfloat16)
        if "swiglu" in pieces:
            for layer in model.layers:
                layer.feed_forward.fuse()
    # Registered after the cast, which would turn tessera's float32 tables into bf16.
    cos, sin = rope_tables(c, half="rope" in pieces)
    model.register_buffer("cos", cos.to(device), persistent=False)
    model.register_buffer("sin", sin.to(device), persistent=False)
    return model


# ---- one run ------------------------------------------------------------------------------------

def first_layer_grads(model) -> dict:
    """The first layer's gradients by parameter name, float32 on the host; a fused w13's split
    back into w1's and w3's."""
    grads = {n: p.grad.float().cpu() for n, p in model.layers[0].named_parameters()}
    if "feed_forward.w13" in grads:
        g = grads.pop("feed_forward.w13")
        blocks = g.view(-1, 2, 64, g.shape[-1])
        grads["feed_forward.w1.weight"] = blocks[:, 0].reshape(-1, g.shape[-1])
        grads["feed_forward.w3.weight"] = blocks[:, 1].reshape(-1, g.shape[-1])
    return grads


def measure(run, c, args, data, first_round: bool) -> dict:
    """Builds, warms up and times one run; returns its median step (ms), peak memory (GiB),
    first timed loss and, in the first round, its first layer's gradients (float32, on the host)
    and with --profile its kernel table and GPU ms per category."""
    compiled = run.endswith("compile")
    if compiled:
        torch._dynamo.reset()  # a fresh cache: no recompile limit reached across runs and rounds
    model = build(c, args.pieces if run.startswith("tessera") else (), args.seed)
    fn = torch.compile(model) if compiled else model
    inputs, targets = data

    def step():
        loss = fn(inputs, targets)
        loss.backward()
        # As after an optimizer step: no gradients held into the next forward.
        model.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):  # the compiled runs compile in here (forward and backward)
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms, loss = step_ms(step, args.steps)
    result = dict(ms=ms, peak=torch.cuda.max_memory_allocated() / 2**30, loss=loss.item())
    # The fingerprint of the backward: the first layer's gradients (every piece and layer above
    # it shapes them), on the host, from one more step.
    if first_round:
        fn(inputs, targets).backward()
        result["grads"] = first_layer_grads(model)
        model.zero_grad(set_to_none=True)
    if first_round and args.profile:
        try:
            rows = profile_step(step)
            result["profile"] = dict(text=top_kernels(rows), categories=by_category(rows))
        except Exception as e:  # noqa: BLE001 - the timing stands without the profile
            result["profile"] = dict(text=f"profile failed: {type(e).__name__}: {e}")
    return result


def free_memory():
    gc.collect()
    torch._dynamo.reset()  # compiled code and its guards keep the model's tensors alive
    torch.cuda.empty_cache()


def add_shape_args(ap, notes=None) -> None:
    """--layers, --dim, ... (FULL's keys): the model and batch shape, each overriding the preset's
    (FULL, or SMALL with --small); `notes` adds a word to a key's help."""
    for k, v in FULL.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=None,
                        help=f"{(notes or {}).get(k, '')}default {v} ({SMALL[k]} with --small)")


def shape_and_pieces(ap, args):
    """The shape add_shape_args's arguments give (a namespace of FULL's keys), and args.pieces
    set from --tessera (ap.error on a bad one)."""
    preset = SMALL if args.small else FULL
    c = SimpleNamespace(**{k: preset[k] if getattr(args, k) is None else getattr(args, k) for k in FULL})
    try:
        args.pieces = parse_pieces(args.tessera)
    except ValueError as e:
        ap.error(f"--tessera: {e}")
    return c


def parse_pieces(text: str) -> tuple:
    """--tessera's pieces, in PIECES order: "all" is DEFAULT_PIECES, "none" nothing, a name adds
    that piece, "-name" drops it, left to right."""
    chosen = set()
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        name = word[1:] if word.startswith("-") else word
        if word in ("all", "none"):
            chosen = set(DEFAULT_PIECES) if word == "all" else set()
        elif name in PIECES:
            (chosen.discard if word.startswith("-") else chosen.add)(name)
        else:
            raise ValueError(f"expected all, none, names of {', '.join(PIECES)} or -name, got "
                             f"{word!r} in {text!r}")
    return tuple(p for p in PIECES if p in chosen)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", default="all",
                    help=f"pieces on tessera, comma-separated: all ({','.join(DEFAULT_PIECES)}), "
                         f"none, names of {','.join(PIECES)}, -name to drop one (all,linear: every "
                         "piece; all,-add_norm: all but add_norm)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run and round "
                    f"(default {DEFAULT_TIMING['steps']}, --quick {QUICK_TIMING['steps']})")
    ap.add_argument("--warmup", type=int, default=None, help=f"default {DEFAULT_TIMING['warmup']}, "
                    f"--quick {QUICK_TIMING['warmup']}")
    ap.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_TIMING['rounds']}, "
                    f"--quick {QUICK_TIMING['rounds']}")
    ap.add_argument("--small", action="store_true", help="a quick check: " + ", ".join(
        f"{k} {v}" for k, v in SMALL.items() if FULL[k] != v))
    ap.add_argument("--quick", action="store_true", help="one round of 5 steps after 2 warm-up "
                    f"steps; --small where the GPU has under {QUICK_FULL_GIB} GiB")
    ap.add_argument("--profile", action="store_true", help="one more step of each run profiled: "
                    "its top 15 CUDA kernels and GPU time per category")
    ap.add_argument("--seed", type=int, default=0, help="of the weights and the tokens")
    ap.add_argument("--out", default="report/llama_step")
    add_shape_args(ap)
    args = ap.parse_args()
    for k, v in (QUICK_TIMING if args.quick else DEFAULT_TIMING).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.quick and not args.small and torch.cuda.is_available():
        gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        if gib < QUICK_FULL_GIB:
            print(f"--quick: the small model, the GPU having {gib:.0f} GiB", flush=True)
            args.small = True
    c = shape_and_pieces(ap, args)
    args.runs = [" ".join(r.replace("-", " ").replace("_", " ").split())
                 for r in args.runs.split(",") if r.strip()]
    if not args.runs or any(r not in RUNS for r in args.runs):
        ap.error(f"--runs: expected names of {', '.join(RUNS)}, got {args.runs}")
    if c.heads % c.kv_heads or c.head_dim % 2 or min(args.steps, args.rounds, args.warmup) < 1:
        ap.error("heads must be a multiple of kv-heads, head-dim even, steps, rounds and warmup >= 1")
    return c, args


def main():
    c, args = parse_args()
    if not torch.cuda.is_available() or not tessera.is_available():
        sys.exit(f"llama_step: needs a CUDA GPU ({tessera.no_gpu_reason() or 'torch sees none'})")
    pieces = ", ".join(args.pieces) or "none"
    print(f"llama_step on {torch.cuda.get_device_name()}: torch {torch.__version__}, tessera "
          f"{tessera.__version__}\nmodel {vars(c)}; tessera pieces: {pieces}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    tokens = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g, device="cuda")
    data = (tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1))  # inputs, next-token targets

    results, errors, profiles, grads = {}, {}, {}, {}
    for rnd in range(args.rounds):
        for run in args.runs:
            if run in errors:  # failed in an earlier round: not retried
                continue
            try:
                r = measure(run, c, args, data, first_round=rnd == 0)
            except Exception as e:  # noqa: BLE001 - one run failing must not lose the others
                traceback.print_exc()
                errors[run] = error_line(e)
                print(f"round {rnd + 1}/{args.rounds} {run}: FAILED {errors[run]}", flush=True)
            else:
                print(f"round {rnd + 1}/{args.rounds} {run}: {r['ms']:.2f} ms/step, peak "
                      f"{r['peak']:.2f} GiB, loss {r['loss']:.5f}", flush=True)
                if "profile" in r:
                    profiles[run] = r.pop("profile")
                if "grads" in r:
                    grads[run] = r.pop("grads")
                first = results.setdefault(run, dict(r, round_ms=[]))  # the loss: the first round's
                first["round_ms"].append(r["ms"])
                first["peak"] = max(first["peak"], r["peak"])
            free_memory()  # the next run starts from the same empty allocator
    for run, r in results.items():
        r["ms"] = statistics.median(r["round_ms"])
        if run in grads and "torch eager" in grads:
            ref = grads["torch eager"]
            r["grad_diff"] = max(((g - ref[n]).norm() / ref[n].norm()).item() for n, g in grads[run].items())
    grads.clear()

    for run, prof in profiles.items():
        print(f"\n{run}: top CUDA kernels of one step\n{prof['text']}")
    rows, table, mismatch = report(c, args, results, errors)
    cat_table = ""
    if any("categories" in p for p in profiles.values()):
        cat_table = category_table({r: p for r, p in profiles.items() if "categories" in p}, args.runs)
        print(f"\nGPU time per category in one profiled step of each run (ms; kernels only, so the "
              f"total is below the step time by the launch gaps):\n{cat_table}")
        for row in rows:
            if "categories" in profiles.get(row["run"], {}):
                row["profile_ms"] = profiles[row["run"]]["categories"]
    print(f"\n{FINAL_TABLE_MARK}: median step over {args.rounds} round(s) of {args.steps} steps, "
          f"{c.batch} x {c.seq} tokens; tessera pieces: {pieces}; loss and grad diff: to torch eager's "
          f"(bf16 noise: loss within {LOSS_TOL}, gradients {GRAD_TOL})\n{table}")
    if mismatch:
        print(f"MISMATCH: {', '.join(mismatch)} off torch eager beyond bf16 noise")
    md = table
    if cat_table:
        md += ("\n\nGPU time per category in one profiled step of each run (ms; kernels only; a "
               "kernel's category: the first pattern of llama_report.py's CATEGORIES that its name "
               f"matches):\n\n{cat_table}")
    md += "".join(f"\n\n{run}: top CUDA kernels of one step\n\n```\n{prof['text']}\n```"
                  for run, prof in profiles.items())
    meta = dict(model=vars(c), pieces=list(args.pieces), steps=args.steps, warmup=args.warmup,
                rounds=args.rounds, seed=args.seed, timer="CUDA events per step; median over rounds")
    write_results(args.out, "llama_step", meta, rows, md)
    title = (f"Llama-style training step, {c.layers} layers, dim {c.dim}, {c.batch} x {c.seq} "
             f"tokens; tessera: {pieces}")
    with open(os.path.join(args.out, "llama_step.svg"), "w", encoding="utf-8") as f:
        f.write(step_svg(title, args.runs, results, errors, profiles))
    print(f"wrote llama_step.json, llama_step.md and llama_step.svg in {args.out}")
    return 1 if errors or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
