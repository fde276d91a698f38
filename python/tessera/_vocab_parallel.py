"""Vocabulary-parallel linear cross-entropy (Megatron's): ``linear_cross_entropy`` where the output
weight is a DTensor with its rows (the vocabulary) sharded over a 1-d mesh.

Each rank holds a slice of the vocabulary and the whole (replicated) hidden states. A rank's logits
for its slice come from tessera's GEMM, a chunk of rows at a time, and are never gathered: per row
only its log-sum-exp over the slice and, where the target falls in the slice, the target's logit
leave the chunk. Three all-reduces of N floats combine them (the max of the slices' log-sum-exps,
the sum of exp of each less that max, the target logits), so every rank holds the global
log-sum-exp and the loss. The backward runs the chunks again: softmax of the slice against the
global log-sum-exp, less one at the target, times the row's factor, gives d_weight for the slice
(complete: no other rank has those rows) and the slice's share of d_hidden, which is all-reduced.

Memory: one chunk's float32 logits (rows x vocabulary slice, at most 1 GiB by default) and a
float32 d_weight slice in the backward; no N x V tensor on any rank. Communication: 3 N floats
forward, N x H in the backward's d_hidden.

Supported: class-index targets, ignore_index, reduction 'mean', 'sum' or 'none'; no bias,
label smoothing, z-loss or soft-cap on this path yet (refused by name). Eager autograd
(torch.distributed's collectives inside an autograd.Function: torch.compile graph-breaks there).
"""

from __future__ import annotations

CHUNK_BYTES = 1 << 30  # one chunk's float32 logits


def vocab_sharded(torch, weight) -> bool:
    """weight is a DTensor on a 1-d mesh with its rows (the vocabulary) sharded."""
    placements = getattr(weight, "placements", None)
    return (type(weight) is not torch.Tensor and placements is not None and len(placements) == 1
            and placements[0].is_shard(0))


def _local(t):
    """A DTensor's local tensor (differentiable), anything else as it is."""
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t


def _mm(a, b):
    from .matrix import matmul
    return matmul(a, b)


def _chunk_rows(torch, n: int, v_local: int, chunk_size) -> int:
    if chunk_size:
        return max(1, min(n, int(chunk_size)))
    return max(1, min(n, CHUNK_BYTES // (4 * max(v_local, 1))))


def _make_function(torch):
    dist = torch.distributed

    class VocabParallelLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, w, target, start, group, ignore_index, reduction, chunk):
            n, v_local = hidden.shape[0], w.shape[0]
            t_local = target.long() - start
            valid = target != ignore_index
            owned = valid & (t_local >= 0) & (t_local < v_local)
            index = t_local.clamp(0, max(v_local - 1, 0))
            lse_local = torch.full((n,), float("-inf"), device=hidden.device)
            picked = torch.zeros(n, device=hidden.device)
            for r0 in range(0, n if v_local else 0, chunk):
                r1 = min(n, r0 + chunk)
                logits = _mm(hidden[r0:r1], w.t()).float()
                lse_local[r0:r1] = torch.logsumexp(logits, -1)
                picked[r0:r1] = logits.gather(1, index[r0:r1, None]).squeeze(1)
            picked = torch.where(owned, picked, torch.zeros_like(picked))
            m = lse_local.clone()
            dist.all_reduce(m, dist.ReduceOp.MAX, group=group)
            s = torch.where(torch.isinf(lse_local), torch.zeros_like(m), (lse_local - m).exp())
            dist.all_reduce(s, group=group)
            dist.all_reduce(picked, group=group)
            lse = m + s.log()
            rows = torch.where(valid, lse - picked, torch.zeros_like(lse))
            count = valid.sum()
            loss = rows.sum() / count if reduction == "mean" else rows.sum() if reduction == "sum" else rows
            ctx.save_for_backward(hidden, w, lse, index, owned, valid, count)
            ctx.args = (group, reduction, chunk)
            ctx.mark_non_differentiable(lse)
            return loss, lse

        @staticmethod
        def backward(ctx, grad_loss, _grad_lse):
            hidden, w, lse, index, owned, valid, count = ctx.saved_tensors
            group, reduction, chunk = ctx.args
            n, v_local = hidden.shape[0], w.shape[0]
            if reduction == "none":
                factor = grad_loss.float()
            else:
                factor = grad_loss.float().expand(n) / (count if reduction == "mean" else 1)
            factor = torch.where(valid, factor, torch.zeros_like(factor))
            d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
            d_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
            for r0 in range(0, n if v_local else 0, chunk):
                r1 = min(n, r0 + chunk)
                h = hidden[r0:r1]
                g = (_mm(h, w.t()).float() - lse[r0:r1, None]).exp_()
                g.scatter_add_(1, index[r0:r1, None], -owned[r0:r1, None].float())
                g = (g * factor[r0:r1, None]).to(hidden.dtype)
                d_hidden[r0:r1] = _mm(g, w).float()
                d_w += _mm(g.t(), h).float()
            dist.all_reduce(d_hidden, group=group)
            return d_hidden.to(hidden.dtype), d_w.to(w.dtype), None, None, None, None, None, None

    return VocabParallelLinearCrossEntropy


_FUNCTION = {}


def linear_cross_entropy(torch, hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                         z_loss, softcap, chunk_size, return_lse):
    """tessera.linear_cross_entropy for a vocabulary-sharded weight (see the module's docstring).
    hidden and target: plain tensors or replicated DTensors on the weight's mesh; returns the loss
    (and each row's float32 log-sum-exp) as plain tensors, or as replicated DTensors where hidden
    is one."""
    op = "tessera.linear_cross_entropy"
    for arg, value, unset in (("bias", bias, None), ("label_smoothing", label_smoothing, 0.0),
                              ("z_loss", z_loss, 0.0), ("softcap", softcap or None, None)):
        if value is not unset and value != unset:
            raise ValueError(f"{op}: argument '{arg}': not supported with a vocabulary-sharded weight "
                             f"(expected {unset!r}, got {value!r})")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: argument 'reduction': expected 'mean', 'sum' or 'none', got {reduction!r}")
    mesh = weight.device_mesh
    for arg, t in (("hidden", hidden), ("target", target)):
        placements = getattr(t, "placements", None)
        if placements is not None and not all(p.is_replicate() for p in placements):
            raise ValueError(f"{op}: argument '{arg}': with a vocabulary-sharded weight, expected a plain "
                             f"tensor or a replicated DTensor, got placements {tuple(placements)}")
    h, t, w = _local(hidden), _local(target), _local(weight)
    if h.dim() != 2 or t.dim() != 1 or t.shape[0] != h.shape[0] or w.dim() != 2 or w.shape[1] != h.shape[1]:
        raise ValueError(f"{op}: arguments: expected hidden (N, H), target (N,) and a weight of (V, H), got "
                         f"{list(h.shape)}, {list(t.shape)} and a local slice of {list(w.shape)}")
    group = mesh.get_group(0)
    dist = torch.distributed
    # The slice's first row: the slices' sizes gathered (whatever rule split the vocabulary).
    sizes = [torch.zeros(1, dtype=torch.long, device=w.device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([w.shape[0]], device=w.device), group=group)
    start = int(sum(int(x) for x in sizes[:dist.get_rank(group)]))
    if torch not in _FUNCTION:
        _FUNCTION[torch] = _make_function(torch)
    loss, lse = _FUNCTION[torch].apply(h, w, t.contiguous(), start, group, int(ignore_index), reduction,
                                       _chunk_rows(torch, h.shape[0], w.shape[0], chunk_size))
    if hasattr(hidden, "placements"):
        from torch.distributed.tensor import DTensor, Replicate
        loss = DTensor.from_local(loss, mesh, [Replicate()], run_check=False)
        lse = DTensor.from_local(lse, mesh, [Replicate()], run_check=False)
    return (loss, lse) if return_lse else loss

