"""tessera.transformers' causal-LM loss: the forward that a row's causal LM (or vision-language
model) takes in training with labels, its loss from tessera's fused linear cross-entropy (the
logits never formed) or from its cross-entropy on the logits, and an MoE family's load-balancing
loss as the family's own forward adds it. Imported by tessera/transformers.py only."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

import tessera

from ._transformers_families import Family, modeling
from . import float8
from .loss import _metrics

IGNORE_INDEX = -100
_MISSING = object()


def _lm_head(model):
    """The output projection module: under PEFT's modules_to_save its active copy; refused, with
    what to do, where an adapter (LoRA) wraps it, which the fused loss would skip."""
    head = model.lm_head
    if type(head).__name__ == "ModulesToSaveWrapper":
        active = head.active_adapters
        head = head.original_module if head.disable_adapters or not active else head.modules_to_save[active[0]]
    if hasattr(head, "base_layer"):
        raise TypeError("tessera.transformers: the fused linear cross-entropy reads lm_head's weight, and "
                        f"lm_head is a {type(head).__name__} (an adapter on it, such as LoRA, would be "
                        "skipped): leave lm_head out of the adapter's target_modules (modules_to_save is "
                        "fine), or apply with fused_linear_cross_entropy=False")
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"tessera.transformers: expected lm_head to be a torch.nn.Linear, got {type(head).__name__}")
    return head


try:
    from torch.distributed.fsdp import FSDPModule as _FSDPModule
except ImportError:  # a torch without FSDP2
    _FSDPModule = None


def _head_loss(head, hidden, target, softcap, num_items, accuracy):
    """The fused loss (and the token accuracy, or None) with the head's weight. Under FSDP2, with
    lm_head sharded on its own (fully_shard(model.lm_head)), its weight is whole only inside its own
    forward, whose hooks also reduce-scatter the weight's gradient: there the loss runs as that
    forward. A head converted to a Float8Linear runs its GEMMs in float8 (_loss_of)."""
    fp8 = (head.recipe, head.cache_weights) if isinstance(head, float8.Float8Linear) else None
    if _FSDPModule is None or not isinstance(head, _FSDPModule):
        return _loss_of(hidden, head.weight, head.bias, target, softcap, num_items, accuracy, fp8)
    own = vars(head).get("forward", _MISSING)
    head.forward = lambda h: _loss_of(h, head.weight, head.bias, target, softcap, num_items, accuracy, fp8)
    try:
        return head(hidden)
    finally:
        if own is _MISSING:
            del head.forward
        else:
            head.forward = own


def _shifted(labels, shift_labels):
    """The next token's label for each position: shift_labels as given, else labels moved left
    by one with -100 padded at the end (no slice of the hidden states)."""
    if shift_labels is not None:
        return shift_labels
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def _loss_of(hidden, weight, bias, target, softcap, num_items, accuracy, fp8=None):
    """(the summed or mean loss, the token accuracy where asked for, else None) of (N, H) hidden
    states against (N,) targets, without the logits. ``fp8`` (a Float8Linear head's recipe and
    cache_weights): the logits' and d_hidden's GEMMs in float8 (tessera.float8.linear_cross_entropy)
    where the loss has no bias, soft-cap or token accuracy and the weight is not a DTensor; those
    run in the weight's dtype."""
    if fp8 is not None and bias is None and not softcap and not accuracy and not hasattr(weight, "placements"):
        loss = float8.linear_cross_entropy(hidden, weight, target, recipe=fp8[0], ignore_index=IGNORE_INDEX,
                                           reduction="sum" if num_items is not None else "mean",
                                           cache_weights=fp8[1])
        return _per_item(loss, num_items), None
    if hidden.is_cuda:
        r = tessera.linear_cross_entropy(hidden, weight, target, bias, ignore_index=IGNORE_INDEX,
                                         reduction="sum" if num_items is not None else "mean",
                                         softcap=softcap, return_token_accuracy=accuracy)
        loss, acc = r if accuracy else (r, None)
        return _per_item(loss, num_items), acc
    logits = F.linear(hidden, weight, bias).float()  # tensors the kernels do not take: torch's
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return _loss_of_logits(logits, target, num_items), _accuracy(logits, target) if accuracy else None


def _accuracy(logits, target):
    """The token accuracy of logits against targets: the rows not ignored whose argmax is the target."""
    logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1).to(logits.device)
    return _metrics(torch, logits, target, IGNORE_INDEX, True, False)[0]


@dataclasses.dataclass
class TesseraCausalLMOutputWithPast(CausalLMOutputWithPast):
    """CausalLMOutputWithPast with the token accuracy (``return_token_accuracy=True`` in the
    forward's call, as TRL's SFTTrainer passes it to Liger's models)."""
    token_accuracy: torch.FloatTensor | None = None


def _per_item(loss, num_items):
    if num_items is None:
        return loss
    return loss / (num_items.to(loss.device) if isinstance(num_items, torch.Tensor) else num_items)


def _causal_lm_forward(family: Family, fused: bool, original: Callable) -> Callable:
    """The causal LM's forward over `original` (the class's own): in training with labels, the
    loss from tessera; otherwise `original`. Written for torch.compile too: the call is read from
    the original's parameter names, fixed here, with plain dict operations."""
    signature = inspect.signature(original)
    names = [p.name for p in signature.parameters.values()
             if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)][1:]
    softcap_attr = family.softcap
    moe = family.experts is not None and family.aux_loss

    def forward(self, *args, **kwargs):
        call = dict(zip(names, args))
        call.update(kwargs)
        labels, shift_labels = call.pop("labels", None), call.pop("shift_labels", None)
        accuracy = bool(call.pop("return_token_accuracy", False))
        if not self.training or (labels is None and shift_labels is None):
            kwargs.pop("return_token_accuracy", None)
            return original(self, *args, **kwargs)
        num_items = call.pop("num_items_in_batch", None)
        call.pop("logits_to_keep", None)  # training takes every position
        call.pop("return_dict", None)
        target = _shifted(labels, shift_labels)
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        router = moe and bool(call.get("output_router_logits") if call.get("output_router_logits") is not None
                              else getattr(text, "output_router_logits", False))
        if moe:
            call["output_router_logits"] = router
        if fused:
            head = _lm_head(self)
            outputs = self.model(**call)
            hidden = outputs.last_hidden_state
            softcap = getattr(text, softcap_attr, None) if softcap_attr else None
            if family.logits_scaling:  # logits / s from hidden / s: the head is linear
                hidden = hidden / getattr(text, family.logits_scaling)
            loss, acc = _head_loss(head, hidden.reshape(-1, hidden.shape[-1]),
                                   target.reshape(-1).to(hidden.device), softcap, num_items, accuracy)
            logits = None
        else:  # the logits as transformers computes them (soft-capped), the loss from tessera
            outputs = original(self, **call)
            logits = outputs.logits
            loss = _loss_of_logits(logits, target.to(logits.device), num_items)
            acc = _accuracy(logits.detach(), target) if accuracy else None
        if moe:  # the router's load-balancing loss, as the family's forward adds it
            experts, k, coef = _router_fields(self, text)
            aux = (modeling(family).load_balancing_loss_func(outputs.router_logits, experts, k,
                                                              call.get("attention_mask")) if router else None)
            if aux is not None:
                loss = loss + coef * aux.to(loss.device)
            return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux, logits=logits, hidden_states=outputs.hidden_states,
                                             attentions=outputs.attentions, router_logits=outputs.router_logits)
        if accuracy:
            return TesseraCausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                                 attentions=outputs.attentions, token_accuracy=acc)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions)

    forward.__doc__ = f"{family.name('ForCausalLM')}'s forward, the loss from tessera (see tessera.transformers)"
    forward.__signature__ = signature  # the Trainer keeps the batch's columns the signature names
    return forward


def _router_fields(model, text):
    """(experts, k, the loss's coefficient) of a MoE model's load-balancing loss: the causal LM's
    own attributes, else its text config's (a vision-language model's)."""
    def field(own, *names):
        value = getattr(model, own, None)
        for name in names:
            value = getattr(text, name, None) if value is None else value
        return value
    return (field("num_experts", "num_experts", "num_local_experts", "n_routed_experts"),
            field("num_experts_per_tok", "num_experts_per_tok"), field("router_aux_loss_coef", "router_aux_loss_coef"))


def _loss_of_logits(logits, target, num_items):
    """The loss of float32 logits, summed over num_items or averaged over the labelled tokens."""
    logits, target = logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1)
    reduction = "sum" if num_items is not None else "mean"
    ce = tessera.cross_entropy if logits.is_cuda else F.cross_entropy
    return _per_item(ce(logits, target, ignore_index=IGNORE_INDEX, reduction=reduction), num_items)
