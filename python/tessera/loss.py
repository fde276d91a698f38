"""Cross-entropy on tessera's kernels, for torch tensors: the loss and its gradient in one pass over
the logits (the backward only scales the saved gradient, and skips even that where the loss
gradient is 1, as in training)."""

from __future__ import annotations

from typing import Any

from . import _interop


def _ops(torch):
    _interop.init_ops(torch)
    if _interop.ops is None:
        raise RuntimeError("tessera.cross_entropy: needs tessera's torch ops (a wheel built with torch "
                           "present: pip install --no-build-isolation .)")
    return _interop.ops


def cross_entropy(logits: Any, target: Any, *, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                  inplace_grad: bool = False, return_lse: bool = False) -> Any:
    """:func:`torch.nn.functional.cross_entropy` with class-index targets: logits (N, V) in
    float32, float16 or bfloat16 (the class dimension contiguous), target (N,) int64 or int32.
    Returns the float32 loss (a scalar for 'mean' and 'sum', (N,) for 'none'), and with
    ``return_lse`` also each row's float32 log-sum-exp.

    ``ignore_index``, ``reduction`` and ``label_smoothing`` are torch's ('mean' over the rows not
    ignored; all ignored: NaN). ``z_loss`` adds z_loss * lse^2 per row; ``softcap`` > 0 turns the
    logits into softcap * tanh(logits / softcap) first. A target out of range (and not ignored)
    gives NaN for its row (torch raises a device-side assertion instead).

    The gradient is computed in the forward's pass over the logits. ``inplace_grad=True`` writes
    it over the logits themselves (Liger's trick): training then needs no second N x V buffer,
    but the logits' values are gone after the call, and nothing else may need them (an op before
    this one that saved its output for its own backward). A second backward through the same loss
    (retain_graph) is refused: the saved gradient is scaled in place by the first.
    """
    torch = _interop.torch_if_tensor(logits)
    if torch is None:
        raise TypeError(f"tessera.cross_entropy: argument 'logits': expected a torch tensor, got {type(logits).__name__}")
    if logits.dim() == 1 and target.dim() == 0:  # one row, as torch takes it
        out = cross_entropy(logits[None], target[None], ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                            inplace_grad=inplace_grad, return_lse=return_lse)
        if reduction != "none":
            return out
        return (out[0][0], out[1][0]) if return_lse else out[0]
    if logits.dim() != 2:
        raise ValueError("tessera.cross_entropy: argument 'logits': expected (N, V) class scores (flatten (B, T, V) "
                         f"to (B * T, V)), got {logits.dim()}-d")
    if logits.stride(-1) != 1 and logits.size(-1) > 1:
        logits = logits.contiguous()  # the kernel reads rows of contiguous classes
    kw = dict(ignore_index=int(ignore_index), reduction=str(reduction), label_smoothing=float(label_smoothing),
              z_loss=float(z_loss), softcap=float(softcap or 0.0))
    ops = _ops(torch)
    if inplace_grad:
        loss, lse = ops.cross_entropy.inplace(logits, target, **kw)
    else:
        loss, lse, _ = ops.cross_entropy.default(logits, target, **kw)
    return (loss, lse) if return_lse else loss


_LCE = None  # the autograd Function, defined on first use (tessera never imports torch itself)


def _chunk_rows(torch, v: int, element_size: int, device, chunk_size) -> int:
    """Token rows per chunk: the caller's, else as many as keep one chunk's logits within a
    quarter of the free memory and 512 MB, in multiples of 256."""
    if chunk_size:
        return max(1, int(chunk_size))
    free, _ = torch.cuda.mem_get_info(device)
    budget = min(free // 4, 512 << 20)
    rows = budget // (v * element_size)
    return int(rows // 256 * 256) if rows >= 256 else int(max(1, rows))


def _lce_function(torch):
    global _LCE
    if _LCE is not None:
        return _LCE
    from .matrix import matmul

    def scale_(t, factor):
        """t (2-d) times a 0-d float32 device tensor, in place; nothing read where it is 1."""
        _ops(torch).cross_entropy.backward(factor, t if t.dim() == 2 else t.view(1, -1), reduction="mean")

    def chunks(hidden, weight, bias, target, kw, chunk, grad_rows=None, want_grad=True):
        """Per chunk of tokens: the logits (tessera's GEMM), the loss and gradient written over them
        (cross_entropy.inplace), then d_hidden and d_weight from that gradient (two more GEMMs).
        grad_rows: per-row factors of the loss gradient ('none'), applied before the GEMMs."""
        n, v = hidden.shape[0], weight.shape[0]
        losses, lses = [], []
        d_hidden = torch.empty_like(hidden) if want_grad else None
        d_weight = torch.empty_like(weight) if want_grad else None
        d_bias = torch.zeros(v, device=hidden.device, dtype=torch.float32) if want_grad and bias is not None else None
        for c0 in range(0, n, chunk):
            h = hidden[c0:c0 + chunk]
            logits = matmul(h, weight.t(), bias=bias)
            loss, lse = _ops(torch).cross_entropy.inplace(logits, target[c0:c0 + chunk], **kw)
            losses.append(loss)
            lses.append(lse)
            if not want_grad:
                del logits
                continue
            if grad_rows is not None:
                _ops(torch).cross_entropy.backward(grad_rows[c0:c0 + chunk], logits, reduction="none")
            matmul(logits, weight, out=d_hidden[c0:c0 + chunk])
            matmul(logits.t(), h, out=d_weight, beta=0.0 if c0 == 0 else 1.0)
            if d_bias is not None:
                d_bias += logits.sum(0, dtype=torch.float32)
            del logits  # freed before the next chunk's is allocated: one chunk's logits at a time
        return losses, lses, d_hidden, d_weight, d_bias

    class LinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, bias, target, kw, chunk):
            ctx.kw, ctx.chunk = kw, chunk
            ctx.bias_dtype = bias.dtype if bias is not None else None
            reduction = kw["reduction"]
            want = any(ctx.needs_input_grad[:3]) and reduction != "none"
            per_chunk = dict(kw, reduction="none" if reduction == "none" else "sum")
            losses, lses, dh, dw, db = chunks(hidden, weight, bias, target, per_chunk, chunk, want_grad=want)
            lse = torch.cat(lses)
            ctx.mark_non_differentiable(lse)
            if reduction == "none":
                ctx.save_for_backward(hidden, weight, bias, target)
                return torch.cat(losses), lse
            loss = torch.stack(losses).sum()
            if reduction == "mean":
                valid = (target != kw["ignore_index"]).sum().to(torch.float32)
                loss = loss / valid
                if want:
                    inv = 1.0 / valid
                    for t in (dh, dw, db):
                        if t is not None:
                            scale_(t, inv)
            ctx.save_for_backward(dh, dw, db)
            return loss, lse

        @staticmethod
        def backward(ctx, grad_loss, grad_lse):
            if ctx.kw["reduction"] == "none":  # per-row factors: the chunks again, scaled before the GEMMs
                hidden, weight, bias, target = ctx.saved_tensors
                kw = dict(ctx.kw, reduction="none")
                _, _, dh, dw, db = chunks(hidden, weight, bias, target, kw, ctx.chunk,
                                          grad_rows=grad_loss.to(torch.float32))
            else:
                dh, dw, db = ctx.saved_tensors
                g = grad_loss.to(torch.float32)
                for t in (dh, dw, db):
                    if t is not None:
                        scale_(t, g)
            return dh, dw, (db.to(ctx.bias_dtype) if db is not None else None), None, None, None

    _LCE = LinearCrossEntropy
    return _LCE


def linear_cross_entropy(hidden: Any, weight: Any, target: Any, bias: Any = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: float | None = None, chunk_size: int | None = None,
                         return_lse: bool = False) -> Any:
    """``cross_entropy(hidden @ weight.T + bias, target)`` without the (N, V) logits: hidden (N, H),
    weight (V, H) (a language model's output projection), target (N,), bias (V,) or None; the
    options are :func:`cross_entropy`'s.

    The tokens go in chunks (``chunk_size`` rows, by default as many as keep one chunk's logits
    within a quarter of the free memory and 512 MB): each chunk's logits come from tessera's
    GEMM, take their loss and gradient in place, and give d_hidden and d_weight through two more
    GEMMs, so the extra memory is one chunk's logits. For 'mean' and 'sum' the gradients are
    computed in the forward and the backward only scales them (nothing where the loss gradient
    is 1); for 'none' the backward runs the chunks again with each row's factor. d_weight
    accumulates over the chunks in the weight's dtype.
    """
    torch = _interop.torch_if_tensor(hidden)
    if torch is None:
        raise TypeError(f"tessera.linear_cross_entropy: argument 'hidden': expected a torch tensor, got "
                        f"{type(hidden).__name__}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError("tessera.linear_cross_entropy: arguments 'hidden', 'weight': expected (N, H) and (V, H), got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"tessera.linear_cross_entropy: argument 'reduction': expected 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    kw = dict(ignore_index=int(ignore_index), reduction=reduction, label_smoothing=float(label_smoothing),
              z_loss=float(z_loss), softcap=float(softcap or 0.0))
    chunk = _chunk_rows(torch, weight.shape[0], hidden.element_size(), hidden.device, chunk_size)
    fn = _lce_function(torch)
    loss, lse = fn.apply(hidden.contiguous(), weight.contiguous(), bias, target.contiguous(), kw, chunk)
    return (loss, lse) if return_lse else loss
