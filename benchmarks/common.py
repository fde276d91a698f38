"""What every benchmark script shares: which ops, dtypes and sizes to run (from the operators'
descriptions, tessera.bench.ops: shapes, bytes, FLOPs and dtypes are never restated here), the
timing method per size, the correctness gate, and the report (table, CSV, JSON, SVGs, ratio table).

The method is the same for every provider in a run: tessera.bench.do_bench (the engine of the
`tessera` command) with CUDA events per repetition; sizes up to GRAPH_MAX are timed as CUDA graphs
of GRAPH_BATCH calls without L2 flush (they are launch-bound otherwise), larger sizes with the L2
flushed before each repetition.

Row-wise benchmarks pass a 2-D `shape` to Suite.run (the report shows it; `size` stays the element
count, which picks the timing method and is the x axis of the plots), their own tolerances, and
ask Suite.finish for a last table against the best peer of each row (best_peer_table).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

import tessera
from tessera.bench import Report, do_bench

GRAPH_MAX = 1 << 16
GRAPH_BATCH = 20

# Where the benchmarks allocate their tensors.
DEVICE = "cuda"

# The line above the last table a benchmark prints (dev/device.sh prints from it to the end).
FINAL_TABLE_MARK = "==== final table"

# allclose tolerances against the reference provider, by dtype. Half types: both sides compute in
# float32 and round, so they may differ by an ulp (2^-8 relative for bf16), and a fast tanh can
# move the far negative tail of GELU (values near 0) by a few 1e-4.
TOLERANCES = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


try:
    from triton.testing import do_bench as _triton_do_bench
except ImportError:  # pragma: no cover - triton is optional
    _triton_do_bench = None


def bench_ms(fn) -> float:
    """Milliseconds per call of fn as a user times it: triton's do_bench (L2 flushed before each
    call, median) where triton is installed, tessera.bench.do_bench with the same settings
    otherwise."""
    if _triton_do_bench is not None:
        return float(_triton_do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return tessera.bench.do_bench(fn, warmup_ms=25, budget_ms=100, flush_l2=True)["median_ms"]


def timer_name() -> str:
    """What bench_ms times with, for the reports."""
    return "triton.testing.do_bench" if _triton_do_bench is not None else "tessera.bench.do_bench"


def peak_gib(call) -> float:
    """The peak of the memory torch's allocator holds over one call of ``call``, above what it held
    before (what the call returns included), GiB."""
    import torch
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def interleaved_ms(calls: dict, rounds: int) -> dict:
    """{provider: median bench_ms over `rounds` rounds}, the providers timed in turn within each
    round: GPU clocks drift between rounds more than within one."""
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            times[k].append(bench_ms(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def kernel_ms(fn, reps: int = 20) -> dict:
    """{kernel name: GPU ms per call of fn}, from torch.profiler over ``reps`` calls (after one
    outside it), L2 flushed before each as bench_ms does (the flush's fill kernels left out): the
    kernels' own time, which host launch gaps do not enter, for ops small enough that a wall-clock
    timer sees the host."""
    import torch
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.fill_(0)
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us > 0 and e.device_type == torch.autograd.DeviceType.CUDA and "FillFunctor" not in e.key:
            out[e.key] = us / 1e3 / reps
    return out


def step_ms(step, steps: int):
    """Times `steps` calls of step(): CUDA events around each, no sync inside the loop (the host
    runs ahead, as in training, and each interval is the GPU's time for one step, host launch gaps
    included). Returns (the median ms, the first call's result)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    results = []
    for start, end in events:
        start.record()
        results.append(step())
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), results[0]


def write_results(out_dir, name: str, meta: dict, rows: list, table: str) -> None:
    """`name`.json (meta: GPU, versions, date, plus `meta`; the rows) and `name`.md (the table) in
    out_dir, created if needed."""
    import json
    import os
    import time
    os.makedirs(out_dir, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "tessera": tessera.__version__, "date": time.strftime("%Y-%m-%d"), **meta}
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(table + "\n")


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---- what to run: the ops' descriptions ---------------------------------------------------------

DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def add_selection_args(p: argparse.ArgumentParser, own_ops, dtypes: str = "float32,bfloat16"):
    """--ops, --dtypes, --quick and --list-ops, for a script that benchmarks `own_ops`."""
    p.add_argument("--ops", default="all",
                   help="comma-separated op names as `tessera bench` takes them, a name also "
                        f"selecting its variants (default: all of {', '.join(own_ops)}); names of "
                        "ops benchmarked elsewhere are accepted and skipped")
    p.add_argument("--dtypes", default=dtypes,
                   help=f"comma-separated dtypes (default {dtypes}; fp32, fp16, bf16 too), each "
                        "op running those its description supports")
    p.add_argument("--quick", action="store_true",
                   help="three of each op's sizes: its smallest, a middle one and its largest")
    p.add_argument("--sizes", type=parse_sizes, default=None,
                   help="comma-separated sizes as the ops' descriptions count them (4096, 2^24, "
                        "16M, 4k): each op runs those of its bench sizes that are listed")
    p.add_argument("--list-ops", action="store_true",
                   help="print the ops this run would benchmark and exit (needs no GPU)")


def resolve_selection(p: argparse.ArgumentParser, args, own_ops) -> None:
    """Turns args.ops into the list of `own_ops` selected and args.dtypes into torch dtypes;
    --list-ops prints the ops and exits; a selection with none of `own_ops` exits (status 0)."""
    if args.ops.strip() == "all":
        ops = list(own_ops)
    else:
        try:
            chosen = {o.name for o in tessera.bench.ops(args.ops)}
        except ValueError as e:
            p.error(f"--ops: {e}")
        ops = [o for o in own_ops if o in chosen]
    names = [DTYPE_ALIASES.get(t.strip(), t.strip()) for t in args.dtypes.split(",") if t.strip()]
    unknown = [t for t in names if t not in tessera._C.DTYPES or not hasattr(torch, t)]
    if unknown or not names:
        p.error(f"--dtypes: expected tessera dtype names ({', '.join(tessera._C.DTYPES)}), got "
                f"{args.dtypes!r}")
    args.dtypes = [getattr(torch, t) for t in dict.fromkeys(names)]
    if args.list_ops:
        print(" ".join(ops))
        sys.exit(0)
    if not ops:
        print(f"{p.prog}: none of --ops {args.ops} is benchmarked here ({', '.join(own_ops)})")
        sys.exit(0)
    args.ops = ops


def describe(op: str):
    """The description of `op` (tessera.bench.op)."""
    return tessera.bench.op(op)


def dtypes_of(desc, dtypes) -> list:
    """The dtypes of `dtypes` (torch dtypes) that the op's description supports."""
    return [d for d in dtypes if dtype_name(d) in desc.dtypes]


def parse_sizes(text: str) -> list:
    """"4096,2^24,16M,4k" -> [4096, 16777216, 16777216, 4096] (k and M: powers of two)."""
    sizes = []
    for item in text.split(","):
        t = item.strip()
        m = re.fullmatch(r"(\d+)\^(\d+)|(\d+)([kKM]?)", t)
        if not m:
            raise argparse.ArgumentTypeError(f"expected sizes such as 4096, 2^24, 16M or 4k, got {t!r}")
        if m.group(1):
            sizes.append(int(m.group(1)) ** int(m.group(2)))
        else:
            sizes.append(int(m.group(3)) << {"": 0, "k": 10, "K": 10, "M": 20}[m.group(4)])
    return sizes


def sizes_of(desc, quick: bool, only=None) -> list:
    """The op's bench sizes (its description's); with quick, the smallest, a middle one and the
    largest; with `only` (--sizes), those of them that `only` lists."""
    sizes = sorted(desc.bench_sizes)
    if only is not None:
        return [n for n in sizes if n in set(only)]
    if quick and len(sizes) > 3:
        sizes = [sizes[0], sizes[len(sizes) // 2], sizes[-1]]
    return sizes


def case(desc, dtype, size: int):
    """The op's bench case at (dtype, size): shapes of its inputs (main tensor first), the report's
    label, the bytes it must move and the FLOPs it must do."""
    return desc.bench_shape(dtype_name(dtype), int(size))


def fmt_size(n: int) -> str:
    k = int(math.log2(n)) if n > 0 else 0
    return f"2^{k}" if n == 1 << k else str(n)


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
        self.failures: list[str] = []  # "what: why" for every case attempt() saw fail
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

    stop_on_failure = False  # attempt() lets a failure end the run, as Suite.run alone does

    def attempt(self, what: str, fn) -> bool:
        """Runs one benchmark case, fn(). A mismatch (check exits) or an exception is printed and
        recorded, and the run goes on with the next case; finish() lists the failures and
        returns their count. With stop_on_failure, it ends the run instead."""
        try:
            fn()
            return True
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one case must not lose the run
            if self.stop_on_failure:
                raise
            why = str(e).strip() if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
            if not isinstance(e, SystemExit):
                traceback.print_exc()
            print(f"  FAILED {what}: {why}", flush=True)
            self.failures.append(f"{what}: {why}")
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a broken context: the next cases will say so
                pass
            return False

    def optional(self, providers: dict, name: str, fn, what: str) -> None:
        """Adds provider `name` after one trial call (which also compiles it, outside the
        timing); if that call raises, the provider is left out with a warning and a note."""
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is left out, not fatal
            first = (str(e).splitlines() or [""])[0][:200]
            msg = f"{what}: {name} left out ({type(e).__name__}: {first})"
            print(f"  WARNING: {msg}", flush=True)
            self.note(msg)
            return
        providers[name] = fn

    def run(self, op: str, dtype, size: int, bytes_moved: float, providers: dict, *,
            reference: str | None = "torch", stream=None, flops: float = 0.0, shape=None,
            tolerances: dict | None = None, timing: dict | None = None, rounds: int = 1) -> None:
        """Checks every provider's output against the reference's, then times each one.

        providers: name -> callable without arguments returning its output tensor, or a tuple of
        tensors (it should write to a preallocated output where the provider has out=). Tuples are
        compared element by element, up to the shorter one. With `stream`, every call runs on it
        (and graphs are captured on it). reference=None: no comparison (the caller has checked
        the outputs its own way); every provider still runs once before timing.

        shape: what the report shows (default: (size,)); size stays the element count, which
        picks the timing method and is the x axis of the plots. tolerances: dtype ->
        dict(rtol, atol[, atol_rel]) in place of TOLERANCES (see check). timing: do_bench's
        method in place of timing_for(size) (e.g. no CUDA graph for a peer that cannot be
        captured)."""
        label = fmt_size(size) if shape is None else _shape_label(shape)
        if shape is not None:
            self._shaped = True
        ctx = torch.cuda.stream(stream) if stream is not None else _nullcontext()
        with ctx:
            outputs = {name: fn() for name, fn in providers.items()}
        torch.cuda.synchronize()
        if reference is not None:
            ref = outputs[reference]
            tol = None if tolerances is None else tolerances[dtype]
            for name, out in outputs.items():
                if name != reference:
                    check(op, name, reference, dtype, size, out, ref, tol=tol,
                          label=None if shape is None else label)
            del ref
        del outputs

        method = timing_for(size) if timing is None else timing
        try:
            results = self._time_all(op, dtype, label, providers, stream, method, rounds)
        except Exception as e:  # noqa: BLE001 - a capture that fails must not lose the run
            if not method.get("cuda_graph"):
                raise
            torch.cuda.synchronize()
            msg = (f"{op} {dtype_name(dtype)} {label}: CUDA graph capture failed "
                   f"({type(e).__name__}: {e}); every provider at this size timed without a graph, "
                   "L2 flushed")
            print(f"  WARNING: {msg}", flush=True)
            self.note(msg)
            results = self._time_all(op, dtype, label, providers, stream,
                                     dict(cuda_graph=False, flush_l2=True))
        report_shape = (size,) if shape is None else tuple(int(d) for d in shape)
        for name, stats in results.items():
            self.report.add(op, name, dtype, report_shape, size, bytes_moved, flops, stats)

    _shaped = False  # set once a row is added with its own shape: the ratio tables key on shapes

    @staticmethod
    def _time_all(op, dtype, label, providers, stream, method, rounds: int = 1) -> dict:
        """Each provider timed once per round, the providers in turn within a round (so that
        clock drift over the run reaches every provider alike); per provider, the round whose
        median is the median of its rounds' medians."""
        runs = {name: [] for name in providers}
        for r in range(rounds):
            for name, fn in providers.items():
                tag = f"  round {r + 1}/{rounds}" if rounds > 1 else ""
                print(f"  {op:<20} {dtype_name(dtype):<9} {label:>5}  {name}{tag}", flush=True)
                runs[name].append(do_bench(fn, stream=stream, **method))
        return {name: sorted(rs, key=lambda s: s["median_ms"])[len(rs) // 2]
                for name, rs in runs.items()}

    def finish(self, out_dir: Path, ours: str = "tessera", baseline: str = "torch", *,
               best_peer: bool = False, peers=None) -> int:
        """Prints the full table, writes CSV, JSON and SVGs to out_dir, prints the ratio table
        against `baseline`. With best_peer, also a last table against the best of `peers` per
        row (see best_peer_table), under FINAL_TABLE_MARK, then the cases attempt() saw fail;
        the tables and failures go to out_dir/summary.txt as well. Returns the failure count."""
        out_dir.mkdir(parents=True, exist_ok=True)
        print()
        print(self.report.table())
        self.report.write_csv(out_dir / "bench.csv")
        self.report.write_json(out_dir / "bench.json")
        svgs = self.report.write_svgs(out_dir)
        print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'} and {len(svgs)} SVGs in {out_dir}")
        print()
        ratios = ratio_table(self.report, ours, baseline, by_shape=self._shaped)
        print(ratios)
        failures = self.failures
        if not best_peer:
            return len(failures)
        final = best_peer_table(self.report, ours, peers, by_shape=self._shaped)
        print()
        print(f"{FINAL_TABLE_MARK}: {ours} against the best peer of each row (GB/s from the bytes "
              f"the op must move; {ours}/peer > 1: {ours} faster)")
        print(final)
        failed = ""
        if failures:
            failed = f"\nFAILED ({len(failures)} case(s), not in the tables):\n" + "".join(
                f"  {f.splitlines()[0][:300]}\n" for f in failures)
            print(failed, end="")
        text = (f"{self.title}\n\n{ours} against {baseline}:\n{ratios}\n\n"
                f"{ours} against the best peer:\n{final}\n{failed}")
        if self.report.notes:
            text += "\nnotes:\n" + "".join(f"  - {n}\n" for n in self.report.notes)
        (out_dir / "summary.txt").write_text(text, encoding="utf-8")
        return len(failures)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _shape_label(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _shape_text(report_shape: str) -> str:
    """The report's "[4096, 1024]" as "4096x1024"."""
    return report_shape.strip("[]").replace(", ", "x").replace(",", "x")


def check(op, name, reference, dtype, size, out, ref, *, tol=None, label=None) -> None:
    """Exits the run when `out` is not close to `ref`: |out - ref| <= atol + rtol * |ref| with
    atol = tol['atol'] + tol.get('atol_rel', 0) * max|ref| (an absolute tolerance on the scale of
    the output, for results that can cancel to near zero). tol defaults to TOLERANCES[dtype].
    Tuples of tensors are compared element by element, up to the shorter one."""
    if isinstance(out, (tuple, list)) or isinstance(ref, (tuple, list)):
        outs = out if isinstance(out, (tuple, list)) else (out,)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        for i, (o, r) in enumerate(zip(outs, refs)):
            check(op, f"{name}[{i}]", f"{reference}[{i}]", dtype, size, o, r, tol=tol, label=label)
        return
    tol = TOLERANCES[dtype] if tol is None else tol
    where = f"size {size}" if label is None else label
    if out.shape == ref.shape:
        o, r = out.float(), ref.float()
        atol = tol["atol"]
        if tol.get("atol_rel"):
            atol += tol["atol_rel"] * (r.abs().max().item() if r.numel() else 0.0)
        if torch.allclose(o, r, rtol=tol["rtol"], atol=atol):
            return
        diff = (o - r).abs()
        diff[torch.isnan(diff)] = float("inf")  # a NaN on one side only is the worst difference
        i = diff.argmax().item()
        detail = (f"max |diff| {diff.max().item():.3g} at flat index {i} "
                  f"({o.reshape(-1)[i].item():.6g} vs {r.reshape(-1)[i].item():.6g}), "
                  f"atol {atol:.3g}")
    else:
        detail = f"shape {tuple(out.shape)} vs {tuple(ref.shape)}"
    sys.exit(f"\nMISMATCH: {op} {dtype_name(dtype)} {where}: {name} differs from {reference} "
             f"beyond rtol={tol['rtol']}, atol={tol['atol']} ({detail}). Not timing a wrong result.")


def _format_table(header, lines, left) -> str:
    """Aligned columns: those whose index is in `left` to the left, the rest to the right."""
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in left else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [fmt(l) for l in lines]
    return "\n".join(out)


def _rows_by_key(report: Report, by_shape: bool):
    """The report's rows, the (op, dtype, size or shape) of each and a lookup by key + provider."""
    rows = report.rows()
    key_of = (lambda r: (r["op"], r["dtype"], _shape_text(r["shape"]))) if by_shape else \
        (lambda r: (r["op"], r["dtype"], r["size"]))
    by_key = {(*key_of(r), r["provider"]): r for r in rows}
    return rows, key_of, by_key


def ratio_table(report: Report, ours: str = "tessera", baseline: str = "torch", *,
                by_shape: bool = False) -> str:
    """op, dtype, size (shape with by_shape), our GB/s, baseline GB/s, ratio, our % of the
    measured copy bandwidth."""
    rows, key_of, by_key = _rows_by_key(report, by_shape)
    copy = (report.peaks or {}).get("copy_gbps") or 0.0
    header = ["op", "dtype", "shape" if by_shape else "size", f"{ours} GB/s", f"{baseline} GB/s",
              f"{ours}/{baseline}", "% of copy"]
    lines = []
    seen = set()
    for r in rows:
        key = key_of(r)
        if key in seen or (*key, ours) not in by_key or (*key, baseline) not in by_key:
            continue
        seen.add(key)
        a, b = by_key[(*key, ours)]["gbps"], by_key[(*key, baseline)]["gbps"]
        lines.append([key[0], key[1], key[2] if by_shape else fmt_size(key[2]), f"{a:.0f}",
                      f"{b:.0f}", f"{a / b:.2f}" if b > 0 else "-",
                      f"{100 * a / copy:.1f}" if copy else "-"])
    return _format_table(header, lines, left={0, 1, 2})


def best_peer_table(report: Report, ours: str = "tessera", peers=None, *,
                    by_shape: bool = True) -> str:
    """Per (op, dtype, shape): our GB/s, the fastest peer and its GB/s, our/peer, our % of the
    measured copy bandwidth. peers: which providers compete: None (every other provider in the
    row), a list of names, or a dict op -> list (ops not in it: every other provider)."""
    rows, key_of, by_key = _rows_by_key(report, by_shape)
    copy = (report.peaks or {}).get("copy_gbps") or 0.0
    header = ["op", "dtype", "shape" if by_shape else "size", f"{ours} GB/s", "best peer",
              "peer GB/s", f"{ours}/peer", "% of copy"]
    lines = []
    seen = set()
    for r in rows:
        key = key_of(r)
        if key in seen or (*key, ours) not in by_key:
            continue
        seen.add(key)
        allowed = peers.get(key[0]) if isinstance(peers, dict) else peers
        candidates = [x for x in rows if key_of(x) == key and x["provider"] != ours
                      and (allowed is None or x["provider"] in allowed)]
        a = by_key[(*key, ours)]["gbps"]
        best = max(candidates, key=lambda x: x["gbps"], default=None)
        b = best["gbps"] if best is not None else 0.0
        lines.append([key[0], key[1], key[2] if by_shape else fmt_size(key[2]), f"{a:.0f}",
                      best["provider"] if best is not None else "-",
                      f"{b:.0f}" if best is not None else "-", f"{a / b:.2f}" if b > 0 else "-",
                      f"{100 * a / copy:.1f}" if copy else "-"])
    return _format_table(header, lines, left={0, 1, 2, 4})
