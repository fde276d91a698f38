"""The report half of benchmarks/llama_step.py, which imports it (it runs nothing itself): the
loss and gradient gaps to torch eager that count as a mismatch, --profile's kernel categories and
tables, the markdown table of the runs, a failed run's error line, and llama_step.svg.
"""
import html
import math
import re

import torch

# Beyond these gaps to torch eager a run is reported as computing something else. The loss at
# init (~ln(vocab), a float32 mean over batch * seq tokens) moves by ~1e-3 between bf16
# implementations, but hardly more for a wrong op (a wrong rope: ~1e-4), so the first layer's
# gradients are compared too (max over its parameters of |g - g_torch| / |g_torch|): ~1e-2
# between implementations, 0.2 to 0.9 for a wrong rope, mask or eps (measured at a small size).
LOSS_TOL, GRAD_TOL = 0.02, 0.1


# ---- GPU time per kernel category (--profile) ---------------------------------------------------

def _w(word):
    """`word` not inside a longer name: no letter or digit either side (an underscore may be:
    Inductor's kernel names join their ops with underscores)."""
    return rf"(?<![a-z0-9]){word}(?![a-z0-9])"


# Inductor's kernels that only move or cast data: triton_poi_fused__to_copy_clone_3 and the like.
_TRITON_COPY = (r"^triton_[a-z]+_fused(_+(to_copy|clone|unsafe_view|view|transpose|permute|t|"
                r"expand|zeros|zeros_like|new_zeros|full|fill|copy|empty|select|slice|split|"
                r"squeeze|unsqueeze|as_strided|lift_fresh))+_\d+$")

# GPU-time categories of --profile. A kernel's category is the first whose pattern its
# lower-cased name matches (re.search), so the order settles overlaps: attention before gemm (flash
# and CUTLASS-based attention kernels name cutlass types), loss before norm and rope (Inductor's
# loss kernels carry other ops' names), copy/fill after the pieces (Inductor's fused names include
# _to_copy). Names: tessera's (tessera::attn::sm90_bwd::..., attention_bwd_sm90_kernel,
# tessera::norm::norm_forward_kernel, gemm_sm90_kernel, rotary_kernel, map_contiguous_kernel<...
# SiluMul>, cross_entropy_kernel), torch's ATen kernels (at::native::...), cuBLAS (sm90_xmma_gemm_*,
# nvjet_*, cutlass*), cuDNN (cudnn_generated_fort_native_sdpa_sm90_flash_{fprop,bprop}_*), flash
# attention (flash_fwd_kernel, flash_bwd_*), memory-efficient attention (fmha_cutlass{F,B}_*) and
# Inductor's (triton_poi_fused_<ops>_N, triton_red_..., triton_per_..., triton_tem_... for its GEMM
# templates), whose <ops> name the ATen ops fused.
CATEGORIES = (
    ("attention bwd", r"attn::sm90_bwd|attention_(bwd|backward|dq|dkdv)|flash_bwd|fmha_cutlassb|"
                      r"fmha\w*(bwd|backward)|bprop|dot_do_o|convert_dq|efficient_attention_backward"),
    ("attention fwd", r"attention|attn::|flash_fwd|flash_attn|fmha|sdpa|fprop"),
    ("gemm", r"gemm|gemv|nvjet|cublas|cutlass|xmma|s16816|s1688|triton_tem_|tessera::matrix::|"
             r"skinny_kernel|splitk|" + _w("mm") + "|" + _w("addmm") + "|" + _w("bmm")),
    ("loss", r"cross_?entropy|nll_?loss|log_?softmax|logsoftmax|softmax(forward|backward)|"
             r"tessera::ce::|"
             r"tessera::(\(anonymous namespace\)::)?"
             r"(count|reduce|scale|factor|divisor|bias_grad)_kernel"),
    ("norm", r"rms_?norm|layer_?norm|layernorm|tessera::norm::|norm_(forward|backward)|gammabeta|"
             r"compute_?gi|cucomputegrad|rowwisemoments|meanops|" + _w("rsqrt") + "|" + _w("pow")
             + "|pow_tensor"),
    ("rope", r"rotary|rope|catarraybatchedcopy|slice_backward|" + _w("cat") + "|" + _w("neg")),
    ("swiglu", r"silu|swiglu|sigmoid"),
    ("embedding", r"embedding|indexselect|index_select|segment|compute_grad_weight|"
                  r"sum_and_scatter|radixsort|radix_sort|onesweep"),
    ("copy/fill", _TRITON_COPY + r"|^(?!triton_).*(memcpy|memset|copy|fillfunctor|fill_kernel)"),
    ("elementwise", r"elementwise|triton_(poi|red|per)_|map_(contiguous|strided)_kernel|"
                    r"add_rows_kernel|reduce_kernel|foreach|multi_tensor"),
)
# The tables' and the plot's order.
CATEGORY_NAMES = ("gemm", "attention fwd", "attention bwd", "norm", "rope", "swiglu", "loss",
                  "embedding", "elementwise", "copy/fill", "other")
assert set(CATEGORY_NAMES) == {n for n, _ in CATEGORIES} | {"other"}
_CATEGORY_RES = tuple((n, re.compile(pat)) for n, pat in CATEGORIES)


def category(kernel: str) -> str:
    """The CATEGORIES name of a CUDA kernel's name (or a memcpy/memset's), "other" if none."""
    name = kernel.lower()
    return next((n for n, pat in _CATEGORY_RES if pat.search(name)), "other")


def profile_step(step) -> list:
    """(name, ms, calls) of each CUDA kernel (and memcpy/memset) in one step, from torch.profiler,
    most time first."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [(e.key, getattr(e, "device_time_total", 0.0) / 1e3, e.count) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda r: -r[1])
    return rows


def kernel_lines(rows, top: int) -> list:
    """The `top` kernels of profile_step's rows as lines (ms, calls, name)."""
    return [f"  {ms:8.3f} ms {calls:4d}x  {name[:110]}" for name, ms, calls in rows[:top]]


def by_category(rows) -> dict:
    """GPU ms per category (every name of CATEGORY_NAMES, in order) of profile_step's rows."""
    ms = dict.fromkeys(CATEGORY_NAMES, 0.0)
    for k, t, _ in rows:
        ms[category(k)] += t
    return ms


def top_kernels(rows, n=15) -> str:
    """The n kernels of profile_step's rows that took the most time, each with its category, and
    the kernels left in "other" (the patterns to extend)."""
    lines = [f"GPU kernel time in the step: {sum(r[1] for r in rows):.2f} ms",
             f"{'kernel':90s} {'category':13s} {'ms':>9s} {'calls':>6s}"]
    lines += [f"{k[:90]:90s} {category(k):13s} {ms:9.3f} {cnt:6d}" for k, ms, cnt in rows[:n]]
    other = [r for r in rows if category(r[0]) == "other"]
    if other:
        lines.append(f"in 'other': {len(other)} kernel(s), {sum(r[1] for r in other):.3f} ms: " +
                     "; ".join(f"{k[:120]} ({ms:.3f} ms)" for k, ms, _ in other[:8]))
    return "\n".join(lines)


def category_table(profiles: dict, runs) -> str:
    """Markdown: GPU ms per category (rows) in one profiled step of each run (columns, in `runs`
    order, those profiled), and the total."""
    runs = [r for r in runs if r in profiles]
    cats = {r: profiles[r]["categories"] for r in runs}
    lines = ["| category | " + " | ".join(runs) + " |", "| --- |" + " ---: |" * len(runs)]
    for name in CATEGORY_NAMES:
        if all(cats[r][name] == 0 for r in runs):
            continue
        lines.append(f"| {name} | " + " | ".join(
            f"{cats[r][name]:.2f}" if cats[r][name] else "-" for r in runs) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(cats[r].values()):.2f}**" for r in runs) + " |")
    return "\n".join(lines)


# ---- the report ---------------------------------------------------------------------------------

def error_line(e) -> str:
    """What a failed run's row says: the root cause's type and first line (torch.compile wraps
    an op's error in its own, whose message ends in advice on its settings)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [l for l in str(e).splitlines() if l.strip()] or [""]
    return f"{type(e).__name__}: {lines[0].strip()}"[:200]


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


# ---- llama_step.svg -----------------------------------------------------------------------------

# The palette and look of tessera's own plots (harness/bench/svg.cpp): hand-written SVG, no
# plotting dependency. That writer draws throughput against size per (op, dtype); these are bars.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")


def _nice_step(top: float, target: int = 5) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving about `target` intervals up to top."""
    raw = top / target
    mag = 10 ** math.floor(math.log10(raw))
    norm = raw / mag
    return (1 if norm <= 1 else 2 if norm <= 2 else 5 if norm <= 5 else 10) * mag


def svg_bars(title: str, panels) -> str:
    """One SVG of horizontal bar panels, one under the other. panels: (heading, unit, bars,
    legend) with bars a list of (label, segments), segments a list of (value, colour, tooltip)
    stacked left to right (an empty list: no bar, the label says why), legend a list of (name,
    colour) or None."""
    width, left, right, bar_h, gap = 820, 170, 720, 18, 8
    esc = lambda t: html.escape(str(t), quote=True)
    out, y = [], 50.0
    out.append(f'<text x="{width / 2:.0f}" y="28" text-anchor="middle" font-size="16" '
               f'font-weight="bold">{esc(title)}</text>')
    for heading, unit, bars, legend in panels:
        top = max((sum(v for v, _, _ in segs) for _, segs in bars), default=0.0) or 1.0
        step = _nice_step(top * 1.05)
        ticks = math.ceil(top * 1.05 / step)
        x_top = ticks * step
        px = lambda v: left + v / x_top * (right - left)
        out.append(f'<text x="{left}" y="{y + 14:.0f}" font-size="13" font-weight="bold">'
                   f'{esc(heading)} ({esc(unit)})</text>')
        y0 = y + 24
        y1 = y0 + len(bars) * (bar_h + gap)
        out.append('<g stroke="#e0e0e0" stroke-width="1">')
        out += [f'<line x1="{px(i * step):.2f}" y1="{y0:.0f}" x2="{px(i * step):.2f}" y2="{y1:.0f}"/>'
                for i in range(1, ticks + 1)]
        out.append("</g>")
        out.append(f'<line x1="{left}" y1="{y0:.0f}" x2="{left}" y2="{y1:.0f}" stroke="black"/>')
        for i in range(ticks + 1):
            out.append(f'<text x="{px(i * step):.2f}" y="{y1 + 14:.0f}" text-anchor="middle" '
                       f'fill="#555555">{i * step:g}</text>')
        for j, (label, segs) in enumerate(bars):
            by = y0 + j * (bar_h + gap) + gap / 2
            out.append(f'<text x="{left - 8}" y="{by + bar_h - 4:.1f}" text-anchor="end">'
                       f'{esc(label)}</text>')
            x = 0.0
            for v, colour, tip in segs:
                out.append(f'<rect x="{px(x):.2f}" y="{by:.1f}" width="{max(px(x + v) - px(x), 0):.2f}" '
                           f'height="{bar_h}" fill="{colour}"><title>{esc(tip)}</title></rect>')
                x += v
            text = f"{x:.2f}" if segs else "failed"
            out.append(f'<text x="{px(x) + 6:.2f}" y="{by + bar_h - 4:.1f}">{text}</text>')
        y = y1 + 24
        if legend:
            y += 12
            per_row = 5
            for k, (name, colour) in enumerate(legend):
                lx, ly = left + (k % per_row) * 110, y + (k // per_row) * 18
                out.append(f'<rect x="{lx}" y="{ly - 10:.0f}" width="12" height="12" fill="{colour}"/>'
                           f'<text x="{lx + 16}" y="{ly:.0f}">{esc(name)}</text>')
            y += (len(legend) + per_row - 1) // per_row * 18 + 6
        y += 16
    height = int(y + 10)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">\n'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>')
    return "\n".join([head, *out, "</svg>"]) + "\n"


def step_svg(title: str, runs, results, errors, profiles) -> str:
    """llama_step.svg: step time and peak memory per run; with profiles, each profiled run's GPU
    time per category, stacked."""
    colour = {run: COLORS[i % len(COLORS)] for i, run in enumerate(runs)}

    def bars(key, unit):
        return [(run, [] if run not in results else
                 [(results[run][key], colour[run], f"{run}: {results[run][key]:.2f} {unit}")])
                for run in runs if run in results or run in errors]

    panels = [("step time, median", "ms", bars("ms", "ms"), None),
              ("peak memory", "GiB", bars("peak", "GiB"), None)]
    cats = {run: profiles[run]["categories"] for run in runs
            if "categories" in profiles.get(run, {})}
    if cats:
        names = [n for n in CATEGORY_NAMES if any(c[n] for c in cats.values())]
        cc = {n: COLORS[i % len(COLORS)] if n != "other" else "#bbbbbb" for i, n in enumerate(names)}
        panels.append(("GPU time by category, one profiled step", "ms",
                       [(run, [(c[n], cc[n], f"{run}, {n}: {c[n]:.2f} ms") for n in names if c[n]])
                        for run, c in cats.items()], [(n, cc[n]) for n in names]))
    return svg_bars(title, panels)
