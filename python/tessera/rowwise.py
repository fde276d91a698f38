"""Row-wise operators with torch's signatures: softmax and log_softmax over one dimension, LayerNorm
and RMSNorm over the trailing dimensions, with their backward functions; and the residual add fused
with either norm (add_layer_norm, add_rms_norm: torch tensors only, differentiable).

Inputs are torch tensors, or (for softmax, log_softmax, their backward functions, layer_norm and
rms_norm) any CUDA array that speaks DLPack, which gets the same kind back. The argument checks
are the library's: a CPU tensor, an unsupported dtype or a mismatched shape raise
ValueError/TypeError with the C++ message, which names the operator and the argument by its Python
parameter's name ('input', 'out', 'weight', 'bias', 'grad_output', 'output', 'mean', 'rstd', ...).
Checks of Python-only arguments (dim's type, normalized_shape, output_mask) run first, before any
of them.

torch tensors go through tessera's registered torch ops (torch.ops.tessera.*: autograd in C++,
traceable by torch.compile) where the wheel was built with torch, subclasses of torch.Tensor too (a
DTensor: the op runs on the local shards, by the sharding rules of tessera._sharding). The forms
the ops do not take (out=, dtype=) take the library's bindings (tessera._C) where autograd will
not record the call, and the registered ops where it will; without the torch ops such a call is
refused (tessera._interop.needs_ops). The backward ops are not differentiable themselves.

Statistics: ``layer_norm_forward`` returns mean and rstd, and ``rms_norm_forward`` returns rstd,
as float32 tensors of the *leading* shape ``input.shape[:-len(normalized_shape)]`` (0-d when every
dimension is normalized): what the C++ API takes. ``torch.native_layer_norm`` gives them the shape
``leading + (1,) * len(normalized_shape)``; the backward functions here accept either shape.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import _C, _interop, _state
from ._interop import (as_arg, dlpack_stream, torch_if_tensor, torch_stream,
                       torch_view, wrap_output)
from ._surface import op
from .elementwise import _no_grad_with_out

if TYPE_CHECKING:
    import torch

    from ._interop import TensorLike, TensorT

__all__ = ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
           "layer_norm", "layer_norm_forward", "layer_norm_backward",
           "rms_norm", "rms_norm_forward", "rms_norm_backward", "add_layer_norm", "add_rms_norm"]

# torch's rms_norm resolves eps=None to the epsilon of its accumulation type, float32 for every
# dtype tessera supports (also for float16/bfloat16 inputs: FLT_EPSILON, not finfo(bfloat16).eps),
# on the CPU and in its fused CUDA kernel alike.
RMS_NORM_DEFAULT_EPS = 2.0 ** -23


# ---- argument helpers ---------------------------------------------------------------------------

def _arg(x, op: str, arg: str):
    """A tensor argument of either kind (None stays None)."""
    return as_arg(torch_if_tensor(x), x, op, arg)


def _dim(dim, op: str) -> int:
    if isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise TypeError(f"tessera.{op}: argument 'dim': expected an integer, "
                        f"got {type(dim).__name__}")
    d = operator.index(dim)
    if not -(1 << 31) <= d < (1 << 31):  # beyond any tensor's dimensions (and the C++ int)
        raise ValueError(f"tessera.{op}: argument 'dim': expected a dimension of 'input', got {d}")
    return d


def _shape_list(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _normalized_ndim(normalized_shape, input, op: str) -> int:
    """len(normalized_shape), after checking that it is the trailing part of input's shape."""
    if isinstance(normalized_shape, bool):
        raise TypeError(f"tessera.{op}: argument 'normalized_shape': expected an int or a sequence "
                        "of ints, got bool")
    if hasattr(normalized_shape, "__index__"):
        dims = (operator.index(normalized_shape),)
    else:
        try:
            dims = tuple(operator.index(s) for s in normalized_shape)
        except TypeError:
            raise TypeError(f"tessera.{op}: argument 'normalized_shape': expected an int or a "
                            f"sequence of ints, got {normalized_shape!r}") from None
    shape = getattr(input, "shape", None)
    if shape is None:
        raise TypeError(f"tessera.{op}: argument 'input': expected a tensor with a .shape (a torch "
                        f"tensor, or an array with __dlpack__ and .shape), got "
                        f"{type(input).__name__}")
    shape = tuple(shape)
    k = len(dims)
    if k == 0 or k > len(shape) or shape[len(shape) - k:] != dims:
        raise ValueError(
            f"tessera.{op}: argument 'normalized_shape': expected the trailing dimensions of the "
            f"input's shape {_shape_list(shape)} "
            f"({'1 to ' + str(len(shape)) + ' of them' if shape else 'a 0-d input has none'}), "
            f"got {_shape_list(dims)}")
    return k


def _shape_arg(normalized_shape):
    """normalized_shape as the ops' int[] takes it (an int, a tuple, list or torch.Size of ints);
    None for anything else, which the Python path checks and refuses by name."""
    t = type(normalized_shape)
    if t is int:
        return (normalized_shape,)
    if t is list or isinstance(normalized_shape, tuple):
        return normalized_shape
    return None


def _output_mask(mask, n: int, op: str) -> tuple:
    try:
        m = tuple(bool(v) for v in mask)
    except TypeError:
        m = ()
    if len(m) != n:
        raise ValueError(f"tessera.{op}: argument 'output_mask': expected {n} booleans, "
                         f"got {mask!r}")
    return m


def _torch_only(torch, input, op: str, alternative: str):
    if torch is None:
        raise TypeError(f"tessera.{op}: argument 'input': expected a torch tensor ({alternative}), "
                        f"got {type(input).__name__}")


def _requires_grad(torch, *tensors) -> bool:
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _new_stats(torch, x, k: int, count: int = 2):
    """``count`` uninitialized float32 tensors of the leading shape (mean and rstd, or rstd) for
    the kernel to fill; NaN where rows have no elements (a size-0 normalized dimension): their
    statistics are undefined and the library writes nothing."""
    lead = x.shape[:x.dim() - k]
    if x.numel() == 0 and math.prod(lead) > 0:
        return tuple(torch.full(lead, math.nan, dtype=torch.float32, device=x.device)
                     for _ in range(count))
    return tuple(torch.empty(lead, dtype=torch.float32, device=x.device) for _ in range(count))


def _param_grad(torch, x, k: int, like):
    """A weight or bias gradient, in the dtype of ``like`` (the weight, or x). The library writes
    zeros when there are no rows to sum over."""
    dtype = like.dtype if isinstance(like, torch.Tensor) else x.dtype
    return torch.empty(x.shape[x.dim() - k:], dtype=dtype, device=x.device)


# ---- softmax and log_softmax --------------------------------------------------------------------

@op("softmax")
def softmax(input: TensorT, dim: int = -1, dtype: torch.dtype | None = None, *,
            out: TensorT | None = None) -> TensorT:
    """Softmax along ``dim``, as :func:`torch.softmax`: a row containing NaN gives NaN, a row of
    all -inf gives NaN. ``dtype`` casts the input first (torch tensors only), as torch does.

    ``out`` (keyword only, not in torch's signature) writes the result to a preallocated tensor of
    the input's shape, dtype and device; it may be the input itself.
    """
    if out is None and _interop.outside_kernels(input, cast=dtype):
        return _state.torch_module.softmax(input, dim, dtype=dtype)
    return _softmax_entry(input, dim, dtype, out, False)


@op("log_softmax")
def log_softmax(input: TensorT, dim: int = -1, dtype: torch.dtype | None = None, *,
                out: TensorT | None = None) -> TensorT:
    """Log-softmax along ``dim``, as :func:`torch.log_softmax`; see :func:`softmax`."""
    if out is None and _interop.outside_kernels(input, cast=dtype):
        return _state.torch_module.log_softmax(input, dim, dtype=dtype)
    return _softmax_entry(input, dim, dtype, out, True)


def _softmax_entry(input, dim, dtype, out, log):
    op = "log_softmax" if log else "softmax"
    dim = _dim(dim, op)
    torch = torch_if_tensor(input)
    if torch is None:
        if dtype is not None:
            raise TypeError(f"tessera.{op}: argument 'dtype': casting needs a torch tensor input, "
                            f"got {type(input).__name__}")
        fn = _C.log_softmax if log else _C.softmax
        result = fn(as_arg(None, input, op, "input"), _arg(out, op, "out"), dim,
                    dlpack_stream(input))
        return out if out is not None else wrap_output(input, result)
    if dtype is not None and input.dtype != dtype:
        input = input.to(dtype)
    if _requires_grad(torch, input):
        if out is not None:
            raise _no_grad_with_out(op)
        ops = _interop.needs_ops(op)
        return (ops.log_softmax if log else ops.softmax).default(input, dim)
    return _softmax_torch(torch, input, dim, log, out)


def _softmax_torch(torch, x, dim, log, out):
    op = "log_softmax" if log else "softmax"
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    (_C.log_softmax if log else _C.softmax)(xv, as_arg(torch, out, op, "out"), dim,
                                             torch_stream(xv))
    return out


@op("softmax_backward")
def softmax_backward(grad_output: TensorLike, output: TensorT, dim: int, *,
                     out: TensorT | None = None) -> TensorT:
    """Gradient of :func:`softmax` with respect to its input, from the forward's ``output`` ``y``:
    ``y * (grad_output - sum_dim(grad_output * y))``, as ``torch.ops.aten._softmax_backward_data``
    (without its input_dtype: the result has ``output``'s dtype). Not differentiable itself."""
    return _softmax_backward_entry(grad_output, output, dim, out, False)


@op("log_softmax_backward")
def log_softmax_backward(grad_output: TensorLike, output: TensorT, dim: int, *,
                         out: TensorT | None = None) -> TensorT:
    """Gradient of :func:`log_softmax` from the forward's ``output`` ``y``:
    ``grad_output - exp(y) * sum_dim(grad_output)``, as
    ``torch.ops.aten._log_softmax_backward_data``. Not differentiable itself."""
    return _softmax_backward_entry(grad_output, output, dim, out, True)


def _softmax_backward_entry(grad, y, dim, out, log):
    op = "log_softmax_backward" if log else "softmax_backward"
    dim = _dim(dim, op)
    torch = torch_if_tensor(y)
    if torch is None:
        fn = _C.log_softmax_backward if log else _C.softmax_backward
        result = fn(_arg(grad, op, "grad_output"), as_arg(None, y, op, "output"),
                    _arg(out, op, "out"), dim, dlpack_stream(y))
        return out if out is not None else wrap_output(y, result)
    return _softmax_backward_torch(torch, grad, y, dim, log, out)


def _softmax_backward_torch(torch, grad, y, dim, log, out):
    op = "log_softmax_backward" if log else "softmax_backward"
    yv = torch_view(y)
    gv = as_arg(torch, grad, op, "grad_output")
    if out is None:
        out = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    fn = _C.log_softmax_backward if log else _C.softmax_backward
    fn(gv, yv, as_arg(torch, out, op, "out"), dim, torch_stream(yv))
    return out


# ---- LayerNorm and RMSNorm, alone and after the residual add --------------------------------------
# Declarations of the norm family's ops (one description template in the library): a call the
# kernels take runs the op; the bodies take the rest (torch's function for CPU tensors and mixed
# dtypes, DLPack arrays and out= through the library's bindings).

def _torch_shape(normalized_shape):
    """normalized_shape as torch's functions take it: a sequence (tessera also takes an int). No
    try/except: torch.compile traces this on the CPU path."""
    if isinstance(normalized_shape, (tuple, list)):  # torch.Size too
        return normalized_shape
    return (operator.index(normalized_shape),)


@op("layer_norm")
def layer_norm(input: TensorT, normalized_shape: int | Sequence[int],
               weight: TensorLike | None = None, bias: TensorLike | None = None,
               eps: float = 1e-5, *, out: TensorT | None = None) -> TensorT:
    """LayerNorm over the trailing ``normalized_shape`` dimensions, as
    :func:`torch.nn.functional.layer_norm`: ``(x - mean) * rstd * weight + bias`` with
    ``rstd = 1 / sqrt(var + eps)`` (biased variance). Differentiable with respect to input,
    weight and bias.

    Args:
        input: a CUDA tensor (float32, float16 or bfloat16), any strides.
        normalized_shape: an int or a sequence of ints equal to ``input.shape[-len:]``.
        weight, bias: None, or tensors of exactly ``normalized_shape`` in the input's dtype
            (other dtypes, as torch's float32 parameters for half inputs, run torch's own
            layer_norm).
        eps: added to the variance.
        out: optional preallocated output (keyword only, not in torch's signature).
    """
    if out is None and _interop.outside_kernels(input, weight, bias, devices=False):
        return _state.torch_module.nn.functional.layer_norm(
            input, _torch_shape(normalized_shape), weight, bias, eps)
    return _norm_entry("layer_norm", input, normalized_shape, weight, bias, eps, 0.0, out)


def _norm_entry(op, input, normalized_shape, weight, bias, eps, weight_offset, out):
    """layer_norm and rms_norm where the op does not take the call: DLPack arrays, out=, and
    arguments of other Python types."""
    rms = op == "rms_norm"
    k = _normalized_ndim(normalized_shape, input, op)
    torch = torch_if_tensor(input)
    if torch is None:
        x, w, o, stream = as_arg(None, input, op, "input"), _arg(weight, op, "weight"), _arg(out, op, "out"), \
            dlpack_stream(input)
        result = _C.rms_norm(x, k, w, float(eps), float(weight_offset), o, None, stream) if rms else \
            _C.layer_norm(x, k, w, _arg(bias, op, "bias"), float(eps), o, None, None, stream)
        return out if out is not None else wrap_output(input, result)
    if _requires_grad(torch, input, weight, bias):
        if out is not None:
            raise _no_grad_with_out(op)
        shape = list(input.shape[input.dim() - k:])
        ops = _interop.needs_ops(op)
        if rms:
            return ops.rms_norm.default(input, shape, weight, float(eps), float(weight_offset))[0]
        return ops.layer_norm.default(input, shape, weight, bias, float(eps))[0]
    if rms:
        return _rms_norm_torch(torch, input, k, weight, eps, weight_offset, out, False)[0]
    return _layer_norm_torch(torch, input, k, weight, bias, eps, out, False)[0]


def _layer_norm_torch(torch, x, k, weight, bias, eps, out, stats):
    op = "layer_norm"
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean, rstd = _new_stats(torch, x, k) if stats else (None, None)
    _C.layer_norm(xv, k, as_arg(torch, weight, op, "weight"), as_arg(torch, bias, op, "bias"),
                  float(eps), as_arg(torch, out, op, "out"), as_arg(torch, mean, op, "mean"),
                  as_arg(torch, rstd, op, "rstd"), torch_stream(xv))
    return out, mean, rstd


def layer_norm_forward(input: torch.Tensor, normalized_shape: int | Sequence[int],
                       weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, mean, rstd)``, as ``torch.native_layer_norm``, for use in a hand-written backward.
    mean and rstd are float32 with the leading shape ``input.shape[:-len(normalized_shape)]`` (not
    torch's ``leading + (1,) * len(normalized_shape)``). Torch tensors only; not differentiable
    (use :func:`layer_norm` for autograd)."""
    ops, T = _state.ops, _state.Tensor
    if ops is not None and (type(input) is T or isinstance(input, T)):
        shape = _shape_arg(normalized_shape)
        if shape is not None:
            return ops.layer_norm.default(input, shape, weight, bias, eps)
    op = "layer_norm_forward"
    torch = torch_if_tensor(input)
    _torch_only(torch, input, op, "for DLPack arrays use tessera.layer_norm")
    k = _normalized_ndim(normalized_shape, input, op)
    return _layer_norm_torch(torch, input, k, weight, bias, eps, None, True)


@op("layer_norm_backward")
def layer_norm_backward(grad_output: torch.Tensor, input: torch.Tensor,
                        normalized_shape: int | Sequence[int], mean: torch.Tensor,
                        rstd: torch.Tensor, weight: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None,
                        output_mask: Sequence[bool] = (True, True, True)
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                   torch.Tensor | None]:
    """``(grad_input, grad_weight, grad_bias)`` of :func:`layer_norm`, given the forward's mean and
    rstd (either the leading shape or torch's ``leading + (1,) * len(normalized_shape)``), as
    ``torch.ops.aten.native_layer_norm_backward`` (its arguments, in its order). An entry is None
    where ``output_mask`` turns it off, grad_weight also where ``weight`` is None and grad_bias
    where ``bias`` is. grad_weight and grad_bias are bit-identical from run to run on one GPU.
    Torch tensors only."""
    op = "layer_norm_backward"
    torch = torch_if_tensor(input)
    _torch_only(torch, input, op, "the backward functions take torch tensors")
    k = _normalized_ndim(normalized_shape, input, op)
    mask = _output_mask(output_mask, 3, op)
    T = _state.Tensor
    if _state.ops is not None and (type(input) is T or isinstance(input, T)):
        return _state.ops.layer_norm_backward.default(
            grad_output, input, tuple(input.shape[input.dim() - k:]), mean, rstd, weight, bias, mask)
    return _layer_norm_backward_torch(torch, grad_output, input, k, mean, rstd, weight, mask[0],
                                      mask[1] and weight is not None, mask[2] and bias is not None)


def _layer_norm_backward_torch(torch, grad, x, k, mean, rstd, weight, want_in, want_w, want_b):
    op = "layer_norm_backward"
    if not (want_in or want_w or want_b):
        return None, None, None
    xv = torch_view(x)
    gi = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_in else None
    gw = _param_grad(torch, x, k, weight) if want_w else None
    gb = _param_grad(torch, x, k, x) if want_b else None
    _C.layer_norm_backward(as_arg(torch, grad, op, "grad_output"), xv, k,
                           as_arg(torch, mean, op, "mean"), as_arg(torch, rstd, op, "rstd"),
                           as_arg(torch, weight, op, "weight"), as_arg(torch, gi, op, "grad_input"),
                           as_arg(torch, gw, op, "grad_weight"), as_arg(torch, gb, op, "grad_bias"),
                           torch_stream(xv))
    return gi, gw, gb


@op("rms_norm")
def rms_norm(input: TensorT, normalized_shape: int | Sequence[int],
             weight: TensorLike | None = None, eps: float | None = RMS_NORM_DEFAULT_EPS, *,
             weight_offset: float = 0.0, out: TensorT | None = None) -> TensorT:
    """RMSNorm over the trailing ``normalized_shape`` dimensions, as
    :func:`torch.nn.functional.rms_norm`: ``x * rstd * weight`` with
    ``rstd = 1 / sqrt(mean(x^2) + eps)``. Differentiable with respect to input and weight.

    ``eps=None`` is torch's default, which (whatever the input dtype) is float32's epsilon,
    2**-23: torch documents ``finfo(input.dtype).eps`` but resolves it with its accumulation type.

    ``weight_offset`` is added to each weight in float32: ``weight_offset=1`` is Gemma's
    ``x * rstd * (1 + weight)``, computed in float32 and rounded once to the input's dtype, as
    Gemma's RMSNorm does, without float32 copies of x. It needs a weight.
    Other arguments as in :func:`layer_norm`.
    """
    if out is None and _interop.outside_kernels(input, weight, devices=False):
        return _rms_norm_fallback(input, normalized_shape, weight, eps, weight_offset)
    eps = RMS_NORM_DEFAULT_EPS if eps is None else eps
    return _norm_entry("rms_norm", input, normalized_shape, weight, None, eps, weight_offset, out)


def _rms_norm_fallback(input, normalized_shape, weight, eps, weight_offset):
    """torch's rms_norm where tessera's kernels do not run; the offset as Gemma computes it."""
    F = _state.torch_module.nn.functional
    shape = _torch_shape(normalized_shape)
    if not weight_offset:
        return F.rms_norm(input, shape, weight, eps)
    if weight is None:
        raise ValueError("tessera.rms_norm: argument 'weight_offset': expected 0 when 'weight' is not "
                         f"given, got {weight_offset}")
    y = F.rms_norm(input.float(), shape, None, eps) * (weight.float() + weight_offset)
    return y.to(input.dtype)


def _rms_norm_torch(torch, x, k, weight, eps, weight_offset, out, stats):
    op = "rms_norm"
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = _new_stats(torch, x, k, 1)[0] if stats else None
    _C.rms_norm(xv, k, as_arg(torch, weight, op, "weight"), float(eps), float(weight_offset),
                as_arg(torch, out, op, "out"), as_arg(torch, rstd, op, "rstd"),
                torch_stream(xv))
    return out, rstd


def rms_norm_forward(input: torch.Tensor, normalized_shape: int | Sequence[int],
                     weight: torch.Tensor | None = None,
                     eps: float | None = None, *,
                     weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, rstd)`` of :func:`rms_norm`, as ``torch.ops.aten._fused_rms_norm``, with rstd float32
    of the leading shape ``input.shape[:-len(normalized_shape)]``. Torch tensors only; not
    differentiable (use :func:`rms_norm` for autograd)."""
    ops, T = _state.ops, _state.Tensor
    eps = RMS_NORM_DEFAULT_EPS if eps is None else eps
    if ops is not None and (type(input) is T or isinstance(input, T)):
        shape = _shape_arg(normalized_shape)
        if shape is not None:
            return ops.rms_norm.default(input, shape, weight, eps, weight_offset)
    op = "rms_norm_forward"
    torch = torch_if_tensor(input)
    _torch_only(torch, input, op, "for DLPack arrays use tessera.rms_norm")
    k = _normalized_ndim(normalized_shape, input, op)
    return _rms_norm_torch(torch, input, k, weight, float(eps), weight_offset, None, True)


@op("rms_norm_backward")
def rms_norm_backward(grad_output: torch.Tensor, input: torch.Tensor,
                      normalized_shape: int | Sequence[int], rstd: torch.Tensor,
                      weight: torch.Tensor | None = None,
                      output_mask: Sequence[bool] = (True, True), *,
                      weight_offset: float = 0.0
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_input, grad_weight)`` of :func:`rms_norm`, given the forward's rstd (the leading
    shape, or ``leading + (1,) * len(normalized_shape)``) and its weight_offset. An entry is None
    where ``output_mask`` turns it off; grad_weight also where ``weight`` is None. grad_weight is
    bit-identical from run to run on one GPU. Torch tensors only."""
    op = "rms_norm_backward"
    torch = torch_if_tensor(input)
    _torch_only(torch, input, op, "the backward functions take torch tensors")
    k = _normalized_ndim(normalized_shape, input, op)
    mask = _output_mask(output_mask, 2, op)
    T = _state.Tensor
    if _state.ops is not None and (type(input) is T or isinstance(input, T)):
        return _state.ops.rms_norm_backward.default(
            grad_output, input, tuple(input.shape[input.dim() - k:]), rstd, weight, mask,
            float(weight_offset))
    return _rms_norm_backward_torch(torch, grad_output, input, k, rstd, weight, weight_offset, mask[0],
                                    mask[1] and weight is not None)


def _rms_norm_backward_torch(torch, grad, x, k, rstd, weight, weight_offset, want_in, want_w):
    op = "rms_norm_backward"
    if not (want_in or want_w):
        return None, None
    xv = torch_view(x)
    gi = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_in else None
    gw = _param_grad(torch, x, k, weight) if want_w else None
    _C.rms_norm_backward(as_arg(torch, grad, op, "grad_output"), xv, k,
                         as_arg(torch, rstd, op, "rstd"), as_arg(torch, weight, op, "weight"),
                         float(weight_offset), as_arg(torch, gi, op, "grad_input"), as_arg(torch, gw, op, "grad_weight"),
                         torch_stream(xv))
    return gi, gw


def _add_norm_entry(op, input, residual, weight, bias, eps):
    """add_layer_norm and add_rms_norm where the op does not take the call: torch's composition
    for the calls the kernels do not take, the op for arguments of other Python types."""
    torch = torch_if_tensor(input, init=True)
    if torch is None:
        raise TypeError(f"tessera.{op}: argument 'input': expected a torch tensor, got "
                        f"{type(input).__name__}")
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"tessera.{op}: argument 'residual': expected a torch tensor, got "
                        f"{type(residual).__name__}")
    rms = op == "add_rms_norm"
    if _interop.outside_kernels(input, residual, weight, bias, devices=False):
        s = input + residual
        F = torch.nn.functional
        return (F.rms_norm(s, s.shape[-1:], weight, eps) if rms else
                F.layer_norm(s, s.shape[-1:], weight, bias, eps), s)
    ops = _interop.needs_ops(op)
    eps = float(RMS_NORM_DEFAULT_EPS if eps is None else eps)
    r = ops.add_rms_norm.default(input, residual, weight, eps) if rms else \
        ops.add_layer_norm.default(input, residual, weight, bias, eps)
    return r[0], r[1]


@op("add_layer_norm")
def add_layer_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, residual_out)``: ``residual_out = input + residual`` and ``output`` its LayerNorm
    over the last dimension, in one pass (Apex's fused add + LayerNorm): input and residual are
    read once, output and residual_out written once. The result is that of
    ``s = input + residual; F.layer_norm(s, s.shape[-1:], weight, bias, eps), s``: residual_out
    is rounded to the input's dtype and normalized as rounded.

    Differentiable with respect to input, residual, weight and bias. The forward saves
    residual_out and the float32 mean and rstd; the backward reads the gradients of output and
    residual_out (the latter may be absent), residual_out and the statistics once and writes one
    gradient, which is both input's and residual's, and reduces grad_weight and grad_bias in a
    fixed order (bit-identical from run to run).

    Args:
        input, residual: CUDA tensors of one shape (at least 1-d) and dtype (float32, float16 or
            bfloat16), any strides.
        weight, bias: None, or tensors of shape ``input.shape[-1:]`` in the input's dtype.
        eps: added to the variance.

    Calls the kernels do not take (CPU tensors, other or mixed dtypes, such as a float32
    residual beside bfloat16 activations) compute the same composition with torch's functions.
    """
    return _add_norm_entry("add_layer_norm", input, residual, weight, bias, eps)


@op("add_rms_norm")
def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float | None = RMS_NORM_DEFAULT_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, residual_out)``: ``residual_out = input + residual`` and ``output`` its RMSNorm
    over the last dimension, in one pass (vLLM's ``fused_add_rms_norm``, out of place): input and
    residual are read once, output and residual_out written once. The result is that of
    ``s = input + residual; F.rms_norm(s, s.shape[-1:], weight, eps), s``.

    ``eps=None`` is torch's default, float32's epsilon (see :func:`rms_norm`). Differentiable
    with respect to input, residual and weight: the forward saves residual_out and the float32
    rstd, the backward writes one gradient for input and residual, as :func:`add_layer_norm`'s.
    Arguments and the calls torch computes as in :func:`add_layer_norm`.
    """
    return _add_norm_entry("add_rms_norm", input, residual, weight, None, eps)
