"""Benchmarking from Python with the engine the `tessera` command uses.

    import torch, tessera
    from tessera.bench import do_bench, Report

    x = torch.randn(1 << 24, device="cuda")
    stats = do_bench(lambda: tessera.gelu(x))            # {'median_ms': ..., 'p20_ms': ..., ...}

Method (as triton.testing.do_bench and nvbench): warm up, evict the L2 before each timed repetition
(by reading a buffer of twice its size, which leaves no dirty lines for the op to write back), put
CUDA events around the call alone, at least ``min_reps`` repetitions, report the median and the
20th/80th percentiles. Launch-bound sizes can be timed over a CUDA graph of ``graph_batch`` calls
(``cuda_graph=True``), per call.

The operators' descriptions, which the `tessera` command and the benchmarks/ scripts read:

    from tessera.bench import ops
    for op in ops("softmax"):                            # softmax, softmax_backward
        case = op.bench_shape("bfloat16", op.bench_sizes[0])
        case.shapes, case.shape, case.bytes, case.flops  # inputs' shapes, label, HBM bytes, FLOPs
        op.tolerance("bfloat16")                         # verify's bound on the relative error
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import _C

__all__ = ["do_bench", "peaks", "summarize", "Report", "ops", "op"]

_STAT_KEYS = ("median_ms", "p20_ms", "p80_ms", "min_ms", "max_ms", "mean_ms")


def do_bench(fn: Callable[[], object], *, warmup_ms: float = 25, min_reps: int = 25,
             max_reps: int = 1000, budget_ms: float = 100, flush_l2: bool = True,
             cuda_graph: bool = False, graph_batch: int = 20,
             stream: Any = None, memory: bool = False) -> dict[str, float]:
    """Times ``fn()`` on the GPU and returns its statistics in milliseconds.

    Args:
        fn: callable without arguments that enqueues its work on the current stream (torch's, or
            cupy's when torch is not in use).
        warmup_ms: run ``fn`` at least this long before timing.
        min_reps, max_reps: bounds on the timed repetitions.
        budget_ms: after ``min_reps``, stop once this much GPU time has been measured.
        flush_l2: read a buffer of twice the L2 before each repetition, so ``fn`` reads its
            inputs from memory, not from the cache (ignored with ``cuda_graph``).
        cuda_graph: capture ``graph_batch`` calls into one CUDA graph (with torch.cuda.graph for
            torch users, after a warm-up on a side stream as torch requires) and time its replays,
            without L2 flush; the times are per call. For launch-bound sizes.
        stream: a torch.cuda.Stream, a cupy Stream or a raw handle (int) to run on, made current
            for ``fn``; by default the current stream. In graph mode a non-default stream given
            here is also the capture stream (so the backward of a forward run on it is captured).

        memory: also measure one more call's memory (torch users): ``extra_mb``, the peak of
            torch's allocator during the call above what was allocated before it (what the call
            returns included; with the torch ops loaded, tessera's scratch memory comes from torch's
            allocator and is counted here), and ``scratch_mb``, the most of tessera's own scratch
            pool (which torch's counters do not see; 0 while torch's allocator serves scratch) in
            use at once during it. MB are 10^6 bytes.

    Returns:
        dict with median_ms, p20_ms, p80_ms, min_ms, max_ms, mean_ms (per call) and reps (timed
        repetitions; graph replays in graph mode); with ``memory``, extra_mb and scratch_mb.
    """
    opts = dict(warmup_ms=float(warmup_ms), min_reps=int(min_reps), max_reps=int(max_reps),
                budget_ms=float(budget_ms))
    if graph_batch < 1:
        raise ValueError("tessera.bench.do_bench: argument 'graph_batch': expected >= 1, "
                         f"got {graph_batch}")
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    if _is_cupy_stream(stream) or (stream is None and cupy is not None and not _torch_cuda(torch)):
        return _bench_cupy(cupy, fn, opts, flush_l2, cuda_graph, graph_batch, stream)
    if _torch_cuda(torch):
        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream) if stream else torch.cuda.default_stream()
        stats = _bench_torch(torch, fn, opts, flush_l2, cuda_graph, graph_batch, stream)
        if memory:
            stats.update(_memory_torch(torch, fn, stream))
        return stats
    if memory:
        raise ValueError("tessera.bench.do_bench: argument 'memory': measuring memory needs torch's CUDA "
                         "allocator")
    if cuda_graph:
        raise ValueError("tessera.bench.do_bench: argument 'cuda_graph': graph mode needs torch or "
                         "cupy to route fn's launches to the capture stream")
    handle = 0 if stream is None else int(stream)
    return _C.time_op(fn, handle, flush_l2=flush_l2, cuda_graph=False, graph_batch=1,
                      **opts)


def _torch_cuda(torch) -> bool:
    return torch is not None and torch.cuda.is_available()


def _is_cupy_stream(s) -> bool:
    return s is not None and type(s).__module__.startswith("cupy")


def _per_call(stats: dict, batch: int) -> dict:
    for k in _STAT_KEYS:
        stats[k] /= batch
    return stats


def _bench_torch(torch, fn, opts, flush_l2, cuda_graph, graph_batch, stream):
    if stream is None:
        stream = torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        if not cuda_graph:
            return _C.time_op(fn, stream.cuda_stream, flush_l2=flush_l2, cuda_graph=False,
                              graph_batch=1, **opts)
        graph = _capture_torch(torch, fn, graph_batch, stream)
        try:
            stats = _C.time_op(graph.replay, stream.cuda_stream, flush_l2=False, cuda_graph=False,
                               graph_batch=1, **opts)
        finally:
            torch.cuda.synchronize(stream.device)
            del graph  # its memory pool goes back to the caching allocator
        return _per_call(stats, graph_batch)


def _memory_torch(torch, fn, stream) -> dict[str, float]:
    """One call's memory: torch's allocator peak above what was allocated before it (with the
    torch ops loaded, tessera's scratch memory comes from that allocator and is counted there),
    and the high-water mark of tessera's own scratch pool during it."""
    stream = stream or torch.cuda.current_stream()
    device = stream.device.index if stream.device.index is not None else torch.cuda.current_device()
    with torch.cuda.stream(stream):
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _C.reset_scratch_peak(device)
        out = fn()
        torch.cuda.synchronize(device)
        extra = torch.cuda.max_memory_allocated(device) - before
        scratch = _C.scratch_peak_bytes(device)
        del out
    return {"extra_mb": extra / 1e6, "scratch_mb": scratch / 1e6}


def _capture_torch(torch, fn, batch, stream):
    default = stream.cuda_stream == torch.cuda.default_stream(stream.device).cuda_stream
    capture = torch.cuda.Stream(device=stream.device) if default else stream
    # Warm up on the capture stream (a side stream), so lazy initializations (cuBLAS handles,
    # autotuning, compilation) happen outside the capture.
    capture.wait_stream(stream)
    with torch.cuda.stream(capture):
        for _ in range(3):
            fn()
    stream.wait_stream(capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        for _ in range(batch):
            fn()
    return graph


def _bench_cupy(cupy, fn, opts, flush_l2, cuda_graph, graph_batch, stream):
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    handle = stream.ptr

    def call(s):
        if s == handle:
            fn()
        else:  # the engine's capture stream, in graph mode
            with cupy.cuda.ExternalStream(s):
                fn()

    with stream:
        return _C.time_op(call, handle, flush_l2=flush_l2, cuda_graph=bool(cuda_graph),
                          graph_batch=int(graph_batch), pass_stream=True, **opts)


def peaks(stream: Any = None) -> dict[str, Any]:
    """Ceilings measured on the current GPU: a 1 GiB device-to-device copy (copy_gbps, bytes read
    plus written per second) and a cuBLAS bf16 GEMM of 8192^3 (bf16_tflops), with the GPU's name,
    SM count, L2 and memory size, driver and runtime versions."""
    torch = sys.modules.get("torch")
    if stream is None:
        handle = torch.cuda.current_stream().cuda_stream if _torch_cuda(torch) else 0
    else:
        handle = stream if isinstance(stream, int) else getattr(stream, "cuda_stream",
                                                                getattr(stream, "ptr", 0))
    return _C.measure_peaks(handle)


def ops(select: str | Iterable[str] | None = None) -> list[_C.OpInfo]:
    """The operators' descriptions (tessera._C.OpInfo), in the order `tessera verify` runs them.

    Each has ``name``, ``family``, ``summary``, ``dtypes`` (names), ``bench_sizes`` (the sizes
    `tessera bench` times), ``size_meaning`` (what a size is for this op: elements, a row
    length, ...), ``bench_shape(dtype, size)`` (the bench case: ``shapes`` of the inputs, main
    tensor first, the report's ``shape`` label, the ``bytes`` the op must move and the ``flops``
    it must do) and ``tolerance(dtype)`` (the bound on ||out - ref|| / ||ref|| against a float64
    reference that `tessera verify` accepts).

    Args:
        select: None for every op; otherwise names (a comma-separated string or an iterable), each
            selecting the op and its variants as on the `tessera` command line ("softmax":
            softmax and softmax_backward; "gelu": gelu, gelu_backward, gelu_tanh, ...).
    """
    if select is None:
        return _C.ops()
    names = select.split(",") if isinstance(select, str) else list(select)
    wanted = set()
    for name in names:
        name = str(name).strip()
        found = _C.select_ops(name) if name else []
        if not found:
            known = ", ".join(o.name for o in _C.ops())
            raise ValueError(f"tessera.bench.ops: argument 'select': expected op names (known: "
                             f"{known}), got {name!r}")
        wanted.update(o.name for o in found)
    return [o for o in _C.ops() if o.name in wanted]


def op(name: str) -> _C.OpInfo:
    """The description of the op named exactly ``name`` (see :func:`ops`)."""
    for o in _C.ops():
        if o.name == name:
            return o
    known = ", ".join(o.name for o in _C.ops())
    raise ValueError(f"tessera.bench.op: argument 'name': expected an op name (known: {known}), "
                     f"got {name!r}")


def summarize(samples_ms: Iterable[float]) -> dict[str, float]:
    """Statistics of raw times in ms (median, p20, p80 by linear interpolation, min, max, mean)."""
    return _C.summarize([float(s) for s in samples_ms])


def _shape_str(shape) -> str:
    if isinstance(shape, str):
        return shape
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _dtype_str(dtype) -> str:
    return str(dtype).replace("torch.", "")


class Report:
    """Benchmark rows and the measured ceilings, with the writers of the `tessera` command: an
    aligned table, CSV, JSON and one SVG plot per (op, dtype). Notes (how a provider was timed,
    caveats) go below the table and into the JSON."""

    def __init__(self) -> None:
        self._report = _C.Report()
        self.notes: list[str] = []

    def add(self, op: str, provider: str, dtype: Any, shape: str | Sequence[int], size: int,
            bytes: float, flops: float, stats: dict[str, float]) -> None:
        """One measurement. ``shape`` is a string or a sequence of ints, ``dtype`` a string or a
        torch dtype, ``size`` the x axis of the plots (e.g. the element count), ``bytes`` and
        ``flops`` what the op must move and compute, ``stats`` a dict from :func:`do_bench`."""
        self._report.add(str(op), str(provider), _dtype_str(dtype), _shape_str(shape), int(size),
                         float(bytes), float(flops), stats)

    def set_peaks(self, peaks: dict) -> None:
        """Ceilings from :func:`peaks`, for the percentage columns and the plots' dashed lines."""
        self._report.set_peaks(peaks)

    @property
    def peaks(self) -> dict | None:
        return self._report.peaks()

    def rows(self) -> list[dict]:
        """Every row with its stats, GB/s and TFLOP/s."""
        return self._report.rows()

    def note(self, text: str) -> None:
        self.notes.append(str(text))

    def table(self) -> str:
        text = self._report.table()
        if self.notes:
            text = text.rstrip("\n") + "\n\nnotes:\n" + "".join(f"  - {n}\n" for n in self.notes)
        return text

    def write_csv(self, path: str | os.PathLike[str]) -> None:
        self._report.write_csv(str(path))

    def write_json(self, path: str | os.PathLike[str]) -> None:
        self._report.write_json(str(path))
        if self.notes:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            doc["notes"] = list(self.notes)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")

    def write_svgs(self, directory: str | os.PathLike[str]) -> list[str]:
        """One SVG per (op, dtype) in ``directory`` (created if needed); returns their paths."""
        return list(self._report.write_svgs(str(directory)))

    def svg(self, op: str, dtype: Any) -> str:
        return self._report.svg(op, _dtype_str(dtype))
