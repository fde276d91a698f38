"""Mixture-of-Experts operators on torch tensors: a layer's (token, expert) pairs moved into expert
order and back, and the sort that says where each pair goes.

    rows, offs = tessera.moe_sort(top_k_index, num_experts)     # rows [T, k], offs [E] (int32)
    x_sorted = tessera.moe_permute(hidden, rows)                # [T k, H], grouped by expert
    h = tessera.grouped_mm(x_sorted, w_up, offs)                # each expert's rows times its weight
    ...
    out = tessera.moe_unpermute(y_sorted, rows, top_k_weights)  # [T, H]: sum_j w[t, j] y[rows[t, j]]

``rows[t, j]`` is the row, in expert order, of token t's j-th expert: a permutation of
[0, T k) (``moe_sort`` makes it from the router's top-k indices with a stable sort, so each
expert's tokens keep their order, and ``offs`` the experts' cumulative ends for
``grouped_mm``). ``moe_permute(input, rows, weight=None)`` writes ``weight[t, j] * input[t]``
to row ``rows[t, j]``; ``moe_unpermute(input, rows, weight=None)`` sums each token's k rows
with their weights in the order j = 0 .. k - 1, in float32: no atomics, the same bits on every
run. A row outside [0, T k) drops its pair. Tokens and pairs share a dtype (float32, float16,
bfloat16), their last dimension contiguous; ``weight`` [T, k] is float32, float16 or bfloat16.
Both are differentiable in ``input`` and ``weight``: each one's input gradient is the other op
(permute's an unpermute of the output's gradient, unpermute's a permute), and the weight's
gradient the dot product of the two rows a pair joins, taken in the same pass. CPU tensors take
the same arithmetic from torch's indexing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from . import _interop

if TYPE_CHECKING:
    import torch

__all__ = ["moe_sort", "moe_permute", "moe_unpermute"]


def _torch_of(x, arg: str, op: str):
    torch = _interop.torch_if_tensor(x, init=True)
    if torch is None:
        raise TypeError(f"tessera.{op}: argument '{arg}': expected a torch tensor, got {type(x).__name__}")
    return torch


def _check_rows(torch, rows, op: str):
    if rows.dtype != torch.int32 or rows.dim() != 2:
        raise TypeError(f"tessera.{op}: argument 'rows': expected a 2-d int32 tensor [tokens, k] "
                        f"(moe_sort's), got {rows.dim()}-d {rows.dtype}")


def moe_sort(top_k_index: torch.Tensor, num_experts: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows, offs) for the router's ``top_k_index`` [T, k] (any integer dtype): ``rows`` [T, k]
    int32, each pair's row in expert order (a stable sort: an expert's tokens keep their order);
    ``offs`` [num_experts] int32, the experts' cumulative ends (``grouped_mm``'s offsets). Nothing
    is read on the host. An index outside [0, num_experts) is sorted past the last expert's rows,
    which ``grouped_mm`` leaves zero."""
    torch = _torch_of(top_k_index, "top_k_index", "moe_sort")
    if top_k_index.dim() != 2 or top_k_index.is_floating_point():
        raise TypeError(f"tessera.moe_sort: argument 'top_k_index': expected a 2-d integer tensor [tokens, k], "
                        f"got {top_k_index.dim()}-d {top_k_index.dtype}")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"tessera.moe_sort: argument 'num_experts': expected a positive int, got {num_experts!r}")
    if top_k_index.shape[1] > num_experts:
        raise ValueError(f"tessera.moe_sort: argument 'top_k_index': expected k <= num_experts ({num_experts}), "
                         f"got k = {top_k_index.shape[1]}")
    ids = top_k_index.reshape(-1)
    # out-of-range indices sort last, past every expert's group
    ids = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    ids_sorted, perm = torch.sort(ids, stable=True)
    rows = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
    rows[perm] = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    # A histogram of fixed size (bincount's depends on the data, which torch.compile cannot trace);
    # CUDA's histc counts integers, the CPU's floats.
    counts = torch.histc(ids_sorted.int() if ids.is_cuda else ids_sorted.float(), bins=num_experts, min=0,
                         max=num_experts - 1)
    return rows.view(top_k_index.shape), torch.cumsum(counts, dim=0, dtype=torch.int32)


def _pairs_torch(torch, permute: bool, input, rows, weight):
    """The same arithmetic from torch's indexing (CPU tensors, dtypes tessera's kernels do not take)."""
    t, k = rows.shape
    flat = rows.reshape(-1).long()
    keep = (flat >= 0) & (flat < t * k)
    w = torch.ones(t * k, dtype=torch.float32, device=input.device) if weight is None else \
        weight.reshape(-1).float()
    w = torch.where(keep, w, torch.zeros_like(w))
    safe = torch.where(keep, flat, torch.zeros_like(flat))
    if permute:
        src = input.float().repeat_interleave(k, dim=0) * w[:, None]
        out = input.new_empty((t * k, input.shape[-1]))
        return out.index_put((flat[keep],), src[keep].to(input.dtype))
    return (input.float()[safe] * w[:, None]).view(t, k, -1).sum(1).to(input.dtype)


def _pairs(op: str, permute: bool, input, rows, weight):
    torch = _torch_of(input, "input", op)
    _torch_of(rows, "rows", op)
    _check_rows(torch, rows, op)
    if weight is not None:
        _torch_of(weight, "weight", op)
    if _interop.outside_kernels(input):
        return _pairs_torch(torch, permute, input, rows, weight)
    return getattr(_interop.needs_ops(op, "needs"), op).default(input, rows, weight)


def moe_permute(input: torch.Tensor, rows: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[T k, H]: row ``rows[t, j]`` is ``weight[t, j] * input[t]`` (weight None: ones), for
    ``input`` [T, H] and ``rows`` [T, k] int32; see the module's documentation. Differentiable."""
    return _pairs("moe_permute", True, input, rows, weight)


def moe_unpermute(input: torch.Tensor, rows: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[T, H]: ``out[t] = sum_j weight[t, j] * input[rows[t, j]]`` for ``input`` [T k, H] and
    ``rows`` [T, k] int32, summed in float32 in the order of j; see the module's documentation.
    Differentiable."""
    return _pairs("moe_unpermute", False, input, rows, weight)
