"""The float8 producers' autograd Functions: the ops that quantize what they write for the float8
projections after them (tessera.float8.rms_norm and add_rms_norm: the norm, its float8 copies
handed to the next Float8Matmul of its output), or before them (gated_linear: the gated product
quantized in the pass that computes it, a down projection's input). Imported by tessera/float8.py
only, which holds their public functions and the quantization they share.
"""

from __future__ import annotations

import weakref

from . import _state
from . import float8 as f8

_norm = None


def norm_function():
    """rms_norm_float8 as an autograd Function (add_rms_norm's with a residual): the forward writes
    the norm and its float8 copies and leaves those for the next Float8Matmul of the output
    (_leave_for_next); the backward is rms_norm's (add_rms_norm's)."""
    global _norm
    if _norm is not None:
        return _norm
    import torch

    class Float8RmsNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, residual, weight, eps, weight_offset, granularity, columns):
            k = x.shape[-1]
            m = x.numel() // k
            fast = _state.fast
            out = None if fast is None else fast.rms_norm_float8(x, residual, weight, eps, weight_offset, granularity,
                                                                 columns)
            if out is not None:  # the op's kernels at once, its outputs allocated in C++
                y, s, rstd, q, scale, q_t, scale_t = out
            else:
                y, s, rstd, q, scale, q_t, scale_t = _norm_float8(x, residual, weight, eps, weight_offset,
                                                                  granularity, columns)
            ctx.save_for_backward(x if s is None else s, weight, rstd)
            ctx.weight_offset, ctx.add = weight_offset, s is not None
            f8._leave_for_next(y.view(m, k), granularity, columns, (q, scale, q_t, scale_t))
            return y if s is None else (y, s)

        @staticmethod
        def backward(ctx, grad, grad_residual_out=None):
            x, weight, rstd = ctx.saved_tensors
            if not ctx.add:
                from .rowwise import rms_norm_backward
                grad_x, grad_w = rms_norm_backward(grad, x, (x.shape[-1],), rstd, weight, ctx.needs_input_grad[::2][:2],
                                                   weight_offset=ctx.weight_offset)
                return grad_x, None, grad_w, None, None, None, None
            from ._interop import needs_ops
            mask = [ctx.needs_input_grad[0] or ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
            grad_x, grad_w = needs_ops("add_rms_norm").add_rms_norm_backward.default(
                grad, grad_residual_out, x, rstd, weight, mask)
            return grad_x, grad_x, grad_w, None, None, None, None

    _norm = Float8RmsNorm
    return _norm


def _norm_float8(x, residual, weight, eps, weight_offset, granularity, columns):
    """rms_norm_float8 through the nanobind extension, its outputs allocated here, where the torch
    extension's fast entry is not built: (y, residual_out, rstd, q, scale, q_t, scale_t)."""
    import torch

    from . import _C
    from ._interop import torch_stream, torch_view
    k = x.shape[-1]
    m = x.numel() // k
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    s = None if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    f32 = dict(dtype=torch.float32, device=x.device)
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(f8._scale_shape((m, k), granularity), **f32)
    q_t = scale_t = None
    if columns:
        q_t = torch.empty((k, m), dtype=torch.float8_e4m3fn, device=x.device)
        scale_t = torch.empty(f8._scale_shape((m, k), granularity, True), **f32)

    def view(t):
        return None if t is None else torch_view(t)
    xv = torch_view(x)
    _C.rms_norm_float8(xv, view(residual), view(weight), eps, weight_offset, torch_view(y), view(s),
                       torch_view(rstd), torch_view(q), torch_view(scale), view(q_t), view(scale_t),
                       granularity, torch_stream(xv))
    return y, s, rstd, q, scale, q_t, scale_t


def fuses(x, weight, residual=None) -> bool:
    """Whether rms_norm_float8 takes the call (see float8.rms_norm)."""
    import torch
    k = x.shape[-1] if x.dim() else 0
    return (getattr(x, "is_cuda", False) and weight is not None and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and x.is_contiguous() and weight.is_contiguous() and x.numel() > 0
            and k % 16 == 0 and (x.numel() // k) % 16 == 0
            and (residual is None or (isinstance(residual, torch.Tensor) and residual.shape == x.shape
                                      and residual.dtype == x.dtype and residual.is_contiguous()
                                      and residual.device == x.device))
            and not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing()
            and not torch.is_autocast_enabled(x.device.type) and f8._major(x.device.index) == 9)


_gated_matmul = None


def gated_function():
    """A Float8Linear of act(gate) * up (a gated feed-forward's down projection) as an autograd
    Function, on the kernels only (_on_kernels): the product quantized in the pass that computes
    it, not kept in bfloat16 (_quantize_gated); the backward keeps gate, up and the product's
    float8 columns, and takes grad_gate and grad_up from dgrad's output in one pass."""
    global _gated_matmul
    if _gated_matmul is not None:
        return _gated_matmul
    import torch

    class Float8GatedMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gate, up, weight, kind, recipe, recorded=True, cache=False):
            act, wgt = f8._OPERANDS[recipe]
            ctx.kind, ctx.recipe, ctx.cache = kind, recipe, cache
            want_dw = recorded and ctx.needs_input_grad[2]
            qa, sa, qa_t, sa_t = f8._quantize_gated(gate, up, kind, act, want_dw)
            ctx.save_for_backward(gate, up, qa_t, sa_t, weight)
            ctx.dtypes = (gate.dtype, weight.dtype)
            return f8._forward_gemm(qa, sa, weight, wgt, cache, gate.dtype)

        @staticmethod
        def backward(ctx, grad):
            gate, up, qa_t, sa_t, weight = ctx.saved_tensors
            want_act = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
            d_act, dw = f8._backward_gemms(grad, qa_t, sa_t, weight, ctx.recipe, ctx.cache, want_act,
                                        ctx.needs_input_grad[2], ctx.dtypes)
            d_gate = d_up = None
            if want_act:  # quantized as they are written for gate_proj's and up_proj's backward
                d_gate, d_up = gated_grads(ctx.kind, d_act, gate, up, f8._OPERANDS[ctx.recipe][0])
            return d_gate, d_up, dw, None, None, None, None

    _gated_matmul = Float8GatedMatmul
    return _gated_matmul


# The gated backward's gradients' float8 copies (gated_grads), for the gate and up projections'
# Float8Matmul.backward, which run next: {identity key: (weakref to the anchor, granularity,
# (q, scale, q_t, scale_t))}. One call's pair at most: each gated backward replaces it.
grad_copies: dict = {}


def take_grad_copies(grad, granularity: str, columns: bool):
    """The float8 copies gated_grads left for ``grad`` (the same elements, unchanged since, of
    ``granularity``), taken out of the table; else None."""
    import torch
    if not grad_copies or torch.compiler.is_compiling():
        return None
    ident = f8._identity(grad)
    if ident is None:
        return None
    held = grad_copies.pop(ident[1], None)
    if held is None or held[0]() is not ident[0] or held[1] != granularity:
        return None
    q, scale, q_t, scale_t = held[2]
    return (q, scale, q_t, scale_t) if columns else (q, scale, None, None)


def gated_grads(kind: str, d_act, gate, up, granularity: str):
    """(grad_gate, grad_up) of act(gate) * up from d_act, each quantized by ``granularity`` (rows
    and columns) in the pass that writes it (tessera's float8_quantize_gated_backward: the same
    bits as the gated backward op, and those of _quantize_both on each gradient), the copies left
    in grad_copies for the projections' backward GEMMs; the gated backward op alone where the
    kernel does not take the call (block granularities, other layouts or dtypes, rows or columns
    not multiples of 16, torch.compile or a CUDA graph capture)."""
    import torch
    from .elementwise import gated_backward
    if torch.compiler.is_compiling():  # its graph has no Python state to hand the copies through
        return gated_backward(kind, d_act, gate, up)
    grad_copies.clear()
    m, k = d_act.shape
    takes = (granularity in ("row", "tensor") and d_act.is_cuda and d_act.dtype in (torch.bfloat16, torch.float16)
             and gate.dtype == up.dtype == d_act.dtype and gate.shape == up.shape == d_act.shape
             and d_act.is_contiguous() and gate.is_contiguous() and up.is_contiguous()
             and m % 16 == 0 and k % 16 == 0 and m > 0 and not torch.cuda.is_current_stream_capturing())
    if not takes:
        return gated_backward(kind, d_act, gate, up)
    fast = _state.fast
    out = None if fast is None else fast.float8_quantize_gated_backward(d_act, gate, up, kind, granularity)
    if out is not None:  # the op's kernels at once, its outputs allocated in C++
        d_gate, d_up, cg, cu = out[0], out[1], out[2:6], out[6:]
    else:
        d_gate, d_up, cg, cu = _gated_grads(kind, d_act, gate, up, granularity)
    for grad, held in ((d_gate, cg), (d_up, cu)):
        ident = f8._identity(grad)
        if ident is not None:
            grad_copies[ident[1]] = (weakref.ref(ident[0]), granularity, held)
    return d_gate, d_up


def _gated_grads(kind: str, d_act, gate, up, granularity: str):
    """float8_quantize_gated_backward through the nanobind extension, its outputs allocated here,
    where the torch extension's fast entry is not built: (grad_gate, grad_up, grad_gate's copies,
    grad_up's)."""
    import torch

    from . import _C
    from ._interop import torch_stream, torch_view
    m, k = d_act.shape
    d_gate, d_up = torch.empty_like(d_act), torch.empty_like(d_act)
    f32 = dict(dtype=torch.float32, device=d_act.device)

    def copies():
        return (torch.empty((m, k), dtype=torch.float8_e4m3fn, device=d_act.device),
                torch.empty(f8._scale_shape((m, k), granularity), **f32),
                torch.empty((k, m), dtype=torch.float8_e4m3fn, device=d_act.device),
                torch.empty(f8._scale_shape((m, k), granularity, True), **f32))
    cg, cu = copies(), copies()
    dv = torch_view(d_act)
    _C.float8_quantize_gated_backward(dv, torch_view(gate), torch_view(up), kind, torch_view(d_gate), torch_view(d_up),
                                      *(torch_view(t) for t in cg), *(torch_view(t) for t in cu), granularity,
                                      torch_stream(dv))
    return d_gate, d_up, cg, cu
