"""What every benchmark script shares: sizes, the timing method per size, the correctness gate,
and the report (table, CSV, JSON, SVGs, ratio table).

The method is the same for every provider in a run: tessera.bench.do_bench (the engine of the
`tessera` command) with CUDA events per repetition; sizes up to GRAPH_MAX are timed as CUDA graphs
of GRAPH_BATCH calls without L2 flush (they are launch-bound otherwise), larger sizes with the L2
flushed before each repetition.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import tessera
from tessera.bench import Report, do_bench

GRAPH_MAX = 1 << 16
GRAPH_BATCH = 20

# allclose tolerances against the reference provider, by dtype. Half types: both sides compute in
# float32 and round, so they may differ by an ulp (2^-8 relative for bf16), and a fast tanh can
# move the far negative tail of GELU (values near 0) by a few 1e-4.
TOLERANCES = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_args(description: str, full_sizes, quick_sizes):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help=f"fewer sizes: {fmt_sizes(quick_sizes)}")
    p.add_argument("--out", default="report", type=Path,
                   help="directory for the CSV, JSON and SVG files (default: ./report)")
    args = p.parse_args()
    args.sizes = list(quick_sizes if args.quick else full_sizes)
    return args


def fmt_size(n: int) -> str:
    k = int(math.log2(n)) if n > 0 else 0
    return f"2^{k}" if n == 1 << k else str(n)


def fmt_sizes(sizes) -> str:
    return ", ".join(fmt_size(n) for n in sizes)


def timing_for(size: int) -> dict:
    if size <= GRAPH_MAX:
        return dict(cuda_graph=True, graph_batch=GRAPH_BATCH, flush_l2=False)
    return dict(cuda_graph=False, flush_l2=True)


class Suite:
    """One benchmark run: measured peaks, rows for every (op, provider, size), notes."""

    def __init__(self, title: str):
        if not torch.cuda.is_available() or not tessera.is_available():
            sys.exit(f"{title}: needs a CUDA GPU ({tessera.no_gpu_reason() or 'torch sees none'})")
        self.title = title
        self.report = Report()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        print(f"{title} on {props.name}: torch {torch.__version__}, tessera {tessera.__version__}",
              flush=True)
        print("measuring peaks (1 GiB device-to-device copy, cuBLAS bf16 GEMM 8192^3) ...", flush=True)
        self.peaks = tessera.bench.peaks()
        self.report.set_peaks(self.peaks)
        print(f"  copy {self.peaks['copy_gbps']:.0f} GB/s, bf16 GEMM {self.peaks['bf16_tflops']:.0f} "
              "TFLOP/s", flush=True)
        self.note(f"timing: tessera.bench.do_bench for every provider; sizes <= {fmt_size(GRAPH_MAX)} "
                  f"as CUDA graphs of {GRAPH_BATCH} calls (no L2 flush, time per call), larger "
                  "sizes with the L2 flushed before each repetition; median of >= 25 repetitions")

    def note(self, text: str) -> None:
        self.report.note(text)

    def run(self, op: str, dtype, size: int, bytes_moved: float, providers: dict, *,
            reference: str = "torch", stream=None, flops: float = 0.0) -> None:
        """Checks every provider's output against the reference's, then times each one.

        providers: name -> callable without arguments returning its output tensor (it should
        write to a preallocated output where the provider has out=). With `stream`, every call
        runs on it (and graphs are captured on it)."""
        ctx = torch.cuda.stream(stream) if stream is not None else _nullcontext()
        with ctx:
            outputs = {name: fn() for name, fn in providers.items()}
        torch.cuda.synchronize()
        ref = outputs[reference]
        for name, out in outputs.items():
            if name != reference:
                check(op, name, reference, dtype, size, out, ref)
        del outputs, ref

        method = timing_for(size)
        try:
            results = self._time_all(op, dtype, size, providers, stream, method)
        except Exception as e:  # noqa: BLE001 - a capture that fails must not lose the run
            if not method.get("cuda_graph"):
                raise
            torch.cuda.synchronize()
            msg = (f"{op} {dtype_name(dtype)} {fmt_size(size)}: CUDA graph capture failed "
                   f"({type(e).__name__}: {e}); every provider at this size timed without a graph, "
                   "L2 flushed")
            print(f"  WARNING: {msg}", flush=True)
            self.note(msg)
            results = self._time_all(op, dtype, size, providers, stream,
                                     dict(cuda_graph=False, flush_l2=True))
        for name, stats in results.items():
            self.report.add(op, name, dtype, (size,), size, bytes_moved, flops, stats)

    @staticmethod
    def _time_all(op, dtype, size, providers, stream, method) -> dict:
        results = {}
        for name, fn in providers.items():
            print(f"  {op:<20} {dtype_name(dtype):<9} {fmt_size(size):>5}  {name}", flush=True)
            results[name] = do_bench(fn, stream=stream, **method)
        return results

    def finish(self, out_dir: Path, ours: str = "tessera", baseline: str = "torch") -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        print()
        print(self.report.table())
        self.report.write_csv(out_dir / "bench.csv")
        self.report.write_json(out_dir / "bench.json")
        svgs = self.report.write_svgs(out_dir)
        print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'} and {len(svgs)} SVGs in {out_dir}")
        print()
        print(ratio_table(self.report, ours, baseline))


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check(op, name, reference, dtype, size, out, ref) -> None:
    tol = TOLERANCES[dtype]
    if out.shape == ref.shape and torch.allclose(out.float(), ref.float(), **tol):
        return
    diff = (out.float() - ref.float()).abs() if out.shape == ref.shape else None
    detail = (f"max |diff| {diff.max().item():.3g} at index {diff.argmax().item()}"
              if diff is not None else f"shape {tuple(out.shape)} vs {tuple(ref.shape)}")
    sys.exit(f"\nMISMATCH: {op} {dtype_name(dtype)} size {size}: {name} differs from {reference} "
             f"beyond rtol={tol['rtol']}, atol={tol['atol']} ({detail}). Not timing a wrong result.")


def ratio_table(report: Report, ours: str = "tessera", baseline: str = "torch") -> str:
    """op, dtype, size, our GB/s, baseline GB/s, ratio, our % of the measured copy bandwidth."""
    rows = report.rows()
    copy = (report.peaks or {}).get("copy_gbps") or 0.0
    by_key = {(r["op"], r["dtype"], r["size"], r["provider"]): r for r in rows}
    header = ["op", "dtype", "size", f"{ours} GB/s", f"{baseline} GB/s", f"{ours}/{baseline}",
              "% of copy"]
    lines = []
    seen = set()
    for r in rows:
        key = (r["op"], r["dtype"], r["size"])
        if key in seen or (*key, ours) not in by_key or (*key, baseline) not in by_key:
            continue
        seen.add(key)
        a, b = by_key[(*key, ours)]["gbps"], by_key[(*key, baseline)]["gbps"]
        lines.append([key[0], key[1], fmt_size(key[2]), f"{a:.0f}", f"{b:.0f}",
                      f"{a / b:.2f}" if b > 0 else "-", f"{100 * a / copy:.1f}" if copy else "-"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [fmt(l) for l in lines]
    return "\n".join(out)
