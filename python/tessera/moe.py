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

__all__ = ["moe_route", "moe_sort", "moe_permute", "moe_unpermute", "moe_experts", "moe_load_balancing_loss",
           "moe_z_loss"]


def _torch_of(x, arg: str, op: str):
    torch = _interop.torch_if_tensor(x, init=True)
    if torch is None:
        raise TypeError(f"tessera.{op}: argument '{arg}': expected a torch tensor, got {type(x).__name__}")
    return torch


def _check_rows(torch, rows, op: str):
    if rows.dtype != torch.int32 or rows.dim() != 2:
        raise TypeError(f"tessera.{op}: argument 'rows': expected a 2-d int32 tensor [tokens, k] "
                        f"(moe_sort's), got {rows.dim()}-d {rows.dtype}")


def moe_sort(top_k_index: torch.Tensor, num_experts: int, *, validate: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows, offs) for the router's ``top_k_index`` [T, k] (any integer dtype): ``rows`` [T, k]
    int32, each pair's row in expert order (a stable sort: an expert's tokens keep their order);
    ``offs`` [num_experts] int32, the experts' cumulative ends (``grouped_mm``'s offsets). Nothing
    is read on the host. A pair whose index is outside [0, num_experts) gets row -1: the
    permutations drop it (it adds nothing to its token's output), and the rows it would have taken,
    past ``offs[-1]``, are never written (transformers marks masked tokens so); ``validate=True``
    makes such an index a ValueError instead (one synchronization)."""
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
    valid = (ids >= 0) & (ids < num_experts)
    if validate and ids.numel() and not bool(valid.all()):
        raise ValueError(f"tessera.moe_sort: argument 'top_k_index': expected expert indices in [0, {num_experts}), "
                         f"got {int(ids.min())} .. {int(ids.max())}")
    ids = torch.where(valid, ids, num_experts)  # sorted last, past every expert's group
    ids_sorted, perm = torch.sort(ids, stable=True)
    rows = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
    rows[perm] = torch.arange(ids.numel(), dtype=torch.int32, device=ids.device)
    rows = torch.where(valid, rows, -1)  # their pairs dropped: written nowhere, read as zero
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


def moe_route(router_logits: torch.Tensor, k: int, *, scoring: str = "softmax", norm_topk_prob: bool = True,
              softmax_after_topk: bool = False, bias: Optional[torch.Tensor] = None, n_group: int = 1,
              topk_group: int = 1, routed_scaling_factor: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(top_k_weights [T, k] float32, top_k_index [T, k] int64) from the router's logits [T, E], as
    the families' routers compute them, differentiable in the logits:

    - ``scoring="softmax"`` (Qwen2/3-MoE, Mixtral): the softmax over all E experts in float32, its
      k largest, renormalized to sum 1 where ``norm_topk_prob``;
    - ``softmax_after_topk=True`` (gpt-oss): the k largest logits, then the softmax over those k;
    - ``scoring="sigmoid"`` (DeepSeek-V3): sigmoid scores; experts chosen by score + ``bias`` (the
      correction bias, [E], chosen by only), among the ``topk_group`` of ``n_group`` groups whose
      two best scores sum highest; weights the chosen scores, renormalized where
      ``norm_topk_prob``, times ``routed_scaling_factor``.

    The router's few bytes (T E logits) make this torch's ops: a fused kernel would save a small
    fraction of a millisecond per layer."""
    torch = _torch_of(router_logits, "router_logits", "moe_route")
    if router_logits.dim() != 2 or not router_logits.is_floating_point():
        raise TypeError(f"tessera.moe_route: argument 'router_logits': expected a 2-d float tensor [tokens, "
                        f"experts], got {router_logits.dim()}-d {router_logits.dtype}")
    experts = router_logits.shape[1]
    if not isinstance(k, int) or not 1 <= k <= experts:
        raise ValueError(f"tessera.moe_route: argument 'k': expected an int in [1, {experts}] (the experts), got {k!r}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"tessera.moe_route: argument 'scoring': expected 'softmax' or 'sigmoid', got {scoring!r}")
    if n_group < 1 or experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"tessera.moe_route: arguments 'n_group', 'topk_group': expected n_group dividing the "
                         f"{experts} experts and 1 <= topk_group <= n_group, got {n_group}, {topk_group}")
    if topk_group * (experts // n_group) < k:
        raise ValueError(f"tessera.moe_route: argument 'k': expected at most the {topk_group * (experts // n_group)} "
                         f"experts of the chosen groups, got {k}")
    logits = router_logits.float()
    if scoring == "softmax":
        if softmax_after_topk:
            top, index = torch.topk(logits, k, dim=-1)
            return torch.softmax(top, dim=-1), index
        top, index = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        return (top / top.sum(dim=-1, keepdim=True) if norm_topk_prob else top), index
    scores = torch.sigmoid(logits)
    choice = scores.detach() if bias is None else scores.detach() + bias.float()
    if n_group > 1:
        group = choice.view(-1, n_group, experts // n_group).topk(min(2, experts // n_group), dim=-1)[0].sum(-1)
        keep = torch.zeros_like(group).scatter_(1, group.topk(topk_group, dim=-1)[1], 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(experts // n_group, dim=1) == 0, float("-inf"))
    index = torch.topk(choice, k, dim=-1)[1]
    weights = scores.gather(1, index)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, index


def moe_load_balancing_loss(router_logits, num_experts: int, k: int,
                            attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Switch Transformer's auxiliary loss as transformers' MoE families compute it
    (``load_balancing_loss_func``, ``output_router_logits=True``): E * sum_e f_e P_e over every
    layer's tokens, f_e the fraction of (token, slot) pairs routed to expert e by the softmax's top
    k, P_e the mean router probability of e; tokens where ``attention_mask`` [B, S] is 0 left out.
    ``router_logits``: one [T, E] tensor or a sequence of them (one per layer)."""
    layers = [router_logits] if not isinstance(router_logits, (tuple, list)) else list(router_logits)
    torch = _torch_of(layers[0], "router_logits", "moe_load_balancing_loss")
    if not isinstance(k, int) or not 1 <= k <= num_experts:
        raise ValueError(f"tessera.moe_load_balancing_loss: argument 'k': expected an int in [1, {num_experts}], "
                         f"got {k!r}")
    device = layers[0].device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = 0.0
    mask = None if attention_mask is None else attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    for logits in layers:
        p = torch.softmax(logits.to(device).float(), dim=-1)
        chosen = torch.topk(p, k, dim=-1)[1].reshape(-1)
        weight = torch.ones_like(chosen, dtype=torch.float32) if mask is None else mask.repeat_interleave(k)
        counts = counts + torch.zeros_like(counts).scatter_add_(0, chosen, weight)
        probs = probs + (p if mask is None else p * mask[:, None]).sum(0)
        rows = rows + (p.shape[0] if mask is None else mask.sum())
    return num_experts * torch.sum((counts / rows) * (probs / rows))


def moe_z_loss(router_logits) -> torch.Tensor:
    """The router z-loss (ST-MoE): the mean over tokens of logsumexp(logits)^2, in float32, over
    one [T, E] tensor or a sequence of them (their tokens together)."""
    layers = [router_logits] if not isinstance(router_logits, (tuple, list)) else list(router_logits)
    torch = _torch_of(layers[0], "router_logits", "moe_z_loss")
    z = torch.cat([torch.logsumexp(x.float(), dim=-1) for x in layers])
    return (z * z).mean()


def _expert_of_rows(torch, offs, rows: int):
    """Each sorted row's expert (for per-expert biases), from the groups' cumulative ends."""
    return torch.searchsorted(offs, torch.arange(rows, device=offs.device, dtype=torch.int32),
                              right=True).clamp_(max=offs.shape[0] - 1)


def _gpt_oss_gate(torch, h, alpha: float, limit: float):
    """gpt-oss's experts' gate: interleaved (gate, up) pairs, clamped."""
    gate, up = h[..., ::2].clamp(max=limit), h[..., 1::2].clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _as_callable(act):
    """A gate kind ("silu", "gelu_tanh": act(gate) * up on concatenated halves) as a function."""
    if not isinstance(act, str):
        return act
    from . import elementwise
    return lambda h: elementwise.gated(act, *h.chunk(2, dim=-1))


def _wgrad(a, g, offs, like):
    """a^T g per group (offsets over a's rows) in the layout of `like` (a weight [E, K, N] or a
    transposed view of one [E, N, K]): the gradient born as the parameter lies, never copied."""
    from . import matrix
    if like.dim() == 3 and like.transpose(-2, -1).is_contiguous():
        return matrix.grouped_mm(g.transpose(0, 1), a, offs).transpose(-2, -1)
    return matrix.grouped_mm(a.transpose(0, 1), g, offs)


def _sorted_weights(torch, rows, weights):
    """Each sorted row's routing weight (float32; 0 for the rows no pair took)."""
    n = rows.numel()
    idx = rows.reshape(-1).long()
    w = torch.zeros(n + 1, dtype=torch.float32, device=rows.device)
    w.index_copy_(0, torch.where(idx < 0, n, idx), weights.reshape(-1).float())
    return w[:n]


class _Experts:
    """The routed SwiGLU / GeGLU experts as one autograd node (built on first use: torch is
    imported lazily). Held for the backward: the tokens (the caller's), the rows, offsets and
    weights, and the gate-up product h [T k, 2I]; the permuted tokens, the gated product and the
    down projection's rows are recomputed or never formed: the routing weights' gradient
    <dy_t, y_row> is <u, act(h)> with u = dy_t W2^T, which the backward computes anyway."""

    function = None

    @classmethod
    def apply(cls, *args):
        if cls.function is None:
            cls.function = cls._make()
        return cls.function.apply(*args)

    @staticmethod
    def _make():
        import torch
        from . import elementwise, matrix

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w1, w2, weights, rows, offs, kind):
                h = matrix.grouped_mm(moe_permute(x, rows), w1, offs)
                y = matrix.grouped_mm(elementwise.gated(kind, *h.chunk(2, dim=-1)), w2, offs)
                ctx.save_for_backward(x, w1, w2, weights, rows, offs, h)
                ctx.kind, ctx.spent = kind, False
                return moe_unpermute(y, rows, weights)

            @staticmethod
            def backward(ctx, grad):
                # Ordered, each buffer dropped after its last use and the gate-up product's
                # gradient written over h, so that the weights' gradients (the largest buffers)
                # meet as few others as the data allows. h is then spent: a second backward
                # (retain_graph) is refused.
                if ctx.spent:
                    raise RuntimeError("tessera.moe_experts: a second backward through the same call (retain_graph) "
                                       "is not supported: the first writes its gradients over the saved activations")
                ctx.spent = True
                x, w1, w2, weights, rows, offs, h = ctx.saved_tensors
                need_x, need_w1, need_w2, need_w = ctx.needs_input_grad[:4]
                dys = moe_permute(grad.contiguous(), rows)  # each pair's dy_t, unweighted
                u = matrix.grouped_mm(dys, w2.transpose(-2, -1), offs)
                gate, up = h.chunk(2, dim=-1)
                # for the unweighted dy (the gate's backward is linear in it): scaled below
                dgate, dup, a = elementwise.gated_backward_recompute(ctx.kind, u, gate, up)
                ws = _sorted_weights(torch, rows, weights)[:, None].to(u.dtype)
                dw = dx = dw1 = dw2 = None
                if need_w:  # <dy_t, y_row> = <u_row, act(h_row)>
                    # the products in u's dtype, summed in float32: one temporary the size of a
                    dots = torch.cat([(u * a).sum(-1, dtype=torch.float32), u.new_zeros(1, dtype=torch.float32)])
                    dw = dots[torch.where(rows < 0, u.shape[0], rows).long()].to(weights.dtype)
                del u
                if need_w2:
                    dw2 = _wgrad(a.mul_(ws), dys, offs, w2)
                del a, dys
                torch.mul(dgate, ws, out=gate)
                torch.mul(dup, ws, out=up)
                dh = h
                del dgate, dup
                if need_x:
                    dx = moe_unpermute(matrix.grouped_mm(dh, w1.transpose(-2, -1), offs), rows)
                if need_w1:
                    dw1 = _wgrad(moe_permute(x, rows), dh, offs, w1)
                return dx, dw1, dw2, dw, None, None, None

        return Function


def routed_experts(hidden_states, w1, w2, top_k_index, top_k_weights, num_experts: int, act, b1=None, b2=None,
                   post=None, validate: bool = False):
    """The routed experts on tessera's ops, for weights as x @ w ([E, H, 2I] or [E, H, I], and
    [E, I, H]; transposed views cost nothing): sort, permute, grouped products with ``act``
    between, the biases per row's expert, ``post`` on the down projection's rows, unpermute.
    ``act`` "silu" or "gelu_tanh" (a gate on concatenated halves) with no bias or post: one
    autograd node holding only the gate-up product (_Experts)."""
    import torch
    from . import matrix
    rows, offs = moe_sort(top_k_index, num_experts, validate=validate)
    if act in ("silu", "gelu_tanh") and b1 is None and b2 is None and post is None:
        return _Experts.apply(hidden_states, w1, w2, top_k_weights, rows, offs, act)
    act = _as_callable(act)
    x = moe_permute(hidden_states, rows)
    expert = _expert_of_rows(torch, offs, x.shape[0]) if b1 is not None or b2 is not None else None
    h = matrix.grouped_mm(x, w1, offs)
    h = act(h if b1 is None else h + b1[expert])
    y = matrix.grouped_mm(h, w2, offs)
    if b2 is not None:
        y = y + b2[expert]
    if post is not None:
        y = post(y)
    return moe_unpermute(y, rows, top_k_weights)


def moe_experts(hidden_states: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                top_k_index: Optional[torch.Tensor] = None, top_k_weights: Optional[torch.Tensor] = None, *,
                router_logits: Optional[torch.Tensor] = None, k: Optional[int] = None, activation: str = "swiglu",
                transposed: bool = False, gate_up_bias: Optional[torch.Tensor] = None,
                down_bias: Optional[torch.Tensor] = None, alpha: float = 1.702, limit: float = 7.0,
                group=None, validate: bool = False, **route) -> torch.Tensor:
    """A Mixture-of-Experts layer's routed experts: for every token t of ``hidden_states`` [..., H],
    ``sum_j w[t, j] * down_e(act(gate_up_e(x_t)))`` over its k experts e = ``top_k_index[t, j]``
    with weights ``top_k_weights`` [T, k], or the routing ``moe_route(router_logits, k, **route)``
    gives. The weights as transformers stores them: ``gate_up_proj`` [E, 2I, H] and ``down_proj``
    [E, H, I] (``transposed=True``: [E, H, 2I] and [E, I, H], gpt-oss's). ``activation``:
    'swiglu' (silu of the first half times the second), 'geglu' (gelu_tanh), 'gpt_oss' (interleaved
    pairs, the gate clamped to ``limit`` and ``(up + 1) * gate * sigmoid(alpha * gate)``), or an
    ungated 'silu', 'gelu', 'relu' (then ``gate_up_proj`` is the up projection [E, I, H]). Biases
    [E, 2I] and [E, H] per expert. Differentiable in everything but the indices; the tokens are
    sorted, the products grouped (``grouped_mm``), the pairs summed back in a fixed order
    (``moe_unpermute``): the same bits on every run. For 'swiglu' and 'geglu' without biases the
    layer is one autograd node that holds only the gate-up product (T k 2I elements) for the
    backward, recomputing the permuted tokens and the gated product there.

    ``validate=True`` checks the indices (``moe_sort``'s) at the cost of a synchronization.

    Expert parallelism: with ``group`` (a torch.distributed process group or a 1-d DeviceMesh)
    of W ranks, the weights (and biases) are this rank's E / W experts, rank r holding experts
    [r E / W, (r + 1) E / W), and the indices count all E. Each rank's sorted pairs go to the ranks
    of their experts and come back by two all-to-alls (differentiable: the backward is the same
    exchange reversed); the split sizes are read on the host, one synchronization a call."""
    torch = _torch_of(hidden_states, "hidden_states", "moe_experts")
    if (router_logits is None) == (top_k_index is None):
        raise ValueError("tessera.moe_experts: arguments 'top_k_index', 'router_logits': expected exactly one "
                         "(with top_k_weights, or with k)")
    if router_logits is not None:
        if k is None:
            raise ValueError("tessera.moe_experts: argument 'k': expected the experts per token with router_logits")
        top_k_weights, top_k_index = moe_route(router_logits, k, **route)
    elif top_k_weights is None or top_k_weights.shape != top_k_index.shape:
        raise ValueError("tessera.moe_experts: argument 'top_k_weights': expected top_k_index's shape "
                         f"{tuple(top_k_index.shape)}, got {None if top_k_weights is None else tuple(top_k_weights.shape)}")
    for arg, w in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
        if w.dim() != 3:
            raise ValueError(f"tessera.moe_experts: argument '{arg}': expected a 3-d [experts, out, in] tensor, "
                             f"got {w.dim()}-d")
    gated = activation in ("swiglu", "geglu", "gpt_oss")
    if not gated and activation not in ("silu", "gelu", "relu"):
        raise ValueError(f"tessera.moe_experts: argument 'activation': expected 'swiglu', 'geglu', 'gpt_oss', "
                         f"'silu', 'gelu' or 'relu', got {activation!r}")
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    index = top_k_index.reshape(x.shape[0], -1)
    weights = top_k_weights.reshape(index.shape)
    w1 = gate_up_proj if transposed else gate_up_proj.transpose(-2, -1)
    w2 = down_proj if transposed else down_proj.transpose(-2, -1)
    if activation in ("swiglu", "geglu"):
        act = "silu" if activation == "swiglu" else "gelu_tanh"
    elif gated:
        def act(h):
            return _gpt_oss_gate(torch, h, alpha, limit)
    else:
        act = {"silu": torch.nn.functional.silu, "relu": torch.relu,
               "gelu": torch.nn.functional.gelu}[activation]
    if validate and group is not None:
        moe_sort(index, gate_up_proj.shape[0] * _world(group), validate=True)
    if group is not None:
        return _expert_parallel(x, w1, w2, index, weights, act, gate_up_bias, down_bias, group).view(shape)
    return routed_experts(x, w1, w2, index, weights, gate_up_proj.shape[0], act, gate_up_bias, down_bias,
                          validate=validate).view(shape)


def _world(group) -> int:
    import torch.distributed as dist
    return dist.get_world_size(group.get_group() if hasattr(group, "get_group") else group)


def _expert_parallel(x, w1, w2, index, weights, act, b1, b2, group):
    """moe_experts over a process group: this rank's tokens to their experts' ranks and back."""
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single
    if hasattr(group, "get_group"):  # a DeviceMesh
        group = group.get_group()
    world = dist.get_world_size(group)
    local = w1.shape[0]
    rows, offs = moe_sort(index, local * world)
    sent = moe_permute(x, rows)  # in expert order: each rank's experts are one run of rows
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    got = torch.empty_like(counts)  # rank s's counts for each of this rank's experts, by s
    dist.all_to_all_single(got, counts, group=group)
    send = counts.view(world, local).sum(1).tolist()
    recv = got.view(world, local).sum(1).tolist()
    n = sum(send)  # pairs of an index out of range sort last and stay here, as zeros
    received = all_to_all_single(sent.new_empty(sum(recv), sent.shape[1]), sent[:n], recv, send, group=group)
    # the rows received run by source rank, then by this rank's expert: sorted again by expert
    expert = torch.arange(local, device=got.device).repeat(world).repeat_interleave(got.long(),
                                                                                   output_size=sum(recv))
    lrows, loffs = moe_sort(expert.view(-1, 1), local)
    from . import matrix
    h = matrix.grouped_mm(moe_permute(received, lrows), w1, loffs)
    ex = _expert_of_rows(torch, loffs, h.shape[0]) if b1 is not None or b2 is not None else None
    y = matrix.grouped_mm(_as_callable(act)(h if b1 is None else h + b1[ex]), w2, loffs)
    if b2 is not None:
        y = y + b2[ex]
    back = all_to_all_single(y.new_empty(n, y.shape[1]), moe_unpermute(y, lrows), send, recv, group=group)
    if n < sent.shape[0]:
        back = torch.cat([back, back.new_zeros(sent.shape[0] - n, back.shape[1])])
    return moe_unpermute(back, rows, weights)
