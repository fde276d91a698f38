"""Post-training losses (DPO and its variants, ORPO, CPO, SimPO, KTO; GRPO; distillation by JSD,
either KL or cosine similarity) on a language model's output projection, without the whole logits: each chunk of
whole sequences (or preference pairs) gives its tokens' log-probabilities from one GEMM and a
row-wise kernel, the loss is a formula of those, and the gradients are computed in the forward
(tessera/_head_chunks.py: three GEMMs for a scored token, none for a prompt or padding token; one
backward).

    loss, aux = tessera.dpo_loss(lm_head.weight, hidden, target, ref_input=ref, ref_weight=w0, beta=0.1)
    loss_fn = tessera.post_training.FusedLinearDPOLoss(beta=0.1)  # Liger-Kernel's module signature
    loss, aux = loss_fn(lm_head.weight, hidden, target, ref_input=ref, ref_weight=w0)

``hidden`` [2B, S, H] holds the B chosen sequences first and the B rejected ones after, ``target``
[2B, S] their next tokens (``ignore_index`` where not scored: the prompt, the padding). Each
sequence's log-probability is the sum of its scored tokens' (``average_log_prob``: their mean).
``aux`` is Liger's: (chosen_logps [B], rejected_logps [B], chosen_logits_mean,
rejected_logits_mean, nll_loss (0 where not computed), then the loss's own: the chosen and
rejected rewards; ORPO's log-odds ratio and chosen log-odds), detached. The logits' means are
exact and cheap: a row's logits sum to ``hidden . weight.sum(0) + bias.sum()``. The reference
model's log-probabilities (``ref_input``, ``ref_weight``) are computed without gradients, for the
scored tokens only. With ``compute_nll_loss`` the loss adds ``alpha`` times the chosen sequences'
token-mean NLL. ``chunk_size`` and ``compiled`` are taken for Liger's signature and not needed
(the chunks are sized by memory).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from . import _head_chunks, _interop, _policy_losses
from . import loss as _loss
from ._distillation import cosine_similarity_loss, jsd_loss

# The functions; the modules (FusedLinearDPOLoss, ...) are tessera.post_training's, made at first use.
__all__ = ["sequence_logps", "dpo_loss", "orpo_loss", "cpo_loss", "simpo_loss", "kto_loss", "grpo_loss", "jsd_loss",
           "cosine_similarity_loss"]


def sequence_logps(hidden: Any, weight: Any, target: Any, bias: Any = None, *, ignore_index: int = -100,
                   average: bool = False, temperature: float = 1.0):
    """(per-sequence log-probabilities [B], per-token ones [B, S] (0 where ignored), the scored-token
    mask [B, S]) of ``target`` [B, S] under ``softmax((hidden @ weight.T + bias) / temperature)``,
    hidden [B, S, H]; the sum over each sequence's scored tokens, or their mean (``average``).
    Differentiable in hidden, weight and bias; on CUDA the logits are never formed (CPU tensors take
    torch's cross-entropy of the whole logits)."""
    if hidden.dim() != 3 or target.shape != hidden.shape[:2]:
        raise ValueError(f"tessera.sequence_logps: arguments 'hidden', 'target': expected [B, S, H] and [B, S], "
                         f"got {tuple(hidden.shape)} and {tuple(target.shape)}")
    if temperature <= 0:
        raise ValueError(f"tessera.sequence_logps: argument 'temperature': expected > 0, got {temperature}")
    b, s, h = hidden.shape
    x = hidden.reshape(b * s, h)
    if temperature != 1.0:  # logits / T = (x / T) W^T + b / T
        x = x / temperature
        bias = None if bias is None else bias / temperature
    if x.is_cuda:
        nll = _loss.linear_cross_entropy(x, weight, target.reshape(-1), bias, ignore_index=ignore_index,
                                         reduction="none")
    else:  # torch's composition, the logits formed (tessera's kernel is CUDA's)
        torch = _interop.torch_if_tensor(hidden, init=True)
        logits = torch.nn.functional.linear(x, weight, bias).float()
        nll = torch.nn.functional.cross_entropy(logits, target.reshape(-1), ignore_index=ignore_index,
                                                reduction="none")
    tokens = -nll.view(b, s).float()
    mask = target != ignore_index
    total = tokens.sum(-1)
    return (total / mask.sum(-1).clamp(min=1) if average else total), tokens, mask


def _logits_mean(torch, hidden, weight, bias, rows) -> Any:
    """The mean of every logit of `rows` sequences [n, S, H] (V per position), without them."""
    with torch.no_grad():
        total = (rows.float() @ weight.sum(0, dtype=torch.float32)).sum()  # no float32 copy of the weight
        if bias is not None:
            total = total + bias.float().sum() * rows.shape[0] * rows.shape[1]
        return total / (rows.shape[0] * rows.shape[1] * weight.shape[0])


def _sequence_loss(torch, hidden, weight, bias, target, formula, *, ignore_index: int, paired: bool,
                   temperature: float = 1.0, keep=None):
    """(loss, aux) of ``formula(tokens)`` -> (value, aux), tokens [B, S] the float32 log-probabilities
    of ``target`` under the head (0 where ``keep``, by default the targets not ignored, is False),
    through _head_chunks: the gradients in the forward, three GEMMs a kept row and none for the
    others, each chunk whole sequences (``paired``: sequence i with sequence B/2 + i, which the
    preference losses couple). ``formula`` must be a sum over those units (beside terms linear in
    the tokens): a chunk's gradient is taken with the other chunks' tokens standing at -1."""
    b, s, h = hidden.shape
    keep = target != ignore_index if keep is None else keep.bool()
    flat, counts, starts = _head_chunks.kept_rows(torch, keep)
    half = b // 2
    units = [[i, half + i] for i in range(half)] if paired else [[i] for i in range(b)]
    chunks = _head_chunks.plan_chunks(counts, units, weight.shape[0] * hidden.element_size())
    rows = [torch.cat([flat[starts[q]:starts[q] + counts[q]] for q in chunk]) for chunk in chunks]
    base = torch.where(keep, -1.0, 0.0).reshape(-1)
    final = torch.zeros(b * s, dtype=torch.float32, device=hidden.device)

    def value_fn(values, i):
        final[rows[i]] = -values.detach()
        return formula(base.index_put((rows[i],), -values).view(b, s))[0]
    aux = []

    def total():  # the whole batch's value and auxiliaries, once, from every chunk's values
        value, extra = formula(final.view(b, s))
        aux.append(extra)
        return value
    target = torch.where(keep, target, ignore_index).reshape(-1)  # a masked row's id is not read
    loss = _head_chunks.fused_head_loss(torch, hidden.reshape(b * s, h), weight, bias, rows,
                                        _head_chunks.ce_rows(torch, target, ignore_index), value_fn,
                                        scale=1.0 / temperature, total=total)
    return loss, aux[0], final.view(b, s)


def _chosen_nll(torch, hidden, weight, bias, target, ignore_index: int):
    """The token-mean cross-entropy of hidden [n, S, H]'s rows against target [n, S], differentiable:
    linear_cross_entropy on CUDA, torch's functions elsewhere."""
    h, t = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    if h.is_cuda:
        total = _loss.linear_cross_entropy(h, weight, t, bias, ignore_index=ignore_index, reduction="sum")
    else:
        total = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, weight, bias).float(), t,
                                                  ignore_index=ignore_index, reduction="sum")
    return total / (t != ignore_index).sum().clamp(min=1)


def _reference_tokens(torch, hidden, weight, bias, target, keep, ignore_index: int, temperature: float = 1.0):
    """The reference model's token log-probabilities [B, S] (0 where not kept), without gradients,
    its logits computed for the kept rows only."""
    b, s, h = hidden.shape
    flat = keep.reshape(-1).nonzero().squeeze(1)
    x, t = hidden.reshape(b * s, h)[flat], target.reshape(-1)[flat]
    tokens = torch.zeros(b * s, dtype=torch.float32, device=hidden.device)
    with torch.no_grad():
        if flat.numel():
            tokens[flat] = sequence_logps(x.unsqueeze(0), weight, t.unsqueeze(0), bias, ignore_index=ignore_index,
                                          temperature=temperature)[1][0]
    return tokens.view(b, s)


def _log_sigmoid(torch, x):
    return torch.nn.functional.logsigmoid(x)


# DPO's loss types (TRL's and Liger's): each pair's loss from d = beta (chosen - rejected log-ratio),
# the rewards cr, rr (beta times each log-ratio), the log-ratios a, b, and the options.
_DPO = {
    "sigmoid": lambda t, d, cr, rr, a, b, o: -_log_sigmoid(t, d),
    "hinge": lambda t, d, cr, rr, a, b, o: t.relu(1 - d),
    "exo_pair": lambda t, d, cr, rr, a, b, o: (t.sigmoid(d) * (_log_sigmoid(t, d) - math.log1p(-o["label_smoothing"]))
                                               + t.sigmoid(-d) * (_log_sigmoid(t, -d) - math.log(o["label_smoothing"]))),
    "nca_pair": lambda t, d, cr, rr, a, b, o: (-_log_sigmoid(t, cr) - 0.5 * _log_sigmoid(t, -cr)
                                               - 0.5 * _log_sigmoid(t, -rr)),
    "robust": lambda t, d, cr, rr, a, b, o: ((-(1 - o["label_smoothing"]) * _log_sigmoid(t, d)
                                              + o["label_smoothing"] * _log_sigmoid(t, -d))
                                             / (1 - 2 * o["label_smoothing"])),
    "bco_pair": lambda t, d, cr, rr, a, b, o: -_log_sigmoid(t, cr) - _log_sigmoid(t, -rr),
    "sppo_hard": lambda t, d, cr, rr, a, b, o: (a - 0.5 / o["beta"]) ** 2 + (b + 0.5 / o["beta"]) ** 2,
    "apo_zero": lambda t, d, cr, rr, a, b, o: (1 - t.sigmoid(cr)) + t.sigmoid(rr),
    "apo_down": lambda t, d, cr, rr, a, b, o: t.sigmoid(cr) + (1 - t.sigmoid(d)),
    "discopop": lambda t, d, cr, rr, a, b, o: (-_log_sigmoid(t, d) * (1 - t.sigmoid(d / o["discopop_tau"]))
                                               + t.exp(-d) * t.sigmoid(d / o["discopop_tau"])),
}


def _check(kind: str, o: dict) -> None:
    if kind == "dpo":
        if o["loss_type"] not in _DPO:
            raise ValueError(f"tessera.dpo_loss: argument 'loss_type': Unsupported loss_type {o['loss_type']!r}; "
                             f"expected one of {sorted(_DPO)}")
        # the messages hold Liger's own wording, which code written against it may match
        if o["loss_type"] == "exo_pair" and o["label_smoothing"] <= 0:
            raise ValueError("tessera.dpo_loss: argument 'label_smoothing': label_smoothing must be > 0 for "
                             "loss_type='exo_pair' (the EXO paper takes 1e-3)")
        if o["loss_type"] == "robust" and not 0 <= o["label_smoothing"] < 0.5:
            raise ValueError("tessera.dpo_loss: argument 'label_smoothing': label_smoothing must lie in [0.0, 0.5) "
                             f"for loss_type='robust', got {o['label_smoothing']}")


def _preference(kind: str, weight, hidden, target, bias, ref_input, ref_weight, ref_bias, o: dict):
    """(loss, aux) of preference loss `kind` (dpo, orpo, cpo, simpo); see the module."""
    torch = _interop.torch_if_tensor(hidden, init=True)
    op = f"tessera.{kind}_loss"
    if torch is None:
        raise TypeError(f"{op}: argument 'hidden': expected a torch tensor, got {type(hidden).__name__}")
    if hidden.dim() != 3 or hidden.shape[0] % 2 or target.shape != hidden.shape[:2]:
        raise ValueError(f"{op}: arguments 'hidden', 'target': expected [2B, S, H] (the chosen sequences, then the "
                         f"rejected ones) and [2B, S], got {tuple(hidden.shape)} and {tuple(target.shape)}")
    _check(kind, o)
    ignore, n = o["ignore_index"], hidden.shape[0] // 2
    keep = target != ignore
    counts = keep.sum(-1).clamp(min=1)
    ref_c = ref_r = torch.zeros((), device=hidden.device)
    if kind == "dpo" and o["use_ref_model"] and ref_input is not None:
        ref = _reference_tokens(torch, ref_input, weight if ref_weight is None else ref_weight, ref_bias, target,
                                keep, ignore).sum(-1)
        ref = ref / counts if o["average_log_prob"] else ref
        ref_c, ref_r = ref[:n], ref[n:]
    beta = o["beta"]

    def formula(tokens):
        total = tokens.sum(-1)
        logps = total / counts if o["average_log_prob"] else total
        chosen, rejected = logps[:n], logps[n:]
        nll = -tokens[:n].sum() / keep[:n].sum().clamp(min=1)
        extra = ()
        if kind == "dpo":
            a, b = chosen - ref_c, rejected - ref_r
            cr, rr = beta * a, beta * b
            pair = _DPO[o["loss_type"]](torch, beta * (a - b), cr, rr, a, b, o)
        elif kind == "orpo":
            log_odds = (chosen - rejected) - (torch.log1p(-torch.exp(chosen)) - torch.log1p(-torch.exp(rejected)))
            ratio = _log_sigmoid(torch, log_odds)
            pair, cr, rr = -beta * ratio, beta * chosen, beta * rejected
            extra = (ratio.sum().detach() / n, log_odds.sum().detach() / n)
        else:  # cpo, simpo: a margin (gamma) for SimPO
            d = beta * (chosen - rejected) - (o["gamma"] if kind == "simpo" else 0.0)
            ls = o["label_smoothing"]
            pair, cr, rr = (-_log_sigmoid(torch, d) * (1 - ls) - _log_sigmoid(torch, -d) * ls, beta * chosen,
                            beta * rejected)
        value = pair.sum() / n
        if o["compute_nll_loss"] and not separate:
            value = value + o["alpha"] * nll
        return value, (chosen, rejected, nll, cr, rr, extra)

    separate = o.get("nll_target") is not None  # the chosen NLL against other targets: its own pass
    value, (chosen, rejected, nll, cr, rr, extra), _ = _sequence_loss(
        torch, hidden, weight, bias, target, formula, ignore_index=ignore, paired=True)
    if separate and o["compute_nll_loss"]:
        nll = _chosen_nll(torch, hidden[:n], weight, bias, o["nll_target"].reshape(hidden.shape[:2])[:n], ignore)
        value = value + o["alpha"] * nll
    nll = nll.detach() if o["compute_nll_loss"] else torch.zeros_like(nll)  # Liger's: 0 where not computed
    aux = (chosen.detach(), rejected.detach(), _logits_mean(torch, hidden, weight, bias, hidden[:n]),
           _logits_mean(torch, hidden, weight, bias, hidden[n:]), nll, cr.detach(), rr.detach(), *extra)
    return value, aux


def dpo_loss(weight, hidden, target, bias=None, ref_input=None, ref_weight=None, ref_bias=None, *,
             ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0, compute_nll_loss: bool = False,
             use_ref_model: bool = True, average_log_prob: bool = False, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0, discopop_tau: float = 0.05):
    """DPO (Rafailov et al.) and TRL's loss types (sigmoid, hinge, exo_pair, nca_pair, robust,
    bco_pair, sppo_hard, apo_zero, apo_down, discopop) on the output projection ``weight`` [V, H];
    (loss, aux) as the module describes. Without ``ref_input`` the reference log-ratios are 0."""
    return _preference("dpo", weight, hidden, target, bias, ref_input, ref_weight, ref_bias, dict(
        ignore_index=ignore_index, beta=beta, alpha=alpha, compute_nll_loss=compute_nll_loss,
        use_ref_model=use_ref_model, average_log_prob=average_log_prob, loss_type=loss_type,
        label_smoothing=label_smoothing, discopop_tau=discopop_tau))


def orpo_loss(weight, hidden, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
              compute_nll_loss: bool = True, nll_target=None):
    """ORPO (Hong et al.): -beta log sigmoid(log odds(chosen) - log odds(rejected)) of the sequences'
    mean token log-probabilities, plus the chosen NLL (against ``nll_target`` [2B, S], the chosen
    half read, where given: its own pass over the chosen rows); (loss, aux) as the module describes."""
    return _preference("orpo", weight, hidden, target, bias, None, None, None, dict(
        ignore_index=ignore_index, beta=beta, alpha=1.0, compute_nll_loss=compute_nll_loss, average_log_prob=True,
        nll_target=nll_target))


def cpo_loss(weight, hidden, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
             label_smoothing: float = 0.0, compute_nll_loss: bool = True, average_log_prob: bool = False):
    """CPO (Xu et al.): DPO's sigmoid loss without a reference model, plus alpha times the chosen
    NLL; (loss, aux) as the module describes."""
    return _preference("cpo", weight, hidden, target, bias, None, None, None, dict(
        ignore_index=ignore_index, beta=beta, alpha=alpha, compute_nll_loss=compute_nll_loss,
        average_log_prob=average_log_prob, label_smoothing=label_smoothing))


def simpo_loss(weight, hidden, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
               label_smoothing: float = 0.0, compute_nll_loss: bool = True, gamma: float = 0.5):
    """SimPO (Meng et al.): the length-normalized sigmoid loss with a target margin ``gamma``, plus
    alpha times the chosen NLL; (loss, aux) as the module describes."""
    return _preference("simpo", weight, hidden, target, bias, None, None, None, dict(
        ignore_index=ignore_index, beta=beta, alpha=alpha, compute_nll_loss=compute_nll_loss,
        average_log_prob=True, label_smoothing=label_smoothing, gamma=gamma))


def kto_loss(_input, weight, target, bias=None, preference_labels=None, ref_input=None, ref_weight=None,
             ref_bias=None, kl=None, *, ignore_index: int = -100, beta: float = 0.1, use_ref_model: bool = False,
             average_log_prob: bool = False):
    """KTO (Ethayarajh et al.), unpaired, as Liger computes it: for each sequence of ``_input``
    [B, S, H] with its ``preference_labels`` [B] (True: desirable), ``1 - sigmoid(beta (r - kl) m)``
    with r its log-ratio to the reference (``ref_input``, ``ref_weight`` under ``use_ref_model``; else
    its log-probability), m = +1 or -1 by its label and ``kl`` the batch's KL estimate (None: 0);
    the mean over the B sequences. Returns (loss, (desirable sequences' log-probability sum,
    undesirable's, their logits' sums, the rewards' sums)), the auxiliaries detached."""
    torch = _interop.torch_if_tensor(_input, init=True)
    if torch is None:
        raise TypeError(f"tessera.kto_loss: argument '_input': expected a torch tensor, got {type(_input).__name__}")
    if preference_labels is None or preference_labels.shape != _input.shape[:1]:
        raise ValueError(f"tessera.kto_loss: argument 'preference_labels': expected [{_input.shape[0]}] booleans "
                         f"(True: desirable), got {None if preference_labels is None else tuple(preference_labels.shape)}")
    labels = preference_labels.bool()
    keep = target != ignore_index
    counts = keep.sum(-1).clamp(min=1)
    ref = 0.0
    if use_ref_model and ref_input is not None:
        ref = _reference_tokens(torch, ref_input, weight if ref_weight is None else ref_weight, ref_bias, target,
                                keep, ignore_index).sum(-1)
        ref = ref / counts if average_log_prob else ref
    sign = torch.where(labels, 1.0, -1.0)

    def formula(tokens):
        logps = tokens.sum(-1) / counts if average_log_prob else tokens.sum(-1)
        ratio = logps - ref
        shifted = ratio if kl is None else ratio - kl
        return (1 - torch.sigmoid(beta * shifted * sign)).sum() / _input.shape[0], (logps, ratio)

    loss, (logps, ratio), _ = _sequence_loss(torch, _input, weight, bias, target, formula, ignore_index=ignore_index,
                                             paired=False)
    rewards = (beta * ratio).detach()
    with torch.no_grad():
        sums = (_input.float() @ weight.sum(0, dtype=torch.float32)).sum(-1)
        if bias is not None:
            sums = sums + bias.float().sum() * _input.shape[1]
    aux = ((logps.detach() * labels).sum(), (logps.detach() * ~labels).sum(), (sums * labels).sum(),
           (sums * ~labels).sum(), (rewards * labels).sum(), (rewards * ~labels).sum())
    return loss, aux


def grpo_loss(_input, weight, selected_token_ids, attention_mask, advantages, bias=None, ref_per_token_logps=None,
              old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None, vllm_is_ratio=None,
              num_items_in_batch: Optional[Any] = None, *, beta: float = 0.04, epsilon_low: float = 0.2,
              epsilon_high: float = 0.2, loss_type: str = "dapo", max_completion_length: Optional[int] = None,
              importance_sampling_level: str = "token", temperature: float = 1.0, use_ref_model: bool = True,
              delta: Optional[float] = None, sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05,
              use_bias_correction_kl: bool = False, vespo_k_pos: float = 2.0, vespo_lambda_pos: float = 3.0,
              vespo_k_neg: float = 3.0, vespo_lambda_neg: float = 2.0):
    """GRPO (DeepSeekMath) and its variants as TRL and Liger compute them, for completions
    ``_input`` [B, T, H] with tokens ``selected_token_ids`` [B, T], ``attention_mask`` [B, T] (the
    completion tokens) and ``advantages`` [B]. Each token's ratio r to ``old_per_token_logps``
    (per token, or per sequence with ``importance_sampling_level="sequence"``, GSPO) enters the
    surrogate of ``loss_type``: the clipped ``-min(r A, clip(r, 1 - epsilon_low, 1 + epsilon_high)
    A)`` ('grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'; ``delta`` > 0 caps r, INTELLECT-2), 'cispo'
    the log-probability weighted by the clipped, detached r, 'sapo' the soft gate ``-(4 / t)
    sigmoid(t (r - 1)) A`` (t: ``sapo_temperature_pos`` where A > 0, else
    ``sapo_temperature_neg``), 'vespo' the log-probability weighted by the detached gamma weight
    ``exp(lambda (1 - w)) w^k`` of the sequence's ratio w (``vespo_k_pos``, ``vespo_lambda_pos``
    where A >= 0, else the _neg pair); the last three token-level only. ``vllm_is_ratio`` [B, T],
    [B, 1] or [B] (the ratio of the trained policy's probabilities to those vLLM sampled with)
    multiplies the surrogate ('vespo': its log joins w). Plus ``beta`` times the k3 estimate of
    the KL to the reference (``ref_per_token_logps``, or computed from ``ref_input`` and
    ``ref_weight``), times the ratio with ``use_bias_correction_kl`` (DeepSeek-V3.2). Normalized
    by ``loss_type``: 'grpo' and 'sapo' per sequence then over the batch, 'bnpo' over the batch's
    tokens, 'dr_grpo' over B x ``max_completion_length``, 'dapo', 'cispo' and 'vespo' over
    ``num_items_in_batch`` (TRL's count across processes; the world size divided out) or the
    batch's tokens, 'luspo' each token's term times its sequence's length, averaged over all B x T
    positions (TRL's mean, masked tokens included: their log-probabilities are computed too). The
    log-probabilities at ``temperature`` come from linear_cross_entropy, the logits never formed.
    Options a loss type does not read are not checked. Returns (loss, [the mean KL if beta, the
    clipped fraction])."""
    torch = _interop.torch_if_tensor(_input, init=True)
    op = "tessera.grpo_loss"
    if torch is None:
        raise TypeError(f"{op}: argument '_input': expected a torch tensor, got {type(_input).__name__}")
    o = dict(beta=beta, epsilon_low=epsilon_low, epsilon_high=epsilon_high, loss_type=loss_type,
             max_completion_length=max_completion_length, importance_sampling_level=importance_sampling_level,
             temperature=temperature, delta=delta, sapo_temperature_pos=sapo_temperature_pos,
             sapo_temperature_neg=sapo_temperature_neg, use_bias_correction_kl=use_bias_correction_kl,
             vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg,
             vespo_lambda_neg=vespo_lambda_neg)
    _policy_losses.check(op, o, _input.shape[0], _input.shape[1], advantages, vllm_is_ratio)
    keep = attention_mask.bool()
    if _policy_losses.reads_masked_tokens(loss_type):
        keep = torch.ones_like(keep)
    ref = ref_per_token_logps
    if beta != 0.0 and ref is None and use_ref_model and ref_input is not None:
        ref = _reference_tokens(torch, ref_input, weight if ref_weight is None else ref_weight, ref_bias,
                                selected_token_ids, keep, -100, temperature)
    formula = _policy_losses.formula(torch, o, attention_mask.float(), keep, advantages, old_per_token_logps, ref,
                                     vllm_is_ratio, num_items_in_batch)
    loss, metrics, _ = _sequence_loss(torch, _input, weight, bias, selected_token_ids, formula, ignore_index=-100,
                                      paired=False, temperature=temperature, keep=keep)
    return loss, metrics


# Liger's modules: name -> (the function, Liger's class, the constructor's keywords and defaults).
_MODULES = {
    "FusedLinearDPOLoss": (dpo_loss, "LigerFusedLinearDPOLoss", dict(
        ignore_index=-100, beta=0.1, alpha=1.0, compute_nll_loss=False, use_ref_model=True, average_log_prob=False,
        loss_type="sigmoid", label_smoothing=0.0, discopop_tau=0.05)),
    "FusedLinearORPOLoss": (orpo_loss, "LigerFusedLinearORPOLoss", dict(ignore_index=-100, beta=0.1,
                                                                        compute_nll_loss=True)),
    "FusedLinearCPOLoss": (cpo_loss, "LigerFusedLinearCPOLoss", dict(
        ignore_index=-100, beta=0.1, alpha=1.0, label_smoothing=0.0, compute_nll_loss=True, average_log_prob=False)),
    "FusedLinearSimPOLoss": (simpo_loss, "LigerFusedLinearSimPOLoss", dict(
        ignore_index=-100, beta=0.1, alpha=1.0, label_smoothing=0.0, compute_nll_loss=True, gamma=0.5)),
    "FusedLinearKTOLoss": (kto_loss, "LigerFusedLinearKTOLoss", dict(
        ignore_index=-100, beta=0.1, use_ref_model=False, average_log_prob=False)),
    "FusedLinearJSDLoss": (jsd_loss, "LigerFusedLinearJSDLoss", dict(
        weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0, chunk_size=1024,
        return_soft_hard_loss=False)),
    "FusedLinearCosineSimilarityLoss": (cosine_similarity_loss, "LigerFusedLinearCosineSimilarityLoss", dict(
        weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.5, ignore_index=-100, temperature=1.0, chunk_size=1024,
        return_soft_hard_loss=False)),
    "FusedLinearGRPOLoss": (grpo_loss, "LigerFusedLinearGRPOLoss", dict(
        beta=0.04, use_ref_model=True, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
        max_completion_length=None, importance_sampling_level="token", sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05, temperature=1.0, delta=None, use_bias_correction_kl=False, vespo_k_pos=2.0,
        vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)),
}
_built: dict = {}
# Liger's modules' forward keywords, where tessera's functions name them otherwise
_LIGER_NAMES = {"lin_weight": "weight", "_input": "hidden"}


def __getattr__(name: str):
    """The torch.nn.Module classes, made at first use (tessera never imports torch itself)."""
    if name not in _MODULES:
        raise AttributeError(f"module 'tessera.post_training' has no attribute {name!r}")
    if name not in _built:
        _built[name] = _module_class(name, *_MODULES[name])
    return _built[name]


def _module_class(name: str, function, liger: str, defaults: dict):
    import inspect

    import torch
    params = inspect.signature(function).parameters

    class Loss(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            unknown = set(kwargs) - set(defaults) - {"compiled", "chunk_size"}
            if unknown:
                raise TypeError(f"tessera.{name}: unexpected keyword argument(s) {sorted(unknown)}; it takes "
                                f"{sorted(defaults)} (and Liger's compiled, chunk_size)")
            # Liger's modules keep their options as attributes (module.beta, module.loss_type): so do these
            for k, v in defaults.items():
                setattr(self, k, kwargs.get(k, v))
            if function is dpo_loss:
                _check("dpo", self.options)

        @property
        def options(self) -> dict:
            return {k: getattr(self, k) for k in defaults}

        def forward(self, *args, **kwargs):  # Liger's positional order (GRPO's: _input, lin_weight, ...)
            kwargs = {_LIGER_NAMES.get(k, k) if k not in params else k: v for k, v in kwargs.items()}
            return function(*args, **kwargs, **self.options)

    Loss.__name__ = Loss.__qualname__ = name
    Loss.__module__ = __name__
    Loss.__doc__ = (f"Liger-Kernel's {liger}: the same constructor keywords and forward(lin_weight, _input, target, "
                    f"bias=None, ...), on tessera.{function.__name__} (the logits never formed).")
    return Loss
