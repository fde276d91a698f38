"""Distillation on a student's and a teacher's output projections, without the whole logits
(tessera.post_training's jsd_loss and cosine_similarity_loss, Liger-Kernel's
LigerFusedLinearJSDLoss and LigerFusedLinearCosineSimilarityLoss): ``weight_hard_loss`` times the
student's cross-entropy on the labels plus ``weight_soft_loss`` times a soft term between the two
distributions, each a mean over the rows not ignored. The rows not ignored go in chunks sized by
memory (tessera/_head_chunks.py), each chunk's student and teacher logits from a GEMM; the soft
term, the cross-entropy and the student's gradient from the chunk's logits, written over them; the
gradients computed in the forward."""
from __future__ import annotations

from typing import Any, Callable

from . import _head_chunks, _interop, _state
from . import loss as _loss


def _hard_rows(torch, logits, y, ignore_index: int, with_grad: bool):
    """Each row's cross-entropy on ``y`` and (``with_grad``, on CUDA) its gradient over the
    logits, apart from them (the soft term's gradient replaces them): tessera's kernel on CUDA,
    else torch's functions (_head_chunks.ce_and_grad)."""
    ops = _state.ops
    if logits.is_cuda and ops is not None:
        hard, _, grad = ops.cross_entropy(logits, y, None, ignore_index=int(ignore_index), reduction="none",
                                          with_grad=with_grad)
        return hard.float(), grad
    return _head_chunks.ce_and_grad(torch, logits, y, ignore_index)


def _divergence(torch, logits, t, beta: float, temperature: float):
    """The generalized JSD (or either KL) of each row at ``temperature``, its gradient written over
    the student's logits: tessera's jsd kernel on CUDA where the vocabularies and dtypes match,
    else torch's functions (tessera.loss.divergence_rows)."""
    ops = _state.ops
    if logits.is_cuda and ops is not None and hasattr(ops, "jsd") and t.shape == logits.shape \
            and t.dtype == logits.dtype:
        return ops.jsd.inplace(logits, t, None, beta=float(beta), temperature=float(temperature))
    with torch.enable_grad():
        z = logits.detach().float().requires_grad_()
        soft = _loss.divergence_rows(torch, z, t, beta, temperature)
        grad, = torch.autograd.grad(soft.sum(), z)
    logits.copy_(grad)
    return soft.detach()


def _cosine(torch, logits, t, beta: float, temperature: float):
    """``beta * (1 - cos(s, t))`` of each row (the logits at ``temperature``, each normalized as
    torch.nn.functional.normalize does, eps 1e-12), its gradient written over the student's logits.
    With s, t normalized, d cos / d s = (t - cos s) / |s|; the temperature divides it once more."""
    s = logits.float() / temperature
    if s.shape[-1] < t.shape[-1]:  # a teacher's padded vocabulary: the student's extra logits 0
        s = torch.nn.functional.pad(s, (0, t.shape[-1] - s.shape[-1]))
    tt = t.float() / temperature
    ns = s.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    s_hat = s.div_(ns)
    t_hat = tt.div_(tt.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    cos = torch.bmm(s_hat.unsqueeze(1), t_hat.unsqueeze(2)).squeeze(2)  # [rows, 1], no [rows, V] product
    grad = t_hat.sub_(s_hat.mul_(cos)).div_(ns).mul_(-beta / temperature)
    if logits.shape[-1] < grad.shape[-1]:
        grad = grad[..., :logits.shape[-1]]
    logits.copy_(grad)
    return beta * (1 - cos.squeeze(-1))


def _rows(torch, soft_term: Callable, teacher_input, teacher_weight, teacher_bias, labels, weights, ignore_index,
          sums):
    """The row function of fused_head_loss: each kept row's ``weights[0]`` times its soft term plus
    ``weights[1]`` times its cross-entropy, their gradient over the student's logits; the two sums
    added to ``sums``."""
    from . import matrix
    soft_w, hard_w = weights

    def rows(logits, index):
        tx = teacher_input[index]
        if tx.is_cuda:
            t = matrix.matmul(tx, teacher_weight.t(), bias=teacher_bias)
        else:
            t = torch.nn.functional.linear(tx, teacher_weight, teacher_bias)
        hard, hard_grad = _hard_rows(torch, logits, labels[index], ignore_index, hard_w != 0)
        soft = soft_term(torch, logits, t)
        logits.mul_(soft_w)
        if hard_w != 0:
            logits.add_(hard_grad, alpha=hard_w)
        sums[0] += soft.sum()
        sums[1] += hard.sum()
        return soft_w * soft + hard_w * hard
    return rows


def _distill(op: str, soft_term: Callable, student_input, student_weight, teacher_input, teacher_weight,
             true_labels, student_bias, teacher_bias, weight_hard_loss: float, weight_soft_loss: float,
             ignore_index: int, temperature: float, return_soft_hard_loss: bool):
    torch = _interop.torch_if_tensor(student_input, init=True)
    if torch is None:
        raise TypeError(f"{op}: argument 'student_input': expected a torch tensor, got {type(student_input).__name__}")
    if temperature <= 0:
        raise ValueError(f"{op}: argument 'temperature': expected > 0, got {temperature}")
    if teacher_input.shape[0] != student_input.shape[0] or true_labels.shape != student_input.shape[:1]:
        raise ValueError(f"{op}: arguments 'teacher_input', 'true_labels': expected {student_input.shape[0]} rows "
                         f"as student_input, got {tuple(teacher_input.shape)} and {tuple(true_labels.shape)}")
    flat = (true_labels != ignore_index).nonzero().squeeze(1)
    valid = max(flat.numel(), 1)
    vocab = max(student_weight.shape[0], teacher_weight.shape[0])
    step = max(1, _head_chunks.BUDGET_BYTES // (2 * vocab * student_input.element_size()))  # student's, teacher's
    rows = [flat[i:i + step] for i in range(0, flat.numel(), step)]
    sums = [student_input.new_zeros((), dtype=torch.float32) for _ in range(2)]
    row_fn = _rows(torch, soft_term, teacher_input.detach(), teacher_weight.detach(),
                   None if teacher_bias is None else teacher_bias.detach(), true_labels,
                   (weight_soft_loss / valid, weight_hard_loss / valid), ignore_index, sums)
    loss = _head_chunks.fused_head_loss(torch, student_input, student_weight, student_bias, rows, row_fn,
                                        lambda values, i: None)
    return (loss, sums[0] / valid, sums[1] / valid) if return_soft_hard_loss else loss


def jsd_loss(student_input, student_weight, teacher_input, teacher_weight, true_labels, student_bias=None,
             teacher_bias=None, *, weight_hard_loss: float = 0.5, weight_soft_loss: float = 0.5, beta: float = 0.5,
             ignore_index: int = -100, temperature: float = 1.0, chunk_size: int = 1024,
             return_soft_hard_loss: bool = False) -> Any:
    """Distillation as Liger's LigerFusedLinearJSDLoss computes it: ``weight_hard_loss`` times the
    student's cross-entropy on ``true_labels`` [N] plus ``weight_soft_loss`` times the divergence
    between the student's and the teacher's distributions at ``temperature`` (``beta`` 0: the
    forward KL(teacher || student); 1: the reverse KL(student || teacher); between: the
    generalized JSD with mixture weight beta), each a mean over the rows not ignored. Inputs [N, H]
    (and [N, H_teacher]) with the output projections [V, H]. The rows not ignored go in chunks
    (``chunk_size`` is taken for Liger's signature: the chunks are sized by memory), each chunk's
    student and teacher logits from a GEMM, both terms and the student's gradient from one pass
    over them (tessera's jsd and cross_entropy kernels), the gradients computed in the forward.
    Returns the loss, or (loss, soft, hard) with ``return_soft_hard_loss`` (those two detached)."""
    op = "tessera.jsd_loss"
    if not 0 <= beta <= 1:
        raise ValueError(f"{op}: argument 'beta': expected a weight in [0, 1], got {beta}")
    return _distill(op, lambda torch, logits, t: _divergence(torch, logits, t, beta, temperature),
                    student_input, student_weight, teacher_input, teacher_weight, true_labels, student_bias,
                    teacher_bias, weight_hard_loss, weight_soft_loss, ignore_index, temperature, return_soft_hard_loss)


def cosine_similarity_loss(student_input, student_weight, teacher_input, teacher_weight, true_labels,
                           student_bias=None, teacher_bias=None, *, weight_hard_loss: float = 0.5,
                           weight_soft_loss: float = 0.5, beta: float = 0.5, ignore_index: int = -100,
                           temperature: float = 1.0, chunk_size: int = 1024,
                           return_soft_hard_loss: bool = False) -> Any:
    """Distillation as Liger's LigerFusedLinearCosineSimilarityLoss computes it: jsd_loss's with the
    soft term ``beta * (1 - cos)``, the cosine similarity of a row's student and teacher logits at
    ``temperature`` (which the cosine does not see but for its sign). Same inputs, chunks and
    returns as jsd_loss."""
    op = "tessera.cosine_similarity_loss"
    if not beta >= 0:
        raise ValueError(f"{op}: argument 'beta': expected a weight >= 0, got {beta}")
    return _distill(op, lambda torch, logits, t: _cosine(torch, logits, t, beta, temperature),
                    student_input, student_weight, teacher_input, teacher_weight, true_labels, student_bias,
                    teacher_bias, weight_hard_loss, weight_soft_loss, ignore_index, temperature, return_soft_hard_loss)
