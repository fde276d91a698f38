"""Elementwise operators with torch's signatures: add, gelu (and gelu's backward).

Every function takes torch tensors, or any CUDA array that speaks DLPack (cupy, jax, ...), and
returns the same kind it was given. All argument checks are the library's: a CPU tensor, an
unsupported dtype or mismatched shapes raise ValueError/TypeError with the C++ message, which names
the operator and its argument ('a', 'b' and 'out' for add; 'x' for gelu).

Autograd: when grad mode is on and a torch input requires grad, the call goes through a
torch.autograd.Function (gelu's backward runs tessera's gelu_backward kernel); otherwise it calls
the kernel directly, without autograd's cost per call.
"""

from __future__ import annotations

from . import _C
from ._interop import (as_arg, as_number, broadcast_shape, dlpack_stream, torch_if_tensor,
                       torch_stream, torch_view, wrap_output)

__all__ = ["add", "gelu", "gelu_backward"]


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

def add(input, other, *, alpha=1, out=None):
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
    torch = torch_if_tensor(input)
    if torch is None:
        return _add_dlpack(input, other, alpha, out)
    if isinstance(other, torch.Tensor):
        # torch accepts a 0-dim CPU tensor next to a CUDA one, as a number.
        if (other.dim() == 0 and input.is_cuda and not other.is_cuda and not other.requires_grad):
            other = other.item()
    elif as_number(other) is None:
        raise TypeError(f"tessera.add: argument 'b': expected a torch tensor or a real number "
                        f"(torch.from_dlpack converts other arrays), got {type(other).__name__}")
    if _requires_grad(torch, input, other):
        if out is not None:
            raise _no_grad_with_out("add")
        return _functions(torch).Add.apply(input, other, alpha)
    return _add_torch(torch, input, other, alpha, out)


def _add_torch(torch, a, b, alpha, out):
    av = torch_view(a)
    stream = torch_stream(av[4])
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
    stand_in = (av[0], av[1], (), (), av[4])
    op(av, bv, stand_in, float(alpha), stream)
    raise AssertionError("tessera.add: shapes that do not broadcast were accepted")  # unreachable


def _add_dlpack(input, other, alpha, out):
    torch = torch_if_tensor(other)
    a = as_arg(None, input, "add", "a")
    number = as_number(other)
    b = as_arg(torch, other, "add", "b") if number is None else number
    result = _C.add(a, b, as_arg(torch, out, "add", "out"), float(alpha), dlpack_stream(input))
    return out if out is not None else wrap_output(input, result)


# ---- gelu -------------------------------------------------------------------------------------

def gelu(input, approximate="none", *, out=None):
    """GELU, as :func:`torch.nn.functional.gelu`: ``x * Φ(x)`` with the erf form of the normal CDF
    (``approximate='none'``) or torch's tanh approximation (``approximate='tanh'``).

    ``out`` (not in torch's signature, keyword only) writes the result to a preallocated tensor of
    ``input``'s shape, dtype and device; it may be ``input`` itself.
    """
    tanh = _approximate(approximate, "gelu")
    torch = torch_if_tensor(input)
    if torch is None:
        stream = dlpack_stream(input)
        result = _C.gelu(as_arg(None, input, "gelu", "x"), as_arg(None, out, "gelu", "out"), tanh,
                         stream)
        return out if out is not None else wrap_output(input, result)
    if _requires_grad(torch, input):
        if out is not None:
            raise _no_grad_with_out("gelu")
        return _functions(torch).Gelu.apply(input, tanh)
    return _gelu_torch(torch, input, tanh, out)


def _gelu_torch(torch, x, tanh, out):
    xv = torch_view(x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.gelu(xv, as_arg(torch, out, "gelu", "out"), tanh, torch_stream(xv[4]))
    return out


def gelu_backward(grad_output, input, *, approximate="none", out=None):
    """Gradient of :func:`gelu` with respect to ``input``: ``grad_output * gelu'(input)``, as
    ``torch.ops.aten.gelu_backward``. Not differentiable itself."""
    tanh = _approximate(approximate, "gelu_backward")
    torch = torch_if_tensor(input)
    if torch is None:
        op = "gelu_backward"
        result = _C.gelu_backward(as_arg(torch_if_tensor(grad_output), grad_output, op, "grad_out"),
                                  as_arg(None, input, op, "x"), as_arg(None, out, op, "grad_in"),
                                  tanh, dlpack_stream(input))
        return out if out is not None else wrap_output(input, result)
    return _gelu_backward_torch(torch, grad_output, input, tanh, out)


def _gelu_backward_torch(torch, grad, x, tanh, out):
    xv = torch_view(x)
    gv = as_arg(torch, grad, "gelu_backward", "grad_out")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.gelu_backward(gv, xv, as_arg(torch, out, "gelu_backward", "grad_in"), tanh,
                     torch_stream(xv[4]))
    return out


# ---- autograd ---------------------------------------------------------------------------------

_autograd = None


def _functions(torch):
    """The autograd.Function classes, defined on first use (torch is optional)."""
    global _autograd
    if _autograd is None:
        _autograd = _define_functions(torch)
    return _autograd


def _define_functions(torch):
    from torch.autograd.function import once_differentiable

    class Add(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, alpha):
            ctx.alpha = alpha
            ctx.a_shape = a.shape
            ctx.b_shape = b.shape if isinstance(b, torch.Tensor) else None
            return _add_torch(torch, a, b, alpha, None)

        @staticmethod
        def backward(ctx, grad):
            # d/da = 1 and d/db = alpha, each summed over the dimensions it was broadcast along.
            # Written with torch ops, so it is itself differentiable.
            grad_a = grad_b = None
            if ctx.needs_input_grad[0]:
                grad_a = grad.sum_to_size(ctx.a_shape)
            if ctx.b_shape is not None and ctx.needs_input_grad[1]:
                g = grad if ctx.alpha == 1 else grad * ctx.alpha
                grad_b = g.sum_to_size(ctx.b_shape)
            return grad_a, grad_b, None

    class Gelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, tanh):
            ctx.save_for_backward(x)
            ctx.tanh = tanh
            return _gelu_torch(torch, x, tanh, None)

        @staticmethod
        @once_differentiable
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return _gelu_backward_torch(torch, grad, x, ctx.tanh, None), None

    class Functions:
        pass

    Functions.Add = Add
    Functions.Gelu = Gelu
    return Functions
