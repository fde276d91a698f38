#!/usr/bin/env python3
"""The headline figure of each operator, read from a benchmark report: one row per operator of
README.md's table (in its order) with the headline case, tessera's time, the best peer's name and
time, their ratio, and tessera's rate (% of the copy rate, or TFLOP/s) where the report gives it.

    python3 scripts/headline.py [REPORT] [--write]
    python3 scripts/headline.py --commands

REPORT (default report): the directory scripts/main.sh writes, one folder per benchmark
(report/<name>/, each benchmark's --out). --write also writes the table to REPORT/headline.md.
--commands prints, one a line, "NAME SCRIPT ARGS...": the benchmark runs that measure every
headline case (each into REPORT/NAME: `python3 SCRIPT --out REPORT/NAME ARGS...`), so that a job
can run just those. A case the report lacks gets a row saying what is missing (the runs that
measure the cases are listed below the table); the exit status is 0 either way (2 for bad
arguments).

What is read is a table, not code per op: RUNS (the command that writes each report folder with
the headline cases in it: the benchmark's quick mode where that holds the case, else only the
ops and dtypes of the cases), HEADLINES (per operator: the report file, the row or rows that are
its case, the peers that compete; `meta` must match the file's meta where the case depends on it)
and FORMATS (how each kind of report file gives providers, times and rates):
  - bench: bench.json of Suite.finish (benchmarks/common.py) and `tessera bench --out`: a row per
    (op, dtype, shape, provider), median_ms, pct_copy, tflops;
  - llama_ops: llama_ops.json: a row per op, each provider's GPU time (us: its kernels' time
    from torch.profiler, "gpu_<provider>"; the wall time, "<provider>", is mostly the host's at
    these sizes), of_copy (a fraction, from GPU time) or tflops (from wall time);
  - per_provider: cross_entropy.json: a row per provider (provider, ms), the case in meta;
  - attention: attention.json: a row per case (b, h, s, d, causal), each provider's TFLOP/s in
    "<provider>_tflops" (times from attention.py's FLOPs: 4 b h s^2 d, half under the causal
    mask).
Ratio: the best peer's time over tessera's (> 1: tessera is faster); the best peer is the fastest
of the entry's peers that the report has for the case. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Report folder -> (script, arguments after --out): the runs that hold every headline case, at the
# sizes the table cites and no others (the benchmarks' --quick forms where those are the case
# alone): what the main job spends its minutes on.
RUNS = {
    "elementwise": ("benchmarks/elementwise.py", "--ops add,gelu,silu,copy --dtypes bfloat16 --sizes 2^24"),
    "dropout": ("benchmarks/dropout.py", "--ops dropout --dtypes bfloat16 --sizes 2^24"),
    "rowwise": ("benchmarks/rowwise.py", "--ops softmax,layer_norm --dtypes bfloat16 --sizes 4096"),
    "set": ("benchmarks/set.py", "--quick --dtypes int32 --no-crossover"),
    "matrix": ("benchmarks/matrix.py", "--sizes 8192 --dtypes bfloat16 --narrow --rounds 3"),
    "llama_ops": ("benchmarks/llama_ops.py",
                  "--ops rms_norm,add_rms_norm,rotary,silu_mul,geglu,mlp,linear_ce --rounds 3"),
    "attention": ("benchmarks/attention.py", "--quick --dims 128 --rounds 3"),
    "cross_entropy": ("benchmarks/cross_entropy.py", "--rounds 2"),
}


def _attention_flops(r: dict) -> float:
    return 4.0 * r["b"] * r["h"] * r["s"] ** 2 * r["d"] * (0.5 if r["causal"] else 1.0)


FORMATS = {
    "bench": dict(per="provider", time="median_ms", scale_us=1e3, copy=("pct_copy", 1.0),
                  tflops="tflops"),
    "llama_ops": dict(per="case", time="gpu_{p}", scale_us=1.0, copy=("of_copy", 100.0),
                      tflops="tflops"),
    "per_provider": dict(per="provider", time="ms", scale_us=1e3),
    "attention": dict(per="case", tflops="{p}_tflops", flops=_attention_flops),
}

# The Llama step's model (benchmarks/llama_step.py FULL): llama_ops runs the small one on a GPU
# under 60 GiB, whose cases are not these.
LLAMA = {"model": {"batch": 2, "seq": 4096, "dim": 2048, "ffn": 5632, "vocab": 128256}}
LLAMA_PEERS = ("compile", "liger")


@dataclass
class Headline:
    op: str          # the first cell of README.md's row
    report: str      # the file, relative to REPORT; its first folder is a key of RUNS
    fmt: str         # a key of FORMATS
    case: str        # what the table says the case is
    where: dict      # the fields that select the case's row(s)
    peers: tuple     # the providers that compete with tessera
    rate: str = ""   # "copy", "tflops" or "" (none shown)
    meta: dict = field(default_factory=dict)  # what the file's meta must hold (a subset)


_EW = "elementwise/bench.json"
_LO = "llama_ops/llama_ops.json"
_FB = "fwd+bwd (GPU time), bf16, Llama step: "
HEADLINES = [
    Headline("`add`", _EW, "bench", "bfloat16, 2^24",
             dict(op="add", dtype="bfloat16", shape=[1 << 24]), ("torch", "triton"), "copy"),
    Headline("`gelu`", _EW, "bench", "bfloat16, 2^24",
             dict(op="gelu", dtype="bfloat16", shape=[1 << 24]), ("torch", "torch.compile"), "copy"),
    Headline("`silu`", _EW, "bench", "bfloat16, 2^24",
             dict(op="silu", dtype="bfloat16", shape=[1 << 24]), ("torch", "torch.compile"), "copy"),
    Headline("`silu_mul`, `geglu`", _LO, "llama_ops", "silu_mul, " + _FB + "8192 x 5632",
             dict(op="silu_mul"), LLAMA_PEERS, "copy", LLAMA),
    Headline("`dropout`", "dropout/bench.json", "bench", "bfloat16, 2^24, p=0.1",
             dict(op="dropout[p=0.1]", dtype="bfloat16", shape=[1 << 24]), ("torch",), "copy"),
    Headline("`softmax`, `log_softmax`", "rowwise/bench.json", "bench", "softmax, bfloat16, 4096 x 4096",
             dict(op="softmax", dtype="bfloat16", shape=[4096, 4096]),
             ("torch", "triton", "torch.compile"), "copy"),
    Headline("`layer_norm`", "rowwise/bench.json", "bench", "bfloat16, 4096 x 4096",
             dict(op="layer_norm", dtype="bfloat16", shape=[4096, 4096]), ("torch", "torch.compile"),
             "copy"),
    Headline("`rms_norm`", _LO, "llama_ops", _FB + "8192 x 2048",
             dict(op="rms_norm"), LLAMA_PEERS, "copy", LLAMA),
    Headline("`add_rms_norm`, `add_layer_norm`", _LO, "llama_ops", "add_rms_norm, " + _FB + "8192 x 2048",
             dict(op="add_rms_norm"), LLAMA_PEERS, "copy", LLAMA),
    Headline("`copy`", _EW, "bench", "bfloat16, 4096 x 4096, transposed to contiguous",
             dict(op="copy", dtype="bfloat16", shape=[4096, 4096]), ("torch", "torch.compile"), "copy"),
    Headline("`isin`", "set/bench.json", "bench", "int32, 2^20 x 2^20",
             dict(op="isin", dtype="int32", shape=[1 << 20, 1 << 20]), ("torch",)),
    Headline("`matmul`, `linear`", "matrix/bench.json", "bench", "bfloat16, 8192 x 8192 x 8192",
             dict(op="matmul", dtype="bfloat16", shape=[8192, 8192, 8192]), ("torch",), "tflops"),
    Headline("`mlp`", _LO, "llama_ops", "SwiGLU, " + _FB + "8192 x 2048 -> 5632 -> 2048",
             dict(op="mlp"), ("compile",), "tflops", LLAMA),
    Headline("`scaled_mm`", "matrix/bench.json", "bench", "float8_e4m3fn, 8192 x 8192 x 8192",
             dict(op="scaled_mm", dtype="float8_e4m3fn", shape=[8192, 8192, 8192]), ("torch",),
             "tflops"),
    Headline("attention", "attention/attention.json", "attention",
             "forward, causal, bf16, 4 x 32 heads x 4096, head_dim 128",
             dict(b=4, h=32, s=4096, d=128, causal=True), ("cudnn", "flash2", "efficient"), "tflops"),
    Headline("`rotary_embedding`", _LO, "llama_ops", _FB + "8192 tokens, 16 + 4 heads of 128",
             dict(op="rotary"), LLAMA_PEERS, "copy", LLAMA),
    Headline("`cross_entropy`", "cross_entropy/cross_entropy.json", "per_provider",
             "fwd+bwd, bf16, 8192 x 128256", {}, ("torch", "torch_bf16", "compile", "liger"), "",
             {"rows": 8192, "vocab": 128256}),
    Headline("`linear_cross_entropy`", _LO, "llama_ops", _FB + "8192 x 2048 -> 128256",
             dict(op="linear_ce"), LLAMA_PEERS, "tflops", LLAMA),
]

OURS = "tessera"


class Missing(Exception):
    """Why a headline case cannot be read from the report."""


def run_of(h: Headline) -> str:
    return h.report.split("/", 1)[0]


def load(path: Path, cache: dict):
    if path not in cache:
        try:
            cache[path] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            cache[path] = Missing("missing")
        except (OSError, ValueError) as e:
            cache[path] = Missing(f"unreadable ({type(e).__name__}: {e})")
    doc = cache[path]
    if isinstance(doc, Missing):
        raise Missing(f"{path} {doc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise Missing(f"{path} has no rows")
    return doc


def _norm(key, value):
    """Report values as the table gives them: bench.json's shapes "[4096, 4096]" as lists."""
    if key == "shape" and isinstance(value, str):
        try:
            return [int(x) for x in value.strip("[]").split(",") if x.strip()]
        except ValueError:
            return value
    return value


def _subset(want, have) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _subset(v, have[k]) for k, v in want.items())
    return want == have


def _describe(where: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in where.items()) or "its case"


def read(h: Headline, root: Path, cache: dict) -> dict:
    """{provider: time in us} of the case and tessera's rate text; raises Missing."""
    path = root / h.report
    doc = load(path, cache)
    if h.meta and not _subset(h.meta, doc.get("meta")):
        raise Missing(f"{path} measured another case (its meta is not {h.meta})")
    form = FORMATS[h.fmt]
    rows = [r for r in doc["rows"] if isinstance(r, dict)
            and all(_norm(k, r.get(k)) == v for k, v in h.where.items())]
    if not rows:
        raise Missing(f"no {_describe(h.where)} in {path}")
    times, rate = {}, ""
    if form["per"] == "provider":
        by = {r.get("provider"): r for r in rows}
        for p, r in by.items():
            t = r.get(form["time"])
            if isinstance(t, (int, float)) and t > 0:
                times[p] = t * form["scale_us"]
        ours = by.get(OURS, {})
    else:
        ours = rows[0]
        for p in (OURS, *h.peers):
            if "time" in form:
                t = ours.get(form["time"].format(p=p))
                if isinstance(t, (int, float)) and t > 0:
                    times[p] = t * form["scale_us"]
            else:
                tf = ours.get(form["tflops"].format(p=p))
                if isinstance(tf, (int, float)) and tf > 0:
                    times[p] = form["flops"](ours) / (tf * 1e6)
    if OURS not in times:
        raise Missing(f"no {OURS} time for {_describe(h.where)} in {path}")
    if h.rate == "copy" and "copy" in form:
        key, scale = form["copy"]
        if isinstance(ours.get(key), (int, float)):
            rate = f"{ours[key] * scale:.1f}% of copy"
    elif h.rate == "tflops" and "tflops" in form:
        tf = ours.get(form["tflops"].format(p=OURS))
        if isinstance(tf, (int, float)):
            rate = f"{tf:.0f} TFLOP/s"
    return {"times": times, "rate": rate, "gpu": gpu_of(doc)}


def gpu_of(doc: dict) -> str:
    meta, peaks = doc.get("meta"), doc.get("peaks")
    if isinstance(meta, dict) and meta.get("gpu"):
        return str(meta["gpu"])
    if isinstance(peaks, dict) and peaks.get("gpu"):
        return str(peaks["gpu"])
    return ""


def fmt_us(us: float) -> str:
    """As scripts/perf_tables.py writes times: 2 decimals under 10 us, 1 under 1000, none above."""
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def command(name: str, root) -> str:
    script, args = RUNS[name]
    return f"python3 {script} --out {root}/{name} {args}"


def table(root: Path) -> tuple:
    """(the markdown table, the GPUs of the reports read)."""
    cache: dict = {}
    gpus: dict = {}
    lines = ["| op | headline case | tessera (us) | best peer | peer (us) | peer / tessera | tessera rate | from |",
             "| --- | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for h in HEADLINES:
        try:
            got = read(h, root, cache)
        except Missing as why:
            lines.append(f"| {h.op} | {h.case} | not measured ({why}) | - | - | - | - | {h.report} |")
            continue
        if got["gpu"]:
            gpus.setdefault(got["gpu"], []).append(h.op)
        times = got["times"]
        ours = times[OURS]
        peers = {p: t for p, t in times.items() if p in h.peers}
        rate = got["rate"] or "-"
        if not peers:
            lines.append(f"| {h.op} | {h.case} | {fmt_us(ours)} | no peer measured "
                         f"(of {', '.join(h.peers)}) | - | - | {rate} | {h.report} |")
            continue
        best = min(peers, key=peers.get)
        lines.append(f"| {h.op} | {h.case} | {fmt_us(ours)} | {best} | {fmt_us(peers[best])} | "
                     f"{peers[best] / ours:.2f}x | {rate} | {h.report} |")
    return "\n".join(lines), gpus


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", nargs="?", default="report", help="the report directory (default: report)")
    ap.add_argument("--write", action="store_true", help="also write the table to REPORT/headline.md")
    ap.add_argument("--commands", action="store_true",
                    help="print the runs that measure the headline cases (NAME SCRIPT ARGS...) and exit")
    args = ap.parse_args(argv)
    if args.commands:
        for name, (script, extra) in RUNS.items():
            print(name, script, extra)
        return 0
    root = Path(args.report)
    text, gpus = table(root)
    if len(gpus) == 1:
        where = f"measured on {next(iter(gpus))}"
    elif gpus:
        where = "measured on different GPUs: " + "; ".join(f"{g} ({', '.join(ops)})" for g, ops in gpus.items())
    else:
        where = "nothing measured"
    head = (f"Headline figures from {root}/ ({where}): tessera against the fastest of the peers "
            "listed in scripts/headline.py; peer / tessera > 1: tessera is faster.")
    print(head)
    print()
    print(text)
    runs = "Measured by (from the repository root):\n\n" + "\n".join(
        f"    {command(name, root)}" for name in dict.fromkeys(run_of(h) for h in HEADLINES))
    print()
    print(runs)
    if args.write:
        out = root / "headline.md"
        try:
            root.mkdir(parents=True, exist_ok=True)
            out.write_text(f"# Headline figures\n\n{head}\n\n{text}\n\n{runs}\n", encoding="utf-8")
        except OSError as e:
            print(f"\ncould not write {out}: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
