"""Elementwise operators with torch's signatures: add, gelu and silu (and their backwards), dropout
(and its backward), copy.

Every function takes torch tensors, or any CUDA array that speaks DLPack (cupy, jax, ...), and
returns the same kind it was given. All argument checks are the library's: a CPU tensor, an
unsupported dtype or mismatched shapes raise ValueError/TypeError with the C++ message, which names
the operator and its argument by the Python parameter's name ('input', 'other', 'out', ...).

torch tensors go through tessera's registered torch ops (torch.ops.tessera.*: autograd in C++,
traceable by torch.compile) where the wheel was built with torch; out= and DLPack arrays take the
library's bindings (tessera._C), which autograd does not see: a call that needs autograd without
the torch ops is refused (tessera._interop.needs_ops).
"""

from __future__ import annotations

import numbers
import sys
from typing import TYPE_CHECKING

from . import _C, _interop, _state
from . import random as _random
from ._surface import _FAST_INDEX, op
from ._interop import (as_arg, as_number, broadcast_shape, dlpack_stream,
                       stand_in, torch_if_tensor, torch_stream, torch_view, wrap_output)

if TYPE_CHECKING:
    from ._interop import TensorLike, TensorT

__all__ = ["add", "gelu", "gelu_backward", "silu", "silu_backward", "silu_mul", "geglu", "dropout",
           "dropout_backward", "copy"]


def _approximate(approximate, op: str) -> bool:
    if approximate == "none":
        return False
    if approximate == "tanh":
        return True
    raise ValueError(
        f"tessera.{op}: argument 'approximate': expected 'none' or 'tanh', got {approximate!r}")


def _requires_grad(torch, a, b=None) -> bool:
    # Spelled out rather than any(...): this runs on every call.
    return torch.is_grad_enabled() and (
        a.requires_grad or (isinstance(b, torch.Tensor) and b.requires_grad))


def _no_grad_with_out(op: str):
    return RuntimeError(
        f"tessera.{op}: argument 'out': out= does not support automatic differentiation, "
        "but an input requires grad (as in torch)")


# ---- add --------------------------------------------------------------------------------------

# add's two kernels for tessera._torch_fast.call: a tensor other, a number.
_ADD, _ADD_SCALAR = _FAST_INDEX["add"], _FAST_INDEX["add.Scalar"]


def add(input: TensorT, other: TensorLike | float, *, alpha: float = 1,
        out: TensorT | None = None) -> TensorT:
    """``input + alpha * other``, as :func:`torch.add`.

    Args:
        input: a CUDA tensor (float32, float16 or bfloat16).
        other: a tensor of the same dtype and device, broadcastable with ``input`` by torch's
            rules, or a Python number.
        alpha: multiplier for ``other``.
        out: optional output with the broadcast shape, ``input``'s dtype and device. It may be
            ``input`` itself (in-place), but must not otherwise overlap an input.

    Returns:
        ``out``, or a new tensor of the broadcast shape (a torch tensor for torch inputs, a cupy
        array for cupy inputs, a :class:`tessera.DeviceArray` for other DLPack inputs).
    """
    fast = _state.fast
    if fast is not None and out is None and not _state.dynamo_compiling():
        r = fast.call(_ADD_SCALAR if type(other) is float or type(other) is int else _ADD, input, other, alpha)
        if r is not None:
            return r
    ops, T = _state.ops, _state.Tensor  # T: a subclass too (a DTensor), after the exact type
    if out is None and ops is not None and (type(input) is T or isinstance(input, T)) and input.is_cuda \
            and input.dtype in _state.FLOATS:
        # Keyword arguments cost the op's argument parsing more than positional ones: left out
        # where they are the defaults.
        if (type(other) is T or isinstance(other, T)) and other.dtype is input.dtype and other.is_cuda:
            return ops.add.default(input, other) if alpha == 1 else \
                ops.add.default(input, other, alpha=alpha)
        if type(other) is float or type(other) is int:
            return ops.add.Scalar(input, other) if alpha == 1 else \
                ops.add.Scalar(input, other, alpha=alpha)
    if out is None:
        result = _add_by_torch(input, other, alpha)
        if result is not None:
            return result
    torch = torch_if_tensor(input)
    if torch is None:
        return _add_dlpack(input, other, alpha, out)
    if isinstance(other, torch.Tensor):
        # torch accepts a 0-dim CPU tensor next to a CUDA one, as a number.
        if (other.dim() == 0 and input.is_cuda and not other.is_cuda and not other.requires_grad):
            other = other.item()
    elif as_number(other) is None:
        raise TypeError(f"tessera.add: argument 'other': expected a torch tensor or a real number "
                        f"(torch.from_dlpack converts other arrays), got {type(other).__name__}")
    if _requires_grad(torch, input, other):
        if out is not None:
            raise _no_grad_with_out("add")
        ops = _interop.needs_ops("add")
        if isinstance(other, torch.Tensor):
            return ops.add.default(input, other, alpha=float(alpha))
        return ops.add.Scalar(input, float(as_number(other)), alpha=float(alpha))
    return _add_torch(torch, input, other, alpha, out)


def _add_by_torch(input, other, alpha):
    """torch.add's contract where tessera's kernel does not take the call: a number first, two
    numbers, integer, float64 or complex tensors, mixed dtypes (torch's promotion), CPU tensors.
    Returns torch's result (or raises torch's error); None where tessera's kernel takes the call
    or tessera's own error is the answer (an argument that is no tensor or number; arrays that are
    not torch tensors)."""
    torch = torch_if_tensor(input) or torch_if_tensor(other)
    if torch is None:
        torch = sys.modules.get("torch")
        if torch is None or as_number(input) is None or as_number(other) is None:
            return None
        return torch.add(input, other, alpha=alpha)  # two numbers: a 0-dim tensor, as torch gives
    if not isinstance(input, torch.Tensor):
        if not isinstance(input, numbers.Number):
            return None
        if alpha == 1 and type(input) in (int, float) and not _interop.outside_kernels(other):
            return add(other, input)  # c + x is x + c: the same sums, on tessera's kernel
        return torch.add(input, other, alpha=alpha)
    if isinstance(other, torch.Tensor):
        if other.dim() == 0 and not other.is_cuda and input.is_cuda:
            # A CPU 0-dim tensor is a number to torch: tessera's kernel where it is a real one.
            if other.dtype.is_complex or _interop.outside_kernels(input):
                return torch.add(input, other, alpha=alpha)
            return None
        return torch.add(input, other, alpha=alpha) if _interop.outside_kernels(input, other) else None
    if as_number(other) is None:
        if isinstance(other, numbers.Complex):
            return torch.add(input, other, alpha=alpha)
        return None
    return torch.add(input, other, alpha=alpha) if _interop.outside_kernels(input) else None


def _add_torch(torch, a, b, alpha, out):
    av = torch_view(a)
    stream = torch_stream(av)
    if isinstance(b, torch.Tensor):
        bv = torch_view(b)
        if out is None:
            shape = broadcast_shape(a.shape, b.shape)
            if shape is None:
                _refuse(_C.add, av, bv, alpha, stream)
            out = torch.empty(shape, dtype=a.dtype, device=a.device)
        _C.add(av, bv, as_arg(torch, out, "add", "out"), float(alpha), stream)
    else:
        if out is None:
            out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
        _C.add(av, as_number(b), as_arg(torch, out, "add", "out"), float(alpha), stream)
    return out


def _refuse(op, av, bv, alpha, stream):
    """Shapes that do not broadcast: let the library raise, so the message and the order of the
    checks (devices and dtypes first) are its own. The stand-in output is a 0-dim view of ``a``,
    which the library refuses before writing anything."""
    op(av, bv, stand_in(av), float(alpha), stream)
    raise AssertionError("tessera.add: shapes that do not broadcast were accepted")  # unreachable


def _add_dlpack(input, other, alpha, out):
    torch = torch_if_tensor(other)
    a = as_arg(None, input, "add", "input")
    number = as_number(other)
    b = as_arg(torch, other, "add", "other") if number is None else number
    result = _C.add(a, b, as_arg(torch, out, "add", "out"), float(alpha), dlpack_stream(input))
    return out if out is not None else wrap_output(input, result)


# ---- float maps: gelu, silu ------------------------------------------------------------------
# One forward and one backward path for every float map out = f(x) (extra: f's own arguments,
# passed on to the kernel after out).

def _map(op: str, fn, input, out, extra, differentiable):
    torch = torch_if_tensor(input)
    if torch is None:
        result = fn(as_arg(None, input, op, "input"), as_arg(None, out, op, "out"), *extra,
                    dlpack_stream(input))
        return out if out is not None else wrap_output(input, result)
    if _requires_grad(torch, input):
        if out is not None:
            raise _no_grad_with_out(op)
        return differentiable(_interop.needs_ops(op))
    return _map_torch(torch, op, fn, input, out, extra)


def _map_torch(torch, op, fn, x, out, extra):
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    fn(xv, as_arg(torch, out, op, "out"), *extra, torch_stream(xv))
    return out


def _map_backward(op: str, fn, grad_output, input, out, extra):
    torch = torch_if_tensor(input)
    if torch is None:
        result = fn(as_arg(torch_if_tensor(grad_output), grad_output, op, "grad_output"),
                    as_arg(None, input, op, "input"), as_arg(None, out, op, "out"), *extra,
                    dlpack_stream(input))
        return out if out is not None else wrap_output(input, result)
    return _map_backward_torch(torch, op, fn, grad_output, input, out, extra)


def _map_backward_torch(torch, op, fn, grad, x, out, extra):
    xv = torch_view(x)
    gv = as_arg(torch, grad, op, "grad_output")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    fn(gv, xv, as_arg(torch, out, op, "out"), *extra, torch_stream(xv))
    return out


@op("gelu")
def gelu(input: TensorT, approximate: str = "none", *, out: TensorT | None = None) -> TensorT:
    """GELU, as :func:`torch.nn.functional.gelu`: ``x * Φ(x)`` with the erf form of the normal CDF
    (``approximate='none'``) or torch's tanh approximation (``approximate='tanh'``).

    ``out`` (not in torch's signature, keyword only) writes the result to a preallocated tensor of
    ``input``'s shape, dtype and device; it may be ``input`` itself.
    """
    if out is None and _interop.outside_kernels(input):
        return _state.torch_module.nn.functional.gelu(input, approximate=approximate)
    return _map("gelu", _C.gelu, input, out, (_approximate(approximate, "gelu"),),
                lambda ops: ops.gelu.default(input, approximate=approximate))


@op("gelu_backward")
def gelu_backward(grad_output: TensorLike, input: TensorT, *, approximate: str = "none",
                  out: TensorT | None = None) -> TensorT:
    """Gradient of :func:`gelu` with respect to ``input``: ``grad_output * gelu'(input)``, as
    ``torch.ops.aten.gelu_backward``. Not differentiable itself."""
    if out is None and _interop.outside_kernels(input, grad_output):
        return _state.torch_module.ops.aten.gelu_backward(grad_output, input,
                                                            approximate=approximate)
    tanh = _approximate(approximate, "gelu_backward")
    return _map_backward("gelu_backward", _C.gelu_backward, grad_output, input, out, (tanh,))


@op("silu")
def silu(input: TensorT, *, out: TensorT | None = None) -> TensorT:
    """SiLU (swish), as :func:`torch.nn.functional.silu`: ``x * sigmoid(x)``. ``out`` as for
    :func:`gelu` (torch's ``inplace=True`` is ``out=input``)."""
    if out is None and _interop.outside_kernels(input):
        return _state.torch_module.nn.functional.silu(input)
    return _map("silu", _C.silu, input, out, (), lambda ops: ops.silu.default(input))


@op("silu_backward")
def silu_backward(grad_output: TensorLike, input: TensorT, *,
                  out: TensorT | None = None) -> TensorT:
    """Gradient of :func:`silu` with respect to ``input``, as ``torch.ops.aten.silu_backward``.
    Not differentiable itself."""
    if out is None and _interop.outside_kernels(input, grad_output):
        return _state.torch_module.ops.aten.silu_backward(grad_output, input)
    return _map_backward("silu_backward", _C.silu_backward, grad_output, input, out, ())


# ---- silu_mul --------------------------------------------------------------------------------

@op("silu_mul")
def silu_mul(gate: TensorT, up: TensorT) -> TensorT:
    """SwiGLU's gate: ``silu(gate) * up``, in one pass (torch spells it
    ``torch.nn.functional.silu(gate) * up``, two kernels and an intermediate).

    ``gate`` and ``up`` are CUDA tensors of one shape and float dtype (float32, float16 or
    bfloat16), in any layout: the two halves of one projection's output (``x.chunk(2, -1)``) are
    taken as they are. Differentiable in both: the backward writes both gradients, one pass each,
    without keeping the product. Other tensors take torch's composition.
    """
    return _state.torch_module.nn.functional.silu(gate) * up


@op("geglu")
def geglu(gate: TensorT, up: TensorT) -> TensorT:
    """GeGLU's gate, as Gemma's feed-forward computes it: ``gelu(gate, approximate="tanh") * up``,
    in one pass; otherwise as :func:`silu_mul` (any layout, differentiable in both, torch's
    composition for other tensors)."""
    return _state.torch_module.nn.functional.gelu(gate, approximate="tanh") * up


# ---- dropout ----------------------------------------------------------------------------------

_U64 = (1 << 64) - 1


def _probability(p, op: str) -> float:
    if isinstance(p, bool) or as_number(p) is None:
        raise TypeError(f"tessera.{op}: argument 'p': expected a real number, "
                        f"got {type(p).__name__}")
    value = float(p)
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ValueError(f"tessera.{op}: argument 'p': expected a probability in [0, 1], "
                         f"got {value!r}")
    return value


def _uint64(v, op: str, arg: str) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"tessera.{op}: argument '{arg}': expected an integer, "
                        f"got {type(v).__name__}")
    value = v.__index__()
    if not 0 <= value <= _U64:
        raise ValueError(f"tessera.{op}: argument '{arg}': expected an integer in [0, 2**64), "
                         f"got {value}")
    return value


def _int64(v: int) -> int:
    """A uint64 as the int64 of the same bits (the ops' schemas take int; C++ reads it back)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _numel(x, op: str) -> int:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"tessera.{op}: argument 'input': without seed=, expected a tensor with a "
                        f".shape (to advance the generator by its size), got {type(x).__name__}")
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _dropout_stream(op: str, seed, offset, numel):
    """(seed, offset) for one call: as given, or taken from tessera.random's generator, which
    then moves past the counters this call consumes (``numel()`` elements)."""
    if seed is not None:
        return _uint64(seed, op, "seed"), _uint64(offset, op, "offset")
    if offset != 0:
        raise ValueError(f"tessera.{op}: argument 'offset': expected 0 when seed is None (the "
                         f"generator supplies both), got {offset!r}")
    return _random._take(_C.dropout_offset_increment(numel()))


def dropout(input: TensorT, p: float = 0.5, training: bool = True, inplace: bool = False, *,
            seed: int | None = None, offset: int = 0, out: TensorT | None = None) -> TensorT:
    """Inverted dropout, as :func:`torch.nn.functional.dropout`: each element is zeroed with
    probability ``p`` and the kept ones are scaled by ``1 / (1 - p)``.

    The mask comes from a counter-based generator (Philox4x32-10) keyed by ``seed`` at counter
    ``offset``: the same (seed, offset) gives the same mask on every run and GPU, and the mask is
    never stored (the backward regenerates it). With ``seed=None`` (the default) the pair comes from
    :mod:`tessera.random`, which then advances; with ``seed`` given, ``(seed, offset)`` are used as
    passed and the generator is untouched.

    As torch: with ``training=False``, ``p == 0`` or no elements, ``input`` itself is returned (no
    copy, no generator use); ``inplace=True`` writes into ``input`` (also under autograd, where
    ``input`` is not a leaf). ``p == 1`` writes zeros (torch multiplies by zero, which keeps NaN and
    turns inf into NaN; tessera gives 0 for them too).

    ``out`` (keyword only, not torch's) writes the result to a preallocated tensor of ``input``'s
    shape, dtype and device; with an identity call (above) ``input`` is copied into it.

    A DTensor (any subclass of torch.Tensor) without ``seed`` takes torch's dropout, which DTensor
    runs on each shard from its own generator; with a seed, tessera's op, which runs replicated
    (the mask follows each element's global index).
    """
    op = "dropout"
    p = _probability(p, op)
    if seed is None and out is None and (_interop.outside_kernels(input) or (
            _state.Tensor is not None and (_state.torch_module.compiler.is_compiling() or (
                type(input) is not _state.Tensor and isinstance(input, _state.Tensor))))):
        # torch's dropout, from torch's generator (a given seed asks for tessera's masks). Also
        # in a torch.compile graph: tessera's generator state is Python ints, which a graph
        # would freeze into one mask for every call. And for a subclass (a DTensor): tessera's
        # mask follows each element's global index, which a shard does not know, so its op
        # runs replicated (gathering a sharded input); torch's dropout on a DTensor runs on the
        # shards, from DTensor's own generator.
        return _state.torch_module.nn.functional.dropout(input, p, training, inplace)
    torch = torch_if_tensor(input)
    if inplace:
        if out is not None and out is not input:
            raise ValueError(f"tessera.{op}: argument 'out': expected None or the input itself "
                             "with inplace=True, got another tensor")
        out = input
    empty = torch is not None and input.numel() == 0
    if not training or p == 0.0 or empty:
        if out is None or out is input:
            return input
        if torch is not None and _requires_grad(torch, input):
            raise _no_grad_with_out(op)
        return copy(input, out)
    seed, offset = _dropout_stream(
        op, seed, offset, input.numel if torch is not None else lambda: _numel(input, op))
    if torch is None:
        result = _C.dropout(as_arg(None, input, op, "input"),
                            as_arg(torch_if_tensor(out), out, op, "out"), p, seed, offset,
                            dlpack_stream(input))
        return out if out is not None else wrap_output(input, result)
    if out is None and _state.ops is not None and isinstance(input, _state.Tensor):
        return _state.ops.dropout.default(input, p, _int64(seed), _int64(offset))
    if _requires_grad(torch, input):
        if out is not None and out is not input:
            raise _no_grad_with_out(op)
        if out is input and input.is_leaf:  # torch's refusal, before anything is written
            raise RuntimeError(f"tessera.{op}: a leaf Variable that requires grad is being used "
                               "in an in-place operation.")
        result = _interop.needs_ops(op).dropout.default(input, p, _int64(seed), _int64(offset))
        # In place under autograd: torch's copy_ records the write, its backward runs dropout's.
        return input.copy_(result) if out is input else result
    return _dropout_torch(torch, input, p, seed, offset, out)


def _dropout_torch(torch, x, p, seed, offset, out):
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.dropout(xv, as_arg(torch, out, "dropout", "out"), p, seed, offset, torch_stream(xv))
    return out


def dropout_backward(grad_output: TensorT, p: float, seed: int, offset: int, *,
                     out: TensorT | None = None) -> TensorT:
    """Gradient of :func:`dropout` with respect to its input, ``grad_output * mask / (1 - p)``,
    given the forward's ``p``, ``seed`` and ``offset`` (the mask is regenerated, not stored). Not
    differentiable itself."""
    op = "dropout_backward"
    p = _probability(p, op)
    seed, offset = _uint64(seed, op, "seed"), _uint64(offset, op, "offset")
    ops = _state.ops
    if out is None and ops is not None and isinstance(grad_output, _state.Tensor):
        return ops.dropout_backward.default(grad_output, p, _int64(seed), _int64(offset))
    torch = torch_if_tensor(grad_output)
    if torch is None:
        result = _C.dropout_backward(as_arg(None, grad_output, op, "grad_output"),
                                     as_arg(torch_if_tensor(out), out, op, "out"), p, seed,
                                     offset, dlpack_stream(grad_output))
        return out if out is not None else wrap_output(grad_output, result)
    return _dropout_backward_torch(torch, grad_output, p, seed, offset, out)


def _dropout_backward_torch(torch, grad, p, seed, offset, out):
    gv = torch_view(grad)
    if out is None:
        out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    _C.dropout_backward(gv, as_arg(torch, out, "dropout_backward", "out"), p, seed, offset,
                        torch_stream(gv))
    return out


# ---- copy -------------------------------------------------------------------------------------

def copy(src: TensorLike, dst: TensorT) -> TensorT:
    """``dst[...] = src`` for tensors of one shape and dtype in any two layouts (a transpose, a
    strided slice), as ``dst.copy_(src)`` without its broadcasting and dtype conversion. ``dst``
    must not overlap ``src`` unless it is the same view. Returns ``dst``. Not tracked by autograd:
    a ``src`` that requires grad (in grad mode) is refused."""
    torch = torch_if_tensor(src) or torch_if_tensor(dst)
    if torch is not None and torch.is_grad_enabled() and isinstance(src, torch.Tensor) \
            and src.requires_grad:
        raise RuntimeError("tessera.copy: argument 'src': copy does not support automatic "
                           "differentiation, but src requires grad (dst.copy_(src) does)")
    sv, dv = as_arg(torch, src, "copy", "src"), as_arg(torch, dst, "copy", "dst")
    if torch is not None and isinstance(dst, torch.Tensor):
        stream = torch_stream(dv)
    elif torch is not None and isinstance(src, torch.Tensor):
        stream = torch_stream(sv)
    else:
        stream = dlpack_stream(dst)
    _C.copy(sv, dv, stream)
    return dst


# ---- the gated products' helpers (tessera.transformers' MLPs, tessera.moe's experts) ---------

def _gate_torch(kind: str, x):
    """(act(x), act'(x)) in torch's operations: SiLU ("silu"), or GELU's tanh form."""
    torch = _state.torch_module
    if kind == "silu":
        s = torch.sigmoid(x)
        return x * s, s * (1 + x * (1 - s))
    c = (2 / torch.pi) ** 0.5
    t = torch.tanh(c * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)


def gated(kind: str, gate, up):
    """act(gate) * up: silu_mul ("silu") or geglu ("gelu_tanh")."""
    return silu_mul(gate, up) if kind == "silu" else geglu(gate, up)


def gated_backward(kind: str, grad, gate, up):
    """(grad_gate, grad_up) of act(gate) * up in one pass on CUDA (the backward ops); torch's
    composition elsewhere."""
    if gate.is_cuda:
        ops = _interop.needs_ops(kind, "needs")
        op = ops.silu_mul_backward if kind == "silu" else ops.geglu_backward
        return tuple(op(grad, gate, up))
    a, da = _gate_torch(kind, gate)
    return grad * up * da, grad * a


def gated_backward_recompute(kind: str, grad, gate, up):
    """(grad_gate, grad_up, act(gate) * up) in one pass on CUDA (the recompute backward ops);
    torch's composition elsewhere."""
    if gate.is_cuda:
        ops = _interop.needs_ops(kind, "needs")
        op = ops.silu_mul_backward_recompute if kind == "silu" else ops.geglu_backward_recompute
        return op(grad, gate, up)
    a, da = _gate_torch(kind, gate)
    return grad * up * da, grad * a, a * up
