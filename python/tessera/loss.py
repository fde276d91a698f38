"""Cross-entropy on tessera's kernels, for torch tensors: the loss and its gradient in one pass over
the logits (the backward only scales the saved gradient, and skips even that where the loss
gradient is 1, as in training), against class indices or class probabilities, with torch's class
weights, ignore_index and label smoothing; and the distillation divergence ``jsd`` the same way."""

from __future__ import annotations

from typing import Any

from . import _interop, _state, _vocab_parallel
from ._surface import _FAST_INDEX

__all__ = ["cross_entropy", "linear_cross_entropy", "jsd"]


def _ops(torch):
    _interop.init_ops(torch)
    if _state.ops is None:
        raise RuntimeError("tessera.cross_entropy: needs tessera's torch ops (a wheel built with torch "
                           "present: pip install --no-build-isolation .)")
    return _state.ops


def cross_entropy(logits: Any, target: Any, weight: Any = None, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None, inplace_grad: bool = False, return_lse: bool = False,
                  validate: bool = False, return_token_accuracy: bool = False,
                  return_predicted_tokens: bool = False) -> Any:
    """:func:`torch.nn.functional.cross_entropy`: logits (N, V) (or one row, (V,)) in float32,
    float16 or bfloat16 (the class dimension contiguous) against ``target``, which is as torch's
    either class indices, (N,) int64 or int32, or class probabilities of the logits' shape
    (any float dtype; taken in the logits' dtype). Returns the float32 loss (a scalar for 'mean'
    and 'sum', (N,) for 'none'), and with ``return_lse`` also each row's float32 log-sum-exp.

    ``weight`` (a float tensor of V class weights; taken in float32), ``ignore_index``,
    ``reduction`` and ``label_smoothing`` are torch's: with class indices a row's loss is
    weight[target] * -log p[target] (smoothing adds label_smoothing / V * sum_c weight[c] *
    -log p[c]) and 'mean' divides by the sum of weight[target] over the rows not ignored (their
    count without weights; all ignored: NaN); with probabilities a row's loss is
    -sum_c weight[c] * q[c] * log p[c], q mixed with the uniform distribution by
    ``label_smoothing``, and 'mean' divides by N; ``ignore_index`` must then stay negative (torch's
    rule). ``z_loss`` adds z_loss * lse^2 per row, times the weight the row's loss puts on lse (1
    without class weights, for probabilities that sum to 1); ``softcap`` > 0 turns the logits into
    softcap * tanh(logits / softcap) first. A class index out of range (and not ignored) gives NaN
    for its row (torch raises a device-side assertion instead), or with ``validate=True`` a
    ValueError naming ``target`` before anything runs (one synchronization; Liger raises there).

    With class indices, ``return_token_accuracy=True`` also returns the fraction of the rows not
    ignored whose logits' argmax (the first of equal maxima) is the target (float32, NaN where
    every row is ignored), and ``return_predicted_tokens=True`` each row's argmax (the target's
    dtype, -1 where the row is ignored), Liger's metrics: torch's argmax, one more read of the
    logits, taken before an ``inplace_grad`` call overwrites them. The result is then ``(loss,
    [lse], [accuracy], [predicted])``, in that order, each only where asked for.

    The gradient is computed in the forward's pass over the logits. ``inplace_grad=True`` writes
    it over the logits themselves (Liger's trick): training then needs no second N x V buffer,
    but the logits' values are gone after the call, and nothing else may need them (an op before
    this one that saved its output for its own backward). A second backward through the same loss
    (retain_graph) is refused: the saved gradient is scaled in place by the first. Probability
    targets and class weights that require grad get their gradients too (from torch's ops in the
    backward; not with ``inplace_grad``), class weights only with probability targets (torch's
    nll_loss refuses them with class indices, and so does this).
    """
    torch = _interop.torch_if_tensor(logits)
    if torch is None:
        raise TypeError(f"tessera.cross_entropy: argument 'logits': expected a torch tensor, got {type(logits).__name__}")
    probs = isinstance(target, torch.Tensor) and target.shape == logits.shape  # torch's rule
    if logits.dim() == 1 and isinstance(target, torch.Tensor) and (target.dim() == 0 or probs):  # one row, as torch
        out = cross_entropy(logits[None], target[None], weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                            inplace_grad=inplace_grad, return_lse=return_lse,
                            return_token_accuracy=return_token_accuracy,
                            return_predicted_tokens=return_predicted_tokens)
        if reduction != "none":
            return out
        # 'none': the row's values without the row dimension (the accuracy is a scalar already)
        out = out if isinstance(out, tuple) else (out,)
        rowed = [r for r, on in ((True, True), (True, return_lse), (False, return_token_accuracy),
                                 (True, return_predicted_tokens)) if on]
        out = tuple(t[0] if r else t for t, r in zip(out, rowed))
        return out if len(out) > 1 else out[0]
    if logits.dim() != 2:
        raise ValueError("tessera.cross_entropy: argument 'logits': expected (N, V) class scores (flatten (B, T, V) "
                         f"to (B * T, V)), got {logits.dim()}-d")
    if validate and not probs:
        _validate_target(target, logits.shape[-1], ignore_index, "cross_entropy")
    metrics = ()
    if return_token_accuracy or return_predicted_tokens:
        if probs:
            raise ValueError("tessera.cross_entropy: argument 'return_token_accuracy' / 'return_predicted_tokens': "
                             "expected class-index targets, got class probabilities")
        metrics = _metrics(torch, logits, target, ignore_index, return_token_accuracy, return_predicted_tokens)
    if logits.stride(-1) != 1 and logits.size(-1) > 1:
        logits = logits.contiguous()  # the kernel reads rows of contiguous classes
    if probs and target.is_floating_point():
        if target.dtype != logits.dtype:
            target = target.to(logits.dtype)  # the kernel reads probabilities in the logits' dtype
        if not target.is_contiguous():
            target = target.contiguous()
    if isinstance(weight, torch.Tensor) and weight.is_floating_point():
        weight = weight.float().contiguous()  # the kernel reads float32 weights, one run of V
    # A DTensor sharded by rows: the op's sharding rule runs 'mean' replicated (a shard does not
    # know the whole batch's divisor), gathering the logits. Without class weights the divisor is
    # the rows not ignored (N for probabilities): the same mean from 'sum', which runs by rows (a
    # partial sum), over that count (two scalars all-reduced, no logits moved).
    mean_of_sum = reduction == "mean" and weight is None and _rows_sharded(torch, logits)
    kw = dict(ignore_index=int(ignore_index), reduction="sum" if mean_of_sum else str(reduction),
              label_smoothing=float(label_smoothing), z_loss=float(z_loss), softcap=float(softcap or 0.0))
    ops = _ops(torch)
    fast = _state.fast
    r = None
    if fast is not None and not inplace_grad and not _state.dynamo_compiling():
        # Plain CUDA tensors: the op's kernel, or where autograd records the call its autograd
        # kernel, from C++ (None for anything else).
        r = fast.call(_FAST_INDEX["cross_entropy"], logits, target, weight, kw["ignore_index"], kw["reduction"],
                      kw["label_smoothing"], kw["z_loss"], kw["softcap"], False)
    if r is not None:
        loss, lse, _ = r
    elif inplace_grad:
        loss, lse = ops.cross_entropy.inplace(logits, target, weight, **kw)
    else:
        loss, lse, _ = ops.cross_entropy.default(logits, target, weight, **kw)
    if mean_of_sum:
        loss = loss / (logits.shape[0] if probs else (target != int(ignore_index)).sum())
    out = (loss,) + ((lse,) if return_lse else ()) + metrics
    return out if len(out) > 1 else loss


def _metrics(torch, logits, target, ignore_index: int, accuracy: bool, predicted: bool) -> tuple:
    """(accuracy,) and/or (predicted tokens,) of class-index targets from torch's argmax."""
    with torch.no_grad():
        keep = target != int(ignore_index)
        pred = torch.where(keep, logits.argmax(-1).to(target.dtype), torch.full_like(target, -1))
        acc = (pred == target)[keep].float().mean() if accuracy else None
    return tuple(t for t, on in ((acc, accuracy), (pred, predicted)) if on)


def _validate_target(target, classes: int, ignore_index: int, op: str) -> None:
    """Class indices in [0, classes) or ignore_index, else a ValueError naming 'target'."""
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bool(bad.any()):
        raise ValueError(f"tessera.{op}: argument 'target': expected class indices in [0, {classes}) or "
                         f"ignore_index {ignore_index}, got {int(target[bad][0])}")


def _rows_sharded(torch, t) -> bool:
    """t is a DTensor whose rows (dimension 0) are sharded on a dimension of its mesh."""
    return type(t) is not torch.Tensor and any(p.is_shard(0) for p in getattr(t, "placements", ()))


def linear_cross_entropy(hidden: Any, weight: Any, target: Any, bias: Any = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: float | None = None, chunk_size: int | None = None,
                         return_lse: bool = False, ce_weight: Any = None, accum_dtype: Any = None,
                         return_token_accuracy: bool = False, validate: bool = False,
                         return_predicted_tokens: bool = False, use_token_scaling: bool = False) -> Any:
    """``cross_entropy(hidden @ weight.T + bias, target)`` without the (N, V) logits: hidden (N, H),
    weight (V, H) (a language model's output projection), target (N,), bias (V,) or None; the
    options are :func:`cross_entropy`'s, ``ce_weight`` its class weights (V values, taken in
    float32, not differentiated; 'mean' divides by the sum of the rows' target weights). With
    class weights, ``z_loss`` is :func:`cross_entropy`'s: z_loss * lse^2 times the row's weight on
    lse (Liger leaves the z-term unweighted).

    The tokens go in chunks (``chunk_size`` rows, by default as many as keep one chunk's logits
    within a quarter of the free memory and 512 MiB): each chunk's logits come from tessera's
    GEMM, take their loss and gradient in place, and give d_hidden and d_weight through two more
    GEMMs, so the extra memory is one chunk's logits (the op ``torch.ops.tessera.linear_cross_entropy``,
    C++ ``tessera::linear_cross_entropy``). For 'mean' and 'sum' the gradients are computed in the
    forward and the backward only scales them (nothing where the loss gradient is 1); for 'none'
    the backward runs the chunks again with each row's factor. d_weight accumulates over the
    chunks in the weight's dtype, or in ``accum_dtype=torch.float32`` (Liger's accum_dtype: a
    float32 (V, H) buffer, rounded to the weight's dtype once, in the backward).

    ``validate=True`` checks the class indices as :func:`cross_entropy`'s does.

    ``return_token_accuracy=True`` also returns the token accuracy that TRL's SFTTrainer logs
    (Liger's): the fraction of the rows not ignored whose logits' argmax is the target (a float32
    scalar, not differentiable; NaN where every row is ignored), at one more read of each chunk's
    logits. ``return_predicted_tokens=True`` also returns each row's argmax from the same pass (the
    target's dtype, -1 where the row is ignored). The result is ``(loss, [lse], [accuracy],
    [predicted])``, in that order, each only where asked for.

    ``use_token_scaling=True`` (Liger's): each row's loss and gradient times the probability the
    model gives its target, detached (exp(logit_t - lse), the target's logit from hidden . weight[t]
    rounded as the GEMM's; 0 for an ignored row); 'mean' keeps the divisor of the unscaled loss.
    It runs as reduction 'none', whose backward takes the chunks again: one more GEMM of three.

    A DTensor ``weight`` with its rows sharded on a 1-d mesh (tensor parallelism over the
    vocabulary) takes Megatron's vocabulary-parallel path: each rank's logits for its slice of the
    vocabulary, never gathered, combined through all-reduces of N floats (tessera/_vocab_parallel.py;
    hidden and target plain or replicated; no bias, smoothing, z-loss, soft-cap or class weights there
    yet).
    """
    torch = _interop.torch_if_tensor(hidden)
    if torch is None:
        raise TypeError(f"tessera.linear_cross_entropy: argument 'hidden': expected a torch tensor, got "
                        f"{type(hidden).__name__}")
    if validate:
        _validate_target(target, weight.shape[0], ignore_index, "linear_cross_entropy")
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"tessera.linear_cross_entropy: argument 'chunk_size': expected a count >= 1, got {chunk_size!r}")
    if use_token_scaling:
        return _token_scaled(torch, hidden, weight, target, bias, ignore_index=ignore_index, reduction=reduction,
                             label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap, chunk_size=chunk_size,
                             return_lse=return_lse, ce_weight=ce_weight, accum_dtype=accum_dtype,
                             return_token_accuracy=return_token_accuracy,
                             return_predicted_tokens=return_predicted_tokens)
    if _vocab_parallel.vocab_sharded(torch, weight):
        for name, value in (("ce_weight", ce_weight), ("accum_dtype", accum_dtype),
                            ("return_token_accuracy", return_token_accuracy or None),
                            ("return_predicted_tokens", return_predicted_tokens or None)):
            if value is not None:
                raise ValueError(f"tessera.linear_cross_entropy: argument '{name}': not taken with a "
                                 "vocabulary-sharded weight yet")
        return _vocab_parallel.linear_cross_entropy(torch, hidden, weight, target, bias, ignore_index, reduction,
                                                    label_smoothing, z_loss, softcap, chunk_size, return_lse)
    if isinstance(target, torch.Tensor) and not target.is_contiguous():
        target = target.contiguous()  # the kernels read the targets of a chunk as one run
    if ce_weight is not None:
        if isinstance(ce_weight, torch.Tensor) and ce_weight.requires_grad:
            raise ValueError("tessera.linear_cross_entropy: argument 'ce_weight': expected class weights that do "
                             "not require grad (no gradient with class-index targets, as torch's cross_entropy)")
        if isinstance(ce_weight, torch.Tensor) and ce_weight.is_floating_point():
            ce_weight = ce_weight.float().contiguous()  # the kernels read float32 weights, one run of V
    # as in cross_entropy: without class weights a row-sharded mean is a sum over the count
    mean_of_sum = reduction == "mean" and ce_weight is None and _rows_sharded(torch, hidden)
    loss, lse, _, _, _, accuracy, predicted = _ops(torch).linear_cross_entropy.default(
        hidden, weight, bias, target, ignore_index=int(ignore_index),
        reduction="sum" if mean_of_sum else str(reduction), label_smoothing=float(label_smoothing),
        z_loss=float(z_loss), softcap=float(softcap or 0.0), chunk_rows=int(chunk_size or 0), ce_weight=ce_weight,
        accum_dtype=accum_dtype, token_accuracy=bool(return_token_accuracy),
        predicted_tokens=bool(return_predicted_tokens))
    if mean_of_sum:
        loss = loss / (target != int(ignore_index)).sum()
    if reduction == "none" and loss.requires_grad and type(loss) is not torch.Tensor and hasattr(loss, "placements"):
        # A DTensor: the backward of 'none' takes the loss's gradient by keyword (grad_loss),
        # which DTensor does not redistribute, so its sharding rule runs by rows only where the
        # gradient comes placed as the loss; else it gathers the rows. Placed so here.
        placements = loss.placements
        loss.register_hook(lambda g: g if g.placements == placements else g.redistribute(g.device_mesh, placements))
    out = (loss,) + ((lse,) if return_lse else ()) + ((accuracy,) if return_token_accuracy else ()) + \
        ((predicted,) if return_predicted_tokens else ())
    return out if len(out) > 1 else loss


def _token_scaled(torch, hidden, weight, target, bias, *, reduction, return_lse, ce_weight, ignore_index,
                  return_token_accuracy, return_predicted_tokens, **kw):
    """linear_cross_entropy with use_token_scaling: the rows' losses (reduction 'none', with their
    lse) times each target's detached probability, then reduced."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"tessera.linear_cross_entropy: argument 'reduction': expected 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    out = linear_cross_entropy(hidden, weight, target, bias, reduction="none", return_lse=True, ce_weight=ce_weight,
                               ignore_index=ignore_index, return_token_accuracy=return_token_accuracy,
                               return_predicted_tokens=return_predicted_tokens, **kw)
    rows, lse, metrics = out[0], out[1], out[2:]
    with torch.no_grad():
        keep = target != int(ignore_index)
        t = torch.where(keep, target, 0).long()
        logit = torch.empty(t.shape, dtype=torch.float32, device=hidden.device)
        step = 4096  # rows a pass: a bounded gather of weight rows
        for r0 in range(0, t.shape[0], step):
            h, w = hidden[r0:r0 + step], weight[t[r0:r0 + step]]
            logit[r0:r0 + step] = (h.float() * w.float()).sum(-1) + (bias[t[r0:r0 + step]].float() if bias is not None
                                                                       else 0)
        logit = logit.to(hidden.dtype).float()  # the logits' rounding, as the GEMM writes them
        cap = kw.get("softcap")
        if cap:
            logit = cap * torch.tanh(logit / cap)
        p = torch.where(keep, torch.exp(logit - lse), torch.zeros_like(lse))
    loss = rows * p
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        divisor = keep.sum() if ce_weight is None else (ce_weight.float()[t] * keep).sum()
        loss = loss.sum() / divisor
    out = (loss,) + ((lse,) if return_lse else ()) + tuple(metrics)
    return out if len(out) > 1 else loss


def divergence_rows(torch, s, t, beta: float, temperature: float = 1.0):
    """Each row's divergence (beta 0: KL(teacher || student), 1: KL(student || teacher), else the
    generalized JSD with mixture weight beta) between the logits ``s`` and ``t`` at
    ``temperature``, in float32 by torch's functions (a teacher's padded vocabulary: the student's
    extra logits 0). tessera::jsd's reference, and its path where the kernel does not run."""
    import math
    F = torch.nn.functional
    if s.shape[-1] < t.shape[-1]:
        s = F.pad(s, (0, t.shape[-1] - s.shape[-1]))
    s = F.log_softmax(s.float() / temperature, dim=-1)
    t = F.log_softmax(t.float() / temperature, dim=-1)
    if beta == 0:
        d = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        d = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        m = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
        d = beta * F.kl_div(m, t, reduction="none", log_target=True) + (1 - beta) * F.kl_div(m, s, reduction="none",
                                                                                            log_target=True)
    return d.sum(-1)


_jsd_function = None


def jsd(student: Any, teacher: Any, target: Any = None, *, beta: float = 0.5, temperature: float = 1.0,
        ignore_index: int = -100, reduction: str = "mean") -> Any:
    """The divergence of a student's distribution from a teacher's over the last dimension (Liger's
    LigerJSD): ``beta`` 0 the forward KL(teacher || student), 1 the reverse KL(student || teacher),
    between them the generalized Jensen-Shannon divergence with mixture weight beta, of
    ``softmax(student / temperature)`` and ``softmax(teacher / temperature)`` (logits, or
    log-probabilities, which softmax leaves as they are). Rows whose ``target`` is
    ``ignore_index`` add 0; 'mean' divides the sum by the rows not ignored (NaN where there are
    none), 'sum', or 'none' (a float32 value per row). Differentiable in ``student`` (the teacher
    takes no gradient); on CUDA ``tessera::jsd`` computes each row's value and gradient in one
    kernel and the backward only scales the gradient; elsewhere torch's functions."""
    torch = _interop.torch_if_tensor(student)
    if torch is None:
        raise TypeError(f"tessera.jsd: argument 'student': expected a torch tensor, got {type(student).__name__}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"tessera.jsd: argument 'reduction': expected 'mean', 'sum' or 'none', got {reduction!r}")
    if not isinstance(teacher, torch.Tensor) or teacher.shape != student.shape:
        raise ValueError(f"tessera.jsd: argument 'teacher': expected a tensor of student's shape "
                         f"{tuple(student.shape)}, got {getattr(teacher, 'shape', type(teacher).__name__)}")
    if not 0 <= beta <= 1:
        raise ValueError(f"tessera.jsd: argument 'beta': expected a weight in [0, 1], got {beta}")
    if not temperature > 0:
        raise ValueError(f"tessera.jsd: argument 'temperature': expected > 0, got {temperature}")
    rows_shape = student.shape[:-1]
    if target is not None and tuple(target.shape) != tuple(rows_shape):
        raise ValueError(f"tessera.jsd: argument 'target': expected shape {tuple(rows_shape)} (a class index or "
                         f"ignore_index per row), got {tuple(target.shape)}")
    s2 = student.reshape(-1, student.shape[-1])
    t2 = teacher.detach().reshape(-1, student.shape[-1])
    y = None if target is None else target.reshape(-1)
    keep = None if y is None else y != ignore_index
    if s2.is_cuda and _state.ops is not None and hasattr(_state.ops, "jsd"):
        rows = _jsd_autograd(torch).apply(s2, t2.contiguous(), None if y is None else y.long().contiguous(),
                                          float(beta), float(temperature), int(ignore_index))
    else:
        rows = divergence_rows(torch, s2, t2, beta, temperature)
        if keep is not None:
            rows = rows * keep
    if reduction == "none":
        return rows.view(rows_shape)
    total = rows.sum()
    if reduction == "sum":
        return total
    count = rows.new_tensor(rows.shape[0]) if keep is None else keep.sum()
    return total / count


def _jsd_autograd(torch):
    """tessera::jsd under autograd: the forward keeps each row's gradient (for a row gradient of 1),
    the backward scales it by the rows' gradients in place (one backward)."""
    global _jsd_function
    if _jsd_function is None:
        class JSD(torch.autograd.Function):
            @staticmethod
            def forward(ctx, student, teacher, target, beta, temperature, ignore_index):
                want = ctx.needs_input_grad[0]
                loss, grad = _state.ops.jsd(student.contiguous(), teacher, target, beta=beta, temperature=temperature,
                                            ignore_index=ignore_index, with_grad=want)
                ctx.grad = grad
                return loss

            @staticmethod
            def backward(ctx, g):
                grad, ctx.grad = ctx.grad, None
                if grad is None:
                    raise RuntimeError("tessera.jsd: a second backward through one call (retain_graph): its gradient "
                                       "is computed in the forward and scaled in place by the first; call it again")
                _state.ops.cross_entropy.backward(g.float().contiguous(), grad, reduction="none")
                return grad, None, None, None, None, None

        _jsd_function = JSD
    return _jsd_function
