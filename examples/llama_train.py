#!/usr/bin/env python3
"""A small Llama-style decoder in plain PyTorch, trained on generated data with and without
tessera.

    python examples/llama_train.py [--steps 300] [--modes torch,enable,ops,flce] [--no-compile]
                                   [--profile] [--out DIR]

The model is what a PyTorch user writes: token embedding, decoder blocks of RMSNorm, causal
self-attention with rotary embeddings (F.scaled_dot_product_attention) and a SwiGLU MLP, a final
RMSNorm and an untied output projection; cross-entropy loss; AdamW; bf16 autocast. The data is
generated: sequences of a random Markov chain over the vocabulary in which every token has four
equally likely successors, so the loss falls from ln(vocab) towards ln(4).

Modes (each trains the same model from the same initial weights on the same batches):
  torch   the model as written;
  enable  the same code under `with tessera.use_tessera(log=True)`: aten's rms_norm, silu,
          log_softmax (inside cross_entropy), softmax and add run on tessera's kernels where it
          takes the arguments (tessera.routing_counts() says how many calls did);
  ops     the model calling tessera's functions itself (tessera.rms_norm, tessera.silu,
          tessera.log_softmax): registered torch ops, which torch.compile keeps as they are,
          where it would lower the aten ops of `enable` into its own kernels;
  flce    torch's model with the output projection and the loss fused into
          tessera.linear_cross_entropy (no logits held; eager only).
Each mode runs eagerly and, unless --no-compile, under torch.compile(fullgraph=True). The
reference for "within bf16 noise" is torch's own run without autocast ("torch fp32", eager): the
gap between its curve and torch's bf16 one is what bf16 alone moves the loss by.

Writes losses.json (per run, per step), loss.svg (the eager curves) and report.md (the table
printed last: median step time, peak memory, losses, gaps to torch's curve, calls routed to tessera; with
--profile, torch.profiler's CUDA kernels for a few eager steps under tessera.enable(), tessera's
marked) to --out.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera


class Config:
    vocab = 8192
    dim = 512
    layers = 4
    heads = 8
    hidden = 1408
    seq = 256
    batch = 32


# The functions the model calls: torch's, or tessera's registered ops.
TORCH_FNS = dict(rms_norm=F.rms_norm, silu=F.silu,
                 cross_entropy=lambda logits, t: F.cross_entropy(logits, t))
TESSERA_FNS = dict(rms_norm=tessera.rms_norm, silu=tessera.silu,
                   cross_entropy=lambda logits, t: F.nll_loss(tessera.log_softmax(logits.float(), -1), t))


def fused_head_loss(h, weight, t):
    """The output projection and the loss in one: tessera.linear_cross_entropy, in autocast's
    dtype where autocast is on (as the projection would have run), never holding the logits."""
    dt = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else h.dtype
    return tessera.linear_cross_entropy(h.to(dt), weight.to(dt), t)


FLCE_FNS = dict(TORCH_FNS, head_loss=fused_head_loss)
FNS = {"torch": TORCH_FNS, "enable": TORCH_FNS, "ops": TESSERA_FNS, "flce": FLCE_FNS}


def rotary(seq, head_dim, device):
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    f = torch.outer(torch.arange(seq, device=device).float(), inv)
    return f.cos(), f.sin()


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class RMSNorm(nn.Module):
    def __init__(self, dim, fns, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.fns = eps, fns

    def forward(self, x):
        return self.fns["rms_norm"](x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.qkv = nn.Linear(c.dim, 3 * c.dim, bias=False)
        self.proj = nn.Linear(c.dim, c.dim, bias=False)
        self.heads = c.heads

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.gate = nn.Linear(c.dim, c.hidden, bias=False)
        self.up = nn.Linear(c.dim, c.hidden, bias=False)
        self.down = nn.Linear(c.hidden, c.dim, bias=False)
        self.fns = fns

    def forward(self, x):
        return self.down(self.fns["silu"](self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.norm1, self.attn = RMSNorm(c.dim, fns), Attention(c)
        self.norm2, self.mlp = RMSNorm(c.dim, fns), SwiGLU(c, fns)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    def __init__(self, c, fns):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(Block(c, fns) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, fns)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)
        self.fns = fns
        cos, sin = rotary(c.seq, c.dim // c.heads, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        h = self.norm(x)
        if "head_loss" in self.fns:
            return self.fns["head_loss"](h.reshape(-1, h.shape[-1]), self.head.weight, targets.reshape(-1))
        logits = self.head(h)
        return self.fns["cross_entropy"](logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def make_data(c, n, seed, device):
    """n sequences of seq + 1 tokens of a Markov chain with four successors per token."""
    g = torch.Generator(device=device).manual_seed(seed)
    succ = torch.randint(0, c.vocab, (c.vocab, 4), generator=g, device=device)
    choice = torch.randint(0, 4, (n, c.seq), generator=g, device=device)
    x = torch.empty(n, c.seq + 1, dtype=torch.long, device=device)
    x[:, 0] = torch.randint(0, c.vocab, (n,), generator=g, device=device)
    for t in range(c.seq):
        x[:, t + 1] = succ[x[:, t], choice[:, t]]
    return x


def lr_at(step, steps, peak=2e-3, warmup=30):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def train(mode, compiled, steps, c, data, seed=0, bf16=True):
    """Trains from the initial weights of `seed` (under bf16 autocast, or in float32); returns
    per-step losses and times (ms), and the routing counters for mode 'enable'."""
    torch.manual_seed(seed)
    model = Llama(c, FNS[mode]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0, steps), weight_decay=0.1, fused=True)
    step_fn = torch.compile(model, fullgraph=True) if compiled else model
    routed = tessera.use_tessera(log=True) if mode == "enable" else contextlib.nullcontext()
    losses, times = [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with routed:
        for i in range(steps):
            batch = data[(i * c.batch) % len(data):][:c.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(i, steps)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = step_fn(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
        counts = tessera.routing_counts() if mode == "enable" else None
    peak = torch.cuda.max_memory_allocated() / 2**20
    return losses, times, counts, peak


def profile_steps(c, data, steps=3, routed=True):
    """torch.profiler's CUDA kernel table for a few eager steps (under tessera.enable())."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = Llama(c, TORCH_FNS).cuda()
    with tessera.use_tessera() if routed else contextlib.nullcontext():
        for _ in range(2):  # warm-up outside the profile
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(data[:c.batch, :-1], data[:c.batch, 1:]).backward()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    model(data[:c.batch, :-1], data[:c.batch, 1:]).backward()
            torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows[e.key] = (e.count, getattr(e, "device_time_total", 0.0))
    total = sum(us for _, us in rows.values()) / steps / 1e3
    lines = [f"GPU time per step (forward and backward, kernels only): {total:.2f} ms", "",
             f"{'kernel':100s} {'calls':>6s} {'total us':>10s}  owner"]
    for key, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        if us <= 0:
            continue
        owner = "tessera" if "tessera" in key else "torch"
        lines.append(f"{key[:100]:100s} {n:6d} {us:10.1f}  {owner}")
    return "\n".join(lines)


def svg_plot(curves, title):
    """A line plot of loss against step, one line per named curve (an SVG document)."""
    w, h, left, right, top, bottom = 720, 420, 60, 150, 40, 50
    n = max(len(v) for v in curves.values())
    lo = min(min(v) for v in curves.values())
    hi = max(max(v) for v in curves.values())
    lo, hi = math.floor(lo), math.ceil(hi)
    def px(i): return left + (w - left - right) * i / max(1, n - 1)
    def py(v): return top + (h - top - bottom) * (hi - v) / max(1e-9, hi - lo)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for v in range(lo, hi + 1):
        y = py(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v}</text>')
    for s in range(0, n, max(1, (n // 6 // 50) * 50 or 50)):
        out.append(f'<text x="{px(s):.1f}" y="{h - bottom + 18}" text-anchor="middle">{s}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" '
               'text-anchor="middle">loss</text>')
    for k, (name, v) in enumerate(curves.items()):
        col = colors[k % len(colors)]
        pts = " ".join(f"{px(i):.1f},{py(x):.1f}" for i, x in enumerate(v))
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.2" stroke-opacity="0.8" points="{pts}"/>')
        y = top + 16 * k + 10
        out.append(f'<line x1="{w - right + 10}" y1="{y}" x2="{w - right + 30}" y2="{y}" stroke="{col}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 35}" y="{y + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--modes", default="torch,enable,ops,flce")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="llama_out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    c = Config()
    data = make_data(c, args.steps * c.batch, seed=1, device="cuda")
    runs = {}  # name -> (losses, times, counts)
    modes = args.modes.split(",")
    for mode in modes + (["torch fp32"] if "torch" in modes else []):
        # flce's chunk loop (a Python loop that sizes its chunks from free memory) runs eagerly.
        for compiled in ([False] if args.no_compile or mode in ("torch fp32", "flce") else [False, True]):
            name = mode + (" compiled" if compiled else "")
            runs[name] = train(mode.split()[0], compiled, args.steps, c, data,
                               bf16=mode != "torch fp32")
            print(f"{name:18s} final loss {runs[name][0][-1]:.4f}  median step "
                  f"{statistics.median(runs[name][1][10:]):.2f} ms", flush=True)
    ref = runs["torch"][0] if "torch" in runs else None
    rows = []
    for name, (losses, times, counts, peak) in runs.items():
        tail = losses[-50:]
        diff = max(abs(a - b) for a, b in zip(losses, ref)) if ref else float("nan")
        tail_diff = (statistics.mean(tail) - statistics.mean(ref[-50:])) if ref else float("nan")
        routed = sum(v["tessera"] for v in counts.values()) if counts else 0
        rows.append((name, statistics.median(times[10:]), losses[-1], statistics.mean(tail),
                     tail_diff, diff, routed, peak))
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "tessera": tessera.__version__, "steps": args.steps,
                   "date": time.strftime("%Y-%m-%d"),
                   "runs": {k: {"loss": v[0], "ms": v[1], "routing_counts": v[2], "peak_mib": v[3]}
                            for k, v in runs.items()}}, f)
    eager = {k: v[0] for k, v in runs.items() if "compiled" not in k}
    with open(os.path.join(args.out, "loss.svg"), "w") as f:
        f.write(svg_plot(eager, f"Llama-style decoder, {args.steps} steps, bf16 autocast "
                                f"({torch.cuda.get_device_name()})"))
    lines = ["| run | median step (ms) | peak memory (MiB) | final loss | mean loss, last 50 | "
             "vs torch, last 50 | largest step gap to torch | calls routed to tessera |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r[0]} | {r[1]:.2f} | {r[7]:.0f} | {r[2]:.4f} | {r[3]:.4f} | {r[4]:+.4f} | {r[5]:.4f} | {r[6]} |"
              for r in rows]
    table = "\n".join(lines)
    report = table + "\n"
    if args.profile:
        report += "\nCUDA kernels of 3 eager steps under tessera.enable():\n\n```\n"
        report += profile_steps(c, data) + "\n```\n"
        report += "\nThe same steps without tessera:\n\n```\n"
        report += profile_steps(c, data, routed=False) + "\n```\n"
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
