"""Routing torch's own functions to tessera: ``tessera.enable()``, ``tessera.disable()``,
``with tessera.use_tessera():``.

While enabled, the aten ops behind torch.add, F.gelu, F.silu, torch.softmax / log_softmax,
F.layer_norm, F.rms_norm and torch.isin (and their backward ops) run tessera's kernels for the
CUDA dispatch key wherever tessera takes the arguments, and torch's own kernels otherwise (a CPU tensor,
float64, mixed dtypes, softmax's half_to_float, ...): never an error, never another result.
F.cross_entropy (aten's cross_entropy_loss, family "cross_entropy") is routed at the AutogradCUDA
key, since torch decomposes it before any backend kernel: tessera's fused loss and gradient for
class-index targets without class weights (the loss in the input's dtype, as torch's), torch's
decomposition otherwise. The
kernels are the torch library's (libtessera_torch.so, python/src/torch/routing.cpp); this module
chooses which ops and reads the counters.

The GEMMs (aten's mm, addmm and bmm, family "matmul": tessera's matmul where both operands are
row- or column-major) and attention (family "attention": the ops of F.scaled_dot_product_attention's
cuDNN backend, which torch picks on Hopper, forward and backward; tessera's attention where it
takes the call: no mask, no dropout, causal only with seq_q = seq_k; dq in a fixed order under
torch.use_deterministic_algorithms) are routable but not routed unless named: tessera's GEMM is
below cuBLAS on many shapes and its attention below cuDNN at short sequences (benchmarks/), so
``enable()`` leaves them to torch and ``enable(include=tessera.routable())`` routes everything.
A routed attention forward hands its lse to the routed backward only: switching routing between
a forward and its backward is not supported.

``include`` / ``exclude`` name ops by family ("softmax", "layer_norm", "matmul", ...; a family
brings its backward op) or by their aten names ("_softmax_backward_data", "addmm"). ``log=True`` counts, per aten op,
the calls that ran on tessera and on torch: ``tessera.routing_counts()``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

__all__ = ["enable", "disable", "use_tessera", "routing_counts", "routable"]

_state: tuple[list[str], bool] | None = None  # what is routed now, and whether it counts


def _ops():
    import torch  # routing is for torch users: importing torch here costs them nothing

    from . import _torch
    if _torch.ops is None:
        raise RuntimeError("tessera.enable: this tessera was built without its torch ops; "
                           "install it with `pip install --no-build-isolation .` where torch is")
    return torch.ops.tessera


_GEMMS = ("mm", "addmm", "bmm")
_ATTENTION = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")
_OPT_IN = _GEMMS + _ATTENTION


def _family(name: str) -> str:
    """The family of an aten op name: '_softmax_backward_data' -> 'softmax', 'addmm' -> 'matmul',
    'cross_entropy_loss' -> 'cross_entropy'."""
    if name in _GEMMS:
        return "matmul"
    if name in _ATTENTION:
        return "attention"
    base = name.split(".")[0].lstrip("_")
    for prefix in ("native_", "fused_"):
        base = base[len(prefix):] if base.startswith(prefix) else base
    for suffix in ("_backward_data", "_backward", "_loss"):
        base = base[:-len(suffix)] if base.endswith(suffix) else base
    return base


def routable() -> list[str]:
    """The aten ops tessera can route (names as torch.ops.aten spells them)."""
    return _ops()._route_names().split(",")


def _chosen(include: Iterable[str] | None, exclude: Iterable[str] | None) -> list[str]:
    names = routable()
    known = set(names) | {_family(n) for n in names}
    for arg, given in (("include", include), ("exclude", exclude)):
        for n in given or ():
            if n not in known:
                raise ValueError(f"tessera.enable: argument '{arg}': expected op names among "
                                 f"{sorted(known)}, got {n!r}")
    inc = None if include is None else set(include)
    exc = set(exclude or ())
    if inc is None:
        exc |= set(_OPT_IN)  # opt-in only (module docstring)
    return [n for n in names
            if (inc is None or n in inc or _family(n) in inc) and n not in exc
            and _family(n) not in exc]


def _route(names: list[str], log: bool) -> None:
    global _state
    with warnings.catch_warnings():  # torch warns once per aten kernel it sees replaced
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        _ops()._route(names, log)
    _state = (names, log) if names else None


def enable(include: Iterable[str] | None = None, exclude: Iterable[str] | None = None, *,
           log: bool = False) -> None:
    """Routes the chosen aten ops (where ``include`` is None: all but the GEMMs and attention) to tessera for
    CUDA tensors, replacing what was routed before."""
    _route(_chosen(include, exclude), bool(log))


def disable() -> None:
    """Gives every routed op back to torch's own kernels."""
    _route([], False)


@contextlib.contextmanager
def use_tessera(include: Iterable[str] | None = None, exclude: Iterable[str] | None = None, *,
                log: bool = False) -> Iterator[None]:
    """``enable()`` for the block; what was routed before (or nothing) afterwards."""
    before = _state
    enable(include, exclude, log=log)
    try:
        yield
    finally:
        _route(*before) if before else disable()


def routing_counts() -> dict[str, dict[str, int]]:
    """Per routable aten op, the calls that ran on tessera and on torch since enable(log=True)."""
    names = routable()
    c = _ops()._route_counts()
    return {n: {"tessera": c[2 * i], "torch": c[2 * i + 1]} for i, n in enumerate(names)}
