"""How Python tensors reach the extension: view tuples for torch, DLPack for everything else.

The view tuple is the extension's format: python/src/tensors.hpp defines its fields and exports
their names, in order, as ``_C.VIEW_FIELDS``; the dtype codes are ``_C.DTYPES``. This module is the
only Python code that builds or reads one (torch_view, stand_in, torch_stream*); it builds them in
the order of ``_C.VIEW_FIELDS``, which it checks once, at import.

torch is never imported here: a torch tensor can only exist once the user has imported torch, so
``sys.modules`` tells whether an argument can be one. The same holds for cupy.
"""

from __future__ import annotations

import numbers
import sys
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Union

from . import _C, _state

if TYPE_CHECKING:
    import torch

# The order torch_view and stand_in write the fields in; a mismatch would hand the extension raw
# pointers in the wrong places, so it stops the import.
if _C.VIEW_FIELDS != ("data_ptr", "dtype", "shape", "strides", "device_index"):
    raise ImportError(f"tessera._interop builds view tuples that tessera._C does not read: "
                      f"_C.VIEW_FIELDS is {_C.VIEW_FIELDS}")


# Type annotations of the public functions (for type checkers; nothing here runs per call).
class SupportsDLPack(Protocol):
    """An array that speaks DLPack: cupy, jax, tessera.DeviceArray, ..."""

    def __dlpack__(self, *, stream: Any = ...) -> Any: ...

    def __dlpack_device__(self) -> tuple[int, int]: ...


# A tensor argument: a torch tensor (torch is only imported by type checkers) or a DLPack array.
TensorLike = Union["torch.Tensor", SupportsDLPack]
# An operator returns the kind of tensor it was given (torch for torch, cupy for cupy); for other
# DLPack producers it returns a tessera.DeviceArray, which this annotation does not tell apart.
TensorT = TypeVar("TensorT", bound=TensorLike)

# torch.dtype -> tessera dtype code, built the first time a torch tensor is seen.
_torch_codes: dict | None = None
_torch_raw_stream = None
def torch_if_tensor(x, init=False):
    """The torch module when ``x`` is a torch tensor, else None; with ``init``, tessera's torch ops
    are loaded (init_ops) the first time one is seen."""
    if _state.Tensor is not None:  # torch seen: no lookup in sys.modules, which torch.compile traces
        return _state.torch_module if isinstance(x, _state.Tensor) else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if init:
            init_ops(torch)
        return torch
    return None


def _init_torch(torch) -> None:
    global _torch_codes, _torch_raw_stream
    codes = {}
    for name, code in _C.DTYPES.items():
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            codes[dt] = code
    # The raw handle of the current stream in one call (what torch.compile's generated code uses);
    # the public spelling builds a Stream object first.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _torch_raw_stream = raw if raw is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)
    _torch_codes = codes
    init_ops(torch)


def init_ops(torch) -> None:
    """Loads tessera's torch ops (tessera._torch), which fill in tessera._state."""
    if _state.Tensor is None:
        from . import _torch  # noqa: F401 (its import fills in _state)


def outside_kernels(first, *rest, dtypes=None, cast=None, devices=True) -> bool:
    """torch's contract for the signatures tessera mirrors: True where ``first`` is a torch tensor
    that tessera's kernels do not take (not a CUDA tensor, or of a dtype outside ``dtypes``, by
    default FLOATS), or where a torch tensor among ``rest`` differs from it in dtype or device
    (None and other objects are ignored). ``cast``: the dtype the call converts ``first`` to
    first (softmax's dtype=), if any. The public functions give those calls to torch's own
    function: torch's result, or torch's error. Arrays that are not torch tensors keep tessera's
    errors. ``devices=False``: a device that differs stays with tessera, whose error names the
    argument (where torch refuses the call too: a parameter on another device)."""
    torch = torch_if_tensor(first)
    if torch is None:
        return False
    init_ops(torch)
    dtype = first.dtype if cast is None else cast
    if not first.is_cuda or dtype not in (_state.FLOATS if dtypes is None else dtypes):
        return True
    for t in rest:
        if isinstance(t, torch.Tensor) and (t.dtype != dtype or (devices and t.device != first.device)):
            return True
    return False


def torch_view(t) -> tuple:
    """The view tuple of a torch tensor (fields: _C.VIEW_FIELDS)."""
    if _torch_codes is None:
        _init_torch(sys.modules["torch"])
    code = _torch_codes.get(t.dtype)
    if code is None:  # a dtype tessera does not represent: pass its name for the error message
        code = str(t.dtype).replace("torch.", "")
    return (t.data_ptr(), code, t.shape, t.stride(), t.get_device() if t.is_cuda else -1)


def as_arg(torch, x, op: str, arg: str):
    """What the extension takes for a tensor argument: a view tuple for a torch tensor, the object
    itself (a DLPack producer) otherwise. A Python tuple is refused here: the extension would read
    it as a view tuple, that is, as raw pointers."""
    if torch is not None and isinstance(x, torch.Tensor):
        return torch_view(x)
    if isinstance(x, tuple):
        raise TypeError(f"tessera.{op}: argument '{arg}': expected a tensor (a torch tensor, or an "
                        "array with __dlpack__ and __dlpack_device__), got tuple")
    return x


def stand_in(view) -> tuple:
    """A 0-d view of ``view``'s first element: an output the library refuses (for its shape)
    before writing anything, for calls whose real output cannot be allocated."""
    return (view[0], view[1], (), (), view[4])


def torch_stream(view) -> int:
    """Handle of torch's current stream on the device of a view tuple; 0 for a tensor not on a
    CUDA device."""
    device_index = view[4]
    if device_index < 0:
        return 0
    if _torch_raw_stream is None:
        _init_torch(sys.modules["torch"])
    return _torch_raw_stream(device_index)


def torch_stream_of_either(first, second) -> int:
    """torch_stream of ``first``, or of ``second`` where ``first`` is not on a CUDA device."""
    return torch_stream(first if first[4] >= 0 else second)


def is_cupy(x) -> bool:
    return type(x).__module__.startswith("cupy")


def dlpack_stream(x) -> int:
    """The stream to launch on for a non-torch input: cupy's current stream for a cupy array,
    else the legacy default stream (0)."""
    if is_cupy(x):
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def wrap_output(like, arr):
    """A DeviceArray made for input ``like``, as ``like``'s kind of array where we know it."""
    if arr is not None and is_cupy(like):
        return sys.modules["cupy"].from_dlpack(arr)
    return arr


def as_number(x):
    """x as a float when it is a real Python (or numpy) number, else None."""
    if type(x) is float or type(x) is int or type(x) is bool:
        return float(x)
    if isinstance(x, numbers.Real):
        return float(x)
    return None


def broadcast_shape(a, b):
    """torch's broadcast of two shapes, or None when they do not broadcast."""
    if a == b:
        return tuple(a)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def needs_ops(op: str, what: str = "autograd needs"):
    """tessera's torch ops (torch.ops.tessera), the one autograd there is (C++); a clear error
    where this installation was built without them (`what` says what needs them)."""
    if _state.ops is None:
        raise RuntimeError(
            f"tessera.{op}: {what} tessera's torch ops (libtessera_torch.so), which this "
            "installation lacks: it was built where torch could not be imported. Reinstall with "
            "torch present: pip install --no-build-isolation <path to tessera>")
    return _state.ops
