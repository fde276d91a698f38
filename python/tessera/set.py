"""Set operators with torch's signatures: isin.

    tessera.isin(elements, test_elements, *, assume_unique=False, invert=False)

as :func:`torch.isin`: a bool tensor shaped like ``elements``, True where an element is in
``test_elements`` (False with ``invert``). Either argument may be a Python number or a 0-d tensor;
the two are brought to one dtype by torch's promotion rules (torch.result_type) before the call.
Integer dtypes (int8 to int64, uint8, bool), float16, bfloat16, float32 and float64; NaN is never
found and -0.0 equals 0.0.

Paths (``path=``): 'brute_force' (one fused compare kernel, small test sets), 'sort' (CUB radix
sort of test_elements, then a binary search per element), 'hash' (a hash set of test_elements),
'bitmap' (8- and 16-bit dtypes: one presence bit per value), or 'automatic' (the default), which
picks one from the sizes with the crossovers measured on an H200 (benchmarks/set.py). The crossovers
are tunable: ``tessera.set.isin_thresholds`` holds the defaults each call uses.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

from . import _C, _interop, _state
from ._interop import (as_arg, dlpack_stream, torch_if_tensor, torch_stream_of_either, torch_view,
                       wrap_output)

if TYPE_CHECKING:
    from ._interop import TensorLike, TensorT

__all__ = ["isin", "isin_thresholds", "isin_path"]

# The automatic dispatch's crossovers (see IsinOptions in include/tessera/ops/set.hpp); change the
# values to retune every later call.
isin_thresholds: dict = dict(_C.ISIN_DEFAULTS)

PATHS = ("automatic", "brute_force", "sort", "hash", "bitmap")


def _path(path) -> str:
    if path not in PATHS:
        raise ValueError(f"tessera.isin: argument 'path': expected one of {', '.join(PATHS)}, "
                         f"got {path!r}")
    return path


def isin_path(dtype: str, num_elements: int, num_test: int) -> str:
    """The path ``isin``'s automatic dispatch takes for these sizes and a dtype name."""
    t = isin_thresholds
    return _C.isin_choose_path(dtype, int(num_elements), int(num_test), int(t["brute_force_max_test"]),
                               int(t["brute_force_max_work"]), int(t["hash_min_test"]))


def isin(elements: TensorT | float, test_elements: TensorT | float, *,
         assume_unique: bool = False, invert: bool = False, path: str = "automatic",
         out: TensorLike | None = None) -> TensorT:
    """``elements in test_elements``, elementwise, as :func:`torch.isin`.

    Args:
        elements: a CUDA tensor (any shape and strides) or a number.
        test_elements: a CUDA tensor or a number (at least one argument is a tensor).
        assume_unique: accepted for torch compatibility; no path here needs it.
        invert: return ``not in`` instead.
        path: 'automatic' (default), 'brute_force', 'sort', 'hash' or 'bitmap'.
        out: optional bool tensor of ``elements``' shape (not overlapping the inputs).
    """
    _path(path)
    if _is_number(elements) and _is_number(test_elements):
        raise TypeError("tessera.isin: argument 'elements': expected a tensor for at least one of "
                        "elements and test_elements, got two numbers")
    torch = torch_if_tensor(elements) or torch_if_tensor(test_elements)
    if torch is None:
        return _isin_dlpack(elements, test_elements, assume_unique, invert, path, out)
    if out is None and path == "automatic" and not any(
            isinstance(x, torch.Tensor) and x.is_cuda for x in (elements, test_elements)):
        # torch's contract: CPU tensors (no CUDA one) get torch's own isin.
        return torch.isin(elements, test_elements, assume_unique=assume_unique, invert=invert)
    elements, test_elements = _promote(torch, elements, test_elements)
    t = isin_thresholds
    if out is None and _state.ops is not None:
        return _state.ops.isin.default(
            elements, test_elements, assume_unique=bool(assume_unique), invert=bool(invert),
            path=path, brute_force_max_test=int(t["brute_force_max_test"]),
            brute_force_max_work=int(t["brute_force_max_work"]),
            hash_min_test=int(t["hash_min_test"]))
    ev = torch_view(elements)
    tv = torch_view(test_elements)
    if out is None:
        out = torch.empty(elements.shape, dtype=torch.bool, device=elements.device)
    _C.isin(ev, tv, as_arg(torch, out, "isin", "out"), bool(assume_unique), bool(invert), path,
            int(t["brute_force_max_test"]), int(t["brute_force_max_work"]), int(t["hash_min_test"]),
            torch_stream_of_either(ev, tv))
    return out


def _is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, complex)


def _promote(torch, elements, test_elements):
    """Both as tensors of one dtype on one device, by torch's rules for isin."""
    for name, x in (("elements", elements), ("test_elements", test_elements)):
        if not _is_number(x) and not isinstance(x, torch.Tensor):
            raise TypeError(f"tessera.isin: argument '{name}': expected a torch tensor or a real "
                            f"number, got {type(x).__name__}")
    dtype = torch.result_type(elements, test_elements)
    ref = elements if isinstance(elements, torch.Tensor) else test_elements
    device = ref.device
    # A 0-d CPU tensor next to a CUDA tensor counts as a number (as torch treats it).
    other = test_elements if ref is elements else elements
    if isinstance(other, torch.Tensor) and other.dim() == 0 and not other.is_cuda and ref.is_cuda:
        other = other.item()
        if ref is elements:
            test_elements = other
        else:
            elements = other

    def as_tensor(x):
        if isinstance(x, torch.Tensor):
            return x if x.dtype == dtype else x.to(dtype)
        return torch.tensor(x, dtype=dtype, device=device)

    return as_tensor(elements), as_tensor(test_elements)


def _isin_dlpack(elements, test_elements, assume_unique, invert, path, out):
    t = isin_thresholds
    result = _C.isin(as_arg(None, elements, "isin", "elements"),
                     as_arg(None, test_elements, "isin", "test_elements"),
                     as_arg(None, out, "isin", "out"), bool(assume_unique), bool(invert), path,
                     int(t["brute_force_max_test"]), int(t["brute_force_max_work"]),
                     int(t["hash_min_test"]), dlpack_stream(elements))
    return out if out is not None else wrap_output(elements, result)
