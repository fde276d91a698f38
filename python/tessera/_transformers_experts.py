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
(``tessera.moe_unpermute``: no atomics, the same bits every run): tessera.moe's routed experts.
With SiLU on concatenated halves, no biases and no post-norm (Qwen2/3-MoE, Mixtral, DeepSeek,
HunYuan) that is one autograd node holding only the gate-up product for the backward; otherwise
autograd runs through the ops (the grouped products' gradients are grouped products, the
permutations' each other). Biases (gpt-oss) are added per pair.
"""

from __future__ import annotations

import torch

from tessera.moe import routed_experts


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


def _gate(module):
    """The experts' gate: "silu" (tessera's fused experts) for SiLU on concatenated halves under
    transformers' default gate; else a function of the gate-up product: the family's own gate
    (gpt-oss's clamped one) as the module computes it, or act(gate) * up."""
    act = getattr(module, "act_fn", None)
    own = getattr(type(module), "_apply_gate", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")
    if own is not None and own is not _default_gate():
        return module._apply_gate
    if silu and getattr(module, "is_concatenated", True):
        return "silu"
    if own is not None:
        return module._apply_gate

    def gate(h):
        g, up = h.chunk(2, dim=-1)
        return act(g) * up
    return gate


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output for every token: sum over its k experts of weight * expert(token)."""
    bias = getattr(self, "has_bias", False)
    gated = getattr(self, "has_gate", True)
    w1 = _weight(self, "gate_up_proj" if gated else "up_proj")
    b1 = getattr(self, "gate_up_proj_bias" if gated else "up_proj_bias") if bias else None
    post = self.post_expert_norm if getattr(self, "has_post_expert_norm", False) else None
    return routed_experts(hidden_states, w1, _weight(self, "down_proj"), top_k_index, top_k_weights,
                          self.num_experts, _gate(self) if gated else self.act_fn, b1,
                          self.down_proj_bias if bias else None, post)


def register(transformers) -> bool:
    """Registers "tessera" with transformers' ExpertsInterface, where this transformers has one."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register("tessera", experts_forward)
    return True
