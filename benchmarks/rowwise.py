#!/usr/bin/env python3
"""Row-wise operators against their peers, in one run, by one method.

    python benchmarks/rowwise.py [--quick] [--ops LIST] [--dtypes LIST] [--no-compile]
                                 [--stop-on-failure] [--time-limit S] [--out DIR]

  softmax               tessera.softmax(out=)     torch.softmax     Triton (tutorial kernel)
                        torch.compile(torch.softmax)
  log_softmax           tessera.log_softmax(out=) torch.log_softmax torch.compile(torch.log_softmax)
  softmax_backward      tessera.softmax_backward(out=)      aten._softmax_backward_data
                        torch.compile(aten._softmax_backward_data)
  log_softmax_backward  tessera.log_softmax_backward(out=)  aten._log_softmax_backward_data
                        torch.compile(aten._log_softmax_backward_data)
  layer_norm            tessera.layer_norm_forward (out, mean, rstd)   F.layer_norm
                        torch.compile(F.layer_norm)
  layer_norm_backward   tessera.layer_norm_backward (dx, dw, db)   aten.native_layer_norm_backward
                        (on torch's own mean and rstd from aten.native_layer_norm)
                        torch.compile(aten.native_layer_norm_backward)
  rms_norm              tessera.rms_norm_forward (out, rstd)   F.rms_norm
                        torch.compile(F.rms_norm)
  rms_norm_backward     tessera.rms_norm_backward (dx, dw)   aten._fused_rms_norm_backward on
                        torch's rstd from aten._fused_rms_norm (where this torch has the fused
                        CUDA kernels; otherwise torch.autograd.grad through F.rms_norm on a
                        retained graph), torch.compile(aten._fused_rms_norm_backward)
  add_layer_norm        torch.ops.tessera.add_layer_norm (out, residual_out, mean, rstd)
                        s = x + r; F.layer_norm(s) (eager: two kernels)   torch.compile of the same
  add_layer_norm_backward  torch.ops.tessera.add_layer_norm_backward (dx, dw, db; dx with the
                        gradient of residual_out added)   aten.native_layer_norm_backward + that
                        gradient, torch.compile of the same
  add_rms_norm          torch.ops.tessera.add_rms_norm (out, residual_out, rstd)   s = x + r;
                        F.rms_norm(s)   torch.compile of the same
  add_rms_norm_backward torch.ops.tessera.add_rms_norm_backward   aten._fused_rms_norm_backward + the
                        gradient of residual_out (without the fused kernels: torch.autograd.grad
                        through F.rms_norm, then the add), torch.compile of the same

Shapes, bytes and FLOPs are each op's description (tessera.bench.ops, what `tessera bench` times):
its bench sizes are row lengths N, each with the number of rows and the input shapes the
description gives (rows x N, the row the last, contiguous dimension), and every provider of a row
is credited with the bytes the description says the op must move through HBM (mean and rstd are
float32). --quick: each op's smallest, a middle and its largest size. dtypes --dtypes (default
float32,bfloat16) where the description supports them. The norms have a weight (and LayerNorm a
bias) of the input's dtype; eps 1e-5 (LayerNorm) and 1e-6 (RMSNorm), passed explicitly to every
provider.
--ops selects ops by name, a name also selecting its _backward (--ops softmax,layer_norm runs
softmax, softmax_backward, layer_norm, layer_norm_backward); --no-compile leaves torch.compile out
(it compiles once per shape and dtype, most of this script's time); --time-limit (default 480 s)
starts no case after that many seconds, so the report is still written under a wall-clock limit.

Before timing a case, every provider's outputs are checked against torch's (tuples output by
output; tolerances per op and dtype in TOLERANCES below, loose for bfloat16, with an absolute part
on the scale of the output where results can cancel to near zero: agreement with torch element by
element, not the description's bound on the relative error against float64), and the norm
forwards' mean and
rstd against a float64 computation. A failing case is reported and left out of the tables, and
the run goes on (--stop-on-failure: it ends the run); the exit status is 1 if any case failed.

Output: the full table, CSV, JSON and one SVG per (op, dtype) in --out, a ratio table (tessera
against torch, tessera's share of the copy bandwidth measured in the same run), and a last table:
tessera against the fastest peer of each row. Also written to --out/summary.txt.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tessera
from common import (DEVICE, Suite, add_selection_args, case, check, describe, dtype_name, dtypes_of,
                    resolve_selection, sizes_of)

aten = torch.ops.aten

OPS = ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward", "layer_norm",
       "layer_norm_backward", "rms_norm", "rms_norm_backward", "add_layer_norm",
       "add_layer_norm_backward", "add_rms_norm", "add_rms_norm_backward"]

LN_EPS = 1e-5
RMS_EPS = 1e-6

# allclose tolerances against torch, per op and dtype: |out - ref| <= atol + atol_rel * max|ref|
# + rtol * |ref|. float32: both sides compute in float32 but reduce in different orders (and may
# use a fast exp), a few 1e-7 relative per reduction. bfloat16: both round a float32 result once,
# so they may differ by one bf16 ulp (2^-7 relative at most); where a result cancels to near zero
# (the backwards, normalized values plus bias), the float32 difference before rounding is bounded
# on the scale of the largest output (atol_rel).
_F32, _BF16 = torch.float32, torch.bfloat16
TOLERANCES = {
    "softmax": {_F32: dict(rtol=2e-5, atol=0.0, atol_rel=1e-6),
                _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=1e-3)},
    "log_softmax": {_F32: dict(rtol=2e-5, atol=0.0, atol_rel=1e-6),
                    _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=1e-3)},
    "softmax_backward": {_F32: dict(rtol=2e-5, atol=0.0, atol_rel=1e-5),
                         _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
    "log_softmax_backward": {_F32: dict(rtol=2e-5, atol=0.0, atol_rel=1e-5),
                             _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
    "layer_norm": {_F32: dict(rtol=1e-5, atol=0.0, atol_rel=1e-5),
                   _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
    "layer_norm_backward": {_F32: dict(rtol=1e-4, atol=0.0, atol_rel=1e-5),
                            _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
    "rms_norm": {_F32: dict(rtol=1e-5, atol=0.0, atol_rel=1e-5),
                 _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
    "rms_norm_backward": {_F32: dict(rtol=1e-4, atol=0.0, atol_rel=1e-5),
                          _BF16: dict(rtol=1.6e-2, atol=0.0, atol_rel=4e-3)},
}
# The add ops: residual_out is the same bits on every side, the rest as the norm's.
for _op in ("layer_norm", "rms_norm"):
    TOLERANCES["add_" + _op] = TOLERANCES[_op]
    TOLERANCES[f"add_{_op}_backward"] = TOLERANCES[f"{_op}_backward"]
# The norm forwards' float32 mean and rstd against float64, whatever the input dtype (both are
# reduced in float32 from the same input values).
STATS_TOLERANCE = dict(rtol=1e-4, atol=1e-6)

try:
    import triton
    import triton.language as tl
except ImportError:  # the Triton provider is left out, and the report says so
    triton = None


if triton is not None:
    @triton.jit
    def _softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols,
                        BLOCK_SIZE: tl.constexpr):
        # Triton's fused-softmax tutorial kernel: one program per row, the whole row in one
        # block. One change: the row is converted to float32 after the load, since tl.exp takes
        # only fp32/fp64 (and torch and tessera compute half types in float32 too).
        row_idx = tl.program_id(0)
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        row = tl.load(input_ptrs, mask=col_offsets < n_cols, other=-float("inf")).to(tl.float32)
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        output_ptrs = output_row_start_ptr + col_offsets
        tl.store(output_ptrs, softmax_output, mask=col_offsets < n_cols)


def triton_warps(block: int) -> int:
    # The tutorial's heuristic: more warps for longer rows.
    return 16 if block >= 4096 else 8 if block >= 2048 else 4


def triton_softmax(x, y):
    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    _softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, BLOCK_SIZE=block,
                               num_warps=triton_warps(block))
    return y


# ---- torch.compile'd peers: one function per op, recompiled per shape and dtype (static) ------

def _softmax(x):
    return torch.softmax(x, -1)


def _log_softmax(x):
    return torch.log_softmax(x, -1)


def _softmax_bwd(g, y):
    return aten._softmax_backward_data(g, y, -1, y.dtype)


def _log_softmax_bwd(g, y):
    return aten._log_softmax_backward_data(g, y, -1, y.dtype)


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def _layer_norm_bwd(g, x, mean, rstd, w, b):
    return aten.native_layer_norm_backward(g, x, [x.shape[-1]], mean, rstd, w, b,
                                           [True, True, True])


def _rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def _rms_norm_bwd(g, x, rstd, w):
    return aten._fused_rms_norm_backward(g, x, [x.shape[-1]], rstd, w, [True, True])


# The add ops' peers: the same math in torch, the sum then the norm; backward, the norm's
# backward and the gradient of residual_out added.
def _add_layer_norm(x, r, w, b):
    s = x + r
    return F.layer_norm(s, (s.shape[-1],), w, b, LN_EPS), s


def _add_layer_norm_bwd(g, h, s, mean, rstd, w, b):
    gi, gw, gb = aten.native_layer_norm_backward(g, s, [s.shape[-1]], mean, rstd, w, b,
                                                 [True, True, True])
    return gi + h, gw, gb


def _add_rms_norm(x, r, w):
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), w, RMS_EPS), s


def _add_rms_norm_bwd(g, h, s, rstd, w):
    gi, gw = aten._fused_rms_norm_backward(g, s, [s.shape[-1]], rstd, w, [True, True])
    return gi + h, gw


_EAGER = {"softmax": _softmax, "log_softmax": _log_softmax, "softmax_backward": _softmax_bwd,
          "log_softmax_backward": _log_softmax_bwd, "layer_norm": _layer_norm,
          "layer_norm_backward": _layer_norm_bwd, "rms_norm": _rms_norm,
          "rms_norm_backward": _rms_norm_bwd, "add_layer_norm": _add_layer_norm,
          "add_layer_norm_backward": _add_layer_norm_bwd, "add_rms_norm": _add_rms_norm,
          "add_rms_norm_backward": _add_rms_norm_bwd}


class Compiled:
    """torch.compile'd functions by op, made on first use; none with --no-compile."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._fns = {}
        # Every op's function sees up to 12 (shape, dtype) pairs, each a static recompilation.
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))

    def get(self, op):
        if not self.enabled:
            return None
        if op not in self._fns:
            self._fns[op] = torch.compile(_EAGER[op], dynamic=False)
        return self._fns[op]


def randn(shape, dtype, scale=1.0, shift=0.0):
    t = torch.randn(shape, device=DEVICE, dtype=torch.float32)
    return (t * scale + shift).to(dtype)


def shape_str(rows, n):
    return f"{rows}x{n}"


# ---- the benchmark cases --------------------------------------------------------------------

def bench_softmax(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    log = op == "log_softmax"
    x = randn((rows, n), dtype)
    out = torch.empty_like(x)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    if log:
        providers = {"tessera": lambda: tessera.log_softmax(x, -1, out=out),
                     "torch": lambda: torch.log_softmax(x, -1)}
    else:
        providers = {"tessera": lambda: tessera.softmax(x, -1, out=out),
                     "torch": lambda: torch.softmax(x, -1)}
        if triton is not None:
            y_triton = torch.empty_like(x)
            suite.optional(providers, "triton", lambda: triton_softmax(x, y_triton), what)
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(x), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def bench_softmax_backward(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    log = op == "log_softmax_backward"
    x = randn((rows, n), dtype)
    y = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    del x
    g = randn((rows, n), dtype)
    out = torch.empty_like(g)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    if log:
        providers = {"tessera": lambda: tessera.log_softmax_backward(g, y, -1, out=out),
                     "torch": lambda: aten._log_softmax_backward_data(g, y, -1, dtype)}
    else:
        providers = {"tessera": lambda: tessera.softmax_backward(g, y, -1, out=out),
                     "torch": lambda: aten._softmax_backward_data(g, y, -1, dtype)}
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(g, y), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def norm_params(n, dtype, bias=True):
    w = randn((n,), dtype, scale=0.1, shift=1.0)
    b = randn((n,), dtype, scale=0.1) if bias else None
    return w, b


def check_stats(suite, op, dtype, rows, n, got: dict, x, eps, rms: bool):
    """The float32 mean and rstd a norm forward returns (flattened: one per row) against float64."""
    xd = x.double()
    if rms:
        ref = {"rstd": torch.rsqrt(xd.square().mean(-1) + eps)}
    else:
        ref = {"mean": xd.mean(-1), "rstd": torch.rsqrt(xd.var(-1, correction=0) + eps)}
    for name, r in ref.items():
        t = got[name]
        check(f"{op} {name}", "tessera", "float64", dtype, rows * n, t.reshape(-1), r.reshape(-1),
              tol=STATS_TOLERANCE, label=shape_str(rows, n))
        if t.dtype != torch.float32:
            suite.note(f"{op} {dtype_name(dtype)}: tessera's {name} is {dtype_name(t.dtype)}, not "
                       "float32 (the byte counts assume float32)")


def bench_layer_norm(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    x = randn((rows, n), dtype)
    w, b = norm_params(n, dtype)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    _, mean, rstd = tessera.layer_norm_forward(x, (n,), w, b, eps=LN_EPS)
    check_stats(suite, op, dtype, rows, n, {"mean": mean, "rstd": rstd}, x, LN_EPS, rms=False)
    del mean, rstd
    providers = {"tessera": lambda: tessera.layer_norm_forward(x, (n,), w, b, eps=LN_EPS),
                 "torch": lambda: F.layer_norm(x, (n,), w, b, LN_EPS)}
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(x, w, b), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def bench_layer_norm_backward(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    x = randn((rows, n), dtype)
    g = randn((rows, n), dtype)
    w, b = norm_params(n, dtype)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    # Each side runs on its own forward's saved statistics, as in training.
    _, t_mean, t_rstd = tessera.layer_norm_forward(x, (n,), w, b, eps=LN_EPS)
    _, mean, rstd = aten.native_layer_norm(x, [n], w, b, LN_EPS)
    providers = {
        "tessera": lambda: tessera.layer_norm_backward(g, x, (n,), t_mean, t_rstd, w, b,
                                                       output_mask=(True, True, True)),
        "torch": lambda: aten.native_layer_norm_backward(g, x, [n], mean, rstd, w, b,
                                                         [True, True, True]),
    }
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(g, x, mean, rstd, w, b), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def bench_rms_norm(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    x = randn((rows, n), dtype)
    w, _ = norm_params(n, dtype, bias=False)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    _, rstd = tessera.rms_norm_forward(x, (n,), w, eps=RMS_EPS)
    check_stats(suite, op, dtype, rows, n, {"rstd": rstd}, x, RMS_EPS, rms=True)
    del rstd
    providers = {"tessera": lambda: tessera.rms_norm_forward(x, (n,), w, eps=RMS_EPS),
                 "torch": lambda: F.rms_norm(x, (n,), w, RMS_EPS)}
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(x, w), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def fused_rms_norm_available() -> bool:
    """Whether this torch has the fused RMSNorm CUDA kernels (aten._fused_rms_norm and its
    backward) and they run here."""
    if not (hasattr(aten, "_fused_rms_norm") and hasattr(aten, "_fused_rms_norm_backward")):
        return False
    try:
        x = torch.randn(4, 64, device=DEVICE)
        w = torch.ones(64, device=DEVICE)
        _, rstd = aten._fused_rms_norm(x, [64], w, RMS_EPS)
        aten._fused_rms_norm_backward(x, x, [64], rstd, w, [True, True])
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - not implemented for this device: autograd instead
        return False


def rms_norm_autograd_node() -> str:
    """The autograd node torch's F.rms_norm records (what its backward runs)."""
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    w = torch.ones(64, device=DEVICE, requires_grad=True)
    return type(F.rms_norm(x, (64,), w, RMS_EPS).grad_fn).__name__


def bench_rms_norm_backward(suite, op, dtype, bench, compiled, fused: bool):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    x = randn((rows, n), dtype)
    g = randn((rows, n), dtype)
    w, _ = norm_params(n, dtype, bias=False)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    _, t_rstd = tessera.rms_norm_forward(x, (n,), w, eps=RMS_EPS)
    providers = {
        "tessera": lambda: tessera.rms_norm_backward(g, x, (n,), t_rstd, w,
                                                     output_mask=(True, True)),
    }
    if fused:
        _, rstd = aten._fused_rms_norm(x, [n], w, RMS_EPS)
        providers["torch"] = lambda: aten._fused_rms_norm_backward(g, x, [n], rstd, w,
                                                                   [True, True])
        fn = compiled.get(op)
        if fn is not None:
            suite.optional(providers, "torch.compile", lambda: fn(g, x, rstd, w), what)
    else:
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()
        yr = F.rms_norm(xr, (n,), wr, RMS_EPS)
        providers["torch"] = lambda: torch.autograd.grad(yr, (xr, wr), g, retain_graph=True)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def bench_add_norm(suite, op, dtype, bench, compiled):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    rms = op == "add_rms_norm"
    x, r = randn((rows, n), dtype), randn((rows, n), dtype, scale=2.0)
    w, b = norm_params(n, dtype, bias=not rms)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    tops = torch.ops.tessera
    if rms:
        _, res, rstd = tops.add_rms_norm(x, r, w, RMS_EPS)
        check_stats(suite, op, dtype, rows, n, {"rstd": rstd}, res, RMS_EPS, rms=True)
        args = (x, r, w)
        providers = {"tessera": lambda: tops.add_rms_norm(x, r, w, RMS_EPS), "torch": lambda: _add_rms_norm(*args)}
    else:
        _, res, mean, rstd = tops.add_layer_norm(x, r, w, b, LN_EPS)
        check_stats(suite, op, dtype, rows, n, {"mean": mean, "rstd": rstd}, res, LN_EPS, rms=False)
        args = (x, r, w, b)
        providers = {"tessera": lambda: tops.add_layer_norm(x, r, w, b, LN_EPS),
                     "torch": lambda: _add_layer_norm(*args)}
    fn = compiled.get(op)
    if fn is not None:
        suite.optional(providers, "torch.compile", lambda: fn(*args), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


def bench_add_norm_backward(suite, op, dtype, bench, compiled, fused: bool):
    rows, n = bench.shapes[0]  # the main tensor: rows x N
    rms = op == "add_rms_norm_backward"
    x, r = randn((rows, n), dtype), randn((rows, n), dtype, scale=2.0)
    g, h = randn((rows, n), dtype), randn((rows, n), dtype)  # the gradients of out, residual_out
    w, b = norm_params(n, dtype, bias=not rms)
    what = f"{op} {dtype_name(dtype)} {shape_str(rows, n)}"
    tops = torch.ops.tessera
    # Each side on its own forward's residual_out (the same bits) and statistics, as in training.
    fn = compiled.get(op)
    if rms:
        _, s, t_rstd = tops.add_rms_norm(x, r, w, RMS_EPS)
        providers = {"tessera": lambda: tops.add_rms_norm_backward(g, h, s, t_rstd, w, [True, True])}
        if fused:
            _, rstd = aten._fused_rms_norm(s, [n], w, RMS_EPS)
            providers["torch"] = lambda: _add_rms_norm_bwd(g, h, s, rstd, w)
            if fn is not None:
                suite.optional(providers, "torch.compile", lambda: fn(g, h, s, rstd, w), what)
        else:
            sr, wr = s.detach().requires_grad_(), w.detach().requires_grad_()
            yr = F.rms_norm(sr, (n,), wr, RMS_EPS)

            def torch_bwd():
                gi, gw = torch.autograd.grad(yr, (sr, wr), g, retain_graph=True)
                return gi + h, gw
            providers["torch"] = torch_bwd
    else:
        _, s, t_mean, t_rstd = tops.add_layer_norm(x, r, w, b, LN_EPS)
        _, mean, rstd = aten.native_layer_norm(s, [n], w, b, LN_EPS)
        providers = {
            "tessera": lambda: tops.add_layer_norm_backward(g, h, s, t_mean, t_rstd, w, b, [True, True, True]),
            "torch": lambda: _add_layer_norm_bwd(g, h, s, mean, rstd, w, b),
        }
        if fn is not None:
            suite.optional(providers, "torch.compile", lambda: fn(g, h, s, mean, rstd, w, b), what)
    suite.run(op, dtype, rows * n, bench.bytes, providers, shape=(rows, n),
              tolerances=TOLERANCES[op], flops=bench.flops)


# ---- driver ---------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--stop-on-failure", action="store_true",
                   help="end the run at the first failing case (default: report it, go on)")
    p.add_argument("--time-limit", type=float, default=480, metavar="S",
                   help="start no case after S seconds, so that the report is still written "
                        "under a wall-clock limit; the cases left are listed (default 480, "
                        "0: none)")
    p.add_argument("--out", default="report", type=Path,
                   help="directory for the CSV, JSON, SVG and summary files (default: ./report)")
    args = p.parse_args()
    resolve_selection(p, args, OPS)
    no_tolerance = [dtype_name(d) for d in args.dtypes if d not in TOLERANCES["softmax"]]
    if no_tolerance:
        p.error(f"--dtypes: no tolerance against torch for {', '.join(no_tolerance)} here "
                f"(TOLERANCES has {', '.join(dtype_name(d) for d in TOLERANCES['softmax'])})")
    return args


def main() -> int:
    args = parse_args()
    torch.manual_seed(0)
    suite = Suite("benchmarks/rowwise.py")
    suite.stop_on_failure = args.stop_on_failure
    compiled = Compiled(not args.no_compile)

    suite.note("bytes: every provider of a row is credited with the least the op must move, "
               "as its description (tessera.bench.ops) says, so GB/s ratios are time ratios")
    suite.note("torch.softmax/log_softmax, F.layer_norm, F.rms_norm, the aten backward ops and the "
               "torch.compile'd functions have no out=: timed as they are, outputs from torch's "
               "caching allocator; tessera's softmax family writes to preallocated outputs (out=), "
               "its norm functions allocate theirs as torch does")
    suite.note("norm forwards: tessera.layer_norm_forward/rms_norm_forward also write the float32 "
               "mean/rstd a backward needs, as torch's CUDA kernels behind F.layer_norm and "
               "F.rms_norm do; torch.compile'd F.layer_norm/F.rms_norm on inputs without grad "
               "writes only the output (8 or 4 bytes a row less, not counted)")
    suite.note("backwards: tessera's backward functions against the aten ops torch's autograd runs "
               "(aten._softmax_backward_data, aten._log_softmax_backward_data, "
               "aten.native_layer_norm_backward), called directly, without autograd's per-call "
               "cost; torch.compile'd: the same aten op compiled (Inductor decomposes it and "
               "generates its own kernels)")
    suite.note("shapes rows x N; the report's size (the SVGs' x axis) is rows*N elements: shapes "
               "of one element count share one x position")
    if "softmax" in args.ops:
        if triton is None:
            suite.note("Triton is not installed: no Triton provider for softmax")
        else:
            suite.note(f"Triton {triton.__version__}: the fused-softmax tutorial's kernel in its "
                       "simple form (one program per row, grid = rows, BLOCK_SIZE = "
                       "next_power_of_2(N), the whole row in one block, num_warps 4, 8 from "
                       "BLOCK_SIZE 2048, 16 from 4096), the row converted to float32 after the "
                       "load (tl.exp takes fp32 only); not the tutorial's later persistent "
                       "variant. Rows of 262144 spill registers in this form")
    fused = False
    if "rms_norm_backward" in args.ops or "add_rms_norm_backward" in args.ops:
        fused = fused_rms_norm_available()
        node = rms_norm_autograd_node()
        if fused:
            suite.note(f"rms_norm_backward: torch = aten._fused_rms_norm_backward on the rstd of "
                       f"aten._fused_rms_norm, called directly (F.rms_norm records {node} here)")
        else:
            suite.note(f"rms_norm_backward: this torch has no fused RMSNorm CUDA kernels: torch = "
                       f"torch.autograd.grad through F.rms_norm (node {node}) on a retained graph, "
                       "autograd's cost included; no torch.compile peer")
    if args.no_compile:
        suite.note("--no-compile: no torch.compile peers")

    plan = []
    for op in args.ops:
        desc = describe(op)
        for dtype in dtypes_of(desc, args.dtypes):
            for size in sizes_of(desc, args.quick, args.sizes):
                plan.append((op, dtype, case(desc, dtype, size)))

    runners = {
        "softmax": bench_softmax, "log_softmax": bench_softmax,
        "softmax_backward": bench_softmax_backward, "log_softmax_backward": bench_softmax_backward,
        "layer_norm": bench_layer_norm, "layer_norm_backward": bench_layer_norm_backward,
        "rms_norm": bench_rms_norm,
        "rms_norm_backward": lambda *a: bench_rms_norm_backward(*a, fused=fused),
        "add_layer_norm": bench_add_norm, "add_rms_norm": bench_add_norm,
        "add_layer_norm_backward": lambda *a: bench_add_norm_backward(*a, fused=fused),
        "add_rms_norm_backward": lambda *a: bench_add_norm_backward(*a, fused=fused),
    }
    t0 = time.time()
    skipped = []
    for i, (op, dtype, bench) in enumerate(plan):
        what = f"{op} {dtype_name(dtype)} {shape_str(*bench.shapes[0])}"
        if args.time_limit and time.time() - t0 > args.time_limit:
            skipped.append(what)
            continue
        print(f"[{i + 1}/{len(plan)} {time.time() - t0:6.0f}s] {what}", flush=True)
        suite.attempt(what, lambda: runners[op](suite, op, dtype, bench, compiled))
        gc.collect()
        torch.cuda.empty_cache()
    print(f"{len(plan) - len(skipped)} of {len(plan)} cases in {time.time() - t0:.0f} s",
          flush=True)
    if skipped:
        msg = (f"--time-limit {args.time_limit:g} s reached: {len(skipped)} case(s) not run: "
               + ", ".join(skipped))
        print(f"WARNING: {msg}", flush=True)
        suite.note(msg)
        suite.failures.append(f"not run (time limit): {len(skipped)} case(s), from {skipped[0]}")

    failed = suite.finish(args.out, best_peer=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
