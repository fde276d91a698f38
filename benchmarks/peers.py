"""Liger-Kernel (pip install liger-kernel: Triton kernels, pure Python) as a benchmark peer, where
`liger_kernel` imports; imported by benchmarks/llama_ops.py and benchmarks/cross_entropy.py.

    LIGER     liger_kernel.ops (Liger's autograd Functions), or None where it does not import
    VERSION   its version ("0.8.5"), or None
    MISSING   why it did not import ("" where it did)
    describe()                 "liger-kernel 0.8.5", or MISSING
    llama_case(op, c, rest)    Liger's function for a case of llama_ops.py, or None
    cross_entropy(logits, target), linear_cross_entropy(hidden, weight, target)

Every call goes through Liger's public autograd Functions (liger_kernel.ops.Liger*Function.apply,
what liger_kernel.transformers.functional and Liger's modules call), with Liger's defaults unless
said below. What their source (liger-kernel 0.8.5) does that a benchmark must know:
- In place. LigerRMSNormFunction (in_place=True, its default) writes dX over the incoming
  gradient; LigerSiLUMulFunction's backward writes the gradients of a and b over a and b;
  LigerRopeFunction rotates q and k in place, and in its backward the incoming gradients;
  LigerCrossEntropyFunction writes the gradient over the logits in its forward (and scales it
  there in its backward). So a caller timing repeated calls gives Liger inputs and gradients of
  its own (the values change from call to call, the work does not), and checks its results on a
  fresh copy first.
- RMSNorm: casting_mode "llama" (Liger's default, Hugging Face's Llama): the inverse RMS in
  float32, x * rstd rounded to the input's dtype, then times the weight; F.rms_norm rounds once.
  Within bf16 rounding of each other.
- Fused add + RMSNorm (LigerFusedAddRMSNormFunction): returns (norm(x + r), x + r), as
  tessera.add_rms_norm and the llama_ops case do.
- RoPE (LigerRopeFunction, what liger_rotary_pos_emb dispatches to): q, k of (batch, heads, seq,
  head_dim) and cos, sin as Hugging Face's rotary embedding gives them, (1, seq, head_dim) with the
  two halves repeated (cat(freqs, freqs)), NeoX halves rotated. llama_case passes the case's
  (batch, seq, heads, head_dim) tensors as transposed views (no copy: Liger's kernel works on the
  (batch, seq, heads, head_dim) memory, as under Hugging Face's attention) and transposes the
  results back; cos and sin (seq, head_dim / 2), float32, are repeated to that layout once,
  outside the timing (float32 as the other providers get them).
- Cross-entropy (LigerCrossEntropyFunction): class weights, ignore_index and label smoothing as
  torch's; the loss in the logits' dtype (bf16 per-row losses, summed).
- Fused linear cross-entropy (LigerFusedLinearCrossEntropyFunction): accum_dtype None, its
  default (the weight gradient accumulated over chunks in the weight's dtype).
Liger returns (loss, z_loss, accuracy, predicted tokens) from both losses: the loss alone here.
"""

from __future__ import annotations

import importlib.metadata

import torch

try:
    import liger_kernel.ops as LIGER
    MISSING = ""
except Exception as e:  # noqa: BLE001 - an optional peer: whatever stops its import leaves it out
    LIGER = None
    MISSING = f"liger_kernel does not import ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"


def _version() -> str:
    for name in ("liger-kernel", "liger_kernel"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "unknown"


VERSION = _version() if LIGER is not None else None


def describe() -> str:
    return f"liger-kernel {VERSION}" if LIGER is not None else MISSING


def _rope(q, k, cos, sin):
    oq, ok = LIGER.LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return oq.transpose(1, 2), ok.transpose(1, 2)


def llama_case(op: str, c, rest: list):
    """(fn, rest) for llama_ops' case `op` at the model `c` (its eps): fn takes the case's
    differentiable inputs and then `rest`, the case's other inputs as Liger takes them (converted
    here, once); None where Liger has no such op or does not import."""
    if LIGER is None:
        return None
    if op == "rms_norm":
        return (lambda x, w: LIGER.LigerRMSNormFunction.apply(x, w, c.eps)), rest
    if op == "add_rms_norm":
        return (lambda x, r, w: LIGER.LigerFusedAddRMSNormFunction.apply(x, r, w, c.eps)), rest
    if op == "rotary":
        return _rope, [torch.cat((t, t), -1)[None] for t in rest]
    if op == "silu_mul":
        return (lambda g, u: LIGER.LigerSiLUMulFunction.apply(g, u)), rest
    if op == "geglu":
        return (lambda g, u: LIGER.LigerGELUMulFunction.apply(g, u)), rest
    if op == "cross_entropy":  # the case's class weights and label smoothing 0.1
        return (lambda x, tg, wt: LIGER.LigerCrossEntropyFunction.apply(x, tg, wt, -100, 0.0, 0.1)[0]), rest
    if op == "linear_ce":
        return linear_cross_entropy, rest
    return None


def cross_entropy(logits, target):
    """The mean over targets != -100, as F.cross_entropy(logits, target)."""
    return LIGER.LigerCrossEntropyFunction.apply(logits, target, None)[0]


def linear_cross_entropy(hidden, weight, target):
    """F.cross_entropy(F.linear(hidden, weight), target) without the logits (ignore_index -100)."""
    return LIGER.LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target)[0]
