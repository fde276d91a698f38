"""tessera.transformers' table: a model family as its modeling module writes it, one row each
(FAMILIES), and the model types patched as another's row (ALIASES). A field exists where a family
differs; tessera/transformers.py turns each row into its apply_tessera_to_<family>."""

from __future__ import annotations

import dataclasses
import importlib
import types


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family as its modeling module writes it (one row of FAMILIES)."""
    model_type: str           # config.model_type
    module: str               # transformers.models.<module>.modeling_<module>
    prefix: str               # the classes' prefix: <prefix>RMSNorm, <prefix>MLP, <prefix>ForCausalLM
    gemma_norm: bool = False  # x * (1 + weight), in float32
    norm: str = "rms"         # "rms", or "layer_norm_1p": LayerNorm with weight + 1 and a bias (Nemotron's)
    gate: str = "silu"        # the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    fused_gate_up: bool = False  # one gate_up_proj, gate in the first half (Phi-3)
    softcap: str | None = None   # the config's final logit soft-cap attribute, if any
    experts: str | None = None   # MoE: the experts' class (<prefix>Experts), run on tessera.grouped_mm
    dense_mlp: bool = True       # <prefix>MLP is a gated MLP (gpt-oss's is its router and experts)
    rotary: bool = True          # tessera's RoPE takes the family's cos/sin (gpt-oss's are half-width)
    attention: bool = True       # tessera's attention takes the family's (gpt-oss's has sinks)
    aux_loss: bool = True        # MoE: the causal LM adds the router's load-balancing loss
    rope_interleaved: bool = False  # RoPE on interleaved pairs (GLM's), the angles repeated in pairs
    logits_scaling: str | None = None  # the config's divisor of the logits (Granite's), if any
    # A vision-language model around another row's language model (its text config's model type):
    # this row patches its loss; an instance's language model takes that row
    language: bool = False
    # Class names where they are not <prefix>RMSNorm, <prefix>MLP, <prefix>ForCausalLM (the
    # vision-language models: their language model's norm and MLP, their ForConditionalGeneration)
    norm_class: str | None = None
    mlp_class: str | None = None
    lm_class: str | None = None

    def name(self, kind: str) -> str:
        """The modeling module's class of `kind` (RMSNorm, MLP, ForCausalLM, PreTrainedModel)."""
        own = {"RMSNorm": self.norm_class, "MLP": self.mlp_class, "ForCausalLM": self.lm_class}.get(kind)
        return own or f"{self.prefix}{kind}"

    @property
    def mlp_keyword(self) -> str:
        return "swiglu" if self.gate == "silu" else "geglu"

    @property
    def keywords(self) -> set[str]:
        """apply_tessera_to_<family>'s keywords beyond every family's: its MLP's (both for a row
        around another's language model, which may be either), and experts for MoE."""
        if self.language:
            return {"swiglu", "geglu", "experts"}
        return {self.mlp_keyword} | ({"experts"} if self.experts else set())


FAMILIES = {f.model_type: f for f in (
    Family("llama", "llama", "Llama"),
    Family("mistral", "mistral", "Mistral"),
    Family("qwen2", "qwen2", "Qwen2"),
    Family("qwen3", "qwen3", "Qwen3"),
    Family("gemma2", "gemma2", "Gemma2", gemma_norm=True, gate="gelu_tanh", softcap="final_logit_softcapping"),
    Family("gemma3_text", "gemma3", "Gemma3", gemma_norm=True, gate="gelu_tanh", softcap="final_logit_softcapping"),
    Family("phi3", "phi3", "Phi3", fused_gate_up=True),
    Family("qwen3_moe", "qwen3_moe", "Qwen3Moe", experts="Qwen3MoeExperts"),
    Family("qwen2_moe", "qwen2_moe", "Qwen2Moe", experts="Qwen2MoeExperts"),
    Family("mixtral", "mixtral", "Mixtral", experts="MixtralExperts"),
    Family("gemma", "gemma", "Gemma", gemma_norm=True, gate="gelu_tanh"),
    Family("granite", "granite", "Granite", logits_scaling="logits_scaling"),
    Family("ministral", "ministral", "Ministral"),
    Family("olmo2", "olmo2", "Olmo2"),
    Family("olmo3", "olmo3", "Olmo3"),
    Family("smollm3", "smollm3", "SmolLM3"),
    Family("glm", "glm", "Glm", fused_gate_up=True, rope_interleaved=True),
    Family("glm4", "glm4", "Glm4", fused_gate_up=True, rope_interleaved=True),
    Family("exaone4", "exaone4", "Exaone4"),
    Family("hunyuan_v1_dense", "hunyuan_v1_dense", "HunYuanDenseV1"),
    Family("helium", "helium", "Helium", rope_interleaved=True),
    # Nemotron: LayerNorm1P; its MLP (ungated ReLU^2) kept as transformers runs it
    Family("nemotron", "nemotron", "Nemotron", norm="layer_norm_1p", norm_class="NemotronLayerNorm1P",
           dense_mlp=False),
    Family("ernie4_5", "ernie4_5", "Ernie4_5", rope_interleaved=True),
    # vision-language models: the language model's norms, MLP, attention and loss; the vision
    # tower and the multimodal RoPE (mrope) as transformers runs them
    Family("qwen2_vl", "qwen2_vl", "Qwen2VL", rotary=False, mlp_class="Qwen2MLP",
           lm_class="Qwen2VLForConditionalGeneration"),
    Family("qwen2_5_vl", "qwen2_5_vl", "Qwen2_5_VL", rotary=False, mlp_class="Qwen2MLP",
           lm_class="Qwen2_5_VLForConditionalGeneration"),
    Family("qwen3_vl", "qwen3_vl", "Qwen3VL", rotary=False, norm_class="Qwen3VLTextRMSNorm",
           mlp_class="Qwen3VLTextMLP", lm_class="Qwen3VLForConditionalGeneration"),
    Family("glm4v", "glm4v", "Glm4v", fused_gate_up=True, rotary=False, mlp_class="Glm4vTextMLP",
           lm_class="Glm4vForConditionalGeneration"),
    Family("mllama", "mllama", "Mllama", norm_class="MllamaTextRMSNorm", mlp_class="MllamaTextMLP",
           lm_class="MllamaForConditionalGeneration"),
    # Gemma 3's vision-language model: no final soft-cap in its forward (its causal LM has one)
    Family("gemma3", "gemma3", "Gemma3", gemma_norm=True, gate="gelu_tanh", lm_class="Gemma3ForConditionalGeneration"),
    # vision-language models around another family's language model, which takes its own row
    Family("llava", "llava", "Llava", rotary=False, language=True, lm_class="LlavaForConditionalGeneration"),
    Family("paligemma", "paligemma", "PaliGemma", rotary=False, language=True, softcap="final_logit_softcapping",
           lm_class="PaliGemmaForConditionalGeneration"),
    Family("internvl", "internvl", "InternVL", rotary=False, language=True,
           lm_class="InternVLForConditionalGeneration"),
    Family("smolvlm", "smolvlm", "SmolVLM", rotary=False, language=True, lm_class="SmolVLMForConditionalGeneration"),
    Family("mistral3", "mistral3", "Mistral3", rotary=False, language=True,
           lm_class="Mistral3ForConditionalGeneration"),
    # MoE vision-language models: the language model's experts, norms, MLP, attention and loss (the
    # load-balancing loss from the text config's fields)
    Family("qwen3_vl_moe", "qwen3_vl_moe", "Qwen3VLMoe", experts="Qwen3VLMoeTextExperts", rotary=False,
           norm_class="Qwen3VLMoeTextRMSNorm", mlp_class="Qwen3VLMoeTextMLP",
           lm_class="Qwen3VLMoeForConditionalGeneration"),
    Family("glm4v_moe", "glm4v_moe", "Glm4vMoe", experts="Glm4vMoeTextExperts", rotary=False,
           norm_class="Glm4vMoeTextRMSNorm", mlp_class="Glm4vMoeTextMLP", lm_class="Glm4vMoeForConditionalGeneration"),
    Family("gpt_oss", "gpt_oss", "GptOss", experts="GptOssExperts", dense_mlp=False, rotary=False, attention=False),
    Family("hunyuan_v1_moe", "hunyuan_v1_moe", "HunYuanMoEV1", experts="HunYuanMoEV1Experts", aux_loss=False),
    # DeepSeek-V2: its MLA attention and complex-valued RoPE kept; no auxiliary loss in training
    Family("deepseek_v2", "deepseek_v2", "DeepseekV2", experts="DeepseekV2Experts", rotary=False, attention=False,
           aux_loss=False),
    # DeepSeek-V3: its MLA attention and (interleaved) RoPE kept; no auxiliary loss (bias balancing)
    Family("deepseek_v3", "deepseek_v3", "DeepseekV3", experts="DeepseekV3Experts", rotary=False, attention=False,
           aux_loss=False),
)}

# The vision-language models' language models, by their own config's model type: their model's row.
ALIASES = {"qwen2_vl_text": "qwen2_vl", "qwen2_5_vl_text": "qwen2_5_vl", "qwen3_vl_text": "qwen3_vl",
           "mllama_text_model": "mllama", "glm4v_text": "glm4v", "qwen3_vl_moe_text": "qwen3_vl_moe",
           "glm4v_moe_text": "glm4v_moe"}


def modeling(family: Family) -> types.ModuleType:
    """The family's transformers modeling module."""
    return importlib.import_module(f"transformers.models.{family.module}.modeling_{family.module}")
