"""tessera for Hugging Face transformers: one call puts a model family's RMSNorm, RoPE, gated MLP
and loss on tessera's kernels, as Liger-Kernel's ``apply_liger_kernel_to_<family>`` does, with the
same keywords (a user switches by renaming the call).

    import tessera.transformers as tt
    tt.apply_tessera_to_llama()                       # before the model is built: its classes
    model = AutoModelForCausalLM.from_config(config)
    tt.apply_tessera(model)                           # or an existing model, in place
    model = tt.AutoTesseraForCausalLM.from_pretrained(path)   # patched as it loads

What each keyword swaps (the modules keep their parameters, names and shapes, so checkpoints,
``state_dict`` and PEFT's ``target_modules`` are unchanged):
  - ``rms_norm``: every ``<Family>RMSNorm``'s forward (the hidden size's and Qwen3's and Gemma 3's
    per-head q/k norms) to ``tessera.rms_norm``; Gemma's ``x * (1 + weight)``, all in float32, as
    Gemma computes it, holding x in its own dtype for the backward.
  - ``rope``: the modeling module's ``apply_rotary_pos_emb`` to ``tessera.rotary_embedding``
    (rotate_half pairs, cos/sin of shape (batch or 1, seq, head_dim), ``unsqueeze_dim``, unequal
    q and k heads, a partial rotary read from cos's width; GLM's, Helium's and ERNIE's interleaved
    pairs). A module-level function: patched for
    the whole family, also when ``model`` is given (as Liger does).
  - ``swiglu`` (``geglu`` for Gemma): the MLP's forward to ``tessera.silu_mul`` of the gate and up
    projections (Phi-3: the halves of ``gate_up_proj``); Gemma's tanh-GELU gate through
    ``tessera.geglu``. The gated product, the down projection's input, is not held for the
    backward: it is recomputed there in the pass that takes the gate's gradients (one
    tokens x intermediate tensor less per layer), where down_proj is a plain ``nn.Linear``. With
    ``fp8=`` the same forward runs on the converted projections (each a Float8Linear, called as
    the module): the gate and up products in float8, then the gated product quantized for
    down_proj, a Float8Linear too, in the pass that computes it (``float8.gated_linear``: never
    written in bfloat16), its float8 copy kept for down_proj's backward. An MLP
    whose config names another activation keeps its own forward.
  - ``fused_linear_cross_entropy``: the causal LM's forward in training with labels: the loss from
    ``tessera.linear_cross_entropy`` on the hidden states, never the logits (labels shifted by
    padding with -100, or ``shift_labels``; ``num_items_in_batch`` for gradient accumulation;
    Gemma 2's final logit soft-cap). Without labels, or in eval, the original forward (logits).
    A head converted to a Float8Linear (``fp8_head=True`` beside ``fp8=``, which alone leaves the
    head out; or ``tessera.float8.convert_to_float8_training(model.lm_head)``) runs the loss's
    logits and d_hidden GEMMs in float8 (``tessera.float8.linear_cross_entropy``), except with a
    soft-cap, a bias or the token accuracy; torch.compile breaks its graph there (fullgraph=True
    refuses it).
  - ``cross_entropy`` (instead of the fused loss): the logits as transformers computes them, the
    loss from ``tessera.cross_entropy``.
  - With either loss, ``model(..., return_token_accuracy=True)`` in training also returns
    ``token_accuracy`` (the output a ``TesseraCausalLMOutputWithPast``), as TRL's SFTTrainer asks of
    Liger's models.

  - ``experts`` (the Mixture-of-Experts families: Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss, DeepSeek-V3): the
    ``<Family>Experts`` forward to tessera's (tessera/_transformers_experts.py: the pairs sorted by
    expert, both projections as ``tessera.grouped_mm``, the gate through ``tessera.silu_mul``, the
    pairs summed per token in a fixed order); also registered as ``experts_implementation="tessera"``.
    The router stays the model's; with ``output_router_logits`` the fused loss adds the
    load-balancing loss as the family's forward does (the output a ``MoeCausalLMOutputWithPast``).
    gpt-oss keeps its attention (its sinks are not in tessera's kernels) and RoPE (half-width
    angles), and its own clamped gate; its norms, experts and loss are tessera's. DeepSeek-V3 keeps
    its MLA attention and RoPE, and has no auxiliary loss (its router balances by a bias).

  - ``attention``: the model's ``attn_implementation`` to ``"tessera"``, tessera's FlashAttention
    behind transformers' AttentionInterface (causal, GQA, sliding windows, soft-cap, padded batches
    and packed sequences: tessera/_transformers_attention.py). By class, a model built afterwards
    without an ``attn_implementation`` of its own takes it (one named in ``from_config`` /
    ``from_pretrained`` is kept); by instance, the model is switched. ``attention=False`` keeps the
    model's own, and so does a config with attention dropout, which tessera's kernels do not apply.
  - Always, with sdpa kept (``attention=False`` or one named): under ``torch.compile``, the family's
    causal mask is left out where it is plainly causal (no cached tokens, no padding, no packed
    sequences, no window it reaches), so that sdpa runs its causal kernels as it does uncompiled.
    transformers materializes the mask whenever it traces, and sdpa's masked kernels are much slower
    than its causal ones. Where the mask or positions must be read to know, the trace breaks once,
    at the mask.

Importing this module also registers ``attn_implementation="tessera"`` and
``experts_implementation="tessera"``.

``revert()`` undoes every patch of this module (the classes' and the modeling modules'). Needs
transformers >= 5 (``pip install tessera[transformers]``); nothing else in tessera imports this.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F
import transformers
from transformers.cache_utils import DynamicCache

import tessera

from . import _interop, _transformers_attention, _transformers_experts, float8
from ._transformers_families import ALIASES, FAMILIES, Family, modeling
from ._transformers_loss import TesseraCausalLMOutputWithPast, _causal_lm_forward
from .elementwise import gated as _gated, gated_backward_recompute as _gated_backward_recompute

_transformers_attention.register(transformers)
_transformers_experts.register(transformers)
# tessera's torch ops now, not at the first call, which may come inside torch.compile's trace.
_interop.init_ops(torch)


# The activations each gate stands for (config.hidden_act, or Gemma's hidden_activation).
_GATE_ACTIVATIONS = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")}

# (id(owner), attribute) -> (owner, what the owner itself held before the first patch: _MISSING
# where nothing, the attribute coming from a base class or, for an instance, from its class), for
# revert(). By id: configs, which are patched too, do not hash.
_ORIGINALS: dict[tuple[int, str], tuple[Any, Any]] = {}
_MISSING = object()


def _keep(owner: Any, name: str) -> None:
    """Records what `owner` holds of `name` before its first patch."""
    _ORIGINALS.setdefault((id(owner), name), (owner, vars(owner).get(name, _MISSING)))


def _patched(owner: Any, name: str) -> bool:
    return (id(owner), name) in _ORIGINALS


def _set(owner: Any, name: str, value: Any) -> None:
    _keep(owner, name)
    setattr(owner, name, value)


def revert() -> None:
    """Undoes every patch this module made: classes, modeling modules, instances and configs."""
    for (_, name), (owner, value) in reversed(list(_ORIGINALS.items())):
        if value is _MISSING:
            if name in vars(owner):
                delattr(owner, name)
        else:
            setattr(owner, name, value)
    _ORIGINALS.clear()


def _original(cls: type, name: str) -> Any:
    """The class's attribute as it was before this module patched it (a base class's where the
    class held none of its own)."""
    if not _patched(cls, name):
        return getattr(cls, name)
    value = _ORIGINALS[(id(cls), name)][1]
    if value is not _MISSING:
        return value
    return getattr(super(cls, cls), name)


# ---- the replacement forwards -------------------------------------------------------------------

def _eps(norm) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(norm.eps if eps is None else eps)


def rms_norm_forward(self, hidden_states):
    """Llama's RMSNorm: x / rms(x) * weight (tessera rounds once, after the weight). A norm that
    feeds float8 projections (fp8=: _mark_fp8_norms) also quantizes its output for them."""
    granularity = getattr(self, "_tessera_fp8", None)
    if granularity is not None:
        return float8.rms_norm(hidden_states, self.weight, _eps(self), granularity)
    return tessera.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, _eps(self))


def layer_norm_1p_forward(self, hidden_states):
    """Nemotron's LayerNorm1P: LayerNorm with the weight offset by 1, in the input's dtype."""
    return tessera.layer_norm(hidden_states, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


class _GemmaRMSNorm(torch.autograd.Function):
    """Gemma's RMSNorm where x and the weight differ in dtype: in float32, holding x in its own
    dtype for the backward rather than its float32 copy."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        out, rstd = tessera.rms_norm_forward(x.float(), (x.shape[-1],), weight.float(), eps, weight_offset=1.0)
        ctx.save_for_backward(x, weight, rstd)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_w = tessera.rms_norm_backward(grad.float(), x.float(), (x.shape[-1],), rstd,
                                                   weight.float(), ctx.needs_input_grad[:2], weight_offset=1.0)
        return (None if grad_x is None else grad_x.to(x.dtype),
                None if grad_w is None else grad_w.to(weight.dtype), None)


def gemma_rms_norm_forward(self, x):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight) in float32, rounded once to x's dtype. The
    kernel adds the 1 to each weight in float32, which is Gemma's arithmetic."""
    if x.dtype == self.weight.dtype:
        granularity = getattr(self, "_tessera_fp8", None)
        if granularity is not None:
            return float8.rms_norm(x, self.weight, _eps(self), granularity, weight_offset=1.0)
        return tessera.rms_norm(x, (x.shape[-1],), self.weight, _eps(self), weight_offset=1.0)
    if x.is_cuda:
        return _GemmaRMSNorm.apply(x, self.weight, _eps(self))
    return tessera.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), _eps(self), weight_offset=1.0).to(x.dtype)


def _activation(config) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _takes_gate(module, gate: str) -> bool:
    config = getattr(module, "config", None)
    return config is None or _activation(config) in _GATE_ACTIVATIONS[gate]


class _GatedDown(torch.autograd.Function):
    """linear(act(gate) * up, weight, bias), the feed-forward's down projection of its gated
    product, holding only gate and up for the backward: the product, the projection's input, is
    recomputed there in the same pass as the gate's gradients, instead of being held from the
    forward (tokens x intermediate elements per layer)."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, kind):
        ctx.save_for_backward(gate, up, weight)
        ctx.kind = kind
        return F.linear(_gated(kind, gate, up), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        grad_gate, grad_up, product = _gated_backward_recompute(ctx.kind, grad @ weight, gate, up)
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = rows.t() @ product.reshape(-1, product.shape[-1]) if ctx.needs_input_grad[2] else None
        grad_bias = rows.sum(0) if ctx.needs_input_grad[3] else None
        return grad_gate, grad_up, grad_weight, grad_bias, None


def _down_of_gated(mlp, kind, gate, up):
    """mlp.down_proj(act(gate) * up); through _GatedDown where down_proj is a plain nn.Linear
    (no hooks, no adapter, not sharded on its own, no autocast), so the product is not held; a
    Float8Linear (fp8=) through float8.gated_linear, which quantizes the product in the pass that
    computes it and holds only its float8 copy; any other down_proj called as the module."""
    down = mlp.down_proj
    if (type(down) is torch.nn.Linear and not down._forward_hooks and not down._forward_pre_hooks
            and not torch.is_autocast_enabled(gate.device.type) and gate.dtype == down.weight.dtype):
        return _GatedDown.apply(gate, up, down.weight, down.bias, kind)
    if type(down).__name__ == "Float8Linear" and type(down).__module__ == float8.__name__:
        return float8.gated_linear(kind, gate, up, down)
    return down(_gated(kind, gate, up))


def swiglu_forward(self, x):
    """down(silu(gate(x)) * up(x)) with tessera.silu_mul."""
    if not _takes_gate(self, "silu"):
        return _original(type(self), "forward")(self, x)
    return _down_of_gated(self, "silu", self.gate_proj(x), self.up_proj(x))


def geglu_forward(self, x):
    """down(gelu_tanh(gate(x)) * up(x)), Gemma's gate."""
    if not _takes_gate(self, "gelu_tanh"):
        return _original(type(self), "forward")(self, x)
    return _down_of_gated(self, "gelu_tanh", self.gate_proj(x), self.up_proj(x))


def fused_swiglu_forward(self, hidden_states):
    """Phi-3: gate and up as the two halves of gate_up_proj."""
    if not _takes_gate(self, "silu"):
        return _original(type(self), "forward")(self, hidden_states)
    gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
    return _down_of_gated(self, "silu", gate, up)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb (rotate_half pairs) on tessera.rotary_embedding: q, k
    (batch, heads, seq, head_dim) where unsqueeze_dim is 1, (batch, seq, heads, head_dim) where 2;
    cos, sin (batch or 1, seq, rotary_dim), each angle twice; rotary_dim < head_dim rotates the
    first rotary_dim features and copies the rest."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"tessera.transformers.apply_rotary_pos_emb: argument 'unsqueeze_dim': expected 1 "
                         f"(q as batch, heads, seq, dim) or 2 (batch, seq, heads, dim), got {unsqueeze_dim!r}")
    if cos.dim() == 2:  # (seq, rotary_dim): one row for every batch
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if cos.shape[-1] < q.shape[-1]:  # a partial rotary: FlashAttention's form, each angle once
        half = cos.shape[-1] // 2
        cos, sin = cos[..., :half], sin[..., :half]
    return tessera.rotary_embedding(q, k, cos, sin, layout="bhsd" if unsqueeze_dim == 1 else "bshd")


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """GLM's apply_rotary_pos_emb on tessera.rotary_embedding: interleaved pairs (x[2i], x[2i+1]),
    the angles of cos, sin (batch or 1, seq, rotary_dim) each once in its first half; rotary_dim <
    head_dim rotates the first rotary_dim features and copies the rest."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"tessera.transformers.apply_rotary_pos_emb: argument 'unsqueeze_dim': expected 1 "
                         f"(q as batch, heads, seq, dim) or 2 (batch, seq, heads, dim), got {unsqueeze_dim!r}")
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    half = cos.shape[-1] // 2
    return tessera.rotary_embedding(q, k, cos[..., :half], sin[..., :half], interleaved=True,
                                    layout="bhsd" if unsqueeze_dim == 1 else "bshd")


# ---- attention ---------------------------------------------------------------------------------

def _plainly_causal(call: dict, sliding: bool) -> bool:
    """Whether a mask creation's arguments (by name) describe a plain causal mask for sdpa: no cached
    tokens, no padding, no packed sequences, no window reached, nothing overlaid. Reads the padding
    mask and, without a cache, the positions (a graph break under torch.compile) only where given."""
    config = call.get("config")
    embeds = call.get("inputs_embeds", call.get("input_embeds"))
    if config is None or embeds is None or config._attn_implementation != "sdpa" or not getattr(config, "is_causal", True):
        return False
    if any(call.get(k) is not None for k in ("or_mask_function", "and_mask_function", "block_sequence_ids")):
        return False
    if call.get("allow_is_causal_skip", True) is False:
        return False
    q = embeds.shape[1]
    if sliding:
        window = getattr(config, "sliding_window", None)
        if window is None or q >= window:
            return False
    cache, positions, mask = call.get("past_key_values"), call.get("position_ids"), call.get("attention_mask")
    if cache is not None:
        if not isinstance(cache, DynamicCache) or cache.get_seq_length() != 0:
            return False
    elif positions is not None and not bool((positions.diff(dim=-1) == 1).all()):
        return False  # packed sequences (positions restarting) need their block mask
    if mask is not None and (mask.dim() != 2 or mask.shape[-1] != q or not bool(mask.all())):
        return False
    return True


def _sdpa_mask(original: Callable, sliding: bool) -> Callable:
    """The modeling module's create_causal_mask (or create_sliding_window_causal_mask), returning
    None under torch.compile where the mask is plainly causal: sdpa then runs with is_causal. The
    call is read by the original's parameter names, fixed here, with plain dict operations."""
    names = list(inspect.signature(original).parameters)

    def create(*args, **kwargs):
        if torch.compiler.is_compiling():
            call = dict(zip(names, args))
            call.update(kwargs)
            if _plainly_causal(call, sliding):
                return None
        return original(*args, **kwargs)

    create.__doc__ = f"{original.__name__} with sdpa's causal kernels kept under torch.compile (tessera.transformers)"
    return create


def _patch_masks(module: types.ModuleType) -> None:
    for name, sliding in (("create_causal_mask", False), ("create_sliding_window_causal_mask", True)):
        original = vars(module).get(name)
        if original is not None and not _patched(module, name):
            _set(module, name, _sdpa_mask(original, sliding))


def _takes_attention(config) -> bool:
    """Whether tessera's attention runs this config's models on its kernels: not with attention
    dropout, which the kernels do not apply (the attention's torch path would, at a torch matmul's
    cost and memory)."""
    return not float(getattr(config, "attention_dropout", 0.0) or 0.0)


def _attention_by_default(cls: type) -> None:
    """Models of `cls` built afterwards take attn_implementation="tessera" unless they name one."""
    check = _original(cls, "_check_and_adjust_attn_implementation")

    def adjust(self, attn_implementation, *args, **kwargs):
        if attn_implementation is None and _takes_attention(self.config):
            attn_implementation = "tessera"
        return check(self, attn_implementation, *args, **kwargs)

    _set(cls, "_check_and_adjust_attn_implementation", adjust)


def _attention_on(model) -> None:
    """Switches a built model (and its submodels sharing its config) to tessera's attention."""
    config = model.config
    if config._attn_implementation == "tessera" or not _takes_attention(config):
        return
    _keep(config, "_attn_implementation_internal")
    model.set_attn_implementation("tessera")


# ---- applying ----------------------------------------------------------------------------------

def _norm_classes(family: Family, module: types.ModuleType) -> list[type]:
    return [c for n, c in vars(module).items() if isinstance(c, type) and n == family.name("RMSNorm")]


def _mlp_forward(family: Family) -> Callable:
    """The family's gated MLP forward, for bf16 and fp8= alike: it calls the projections as
    modules, so Float8Linear ones run their float8 GEMMs, and _down_of_gated hands the product to a
    Float8Linear down_proj as the module."""
    if family.fused_gate_up:
        return fused_swiglu_forward
    return swiglu_forward if family.gate == "silu" else geglu_forward


def _fp8_filter(model, recipe: str) -> Callable:
    """The Linears fp8= converts: the language model's projections (attention, MLP, a shared
    expert's), not the output head (it stays under the fused loss), a router, or a vision tower."""
    head = model.get_output_embeddings()

    def keep(linear, fqn: str) -> bool:
        leaf = fqn.rsplit(".", 1)[-1]
        return (linear is not head and leaf not in ("gate", "router", "shared_expert_gate", "lm_head")
                and not any(part in fqn for part in ("vision", "visual", "projector"))
                and float8._misfit(linear, recipe) is None)
    return keep


def _check_fp8(fp8, fp8_head: bool = False) -> None:
    if fp8 is not None and fp8 not in float8.RECIPES:
        raise ValueError(f"tessera.transformers: argument 'fp8': expected None or one of {float8.RECIPES}, got {fp8!r}")
    if fp8_head and fp8 is None:
        raise ValueError("tessera.transformers: argument 'fp8_head': it converts the output head by the fp8 recipe, "
                         "so it needs fp8='rowwise', 'blockwise' or 'tensorwise'")


def _apply(family: Family, *, rope: bool = True, rms_norm: bool = True, mlp: bool = True,
           cross_entropy: bool = False, fused_linear_cross_entropy: bool = True, attention: bool = True,
           experts: bool = True, fp8: str | None = None, fp8_head: bool = False, model=None) -> None:
    if cross_entropy and fused_linear_cross_entropy:
        raise ValueError("tessera.transformers: cross_entropy and fused_linear_cross_entropy are two ways "
                         "to the same loss: ask for one")
    _check_fp8(fp8, fp8_head)
    if fp8 is not None and model is None:
        raise ValueError("tessera.transformers: argument 'fp8': it converts a model's Linear layers, so it needs "
                         "the model (apply_tessera(model, fp8=...), model=..., or AutoTesseraForCausalLM)")
    module = modeling(family)
    if family.language:
        return _apply_around(family, module, rope=rope, rms_norm=rms_norm, mlp=mlp, cross_entropy=cross_entropy,
                             fused_linear_cross_entropy=fused_linear_cross_entropy, attention=attention,
                             experts=experts, fp8=fp8, fp8_head=fp8_head, model=model)
    _with_fp8(model, fp8, fp8_head)
    rope, mlp, attention = rope and family.rotary, mlp and family.dense_mlp, attention and family.attention
    if rope:
        _set(module, "apply_rotary_pos_emb",
             apply_rotary_pos_emb_interleaved if family.rope_interleaved else apply_rotary_pos_emb)
    _patch_masks(module)
    if attention and model is None:
        _attention_by_default(getattr(module, family.name("PreTrainedModel")))
    elif attention:
        _attention_on(model)
    norm_fn = (layer_norm_1p_forward if family.norm == "layer_norm_1p" else
               gemma_rms_norm_forward if family.gemma_norm else rms_norm_forward)
    mlp_cls = getattr(module, family.name("MLP"), None)  # a dense MLP (MoE: the shared expert, if any)
    mlp = mlp and mlp_cls is not None
    experts_cls = getattr(module, family.experts) if family.experts and experts else None
    lm_cls = getattr(module, family.name("ForCausalLM"))
    lm_fn = (_causal_lm_forward(family, fused_linear_cross_entropy, _original(lm_cls, "forward"))
             if cross_entropy or fused_linear_cross_entropy else None)
    norms = _norm_classes(family, module)
    if model is None:  # the classes: every model built afterwards (and before) runs tessera
        for cls in norms if rms_norm else []:
            _set(cls, "forward", norm_fn)
        if mlp:
            _set(mlp_cls, "forward", _mlp_forward(family))
        if experts_cls is not None:
            _set(experts_cls, "forward", _transformers_experts.experts_forward)
        if lm_fn is not None:
            _set(lm_cls, "forward", lm_fn)
        return
    for m in model.modules():  # this model's modules, in place (inside a PEFT model too)
        if rms_norm and isinstance(m, tuple(norms)):
            _set(m, "forward", types.MethodType(norm_fn, m))
        elif mlp and isinstance(m, mlp_cls):
            _set(m, "forward", types.MethodType(_mlp_forward(family), m))
        elif experts_cls is not None and isinstance(m, experts_cls):
            _set(m, "forward", types.MethodType(_transformers_experts.experts_forward, m))
        elif lm_fn is not None and isinstance(m, lm_cls):
            _set(m, "forward", types.MethodType(lm_fn, m))


def _apply_around(family: Family, module, *, cross_entropy: bool, fused_linear_cross_entropy: bool, model,
                  fp8: str | None = None, fp8_head: bool = False, **text) -> None:
    """A vision-language model around another row's language model: its loss here (by class or
    instance); an instance's language model as the row of its text config's model type."""
    lm_cls = getattr(module, family.name("ForCausalLM"))
    if cross_entropy or fused_linear_cross_entropy:
        fn = _causal_lm_forward(family, fused_linear_cross_entropy, _original(lm_cls, "forward"))
        if model is None:
            _set(lm_cls, "forward", fn)
        for m in model.modules() if model is not None else ():
            if isinstance(m, lm_cls):
                _set(m, "forward", types.MethodType(fn, m))
    if model is not None:
        _apply(_family_of(model.config.get_text_config().model_type), cross_entropy=False,
               fused_linear_cross_entropy=False, fp8=fp8, fp8_head=fp8_head, model=model, **text)


def _apply_function(family: Family) -> Callable:
    mlp_kw = family.mlp_keyword
    extra = family.keywords

    def apply(rope: bool = True, rms_norm: bool = True, cross_entropy: bool = False,
              fused_linear_cross_entropy: bool = True, attention: bool = True, fp8: str | None = None,
              fp8_head: bool = False, model=None, **kwargs) -> None:
        unknown = set(kwargs) - extra
        if unknown:
            raise TypeError(f"apply_tessera_to_{family.model_type}() got unexpected keyword argument(s) "
                            f"{', '.join(sorted(unknown))} (it takes rope, rms_norm, {', '.join(sorted(extra))}, "
                            "cross_entropy, fused_linear_cross_entropy, attention, fp8, fp8_head, model)")
        mlp = all(kwargs.get(k, True) for k in extra - {"experts"})
        _apply(family, rope=rope, rms_norm=rms_norm, mlp=mlp, cross_entropy=cross_entropy,
               fused_linear_cross_entropy=fused_linear_cross_entropy, attention=attention,
               experts=kwargs.get("experts", True), fp8=fp8, fp8_head=fp8_head, model=model)

    apply.__name__ = apply.__qualname__ = f"apply_tessera_to_{family.model_type}"
    apply.__doc__ = (f"Puts {family.prefix} models on tessera's kernels: rope, rms_norm, {mlp_kw}, the loss "
                     "(fused_linear_cross_entropy, or cross_entropy) and attention (attn_implementation "
                     "'tessera'; False keeps the model's); fp8='rowwise', 'blockwise' or 'tensorwise' also "
                     "converts the model's Linear layers (the output head too with fp8_head=True, then the "
                     "fused loss's GEMMs in float8) to tessera.float8's "
                     "Float8Linear (the MLP's gate still tessera's); model=None patches the classes before "
                     "a model is built, model=... an existing one in place (see tessera.transformers).")
    if family.language:
        apply.__doc__ = (f"Puts {family.prefix} models' loss on tessera (fused_linear_cross_entropy, or "
                         "cross_entropy); with model=..., also its language model as the row of its text "
                         "config's model type (rope, rms_norm, swiglu or geglu, experts, attention). "
                         "model=None patches the loss's class only: the language model's family takes its "
                         "own apply_tessera_to_<family>() (see tessera.transformers).")
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in
              (("rope", True), ("rms_norm", True), *((k, True) for k in ("swiglu", "geglu", "experts") if k in extra),
               ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("attention", True),
               ("fp8", None), ("fp8_head", False), ("model", None))]
    apply.__signature__ = inspect.Signature(params)
    return apply


for _family in FAMILIES.values():
    globals()[f"apply_tessera_to_{_family.model_type}"] = _apply_function(_family)

__all__ = ["FAMILIES", "AutoTesseraForCausalLM", "TesseraCausalLMOutputWithPast", "apply_rotary_pos_emb",
           "apply_rotary_pos_emb_interleaved", "apply_tessera",
           "revert",
           *(f"apply_tessera_to_{t}" for t in FAMILIES)]


def _family_of(model_type: str) -> Family:
    family = FAMILIES.get(ALIASES.get(model_type, model_type))
    if family is None:
        raise ValueError(f"tessera.transformers: no patch for model_type {model_type!r}; it covers "
                         f"{', '.join(FAMILIES)}")
    return family


def apply_tessera(model, **kwargs) -> None:
    """apply_tessera_to_<family>(model=model, **kwargs) for model.config.model_type, leaving out the
    keywords the family does not take (geglu for Llama, swiglu for Gemma)."""
    family = _family_of(model.config.model_type)
    other = {"swiglu", "geglu", "experts"} - family.keywords
    taken = {k: v for k, v in kwargs.items() if k not in other}
    globals()[f"apply_tessera_to_{family.model_type}"](model=model, **taken)


def _apply_for_config(config, kwargs: dict) -> tuple:
    """Pops tessera's keywords from from_pretrained's / from_config's and patches the family's
    classes; returns (the other keywords, the fp8 recipe and fp8_head for the model once built)."""
    names = {"rope", "rms_norm", "swiglu", "geglu", "experts", "cross_entropy", "fused_linear_cross_entropy",
             "attention"}
    ours = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
    fp8, head = kwargs.pop("fp8", None), kwargs.pop("fp8_head", False)
    _check_fp8(fp8, head)
    family = _family_of(config.model_type)
    other = {"swiglu", "geglu", "experts"} - family.keywords
    ours = {k: v for k, v in ours.items() if k not in other}
    globals()[f"apply_tessera_to_{family.model_type}"](**ours)
    return kwargs, (fp8, head)


def _mark_fp8_norms(model, recipe: str) -> None:
    """The norms whose output goes straight into float8 projections (a decoder layer's norm before
    its attention, and the one before its MLP: pre_feedforward_layernorm where the layer has one,
    else post_attention_layernorm) quantize that output as they write it (float8.rms_norm), for the
    recipes whose activations go by rows or by tensor. A mark on a norm no Float8Linear then reads
    costs the quantization and nothing else: the copies are dropped at the next float8 GEMM."""
    granularity = float8._OPERANDS[recipe][0]
    if granularity not in ("row", "tensor"):
        return
    linear = float8.Float8Linear
    for layer in model.modules():
        mlp_norm = "pre_feedforward_layernorm" if hasattr(layer, "pre_feedforward_layernorm") else "post_attention_layernorm"
        for norm_name, block_name in (("input_layernorm", "self_attn"), (mlp_norm, "mlp")):
            norm, block = getattr(layer, norm_name, None), getattr(layer, block_name, None)
            if (isinstance(norm, torch.nn.Module) and isinstance(block, torch.nn.Module)
                    and any(isinstance(m, linear) for m in block.modules())):
                norm._tessera_fp8 = granularity


def _with_fp8(model, fp8, head: bool = False):
    lm_head = model.get_output_embeddings() if head else None
    if head:  # checked before anything is converted
        if not isinstance(lm_head, torch.nn.Linear):
            raise TypeError("tessera.transformers: argument 'fp8_head': expected the output head to be a "
                            f"torch.nn.Linear, got {type(lm_head).__name__}")
        bad = float8._misfit(lm_head, fp8)
        if bad:
            raise ValueError(f"tessera.transformers: argument 'fp8_head': the output head's {bad[0]} must be a "
                             f"multiple of {bad[1]} for the {fp8} recipe, got {lm_head}")
    if fp8 is not None:
        float8.convert_to_float8_training(model, recipe=fp8, module_filter_fn=_fp8_filter(model, fp8))
        _mark_fp8_norms(model, fp8)
    if head:  # the fused loss then runs the head's GEMMs in float8 (float8.linear_cross_entropy)
        float8.convert_to_float8_training(lm_head, recipe=fp8)
    return model


class AutoTesseraForCausalLM(transformers.AutoModelForCausalLM):
    """AutoModelForCausalLM whose from_pretrained and from_config patch the model's family first
    (tessera's keywords, apply_tessera_to_<family>'s, go with the others; fp8= converts the built
    model's Linear layers)."""

    @classmethod
    def from_config(cls, config, **kwargs):
        kwargs, fp8 = _apply_for_config(config, kwargs)
        return _with_fp8(super().from_config(config, **kwargs), *fp8)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        config = kwargs.get("config")
        if config is None or isinstance(config, (str, bytes)):
            config = transformers.AutoConfig.from_pretrained(pretrained_model_name_or_path,
                                                             trust_remote_code=kwargs.get("trust_remote_code", False))
        kwargs, fp8 = _apply_for_config(config, kwargs)
        return _with_fp8(super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs), *fp8)

