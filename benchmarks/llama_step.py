#!/usr/bin/env python3
"""A Llama-style training step (forward + backward, bf16 weights) as a PyTorch user writes it,
torch against tessera's pieces, eager and under torch.compile: step time, tokens/s, peak memory.

    python benchmarks/llama_step.py [--tessera all|none|rms_norm,rope,attention,silu_mul,loss]
        [--runs "torch eager,torch compile,tessera eager,tessera compile"] [--steps 8] [--rounds 2]
        [--warmup 3] [--small] [--profile] [--out report/llama_step] [--layers 8 --dim 2048 ...]

The model (Llama 3.2 1B's shapes, 8 layers; each size a flag): embedding; blocks of RMSNorm + GQA
attention (RoPE, unscaled, on q, k as (batch, seq, heads, head_dim); causal SDPA) and RMSNorm + SwiGLU
w2(silu(w1 x) * w3 x) (two projections, as HF's LlamaMLP and torchtitan write it); RMSNorm; untied
output projection; cross-entropy on next tokens of random data. bf16 parameters, no autocast; a
step is forward, backward and zero_grad(set_to_none=True), no optimizer. Each piece in --tessera
swaps torch's function for tessera's (TORCH and TESSERA below): F.rms_norm, HF's rotate_half rope
(bf16 (seq, head_dim) tables; tessera's takes float32 (seq, head_dim / 2) ones), SDPA, F.silu(gate)
* up, and F.cross_entropy(F.linear(h, W).float(), target) (tessera's holds no logits).

Each run builds the model from the same seed, runs --warmup steps (compilation happens there),
resets the peak-memory counter and times --steps steps with CUDA events (median); the runs take
turns in --rounds rounds, and the median over rounds is reported. Each run's loss (the first timed
step's) and first-layer gradients are compared with torch eager's. A failed run (OOM, an op
missing) is reported with its error's root cause and the others go on; the exit status is 1 if any
failed or disagreed. --profile: the top 15 CUDA kernels of one more step of each run. Writes
llama_step.json and llama_step.md to --out.
"""
import argparse
import gc
import statistics
import sys
import traceback
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from common import FINAL_TABLE_MARK, write_results

FULL = dict(layers=8, dim=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632, vocab=128256,
            batch=2, seq=4096, rope_theta=500000.0, eps=1e-5)
SMALL = dict(FULL, layers=2, dim=512, heads=8, kv_heads=2, head_dim=64, ffn=1408, vocab=8192,
             seq=512)
PIECES = ("rms_norm", "rope", "attention", "silu_mul", "loss")
RUNS = ("torch eager", "torch compile", "tessera eager", "tessera compile")
# Beyond these gaps to torch eager a run is reported as computing something else. The loss at
# init (~ln(vocab), a float32 mean over batch * seq tokens) moves by ~1e-3 between bf16
# implementations, but hardly more for a wrong op (a wrong rope: ~1e-4), so the first layer's
# gradients are compared too (max over its parameters of |g - g_torch| / |g_torch|): ~1e-2
# between implementations, 0.2 to 0.9 for a wrong rope, mask or eps (measured at a small size).
LOSS_TOL, GRAD_TOL = 0.02, 0.1


# ---- the two implementations of each piece ------------------------------------------------------

def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def rope_torch(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb, on (batch, seq, heads, head_dim)."""
    cos, sin = cos[:, None], sin[:, None]  # (seq, 1, head_dim): broadcast over heads
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


TORCH = dict(rms_norm=F.rms_norm, rope=rope_torch, attention=F.scaled_dot_product_attention,
             silu_mul=lambda gate, up: F.silu(gate) * up,
             loss=lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t))
TESSERA = dict(rms_norm=tessera.rms_norm, attention=tessera.scaled_dot_product_attention,
               rope=lambda q, k, cos, sin: tessera.rotary_embedding(q, k, cos, sin, layout="bshd"),
               silu_mul=tessera.silu_mul,
               loss=lambda h, w, t: tessera.linear_cross_entropy(h, w, t))  # no logits held


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

    def forward(self, x):
        return self.fns["rms_norm"](x, (x.shape[-1],), self.weight, self.eps)


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
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = self.fns["rope"](q, k, cos, sin)
        # SDPA takes (batch, heads, seq, head_dim): transposed views, no copies.
        y = self.fns["attention"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn, bias=False)  # gate
        self.w3 = nn.Linear(c.dim, c.ffn, bias=False)  # up
        self.w2 = nn.Linear(c.ffn, c.dim, bias=False)
        self.fns = fns

    def forward(self, x):
        return self.w2(self.fns["silu_mul"](self.w1(x), self.w3(x)))


class Block(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(c.dim, c.eps, fns), Attention(c, fns)
        self.ffn_norm, self.feed_forward = RMSNorm(c.dim, c.eps, fns), FeedForward(c, fns)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c, fns) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps, fns)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)  # untied from the embedding
        self.fns = fns

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        h = self.norm(x)
        return self.fns["loss"](h.view(-1, h.shape[-1]), self.output.weight, targets)


def build(c, pieces, seed=0):
    """The model with `pieces` on tessera's functions, the rest on torch's; same weights for a
    given seed whatever the pieces (initialised on the GPU in float32, then cast to bf16)."""
    fns = {p: (TESSERA if p in pieces else TORCH)[p] for p in PIECES}
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Llama(c, fns).to(torch.bfloat16)
    # Registered after the cast, which would turn tessera's float32 tables into bf16.
    cos, sin = rope_tables(c, half="rope" in pieces)
    model.register_buffer("cos", cos.cuda(), persistent=False)
    model.register_buffer("sin", sin.cuda(), persistent=False)
    return model


# ---- one run ------------------------------------------------------------------------------------

def top_kernels(step, n=15) -> str:
    """The n CUDA kernels that took the most time in one step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [(e.key, getattr(e, "device_time_total", 0.0) / 1e3, e.count) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda r: -r[1])
    lines = [f"GPU kernel time in the step: {sum(r[1] for r in rows):.2f} ms",
             f"{'kernel':90s} {'ms':>9s} {'calls':>6s}"]
    lines += [f"{k[:90]:90s} {ms:9.3f} {cnt:6d}" for k, ms, cnt in rows[:n]]
    return "\n".join(lines)


def measure(run, c, args, data, first_round: bool) -> dict:
    """Builds, warms up and times one run; returns its median step (ms), peak memory (GiB),
    first timed loss and, in the first round, its first layer's gradients (float32, on the host)
    and with --profile its kernel table."""
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
    # CUDA events, no sync inside the loop: the host runs ahead, as in training, and each
    # interval is the GPU's time for one step, host launch gaps included.
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.steps)]
    losses = []
    for start, end in events:
        start.record()
        losses.append(step())
        end.record()
    torch.cuda.synchronize()
    result = dict(ms=statistics.median(s.elapsed_time(e) for s, e in events),
                  peak=torch.cuda.max_memory_allocated() / 2**30, loss=losses[0].item())
    # The fingerprint of the backward: the first layer's gradients (every piece and layer above
    # it shapes them), on the host, from one more step.
    if first_round:
        fn(inputs, targets).backward()
        result["grads"] = [p.grad.float().cpu() for p in model.layers[0].parameters()]
        model.zero_grad(set_to_none=True)
    if first_round and args.profile:
        try:
            result["profile"] = top_kernels(step)
        except Exception as e:  # noqa: BLE001 - the timing stands without the profile
            result["profile"] = f"profile failed: {type(e).__name__}: {e}"
    return result


def error_line(e) -> str:
    """What a failed run's row says: the root cause's type and first line (torch.compile wraps
    an op's error in its own, whose message ends in advice on its settings)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [l for l in str(e).splitlines() if l.strip()] or [""]
    return f"{type(e).__name__}: {lines[0].strip()}"[:200]


def free_memory():
    gc.collect()
    torch._dynamo.reset()  # compiled code and its guards keep the model's tensors alive
    torch.cuda.empty_cache()


# ---- the report ---------------------------------------------------------------------------------

def report(c, args, results, errors) -> tuple:
    """The rows (dicts), the markdown table (one row per run, in --runs order) and the runs whose
    loss is off torch eager's by more than LOSS_TOL."""
    ref = results["torch eager"]["loss"] if "torch eager" in results else None
    compile_ms = results["torch compile"]["ms"] if "torch compile" in results else None
    rows, mismatch = [], []
    lines = ["| run | step ms | tokens/s | peak GiB | loss | loss - torch eager | grad diff | "
             "vs torch.compile |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run in args.runs:
        if run in errors:
            rows.append(dict(run=run, failed=errors[run]))
            lines.append(f"| {run} | failed: {errors[run]} | | | | | | |")
            continue
        r = results[run]
        diff = None if ref is None else r["loss"] - ref
        ratio = compile_ms / r["ms"] if compile_ms else None  # > 1: faster than torch.compile
        gdiff = r.get("grad_diff")
        if (diff is not None and abs(diff) > LOSS_TOL) or (gdiff is not None and gdiff > GRAD_TOL):
            mismatch.append(run)
        rows.append(dict(run=run, step_ms=r["ms"], round_ms=r["round_ms"],
                         tokens_per_s=c.batch * c.seq / r["ms"] * 1e3, peak_gib=r["peak"],
                         loss=r["loss"], loss_diff=diff, grad_diff=gdiff, vs_torch_compile=ratio))
        lines.append(f"| {run} | {r['ms']:.2f} | {rows[-1]['tokens_per_s']:,.0f} | {r['peak']:.2f} | "
                     f"{r['loss']:.5f} | {'-' if diff is None else f'{diff:+.2e}'} | "
                     f"{'-' if gdiff is None else f'{gdiff:.1e}'} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    return rows, "\n".join(lines), mismatch


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", default="all",
                    help=f"pieces on tessera: all, none or some of {','.join(PIECES)}")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per run and round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="a quick check: " + ", ".join(
        f"{k} {v}" for k, v in SMALL.items() if FULL[k] != v))
    ap.add_argument("--profile", action="store_true", help="top 15 CUDA kernels of one step of each run")
    ap.add_argument("--seed", type=int, default=0, help="of the weights and the tokens")
    ap.add_argument("--out", default="report/llama_step")
    for k, v in FULL.items():  # model and batch shape, overriding the preset's
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v}")
    args = ap.parse_args()
    preset = SMALL if args.small else FULL
    c = SimpleNamespace(**{k: preset[k] if getattr(args, k) is None else getattr(args, k)
                           for k in FULL})
    names = [p.strip() for p in args.tessera.split(",") if p.strip()]
    args.pieces = PIECES if names == ["all"] else () if names == ["none"] else tuple(names)
    if any(p not in PIECES for p in args.pieces):
        ap.error(f"--tessera: expected all, none or names of {', '.join(PIECES)}, got {args.tessera!r}")
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
            r["grad_diff"] = max(((a - b).norm() / b.norm()).item()
                                 for a, b in zip(grads[run], grads["torch eager"]))
    grads.clear()

    for run, text in profiles.items():
        print(f"\n{run}: top CUDA kernels of one step\n{text}")
    rows, table, mismatch = report(c, args, results, errors)
    print(f"\n{FINAL_TABLE_MARK}: median step over {args.rounds} round(s) of {args.steps} steps, "
          f"{c.batch} x {c.seq} tokens; tessera pieces: {pieces}; loss and grad diff: to torch eager's "
          f"(bf16 noise: loss within {LOSS_TOL}, gradients {GRAD_TOL})\n{table}")
    if mismatch:
        print(f"MISMATCH: {', '.join(mismatch)} off torch eager beyond bf16 noise")
    md = table + "".join(f"\n\n{run}: top CUDA kernels of one step\n\n```\n{text}\n```"
                         for run, text in profiles.items())
    meta = dict(model=vars(c), pieces=list(args.pieces), steps=args.steps, warmup=args.warmup,
                rounds=args.rounds, seed=args.seed, timer="CUDA events per step; median over rounds")
    write_results(args.out, "llama_step", meta, rows, md)
    print(f"wrote llama_step.json and llama_step.md in {args.out}")
    return 1 if errors or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
