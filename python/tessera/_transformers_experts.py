"""transformers' experts on tessera: ``experts_implementation="tessera"`` (registered with
transformers' ExpertsInterface when tessera.transformers is imported) and the forward that
``apply_tessera`` gives the MoE families' ``<Family>Experts`` classes.

The forward is transformers' "grouped_mm" backend on tessera's ops: the k (token, expert) pairs
sorted by expert (``tessera.moe_sort``: a stable sort, so each expert's tokens keep their order,
and the groups' cumulative ends, which stay on the GPU), the tokens copied into that order
(``tessera.moe_permute``), the gate and up projections of
every pair as one ``tessera.grouped_mm`` over the experts' weights as stored ([E, 2F, H] as a
transposed view: no copy), the gate through ``tessera.silu_mul`` where it is SiLU on concatenated
halves (the module's own ``_apply_gate`` otherwise), the down projection as a second grouped
product, and each token's pairs summed back with their routing weights in a fixed order
(``tessera.moe_unpermute``: no atomics, the same bits every run). Autograd runs through tessera's
ops: the grouped products' gradients are grouped products, the permutations' each other.
Biases (gpt-oss) are added per pair.
"""

from __future__ import annotations

import torch

import tessera


def _weight(module, name: str) -> torch.Tensor:
    """[E, in, out] for x @ w: the stored [E, out, in] transposed (a view), unless stored transposed."""
    w = getattr(module, name)
    return w if getattr(module, "is_transposed", False) else w.transpose(-2, -1)


def _default_gate():
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:
        return None
    return _default_apply_gate


def _gate(module, h: torch.Tensor) -> torch.Tensor:
    """act(gate) * up: tessera.silu_mul for SiLU on concatenated halves under transformers' default
    gate; a family's own gate (gpt-oss's clamped one) as the module computes it."""
    act = getattr(module, "act_fn", None)
    own = getattr(type(module), "_apply_gate", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")
    if own is not None and own is not _default_gate():
        return module._apply_gate(h)
    if silu and getattr(module, "is_concatenated", True):
        gate, up = h.chunk(2, dim=-1)
        return tessera.silu_mul(gate, up)
    if own is not None:
        return module._apply_gate(h)
    gate, up = h.chunk(2, dim=-1)
    return act(gate) * up


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output for every token: sum over its k experts of weight * expert(token)."""
    rows, offs = tessera.moe_sort(top_k_index, self.num_experts)
    x = tessera.moe_permute(hidden_states, rows)
    has_bias = getattr(self, "has_bias", False)
    if has_bias:  # each sorted row's expert, for the biases (gpt-oss)
        expert = torch.searchsorted(offs, torch.arange(x.shape[0], device=offs.device, dtype=torch.int32),
                                    right=True).clamp_(max=self.num_experts - 1)
    if getattr(self, "has_gate", True):
        h = tessera.grouped_mm(x, _weight(self, "gate_up_proj"), offs)
        if has_bias:
            h = h + self.gate_up_proj_bias[expert]
        h = _gate(self, h)
    else:
        h = tessera.grouped_mm(x, _weight(self, "up_proj"), offs)
        if has_bias:
            h = h + self.up_proj_bias[expert]
        h = self.act_fn(h)
    y = tessera.grouped_mm(h, _weight(self, "down_proj"), offs)
    if has_bias:
        y = y + self.down_proj_bias[expert]
    if getattr(self, "has_post_expert_norm", False):
        y = self.post_expert_norm(y)
    return tessera.moe_unpermute(y, rows, top_k_weights)


def register(transformers) -> bool:
    """Registers "tessera" with transformers' ExpertsInterface, where this transformers has one."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register("tessera", experts_forward)
    return True
