"""Attention: ``softmax(scale * Q K^T, masked) V`` on tessera's kernels, for torch tensors.

Two layouts, one kernel (a transposed view costs nothing):

- :func:`scaled_dot_product_attention`: torch's signature and layout, (batch, heads, seq,
  head_dim), as :func:`torch.nn.functional.scaled_dot_product_attention`.
- :func:`flash_attention`: FlashAttention's, (batch, seq, heads, head_dim), with its options
  (bottom-right causal alignment, sliding window, soft-cap, ALiBi) and the log-sum-exp on request.

Both are differentiable (dq, dk, dv through autograd). The math is float32 whatever the dtype. On
the tensor-core backward, dq is summed across key tiles by atomic additions, so its last bits may
differ from run to run; ``deterministic=True`` (or torch's
``torch.use_deterministic_algorithms(True)`` for :func:`scaled_dot_product_attention`) sums in a
fixed order instead, somewhat slower. A
query that sees no key (causal with seq_q > seq_k, or a window) gets output 0, no NaN, and lse
+inf, as FlashAttention gives. On Hopper, bf16/fp16 at head_dim 64, 128 and 256 run the
tensor-core forward (the backward at head_dim 64 and 128); every other case runs the generic
kernels (head_dim up to 256).
"""

from __future__ import annotations

from typing import Any

from . import _interop, _state
from ._surface import op

__all__ = ["flash_attention", "flash_attention_varlen", "flash_attention_with_kvcache", "rotary_embedding",
           "scaled_dot_product_attention"]


def _ops(torch, name: str):
    _interop.init_ops(torch)
    ops = _state.ops
    if ops is None:
        raise RuntimeError(f"tessera.{name}: needs tessera's torch ops (a wheel built with torch "
                           "present: pip install --no-build-isolation .)")
    return ops


def flash_attention(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: float | None = None,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Any = None, return_lse: bool = False, deterministic: bool = False) -> Any:
    """Attention in FlashAttention's layout: q (batch, seq_q, heads_q, head_dim), k
    (batch, seq_k, heads_kv, head_dim), v (batch, seq_k, heads_kv, head_dim_v); heads_q a multiple
    of heads_kv (GQA and MQA, with no copy of k and v). Returns out (batch, seq_q, heads_q,
    head_dim_v), and with ``return_lse`` also the float32 log-sum-exp (batch, heads_q, seq_q).

    ``causal`` aligns the diagonal to the bottom right when seq_q != seq_k (query i sees key j
    where j <= i + seq_k - seq_q), as flash_attn_func does. ``window_size`` (left, right): keys
    that far before and after that diagonal (-1: unbounded; so is a side at or beyond seq_k, as in
    FlashAttention). ``softcap`` > 0 turns scores s into softcap * tanh(s / softcap).
    ``softmax_scale`` defaults to 1 / sqrt(head_dim).

    ``alibi_slopes``: ALiBi, as flash_attn_func takes it: a float32 CUDA tensor (heads_q,) or
    (batch, heads_q); the score of query i and key j (after the scale and the soft-cap) gets
    ``-slope * |i + seq_k - seq_q - j|``. Not differentiated (its gradient is None, as in
    FlashAttention). lse includes the bias (FlashAttention's causal kernel adds ``slope * j``
    instead: the same output, an lse larger by ``slope * (i + seq_k - seq_q)``).

    ``deterministic``: the backward's dq summed in a fixed order (the same bits every run).
    """
    torch = _interop.torch_if_tensor(q)
    if torch is None:
        raise TypeError(f"tessera.flash_attention: argument 'q': expected a torch tensor, got {type(q).__name__}")
    left, right = window_size
    if alibi_slopes is not None and type(q) is not torch.Tensor and hasattr(q, "placements"):  # DTensors
        alibi_slopes = _slopes_as_placed(q, k, alibi_slopes)
    out, lse = _ops(torch, "flash_attention").attention.default(
        q, k, v, causal=bool(causal), scale=None if softmax_scale is None else float(softmax_scale),
        window_left=int(left), window_right=int(right), softcap=float(softcap),
        deterministic=bool(deterministic), alibi_slopes=alibi_slopes)
    return (out, lse) if return_lse else out


def _slopes_as_placed(q, k, slopes):
    """For DTensors: ALiBi's slopes placed as the sharding rule of torch.ops.tessera.attention
    (tessera/_sharding.py) takes them beside q as it is: sharded with the heads (where the rule
    shards them: as many key heads as query heads, or GQA's key heads a multiple of the mesh's
    size) or, per sequence ((batch, heads)), with the batch. The op takes them by keyword, which
    DTensor does not redistribute; a replicated one is split here (a local slice)."""
    from torch.distributed.tensor import Replicate, Shard
    if not hasattr(slopes, "placements") or slopes.device_mesh != q.device_mesh:
        return slopes
    heads = k.dim() == 4 and (q.shape[2] == k.shape[2] or k.shape[2] % q.device_mesh.size() == 0)
    new = []
    for p, pq in zip(slopes.placements, q.placements):
        if not p.is_replicate():
            new.append(p)
        elif pq == Shard(2) and heads:
            new.append(Shard(slopes.dim() - 1))
        elif pq == Shard(0) and slopes.dim() == 2:
            new.append(Shard(0))
        else:
            new.append(Replicate())
    return slopes if new == list(slopes.placements) else slopes.redistribute(slopes.device_mesh, new)


def flash_attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                           max_seqlen_k: int, *, causal: bool = False, softmax_scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Any = None, return_lse: bool = False,
                           deterministic: bool = False) -> Any:
    """:func:`flash_attention` over packed sequences of different lengths, as flash_attn_varlen_func
    takes them: q (total_q, heads_q, head_dim), k and v (total_k, heads_kv, ...); sequence b is
    rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q (likewise for k and v), the offsets int32
    CUDA tensors of batch + 1 entries from 0. Masks and ALiBi apply within each sequence, with its
    own lengths (``alibi_slopes`` (heads_q,) or (batch, heads_q)); a window side at or beyond
    ``max_seqlen_k`` is unbounded. lse is (heads_q, total_q). The offsets are checked on the host
    (a copy and a wait on the stream): not increasing, not ending at the packed length, or a
    sequence longer than its max is a ValueError naming the argument.
    """
    torch = _interop.torch_if_tensor(q)
    if torch is None:
        raise TypeError(f"tessera.flash_attention_varlen: argument 'q': expected a torch tensor, got {type(q).__name__}")
    left, right = window_size
    out, lse = _ops(torch, "flash_attention_varlen").attention.varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal=bool(causal),
        scale=None if softmax_scale is None else float(softmax_scale), window_left=int(left),
        window_right=int(right), softcap=float(softcap), deterministic=bool(deterministic),
        alibi_slopes=alibi_slopes)
    return (out, lse) if return_lse else out


def flash_attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any = None, *,
                                 block_table: Any = None, causal: bool = False,
                                 softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                                 softcap: float = 0.0, alibi_slopes: Any = None,
                                 return_lse: bool = False) -> Any:
    """Attention of a few new queries against a KV cache, as flash_attn_with_kvcache takes one
    (generation). q (batch, seq_q, heads_q, head_dim); sequence b sees the first
    ``cache_seqlens[b]`` keys of its cache (an int32 CUDA tensor of batch lengths, an int for
    all, or None for the whole cache), and ``causal`` aligns its last query with its last key.

    Without ``block_table``: k_cache (batch, cache_len, heads_kv, head_dim), v_cache likewise.
    With one (a paged cache, as vLLM keeps it): ``block_table`` (batch, max_blocks) int32 names the
    cache blocks of each sequence in order, k_cache and v_cache (num_blocks, block_size, heads_kv,
    head_dim), any block size. Options and the returned lse are :func:`flash_attention`'s; ALiBi
    measures from each sequence's own length (its query i against key j gets
    ``-slope * |i + cache_seqlens[b] - seq_q - j|``), and a window side at or beyond the cache's
    capacity (cache_len, or max_blocks * block_size) is unbounded.

    The lengths and block ids are read on the GPU only, so the call can be captured in a CUDA
    graph: a length beyond the cache, or a block id outside it, turns that sequence's output into
    NaN (nothing outside the cache is read). Appending the new keys to the cache is the caller's
    (``k_cache[b, pos] = k``); inference only: no backward.
    """
    torch = _interop.torch_if_tensor(q)
    if torch is None:
        raise TypeError("tessera.flash_attention_with_kvcache: argument 'q': expected a torch tensor, "
                        f"got {type(q).__name__}")
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        if cache_seqlens is None:
            cache_seqlens = (block_table.size(-1) * k_cache.size(1) if block_table is not None
                             else k_cache.size(1))
        cache_seqlens = torch.full((q.size(0),), int(cache_seqlens), dtype=torch.int32, device=q.device)
    left, right = window_size
    out, lse = _ops(torch, "flash_attention_with_kvcache").attention.kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table, causal=bool(causal),
        scale=None if softmax_scale is None else float(softmax_scale), window_left=int(left),
        window_right=int(right), softcap=float(softcap), alibi_slopes=alibi_slopes)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False) -> Any:
    """:func:`torch.nn.functional.scaled_dot_product_attention` on tessera's kernels: query
    (batch, heads_q, seq_q, head_dim), key and value (batch, heads_kv, seq_k, ...).

    Calls tessera does not take are torch's own function, with torch's result or error: an
    ``attn_mask``, ``dropout_p`` > 0, inputs that are not 4-d CUDA float tensors of one dtype,
    ``is_causal`` with seq_q != seq_k (torch aligns that mask to the top left, FlashAttention to
    the bottom right), heads that differ without ``enable_gqa``, and head dimensions over 256.
    """
    torch = _interop.torch_if_tensor(query)
    if torch is None:
        raise TypeError("tessera.scaled_dot_product_attention: argument 'query': expected a torch tensor, "
                        f"got {type(query).__name__}")
    takes = (attn_mask is None and dropout_p == 0.0
             and not _interop.outside_kernels(query, key, value)
             and query.dim() == 4 and key.dim() == 4 and value.dim() == 4
             and (not is_causal or query.size(2) == key.size(2))
             and (query.size(1) == key.size(1) or enable_gqa)
             and query.size(-1) <= 256 and value.size(-1) <= 256
             and (scale is None or scale > 0))
    if not takes:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa)
    out, _ = _ops(torch, "scaled_dot_product_attention").attention.default(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=bool(is_causal),
        scale=None if scale is None else float(scale),
        deterministic=torch.are_deterministic_algorithms_enabled())
    return out.transpose(1, 2)


# ---- rotary position embedding --------------------------------------------------------------

@op("rotary_embedding")
def rotary_embedding(q: Any, k: Any, cos: Any, sin: Any, *, layout: str = "bshd", interleaved: bool = False,
                     seqlen_offset: int = 0, seqlen_offsets: Any = None) -> tuple[Any, Any]:
    """RoPE: ``(q, k)`` with each pair of a head's first ``rotary_dim`` features rotated by the
    angle of its position, ``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``, as FlashAttention's
    ``apply_rotary_emb`` (and Liger's ``liger_rotary_pos_emb``); features past ``rotary_dim`` are
    copied. One pass over q and k, forward and backward (the backward is the opposite rotation).

    Args:
        q, k: CUDA tensors of one float dtype, (batch, seq, heads, head_dim) for
            ``layout="bshd"`` (FlashAttention's) or (batch, heads, seq, head_dim) for ``"bhsd"``
            (torch SDPA's), the last dimension contiguous (slices of a packed qkv are fine); k may
            have fewer heads (GQA).
        cos, sin: (positions, rotary_dim / 2) or (batch or 1, positions, rotary_dim / 2), in
            float32 or q's dtype: row p holds position p's angles. Hugging Face's
            (batch or 1, positions, head_dim), each angle twice, is taken too, for a full
            rotary only (a last dimension below head_dim is read as FlashAttention's form: for
            a partial rotary pass ``cos[..., :rotary_dim // 2]``).
        interleaved: pairs (2i, 2i + 1) (GPT-J); else (i, i + rotary_dim / 2) (GPT-NeoX, Llama).
        seqlen_offset, seqlen_offsets: sequence index s sits at position ``seqlen_offset + s``,
            plus ``seqlen_offsets[b]`` (an int32 or int64 CUDA tensor, one per batch, for decode)
            where given: FlashAttention's ``seqlen_offsets``, an int or a tensor. A position
            outside cos's rows gives NaN features (torch's composition raises instead).

    Returns the rotated ``(q, k)``, new tensors of their shapes. Differentiable in q and k. Other
    tensors (CPU, float64) take torch's composition of the same contract.
    """
    torch = _state.torch_module
    if (_state.ops is not None and isinstance(q, _state.Tensor) and q.is_cuda and q.dtype in _state.FLOATS
            and isinstance(cos, torch.Tensor) and cos.dtype == torch.float32):
        # float32 angles beside a half-precision q: the kernels' own case, which the generic
        # route (one dtype for every tensor) passes here.
        return _state.ops.rotary_embedding.default(q, k, cos, sin, layout=layout, interleaved=interleaved,
                                                     seqlen_offset=seqlen_offset, seqlen_offsets=seqlen_offsets)
    return _rotary_torch(q, k, cos, sin, layout, interleaved, seqlen_offset, seqlen_offsets)


def _rotary_torch(q, k, cos, sin, layout, interleaved, offset, offsets):
    """rotary_embedding in torch's operations (float32 math, float64 for float64 tensors)."""
    torch = _state.torch_module
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"tessera.rotary_embedding: argument 'layout': expected 'bshd' or 'bhsd', got {layout!r}")
    seq_dim = 1 if layout == "bshd" else 2
    math_dtype = torch.promote_types(q.dtype, torch.float32)
    batch, seq, dim = q.shape[0], q.shape[seq_dim], q.shape[-1]

    def angles(c):  # (batch, seq, rotary_dim / 2) for each sequence index
        if c.shape[-1] == dim and dim > 1:  # Hugging Face's form: each angle twice
            c = c[..., ::2] if interleaved else c[..., :dim // 2]
        c = c.unsqueeze(0) if c.dim() == 2 else c
        pos = torch.arange(seq, device=c.device) + offset
        pos = pos.unsqueeze(0) + (offsets.to(c.device).long().unsqueeze(1) if offsets is not None else 0)
        pos = pos.expand(batch, seq)
        rows = torch.arange(batch, device=c.device).unsqueeze(1) if c.shape[0] > 1 else torch.zeros_like(pos[:, :1])
        a = c[rows, pos].to(math_dtype)
        return a.unsqueeze(2) if layout == "bshd" else a.unsqueeze(1)

    c, s = angles(cos), angles(sin)
    half = c.shape[-1]

    def rotate(x):
        xf = x.to(math_dtype)
        r = xf[..., :2 * half]
        x1, x2 = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :half], r[..., half:])
        o1, o2 = x1 * c - x2 * s, x1 * s + x2 * c
        out = torch.stack((o1, o2), -1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)
        return torch.cat((out, xf[..., 2 * half:]), -1).to(x.dtype)

    return rotate(q), rotate(k)
