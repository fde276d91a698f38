"""tessera.transformers' Mixture-of-Experts families on the CPU: tiny Qwen3-MoE, Qwen2-MoE, Mixtral,
gpt-oss (transposed, interleaved experts with biases and a clamped gate) and DeepSeek-V3 (a dense
first layer, shared experts, grouped sigmoid routing, MLA kept) models patched by class and by instance (the experts' forward on tessera.grouped_mm, the
norms, RoPE and loss as for the dense families), parameter names unchanged, and the patched
model's loss (the router's load-balancing loss included) and gradients equal to the plain model's
in float32, through the ops' CPU paths (torch._grouped_mm, torch's composition of silu_mul)."""

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

import tessera.transformers as tt  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                                         num_experts_per_tok=2, head_dim=16, norm_topk_prob=True)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                                         num_experts_per_tok=2, shared_expert_intermediate_size=48)),
    "mixtral": ("MixtralConfig", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)),
    "gpt_oss": ("GptOssConfig", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                     sliding_window=8)),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", dict(intermediate_size=32, num_experts=4, moe_topk=2, head_dim=16)),
    "deepseek_v2": ("DeepseekV2Config", dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                                             num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                             kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                             v_head_dim=16, num_key_value_heads=4)),
    "deepseek_v3": ("DeepseekV3Config", dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                                             num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                                             first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                             num_key_value_heads=4)),  # MLA: a key head per query head
}
MOE = [t for t in CONFIGS if hasattr(transformers, CONFIGS[t][0])]

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="the CPU path needs torch._grouped_mm")


@pytest.fixture(autouse=True)
def unpatched():
    tt.revert()
    yield
    tt.revert()


def build(model_type, seed=0, **extra):
    name, kwargs = CONFIGS[model_type]
    config = getattr(transformers, name)(**{**COMMON, **kwargs}, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    for p in model.parameters():  # the experts' 3-d weights start uninitialized in some versions
        if p.dim() == 3:
            torch.nn.init.normal_(p, std=0.05)
    return model.float()


def same_gradients(plain, patched):
    """Each parameter's gradient in the patched model equals the plain model's (none, or zero, where
    the plain one has none: an expert no token reached)."""
    for (name, p), q in zip(plain.named_parameters(), patched.parameters()):
        if p.grad is None:
            assert q.grad is None or not q.grad.any(), name
            continue
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def experts_class(model_type):
    family = tt.FAMILIES[model_type]
    return getattr(tt.modeling(family), family.experts)


def test_experts_backend_is_registered():
    moe = pytest.importorskip("transformers.integrations.moe")
    assert "tessera" in moe.ExpertsInterface._global_mapping


@pytest.mark.parametrize("model_type", MOE)
def test_patch_by_instance_and_by_class(model_type):
    model = build(model_type)
    before = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    cls = experts_class(model_type)
    tt.apply_tessera(model)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == before
    experts = [m for m in model.modules() if isinstance(m, cls)]
    dense = CONFIGS[model_type][1].get("first_k_dense_replace", 0)  # DeepSeek-V3's first layers are dense
    assert len(experts) == COMMON["num_hidden_layers"] - dense
    assert all(m.forward.__func__ is tt._transformers_experts.experts_forward for m in experts)
    tt.revert()
    getattr(tt, f"apply_tessera_to_{model_type}")()
    assert cls.forward is tt._transformers_experts.experts_forward
    assert str(build(model_type))
    tt.revert()
    assert cls.forward is not tt._transformers_experts.experts_forward


def test_experts_keyword_keeps_theirs():
    cls = experts_class("qwen3_moe")
    tt.apply_tessera_to_qwen3_moe(experts=False)
    assert cls.forward is not tt._transformers_experts.experts_forward
    with pytest.raises(TypeError, match="experts"):
        tt.apply_tessera_to_llama(experts=False)


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("router", [False, True])
def test_same_loss_and_gradients(model_type, router):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, COMMON["vocab_size"], (2, 11), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    plain = build(model_type, output_router_logits=router).train()
    loss = plain(input_ids=ids, labels=labels).loss
    loss.backward()
    patched = build(model_type, output_router_logits=router).train()
    tt.apply_tessera(patched)
    out = patched(input_ids=ids, labels=labels)
    assert out.logits is None
    assert (getattr(out, "aux_loss", None) is not None) == (router and tt.FAMILIES[model_type].aux_loss)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    same_gradients(plain, patched)


@pytest.mark.parametrize("model_type", MOE)
def test_experts_forward_matches_the_modules_own(model_type):
    model = build(model_type)
    cls = experts_class(model_type)
    experts = next(m for m in model.modules() if isinstance(m, cls))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(13, COMMON["hidden_size"], generator=g)
    idx = torch.randint(0, experts.num_experts, (13, 2), generator=g)
    idx[:, 1] = (idx[:, 0] + 1) % experts.num_experts  # two distinct experts a token
    w = torch.rand(13, 2, generator=g)
    want = type(experts).forward.__wrapped__(experts, x, idx, w)  # the modeling file's own loop
    got = tt._transformers_experts.experts_forward(experts, x, idx, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_experts_implementation_by_name():
    """transformers' own dispatch to the registered "tessera" backend gives the eager loss."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, COMMON["vocab_size"], (2, 9), generator=g)
    name, kwargs = CONFIGS["qwen3_moe"]
    losses = []
    for impl in ("eager", "tessera"):
        torch.manual_seed(0)
        config = getattr(transformers, name)(**COMMON, **kwargs)
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                                  experts_implementation=impl).float()
        except (TypeError, ValueError) as e:  # a transformers without the keyword
            pytest.skip(f"from_config(experts_implementation=...): {e}")
        assert model.config._experts_implementation == impl
        for p in model.parameters():
            if p.dim() == 3:
                torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(4))
        losses.append(model(input_ids=ids, labels=ids).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)


# MoE vision-language models: the language model's experts, norms, MLP and loss patched, the vision
# tower and the multimodal RoPE kept; the load-balancing loss's fields from the text config.
VLM_MOE = {  # model type: (config class, the text config's own fields, the vision config)
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                                              num_experts_per_tok=2, head_dim=16, router_aux_loss_coef=0.1),
                     dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64)),
    "glm4v_moe": ("Glm4vMoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                                         num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                         head_dim=16, router_aux_loss_coef=0.1,
                                         rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2],
                                                          "partial_rotary_factor": 0.5}),
                  dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=14,
                       image_size=28)),
}


def build_vlm(model_type, router):
    name, text, vision = VLM_MOE[model_type]
    config = getattr(transformers, name)(text_config=dict(COMMON, output_router_logits=router, **text),
                                         vision_config=vision)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager")
    for p in model.parameters():  # the experts' 3-d weights start uninitialized in some versions
        if p.dim() == 3:
            torch.nn.init.normal_(p, std=0.05)
    return model.float().train()


@pytest.mark.parametrize("model_type", [t for t in VLM_MOE if hasattr(transformers, VLM_MOE[t][0])])
@pytest.mark.parametrize("router", [False, True])
def test_moe_vision_language_models(model_type, router):
    """A text-only batch through the whole model: the patched loss (with the router's
    load-balancing loss from the text config) and gradients equal the plain model's; the language
    model alone (its config's own type, e.g. qwen3_vl_moe_text) takes the same row."""
    ids = torch.randint(3, COMMON["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    plain = build_vlm(model_type, router)
    # the call's own flag: transformers 5.17 reads only it, 5.24 the text config's too (as the patched
    # loss does)
    want = plain(input_ids=ids, labels=ids, output_router_logits=router)
    want.loss.backward()
    patched = build_vlm(model_type, router)
    tt.apply_tessera(patched, attention=False)
    cls = experts_class(model_type)
    experts = [m for m in patched.modules() if isinstance(m, cls)]
    assert experts and all(m.forward.__func__ is tt._transformers_experts.experts_forward for m in experts)
    out = patched(input_ids=ids, labels=ids, output_router_logits=router)
    assert out.logits is None  # the fused loss
    assert (out.aux_loss is not None) == router
    if router:
        torch.testing.assert_close(out.aux_loss, want.aux_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    same_gradients(plain, patched)
    tt.revert()
    language = build_vlm(model_type, router).model.language_model
    tt.apply_tessera(language, attention=False)
    assert all(m.forward.__func__ is tt._transformers_experts.experts_forward
               for m in language.modules() if isinstance(m, cls))
