"""A loss on a language model's output projection whose gradients are computed in the forward,
one chunk of rows at a time: the mechanism under tessera.post_training's losses.

Each chunk's logits come from one GEMM, a row-wise kernel turns them into each row's value (its
-log p of the target, or its divergence from a teacher) and writes that value's gradient over
them, the loss's gradient with respect to the chunk's values (a function of the few values of
whole sequences, so computed by autograd on small tensors) scales those rows in place, and two
more GEMMs give d_hidden's rows and add to d_weight: three GEMMs a row, against four where the
values' gradients are known only in the backward. The rows are compacted first: a row that no
value needs (an ignored target, a masked completion token) takes no GEMM at all. The backward
only scales what the forward computed.

A chunk holds whole units (sequences, or pairs of them: what the loss couples) up to a memory
budget of logits; a unit larger than the budget is a chunk of its own.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from . import _interop, _state

BUDGET_BYTES = 512 << 20  # one chunk's logits, as linear_cross_entropy's default chunks


def plan_chunks(counts: Sequence[int], units: Sequence[Sequence[int]], row_bytes: int,
                budget: int | None = None) -> list[list[int]]:
    """Units (each a list of sequence indices) packed in order into chunks of at most ``budget``
    (BUDGET_BYTES) bytes of logits (``row_bytes`` a row), given each sequence's count of kept
    rows; returns each chunk's sequence indices."""
    budget = BUDGET_BYTES if budget is None else budget
    chunks, current, size = [], [], 0
    for unit in units:
        rows = sum(counts[s] for s in unit)
        if current and (size + rows) * row_bytes > budget:
            chunks.append(current)
            current, size = [], 0
        current.extend(unit)
        size += rows
    if current:
        chunks.append(current)
    return chunks


def kept_rows(torch, keep) -> tuple[Any, list[int], list[int]]:
    """(the flat indices of the kept rows of ``keep`` [B, S] in order, each sequence's count, each
    sequence's first position in that list): one synchronization."""
    flat = keep.reshape(-1).nonzero().squeeze(1)
    counts = keep.sum(-1).tolist()
    starts, total = [], 0
    for c in counts:
        starts.append(total)
        total += c
    return flat, counts, starts


def ce_and_grad(torch, logits, t, ignore_index: int):
    """Each row's cross-entropy on ``t`` and its gradient over the logits (float32; 0 on a row
    ignored), by torch's functions: the path where tessera's cross_entropy kernel does not run."""
    z = logits.float()
    nll = torch.nn.functional.cross_entropy(z, t, ignore_index=ignore_index, reduction="none")
    grad = torch.softmax(z, -1)
    grad[torch.arange(len(t)), t.clamp(min=0)] -= 1
    grad.mul_((t != ignore_index).unsqueeze(1))
    return nll, grad


def ce_rows(torch, target: Any, ignore_index: int):
    """A row function: each row's cross-entropy (-log p of ``target``'s entry for it), its gradient
    written over the logits; tessera's kernel on CUDA, torch's functions elsewhere."""
    def rows(logits, index):
        t = target[index]
        if logits.is_cuda:
            return _interop.needs_ops("post_training", "the fused losses need").cross_entropy.inplace(
                logits, t, None, ignore_index=int(ignore_index), reduction="none")[0]
        nll, grad = ce_and_grad(torch, logits, t, ignore_index)
        logits.copy_(grad)
        return nll
    return rows


def scale_rows(torch, grad, factor) -> None:
    """grad's rows times ``factor`` [n] (float32), in place."""
    if grad.is_cuda:
        _state.ops.cross_entropy.backward(factor.float().contiguous(), grad, reduction="none")
    else:
        grad.mul_(factor.to(grad.dtype).unsqueeze(1))


def fused_head_loss(torch, hidden, weight, bias, rows: Sequence[Any], row_fn: Callable, value_fn: Callable,
                    *, scale: float = 1.0, total: Callable | None = None, gemms: Any = None, factor: float = 1.0):
    """The loss sum over chunks of ``value_fn(values, i)``, where ``values`` (float32, a leaf)
    are ``row_fn(logits, rows[i])``'s for the logits ``(hidden[rows[i]] @ weight.T + bias) *
    scale`` of chunk i's rows (hidden [N, H], weight [V, H]); differentiable in hidden, weight and
    bias (those that require grad), the gradients computed here. ``value_fn`` may return None for
    a chunk whose rows' values are their own contributions (gradient 1 each). With ``total``,
    the loss's value is ``total()`` after the chunks (value_fn then gives each chunk's gradient
    only: a function of the whole batch, exact for the chunk's rows where the loss is a sum over
    the units the chunks hold). ``gemms`` (no bias, scale 1) computes a chunk's logits
    (``gemms.logits(x_rows)``), d_hidden's rows (``gemms.d_hidden(grad, alpha)``) and d_weight's
    part (``gemms.d_weight(grad, x_rows, alpha, accumulate, dw)``, into dw) in its own way
    (tessera.float8's, in float8; ``gemms.d_hidden(grad, alpha, out=dx[rows])`` where a chunk's rows
    are a slice). ``factor`` (a mean's 1 / count) multiplies the loss, folded into the gradients'
    GEMMs rather than a pass over them: a float, or with ``gemms`` a 0-d tensor (a count that the
    host has not read). ``rows`` index tensors, or slices of hidden's rows (views, no gathers)."""
    from . import matrix
    need = [t is not None and t.requires_grad for t in (hidden, weight, bias)]
    first = next((i for i, index in enumerate(rows) if _size(index)), len(rows))
    # d_hidden's rows: each written by its chunk where the chunks are slices covering them all
    whole = all(isinstance(index, slice) for index in rows) and sum(map(_size, rows)) == hidden.shape[0]
    dx = (torch.empty_like if whole else torch.zeros_like)(hidden) if need[0] else None
    # the first chunk's GEMM writes d_weight on the GPU (beta 0): nothing to zero there
    dw = (torch.empty_like if hidden.is_cuda and first < len(rows) else torch.zeros_like)(weight) if need[1] else None
    db = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need[2] else None
    value = torch.zeros((), dtype=torch.float32, device=hidden.device)
    alpha = scale * factor  # the gradients' GEMMs
    with torch.no_grad():
        x, w = hidden.detach(), weight.detach()
        b = None if bias is None else bias.detach() * scale
        for i, index in enumerate(rows):
            if _size(index) == 0:
                continue
            xc = x[index]
            if gemms is not None:
                logits = gemms.logits(xc)
            elif x.is_cuda:
                logits = matrix.matmul(xc, w.t(), bias=b, alpha=scale)
            else:
                logits = (xc @ w.t()) * scale + (0 if b is None else b.to(xc.dtype))
            values = row_fn(logits, index).float()
            with torch.enable_grad():
                leaf = values.detach().requires_grad_()
                part = value_fn(leaf, i)
                if part is None:
                    part = leaf.sum()
                else:
                    g = torch.autograd.grad(part, leaf, allow_unused=True)[0] if part.requires_grad else None
                    scale_rows(torch, logits, torch.zeros_like(leaf) if g is None else g)
            if total is None:
                value += part.detach()
            if dx is not None and gemms is not None and isinstance(index, slice):
                gemms.d_hidden(logits, alpha, out=dx[index])
            elif dx is not None:
                dx[index] = (gemms.d_hidden(logits, alpha) if gemms is not None else
                             matrix.matmul(logits, w, alpha=alpha) if x.is_cuda else (logits @ w) * alpha)
            if dw is not None:
                if gemms is not None:
                    gemms.d_weight(logits, xc, alpha, i > first, dw)
                elif x.is_cuda:  # d_weight accumulates in the weight's dtype, as linear_cross_entropy's
                    matrix.matmul(logits.t(), xc, alpha=alpha, beta=float(i > first), out=dw)
                else:
                    dw += (logits.t() @ xc) * alpha
            if db is not None:
                db += logits.sum(0, dtype=torch.float32) * alpha
    with torch.no_grad():
        if total is not None:
            value = total().float()
        if not (isinstance(factor, float) and factor == 1.0):
            value = value * factor
    return _saved().apply(value, hidden, weight, bias, dx, dw, None if db is None else db.to(bias.dtype))


_saved_cls = None


def _saved():
    """The autograd Function that hands out the forward's gradients (made at first use: tessera
    imports torch only when given tensors)."""
    global _saved_cls
    if _saved_cls is None:
        import torch

        class Saved(torch.autograd.Function):
            @staticmethod
            def forward(ctx, total, hidden, weight, bias, dx, dw, db):
                ctx.grads = (dx, dw, db)
                return total.clone()

            @staticmethod
            def backward(ctx, g):  # in place: the forward's gradients are used once
                if ctx.grads is None:
                    raise RuntimeError("tessera.post_training: a second backward through the loss (retain_graph): "
                                       "its gradients are computed in the forward and scaled in place by the "
                                       "first; compute the loss again instead")
                out = [None if d is None else _scaled_by(torch, d, g) for d in ctx.grads]
                ctx.grads = None
                return (None, *out, None, None, None)

        _saved_cls = Saved
    return _saved_cls


def _size(index) -> int:
    """A chunk's row count: an index tensor's or a slice's (start and stop given)."""
    return index.stop - index.start if isinstance(index, slice) else index.numel()


def _scaled_by(torch, d, g):
    """d times the loss's gradient g (0-d), in place: on CUDA by cross_entropy's backward kernel,
    which reads g on the device and leaves d alone where it is 1 (training's case: a pass over
    d_weight saved, without a host synchronization to learn it)."""
    if (_state.ops is not None and d.is_cuda and g.device == d.device and d.dim() in (1, 2) and d.is_contiguous()
            and d.dtype in (torch.float32, torch.float16, torch.bfloat16)):
        _state.ops.cross_entropy.backward(g.detach().float().reshape(()).contiguous(), d.view(-1, d.shape[-1]),
                                          reduction="sum")
        return d
    return d.mul_(g.to(d.dtype))
