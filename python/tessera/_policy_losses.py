"""GRPO's family of policy-gradient losses (tessera.grpo_loss) as formulas of the completion
tokens' log-probabilities [B, T]: plain torch on small tensors, which tessera/_head_chunks.py
differentiates once per chunk of whole sequences. Every term below is a sum over sequences (a
token's, or a sequence's ratio, weight or length), so a chunk's gradient is exact whatever the
other chunks' tokens stand at.

A loss type is a row of _TYPES: how a token's surrogate is formed from its ratio r to the
sampling policy, and how the batch's tokens are averaged.
"""

from __future__ import annotations

import math
from typing import Any

# loss type: (its surrogate, its normalization)
#   surrogate  'clip': -min(r A, clip(r, 1 - epsilon_low, 1 + epsilon_high) A) (PPO's; delta caps r)
#              'cispo': -sg(min(r, epsilon_high)) A log p (MiniMax-M1: the weight clipped, detached)
#              'sapo': -(4 / t) sigmoid(t (r - 1)) A, t by A's sign (SAPO: a soft gate, no clip)
#              'vespo': -sg(phi(w)) A log p, phi a gamma weight of the sequence's ratio w (VESPO)
#   normalized 'sequence': each sequence's token mean, then the mean over the B sequences
#              'tokens': the batch's token mean
#              'max_length': over B x max_completion_length
#              'items': over num_items_in_batch / world size (TRL's count across processes), else
#                       the batch's tokens
#              'length': TRL's LUSPO: each entry times its sequence's length, then the mean over
#                       the whole [B, T] array, masked tokens included
_TYPES = {
    "grpo": ("clip", "sequence"),
    "bnpo": ("clip", "tokens"),
    "dr_grpo": ("clip", "max_length"),
    "dapo": ("clip", "items"),
    "cispo": ("cispo", "items"),
    "sapo": ("sapo", "sequence"),
    "luspo": ("clip", "length"),
    "vespo": ("vespo", "items"),
}
TOKEN_LEVEL_ONLY = ("cispo", "sapo", "vespo")  # a per-token weight of their own: no sequence-level ratio
_LOG_MIN_WEIGHT = math.log(1e-8)  # VESPO's floor on a sequence's log-ratio (and on vLLM's)


def reads_masked_tokens(loss_type: str) -> bool:
    """Whether the loss reads the masked tokens' log-probabilities (LUSPO's mean runs over them)."""
    return _TYPES[loss_type][1] == "length"


def check(op: str, o: dict, batch: int, length: int, advantages: Any, vllm_is_ratio: Any) -> None:
    """ValueError naming the argument, for options the loss type reads."""
    kind = o["loss_type"]
    if kind not in _TYPES:
        raise ValueError(f"{op}: argument 'loss_type': expected one of {list(_TYPES)}, got {kind!r}")
    level = o["importance_sampling_level"]
    if level not in ("token", "sequence"):
        raise ValueError(f"{op}: argument 'importance_sampling_level': expected 'token' or 'sequence', got {level!r}")
    if level == "sequence" and kind in TOKEN_LEVEL_ONLY:
        raise ValueError(f"{op}: argument 'importance_sampling_level': expected 'token' for loss_type {kind!r}. "
                         f"Sequence-level importance sampling is not supported for {list(TOKEN_LEVEL_ONLY)}")
    if kind == "dr_grpo" and not (o["max_completion_length"] or 0) > 0:
        raise ValueError(f"{op}: argument 'max_completion_length': expected the completions' length (> 0) for "
                         f"'dr_grpo', got {o['max_completion_length']!r}")
    if not o["temperature"] > 0:
        raise ValueError(f"{op}: argument 'temperature': expected > 0, got {o['temperature']}")
    if o["delta"] is not None and not o["delta"] > 0:
        raise ValueError(f"{op}: argument 'delta': expected None or > 0 (the cap on the ratio), got {o['delta']}")
    positive = {"sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
                "vespo": ("vespo_lambda_pos", "vespo_lambda_neg")}.get(kind, ())
    for name in positive:
        if not o[name] > 0:
            raise ValueError(f"{op}: argument '{name}': expected > 0 for loss_type {kind!r}, got {o[name]}")
    for name in ("vespo_k_pos", "vespo_k_neg") if kind == "vespo" else ():
        if not o[name] >= 0:
            raise ValueError(f"{op}: argument '{name}': expected >= 0 (the gamma weight's shape) for loss_type "
                             f"'vespo', got {o[name]}")
    if advantages.dim() != 1 or advantages.shape[0] != batch:
        raise ValueError(f"{op}: argument 'advantages': expected [{batch}] (one per completion), "
                         f"got {tuple(advantages.shape)}")
    if vllm_is_ratio is not None and tuple(vllm_is_ratio.shape) not in ((batch,), (batch, 1), (batch, length)):
        raise ValueError(f"{op}: argument 'vllm_is_ratio': expected [{batch}], [{batch}, 1] or [{batch}, {length}], "
                         f"got {tuple(vllm_is_ratio.shape)}")


def _gamma_weights(torch, log_ratio, mask, adv, vllm, o):
    """VESPO's per-sequence weight phi(w) = exp(lambda (1 - w)) w^k [B, 1] of the sequence's ratio
    w (its tokens' log-ratios summed, each clamped to +-20; vLLM's log-ratios added, all of them:
    the correction folded in here rather than on the tokens), k and lambda by the sign of A
    (A >= 0: the _pos pair), phi(1) = 1; a coefficient, so no gradient flows through it."""
    with torch.no_grad():
        log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
        if vllm is not None:
            log_w = log_w + vllm.log().clamp(_LOG_MIN_WEIGHT, 20.0).sum(-1, keepdim=True)
        log_w = log_w.clamp(_LOG_MIN_WEIGHT, 20.0)
        pos = adv >= 0
        k = torch.where(pos, adv.new_tensor(o["vespo_k_pos"]), adv.new_tensor(o["vespo_k_neg"]))
        lam = torch.where(pos, adv.new_tensor(o["vespo_lambda_pos"]), adv.new_tensor(o["vespo_lambda_neg"]))
        return torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _surrogate(torch, kind, logps, log_ratio, log_w, adv, mask, vllm, o):
    """(each token's surrogate loss, its ratio clipped below, above) for surrogate `kind`."""
    ratio = torch.exp(log_w)
    never = torch.zeros_like(ratio, dtype=torch.bool)
    if kind == "cispo":
        high = o["epsilon_high"]
        return -ratio.clamp(max=high).detach() * adv * logps, never, ratio > high
    if kind == "sapo":
        t = torch.where(adv > 0, adv.new_tensor(o["sapo_temperature_pos"]), adv.new_tensor(o["sapo_temperature_neg"]))
        return -(4.0 / t) * torch.sigmoid(t * (ratio - 1.0)) * adv, never, never
    if kind == "vespo":
        return -_gamma_weights(torch, log_ratio, mask, adv, vllm, o) * adv * logps, never, never
    low, high = 1.0 - o["epsilon_low"], 1.0 + o["epsilon_high"]
    capped = ratio if o["delta"] is None else ratio.clamp(max=o["delta"])
    return -torch.min(capped * adv, ratio.clamp(low, high) * adv), ratio < low, ratio > high


def formula(torch, o: dict, mask, read, advantages, old, ref, vllm_is_ratio, num_items_in_batch):
    """The loss as a function of the tokens' log-probabilities [B, T] -> (loss, metrics: [the mean
    KL if beta, the clipped fraction]); ``mask`` [B, T] float32, ``read`` [B, T] the tokens whose
    log-probabilities are computed (the others stand at 0), ``old`` and ``ref`` [B, T] or None
    (then the tokens' own, detached)."""
    kind, how = _TYPES[o["loss_type"]]
    beta = o["beta"]
    adv = advantages.to(mask.dtype).unsqueeze(1)  # mask: float32 (float64 in tests of the formula alone)
    vllm = None if vllm_is_ratio is None else vllm_is_ratio.to(mask.dtype).reshape(mask.shape[0], -1)
    tokens = mask.sum().clamp(min=1.0)
    items = tokens
    if num_items_in_batch is not None:
        import torch.distributed as dist
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        items = (torch.as_tensor(num_items_in_batch, dtype=mask.dtype, device=mask.device) / world).clamp(min=1.0)

    def loss_of(logps):
        # A token not read counts with ratio 1 and no KL, whatever its old and reference values: its
        # terms are masked out, but a padding's old log-probability far below 0 would make them inf.
        log_ratio = logps - (logps.detach() if old is None else old.to(logps.dtype))
        log_ratio = torch.where(read, log_ratio, 0.0)
        log_w = log_ratio  # the importance weight's log, per token or (GSPO) per sequence [B, 1]
        if o["importance_sampling_level"] == "sequence":
            log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        per_token, lower, upper = _surrogate(torch, kind, logps, log_ratio, log_w, adv, mask, vllm, o)
        if vllm is not None and kind != "vespo":  # vLLM's sampling corrected, before the KL
            per_token = per_token * vllm
        metrics = []
        if beta != 0.0:
            d = torch.where(read, (logps.detach() if ref is None else ref.to(logps.dtype)) - logps, 0.0)
            kl = torch.exp(d) - d - 1.0  # k3, the KL to the reference
            if o["use_bias_correction_kl"]:  # DeepSeek-V3.2: the KL's estimate at the sampling policy
                kl = kl * torch.exp(log_w)
            per_token = per_token + beta * kl
            metrics.append((kl * mask).sum().detach() / tokens)
        if how == "sequence":
            loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / mask.shape[0]
        elif how == "tokens":
            loss = (per_token * mask).sum() / tokens
        elif how == "max_length":
            loss = (per_token * mask).sum() / (mask.shape[0] * o["max_completion_length"])
        elif how == "items":
            loss = (per_token * mask).sum() / items
        else:  # 'length': TRL's mean over its per-token array, [B, 1] where nothing is per token
            loss = (per_token * mask.sum(-1, keepdim=True)).sum() / (mask.shape[0] * per_token.shape[-1])
        clipped = ((lower & (adv < 0)) | (upper & (adv > 0))).expand_as(mask)
        metrics.append((clipped * mask).sum().detach() / tokens)
        return loss, metrics
    return loss_of
