"""Convergence of patched transformers models on the GPU, Liger-Kernel's method: a mini model of
each family (the Mixture-of-Experts ones with their experts on tessera.grouped_mm, against
transformers' default experts; the vision-language ones on text alone) from a seeded init, trained plain and patched (tessera.transformers.apply_tessera,
tessera's attention) for 32 AdamW steps (lr 1e-4) on the same batches, in bfloat16 and float32;
compared on the loss at every step, the final parameters and the top-k log-probabilities at eval,
within Liger's tolerances (bfloat16: loss atol 1e-2 / rtol 5e-2, parameters 1e-2 / 1e-2;
float32: loss rtol 2e-5, parameters 5e-3 / 1e-5). GPU only."""

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

import tessera.transformers as tt  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MINI = dict(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            head_dim=32)
CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 64}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": ("Gemma2Config", {"query_pre_attn_scalar": 32, "sliding_window": 64}),
    "gemma3_text": ("Gemma3TextConfig", {"query_pre_attn_scalar": 32, "sliding_window": 64}),
    "phi3": ("Phi3Config", {}),
    "gemma": ("GemmaConfig", {}),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0, "residual_multiplier": 0.5, "embedding_multiplier": 2.0}),
    "ministral": ("MinistralConfig", {"sliding_window": 64}),
    "olmo2": ("Olmo2Config", {}),
    "olmo3": ("Olmo3Config", {"sliding_window": 64}),
    "smollm3": ("SmolLM3Config", {}),
    "glm": ("GlmConfig", {}),
    "glm4": ("Glm4Config", {}),
    "exaone4": ("Exaone4Config", {}),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", {}),
    "helium": ("HeliumConfig", {}),
    "ernie4_5": ("Ernie4_5Config", {}),
    "nemotron": ("NemotronConfig", {"partial_rotary_factor": 0.5}),
    # Mixture of Experts: 8 experts, top-2, every layer sparse
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                     "norm_topk_prob": True, "decoder_sparse_step": 1}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                     "shared_expert_intermediate_size": 256, "decoder_sparse_step": 1}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 8, "num_experts_per_tok": 2}),
    "gpt_oss": ("GptOssConfig", {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 64}),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", {"num_experts": 8, "moe_topk": 2, "intermediate_size": 128}),
    "deepseek_v2": ("DeepseekV2Config", {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                         "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 64,
                                         "q_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
                                         "v_head_dim": 32, "num_key_value_heads": 8, "head_dim": 16}),
    "deepseek_v3": ("DeepseekV3Config", {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                         "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
                                         "first_k_dense_replace": 1, "kv_lora_rank": 64, "q_lora_rank": 96,
                                         "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 32,
                                         "num_key_value_heads": 8, "head_dim": 16}),
}
# Vision-language models, trained on text: (config class, the text config's own fields, the vision
# config); their attention kept (sdpa) in both runs, the vision tower idle.
TINY_VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                   patch_size=14)
QWEN_VISION = dict(depth=1, hidden_size=64, embed_dim=64, num_heads=2, intermediate_size=128, out_hidden_size=256)
MROPE = {"rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}}
VLMS = {
    "qwen2_vl": ("Qwen2VLConfig", MROPE, QWEN_VISION),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", MROPE, QWEN_VISION),
    "qwen3_vl": ("Qwen3VLConfig", {}, QWEN_VISION),
    "gemma3": ("Gemma3Config", {"query_pre_attn_scalar": 32, "sliding_window": 64}, TINY_VISION),
    "glm4v": ("Glm4vConfig", {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4],
                                                  "partial_rotary_factor": 0.5}},
              dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=256, patch_size=14,
                   image_size=28)),
    "mllama": ("MllamaConfig", {"cross_attention_layers": [1]},
               dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_global_layers=1,
                    attention_heads=2, image_size=28, patch_size=14, vision_output_dim=128,
                    intermediate_layers_indices=[0], max_num_tiles=4)),
    "llava": ("LlavaConfig", {"model_type": "llama"}, dict(TINY_VISION, model_type="clip_vision_model")),
    "paligemma": ("PaliGemmaConfig", {"model_type": "gemma"}, dict(TINY_VISION, model_type="siglip_vision_model")),
    "internvl": ("InternVLConfig", {"model_type": "qwen2"}, dict(TINY_VISION, image_size=[28, 28],
                                                                 patch_size=[14, 14])),
    "smolvlm": ("SmolVLMConfig", {"model_type": "llama"}, TINY_VISION),
    "mistral3": ("Mistral3Config", {"model_type": "mistral"}, dict(TINY_VISION, model_type="pixtral", head_dim=32)),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128},
                     QWEN_VISION),
    "glm4v_moe": ("Glm4vMoeConfig", {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                     "n_shared_experts": 1, "first_k_dense_replace": 1,
                                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4],
                                                         "partial_rotary_factor": 0.5}},
                  dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=256,
                       patch_size=14, image_size=28)),
}
# (loss atol, loss rtol, parameter atol, parameter rtol, log-probability atol, rtol): Liger's for
# its mini models (test/convergence/{bf16,fp32}), with its learning rate.
TOLERANCES = {torch.bfloat16: (1e-2, 5e-2, 1e-2, 1e-2, 1e-1, 1e-2),
              torch.float32: (1e-8, 2e-5, 5e-3, 1e-5, 5e-2, 1e-5)}
STEPS, BATCH, SEQ, TOPK, LR = 32, 4, 128, 20, 1e-4
# The routed models in bf16: a logit that rounds the other way flips a token's expert, so any change
# of rounding (tessera's loss alone, whose result is the plain one's within bf16 rounding) moves
# the trained model's eval log-probabilities by up to ~1 (gpt-oss), where a dense model's move 0.1.
NOISY = {(t, torch.bfloat16) for t in ("qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "hunyuan_v1_moe",
                                       "deepseek_v2", "deepseek_v3", "qwen3_vl_moe", "glm4v_moe")}
KEYWORDS = ("rope", "rms_norm", "swiglu", "geglu", "experts", "cross_entropy", "fused_linear_cross_entropy",
            "attention")


@pytest.fixture(autouse=True)
def unpatched():
    tt.revert()
    yield
    tt.revert()


def attention_of(model_type, patched):
    """tessera's attention for the patched model; gpt-oss's attention sinks keep its own (eager)."""
    if not tt.FAMILIES[model_type].attention:
        return "eager"
    return "tessera" if patched else "sdpa"


def train(model_type, dtype, patched, **keywords):
    torch.manual_seed(42)
    if model_type in VLMS:
        name, text, vision = VLMS[model_type]
        config = getattr(transformers, name)(text_config={**MINI, **text}, vision_config=vision,
                                             image_token_id=MINI["vocab_size"] - 1)
        model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa", dtype=dtype)
        for p in model.parameters():  # the experts' 3-d weights start uninitialized in some versions
            if p.dim() == 3:
                torch.nn.init.normal_(p, std=0.02)
        keywords = {"attention": False, **keywords}
    else:
        name, extra = CONFIGS[model_type]
        config = getattr(transformers, name)(**{**MINI, **extra})
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attention_of(model_type, patched), dtype=dtype)
    model = model.cuda().train()
    if patched:
        tt.apply_tessera(model, **keywords)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab = MINI["vocab_size"] - (model_type in VLMS)  # a VLM's last id is its image token
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(3, vocab, (BATCH, SEQ), device="cuda", generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    model.eval()
    with torch.no_grad():
        ids = torch.randint(3, vocab, (BATCH, SEQ), device="cuda", generator=g)
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    return torch.stack(losses), dict(model.named_parameters()), logprobs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("model_type", [t for t, c in {**CONFIGS, **VLMS}.items() if hasattr(transformers, c[0])])
def test_patched_training_converges_as_plain(model_type, dtype):
    loss_atol, loss_rtol, p_atol, p_rtol, lp_atol, lp_rtol = TOLERANCES[dtype]
    want_loss, want_params, want_lp = train(model_type, dtype, patched=False)
    tt.revert()
    got_loss, got_params, got_lp = train(model_type, dtype, patched=True)
    torch.testing.assert_close(got_loss, want_loss, atol=loss_atol, rtol=loss_rtol)
    for name, p in want_params.items():
        torch.testing.assert_close(got_params[name].float(), p.float(), atol=p_atol, rtol=p_rtol,
                                   msg=lambda m, name=name: f"{name}: {m}")
    top = want_lp.topk(TOPK, dim=-1)
    if (model_type, dtype) in NOISY:
        # the patched model may drift no further than twice what the loss alone moves them
        tt.revert()
        _, _, noise_lp = train(model_type, dtype, patched=True, **{k: k == "cross_entropy" for k in KEYWORDS})
        noise = (noise_lp.gather(-1, top.indices) - top.values).abs().max()
        drift = (got_lp.gather(-1, top.indices) - top.values).abs().max()
        assert drift <= max(lp_atol, 2 * noise), (drift.item(), noise.item())
        return
    torch.testing.assert_close(got_lp.gather(-1, top.indices), top.values, atol=lp_atol, rtol=lp_rtol)
