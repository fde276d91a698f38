"""``attn_implementation="tessera"`` for transformers models: tessera's FlashAttention behind
transformers' ``AttentionInterface``, registered by ``import tessera.transformers``.

transformers calls the function with q (batch, heads_q, seq_q, head_dim), k and v (batch, heads_kv,
seq_k, head_dim) and FlashAttention's mask (None, or a 2-d (batch, seq_k) padding mask: the mask
function registered beside it is transformers' flash_attention_mask). What it takes:
  - causal or not (the module's is_causal), GQA (heads_kv dividing heads_q), the module's scaling;
  - a sliding window of W keys (Mistral, Gemma 2): FlashAttention's (W - 1, W - 1) where seq_k > W;
  - Gemma 2's soft-cap of the scores;
  - padded batches (the 2-d mask): the tokens unpadded and run as packed sequences;
  - packed sequences of one row (DataCollatorWithFlattening): ``cu_seq_lens_q``/``_k`` and
    ``max_length_q``/``_k`` where the collator gives them, else the restarts of ``position_ids``;
    each sequence attends within itself, as transformers' flash-attention path does.
The packing of a batch (offsets, lengths, the rows kept), which waits on the device, is worked out
once per position_ids or mask tensor, not once per layer.
CUDA tensors of float32, float16 or bfloat16 without attention dropout run tessera.flash_attention
(or flash_attention_varlen); anything else runs the same contract in torch's operations, in float32
(``reference``), which is also what the CPU tests check the packing against.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

import tessera

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def reference(q, k, v, *, causal, scale, window=(-1, -1), softcap=0.0, dropout=0.0):
    """Attention of (batch, seq, heads, dim) tensors in float32, FlashAttention's masks (the causal
    diagonal at the bottom right, window sides counted from it); fully masked rows give 0."""
    sq, sk, hq, hk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(hq // hk, dim=2), v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= j <= i
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    if dropout:
        p = F.dropout(p, dropout)
    return torch.einsum("bhqk,bkhd->bqhd", p, v.float()).to(q.dtype)


def _dense(q, k, v, options, fast):
    if fast:
        return tessera.flash_attention(q, k, v, causal=options["causal"], softmax_scale=options["scale"],
                                       window_size=options["window"], softcap=options["softcap"])
    return reference(q, k, v, **options)


def _packed(q, k, v, cu_q, cu_k, max_q, max_k, options, fast):
    """q (total_q, heads, dim), k and v (total_k, ...): sequence i is rows cu[i]:cu[i + 1]."""
    if fast:
        return tessera.flash_attention_varlen(q, k, v, cu_q.int(), cu_k.int(), int(max_q), int(max_k),
                                              causal=options["causal"], softmax_scale=options["scale"],
                                              window_size=options["window"], softcap=options["softcap"])
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bq) - 1):
        out[bq[i]:bq[i + 1]] = reference(q[None, bq[i]:bq[i + 1]], k[None, bk[i]:bk[i + 1]],
                                         v[None, bk[i]:bk[i + 1]], **options)[0]
    return out


def _offsets(lengths):
    return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


# name -> (weak reference to a tensor, its version, what was computed from it): the packing of a
# batch, worked out once per forward rather than once per layer, as every layer is passed the same
# position_ids or mask and each working-out waits on the device.
_CACHE: dict = {}


def _once(name, t, compute):
    """compute(t), kept while t is the same tensor object, unmodified (not under torch.compile)."""
    if torch.compiler.is_compiling():
        return compute(t)
    ref, version, value = _CACHE.get(name, (None, None, None))
    if ref is not None and ref() is t and version == t._version:
        return value
    value = compute(t)
    _CACHE[name] = (weakref.ref(t), t._version, value)
    return value


def _packing(position_ids):
    """(offsets, longest) of the packed sequences of one row of position_ids, or None."""
    cu = _restarts(position_ids)
    return None if cu is None else (cu, int((cu[1:] - cu[:-1]).max()))


def _unpadding(mask, sq, sk):
    """The rows kept of a 2-d padding mask, for q (its last sq columns) and k, with each row's
    lengths, offsets and the longest."""
    keep_k = mask[:, -sk:].bool()
    keep_q = keep_k[:, -sq:]
    len_q, len_k = keep_q.sum(1), keep_k.sum(1)
    return (keep_q.reshape(-1).nonzero().view(-1), keep_k.reshape(-1).nonzero().view(-1), _offsets(len_q),
            _offsets(len_k), int(len_q.max()), int(len_k.max()))


def _restarts(position_ids):
    """The packed sequences of one row of position_ids (each restarting at its minimum), as
    cumulative offsets, or None where the row is one increasing sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1 or position_ids.shape[1] == 1:
        return None
    row = position_ids[0]
    starts = (row == row.min()).nonzero().view(-1)
    if starts.numel() < 2:
        return None
    return torch.cat((starts, torch.tensor([row.numel()], device=row.device))).to(torch.int32)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, **kwargs):
    """transformers' attention function: returns ((batch, seq_q, heads_q, dim) output, None)."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # FlashAttention's (batch, seq, heads, dim)
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (sliding_window - 1, sliding_window - 1) if sliding_window is not None and sk > sliding_window else (-1, -1)
    options = dict(causal=causal, scale=q.shape[-1] ** -0.5 if scaling is None else float(scaling), window=window,
                   softcap=float(softcap or 0.0))
    p = float(dropout or 0.0) if module.training else 0.0
    fast = q.is_cuda and q.dtype in _KERNEL_DTYPES and p == 0.0
    if not fast:
        options["dropout"] = p
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    if cu_q is None and attention_mask is None and b == 1 and position_ids is not None:
        packing = _once("position_ids", position_ids, _packing)
        if packing is not None:
            cu_q = cu_k = packing[0]
            kwargs.setdefault("max_length_q", packing[1])
            kwargs.setdefault("max_length_k", packing[1])
    if cu_q is not None and b == 1:  # packed sequences of one row
        max_q = kwargs.get("max_length_q") or int((cu_q[1:] - cu_q[:-1]).max())
        max_k = kwargs.get("max_length_k") or int((cu_k[1:] - cu_k[:-1]).max())
        out = _packed(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, options, fast)[None]
    elif attention_mask is not None and attention_mask.dim() == 2:  # padding: unpadded, packed
        rows_q, rows_k, cu_q, cu_k, max_q, max_k = _once(f"mask {sq} {sk}", attention_mask,
                                                         lambda m: _unpadding(m, sq, sk))
        packed = _packed(q.reshape(b * sq, *q.shape[2:])[rows_q], k.reshape(b * sk, *k.shape[2:])[rows_k],
                         v.reshape(b * sk, *v.shape[2:])[rows_k], cu_q, cu_k, max_q, max_k, options, fast)
        out = packed.new_zeros(b * sq, *packed.shape[1:])
        out[rows_q] = packed
        out = out.view(b, sq, *packed.shape[1:])
    elif attention_mask is not None:
        raise ValueError("tessera attention: expected FlashAttention's mask (None or a 2-d padding mask), got a "
                         f"{attention_mask.dim()}-d one (a custom 4-d mask needs attn_implementation='sdpa')")
    else:
        out = _dense(q, k, v, options, fast)
    return out.contiguous(), None


def register(transformers) -> None:
    """Makes attn_implementation="tessera" known to transformers (and its mask: FlashAttention's)."""
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    transformers.AttentionInterface.register("tessera", attention_forward)
    AttentionMaskInterface.register("tessera", flash_attention_mask)
