"""tessera.float8.linear_cross_entropy: a language model's output head and its cross-entropy with
its three GEMMs in float8, on tessera/_head_chunks.py's mechanism (chunks of the rows not ignored,
each chunk's gradient computed in the forward, the logits never all held).

The logits GEMM quantizes a chunk's hidden states and the weight along the hidden size; d_hidden's
quantizes the chunk's logits' gradient and the weight's columns along the vocabulary; d_weight's
(K = the chunk's rows) the same gradient's and hidden states' columns along the rows, quantized in
the same calls as their rows (tensorwise: one scale a chunk). Each chunk's d_weight is added into
the weight's gradient by scaled_mm's beta, in the weight's dtype, as tessera.linear_cross_entropy
adds its chunks; blockwise scales take no beta, so there d_weight runs in the weight's dtype. The
weight is quantized once a call, in both layouts (or once an optimizer step with
``cache_weights``). Imported by tessera/float8.py only.
"""

from __future__ import annotations

from types import SimpleNamespace

from . import _head_chunks
from . import float8 as f8


class _Gemms:
    """fused_head_loss's GEMMs by ``recipe``: on tessera.scaled_mm where float8._on_kernels says
    so, else emulated (quantized, dequantized, products in float32). d_weight (K = a chunk's rows)
    adds each chunk's product into the weight's gradient through scaled_mm's beta; block-wise
    scales take no beta, so there it runs in the weight's dtype."""

    def __init__(self, weight, recipe: str, cache: bool, want_dw: bool):
        self.act, self.wgt = f8._OPERANDS[recipe]
        self.kernels = f8._on_kernels(weight, recipe)
        self.fp8_dw = want_dw and recipe != "blockwise"
        self.columns = self.kernels and self.fp8_dw  # x's and the gradient's columns, for d_weight
        self.x_t = self.grad_t = None
        w = weight.detach()
        if not self.kernels:
            self.w = f8._fake(w, self.wgt)  # [V, H], K = H
            self.w_t = f8._fake(w.t().contiguous(), self.wgt)  # [H, V], K = V
        elif cache:  # keyed by the parameter itself, as Float8Linear's copies are
            self.q, self.s, _, _ = f8._weight_layouts(weight, self.wgt, False, True)
            _, _, self.q_t, self.s_t = f8._weight_layouts(weight, self.wgt, True, True)
        else:
            self.q, self.s, self.q_t, self.s_t = f8._quantize_both(w, self.wgt, True)

    def logits(self, x):
        """x [n, H] @ weight^T: [n, V] in x's dtype (x's columns kept for d_weight)."""
        if not self.kernels:
            return f8._cast(f8._fake(x, self.act) @ self.w.t(), x.dtype)
        qx, sx, *self.x_t = f8._quantize_both(x.contiguous(), self.act, self.columns)
        return f8._scaled(qx, sx, self.q.t(), f8._as_right(self.s, self.wgt), x.dtype)

    def d_hidden(self, grad, alpha=1.0, out=None):
        """alpha * grad [n, V] @ weight: [n, H] in grad's dtype, or into ``out`` (alpha, a float or
        a 0-d tensor, folded into grad's scales; grad's columns kept for d_weight)."""
        if not self.kernels:
            d = f8._cast((f8._fake(grad, self.act) @ self.w_t.t()) * alpha, grad.dtype)
            return d if out is None else out.copy_(d)
        qg, sg, *self.grad_t = f8._quantize_both(grad.contiguous(), self.act, self.columns)
        if out is None:
            return f8._scaled(qg, _times(sg, alpha), self.q_t.t(), self.s_t, grad.dtype)
        from . import matrix
        return matrix.scaled_mm(qg, self.q_t.t(), _times(sg, alpha), self.s_t, out=out)

    def d_weight(self, grad, x, alpha, accumulate: bool, dw):
        """dw = alpha * grad^T [V, n] @ x [n, H] (+ dw where ``accumulate``), K = the n rows (called
        under fused_head_loss's no_grad)."""
        from . import matrix
        if self.fp8_dw and self.kernels:
            (qg_t, sg_t), (qx_t, sx_t) = self.grad_t, self.x_t
            self.grad_t = self.x_t = None
            sg_t = sg_t.t() if sg_t.dim() else sg_t  # [V, 1]: scale_a for qg_t as the left operand
            matrix.scaled_mm(qg_t, qx_t.t(), _times(sg_t, alpha), sx_t, beta=float(accumulate), out=dw)
            return
        if self.fp8_dw:  # the emulation
            part = f8._fake(grad.t().contiguous(), self.act) @ f8._fake(x.t().contiguous(), self.act).t()
        elif grad.is_cuda:  # a 0-d tensor alpha (a count not read) scales the chunk's few rows of x
            scaled = isinstance(alpha, float)
            matrix.matmul(grad.t(), x if scaled else x * alpha, alpha=alpha if scaled else 1.0,
                          beta=float(accumulate), out=dw)
            return
        else:
            part = grad.t() @ x
        part = (part * alpha).to(dw.dtype)
        dw.add_(part) if accumulate else dw.copy_(part)


def _times(scale, alpha):
    """A dequantization scale times alpha (a float, or a 0-d tensor: never read on the host)."""
    return scale if isinstance(alpha, float) and alpha == 1.0 else scale * alpha


def head_loss(hidden, weight, target, recipe: str, ignore_index: int, reduction: str, cache: bool,
              compact_rows: bool = False):
    import torch
    name = "tessera.float8.linear_cross_entropy"
    f8._check_recipe(recipe)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError(f"{name}: argument 'hidden': expected a 2-d tensor [N, H], got "
                         f"{getattr(hidden, 'shape', type(hidden).__name__)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"{name}: argument 'weight': expected [V, {hidden.shape[1]}] (hidden's H), got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    if weight.dtype != hidden.dtype or hidden.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name}: argument 'weight': expected hidden's float dtype, got {weight.dtype} and "
                         f"{hidden.dtype}")
    if (not isinstance(target, torch.Tensor) or target.shape != hidden.shape[:1]
            or target.dtype not in (torch.int64, torch.int32)):
        raise ValueError(f"{name}: argument 'target': expected [{hidden.shape[0]}] class indices (int64 or "
                         f"int32), got {getattr(target, 'shape', type(target).__name__)} "
                         f"{getattr(target, 'dtype', '')}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{name}: argument 'reduction': expected 'mean' or 'sum', got {reduction!r}")
    # the weight [V, H] as a Linear's [out_features, in_features]: V is d_hidden's K, H the logits'
    misfit = f8._misfit(SimpleNamespace(out_features=weight.shape[0], in_features=weight.shape[1]), recipe)
    if misfit is not None:
        raise ValueError(f"{name}: argument 'weight': its {misfit[0]} ({list(weight.shape)}: [out_features, "
                         f"in_features]) must be a multiple of {misfit[1]} for the {recipe} recipe")
    target = target.to(hidden.device)
    n = hidden.shape[0]
    if compact_rows:  # the rows not ignored gathered: one host synchronization for their count
        index, _, _ = _head_chunks.kept_rows(torch, (target != ignore_index).reshape(1, -1))
        n = index.numel()
    # Chunks of the logits' budget, as even as 16-row multiples make them: d_weight's K (a chunk's
    # rows) is padded to 16 for the copy engine, which a whole chunk's gradient should not need.
    most = max(1, _head_chunks.BUDGET_BYTES // (weight.shape[0] * hidden.element_size()))
    chunks = max(1, -(-n // most))
    per = max(16, -(-n // chunks // 16) * 16)  # ceil(n / chunks), rounded up to 16
    if compact_rows:
        rows = [index[i:i + per] for i in range(0, n, per)]
    else:  # slices of every row, views: an ignored row's loss and gradient are zeros
        rows = [slice(i, min(i + per, n)) for i in range(0, n, per)]
    # Each row's gradient unscaled (its values are the loss's terms): the mean's 1 / count goes
    # into the gradients' GEMMs (d_hidden's through its scales), not over every chunk's logits:
    # a float where the count was read, else a 0-d tensor. Every row ignored: torch's 'mean',
    # 0 / 0, and zero gradients.
    count = n if compact_rows else (target != ignore_index).sum()
    factor = 1.0
    if reduction == "mean":
        factor = 1.0 / max(count, 1) if compact_rows else 1.0 / count.clamp(min=1).float()
    loss = _head_chunks.fused_head_loss(torch, hidden, weight, None, rows,
                                        _head_chunks.ce_rows(torch, target, ignore_index), lambda values, i: None,
                                        gemms=_Gemms(weight, recipe, cache, weight.requires_grad), factor=factor)
    if reduction == "mean" and compact_rows and not count:
        loss = loss + float("nan")  # its gradients zeros: there were no chunks
    elif reduction == "mean" and not compact_rows:
        loss = torch.where(count > 0, loss, torch.full_like(loss, float("nan")))
    return loss
