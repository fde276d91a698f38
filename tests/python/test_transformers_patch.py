"""tessera.transformers on the CPU: tiny models of every family it covers, built from configs (two
layers), patched by class and by instance: every expected module's forward swapped, parameter
names and shapes unchanged, print(model) working; and, through the ops' CPU paths (torch's
composition of each op's contract), the patched model's loss and gradients equal to the plain
model's in float32, with labels shifted, num_items_in_batch and Gemma 2's soft-cap."""

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

import tessera.transformers as tt  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16, "final_logit_softcapping": 5.0}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16}),
    "phi3": ("Phi3Config", {}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0, "residual_multiplier": 0.5, "embedding_multiplier": 2.0}),
    "ministral": ("MinistralConfig", {"head_dim": 16}),
    "olmo2": ("Olmo2Config", {}),
    "olmo3": ("Olmo3Config", {}),
    "smollm3": ("SmolLM3Config", {}),
    "glm": ("GlmConfig", {"head_dim": 16}),
    "glm4": ("Glm4Config", {"head_dim": 16}),
    "exaone4": ("Exaone4Config", {}),
    "hunyuan_v1_dense": ("HunYuanDenseV1Config", {"head_dim": 16}),
    "helium": ("HeliumConfig", {"head_dim": 16}),
    "ernie4_5": ("Ernie4_5Config", {"head_dim": 16}),
    "nemotron": ("NemotronConfig", {"partial_rotary_factor": 0.5}),
}
# the families whose config this transformers has
FAMILIES = [t for t in CONFIGS if hasattr(transformers, CONFIGS[t][0])]


@pytest.fixture(autouse=True)
def unpatched():
    tt.revert()
    yield
    tt.revert()


def config_of(model_type):
    name, extra = CONFIGS[model_type]
    return getattr(transformers, name)(**COMMON, **extra)


def build(model_type, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_of(model_type), attn_implementation="eager")
    return model.float()


def expected(model_type):
    """(modeling module, norm class, norm forward, MLP class, MLP forward (None: kept), causal LM
    class) of the family."""
    family = tt.FAMILIES[model_type]
    module = tt.modeling(family)
    norm = (tt.layer_norm_1p_forward if family.norm == "layer_norm_1p" else
            tt.gemma_rms_norm_forward if family.gemma_norm else tt.rms_norm_forward)
    mlp = (None if not family.dense_mlp else tt.fused_swiglu_forward if family.fused_gate_up else
           tt.swiglu_forward if family.gate == "silu" else tt.geglu_forward)
    return (module, getattr(module, family.name("RMSNorm")), norm, getattr(module, family.name("MLP")), mlp,
            getattr(module, family.name("ForCausalLM")))


def params(model):
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patch_by_instance(model_type):
    model = build(model_type)
    before = params(model)
    module, norm_cls, norm_fn, mlp_cls, mlp_fn, lm_cls = expected(model_type)
    tt.apply_tessera(model)
    assert params(model) == before
    norms = [m for m in model.modules() if isinstance(m, norm_cls)]
    mlps = [m for m in model.modules() if isinstance(m, mlp_cls)]
    # every layer's two norms and the final one (more where q/k are normed: Qwen3, Gemma 3)
    assert len(norms) >= 2 * COMMON["num_hidden_layers"] + 1
    assert len(mlps) == COMMON["num_hidden_layers"]
    for m in norms:
        assert m.forward.__func__ is norm_fn
    for m in mlps:
        assert m.forward.__func__ is mlp_fn if mlp_fn else "forward" not in vars(m)
    assert model.forward.__func__.__name__ == "forward" and "tessera" in model.forward.__doc__
    assert module.apply_rotary_pos_emb is (tt.apply_rotary_pos_emb_interleaved if tt.FAMILIES[model_type].rope_interleaved
                                           else tt.apply_rotary_pos_emb)
    assert type(model).forward is not model.forward.__func__  # the class stays as it was
    assert norm_cls.__name__ in str(model)
    other = build(model_type)  # another model of the family is untouched but for RoPE
    assert all("forward" not in vars(m) for m in other.modules())


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patch_by_class(model_type):
    module, norm_cls, norm_fn, mlp_cls, mlp_fn, lm_cls = expected(model_type)
    getattr(tt, f"apply_tessera_to_{model_type}")()
    assert norm_cls.forward is norm_fn and (mlp_cls.forward is mlp_fn) == (mlp_fn is not None)
    assert "tessera" in lm_cls.forward.__doc__
    model = build(model_type)
    assert str(model)
    tt.revert()
    assert norm_cls.forward is not norm_fn and module.apply_rotary_pos_emb is not tt.apply_rotary_pos_emb


def batch(model_type, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, COMMON["vocab_size"], (2, 11), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # a prompt
    labels[1, -2:] = -100  # padding
    return ids, labels


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("by_class", [False, True])
def test_same_loss_and_gradients(model_type, by_class):
    ids, labels = batch(model_type)
    plain = build(model_type).train()
    loss = plain(input_ids=ids, labels=labels).loss
    loss.backward()
    if by_class:
        getattr(tt, f"apply_tessera_to_{model_type}")()
        patched = build(model_type).train()
    else:
        patched = build(model_type).train()
        tt.apply_tessera(patched)
    out = patched(input_ids=ids, labels=labels)
    assert out.logits is None  # training with labels: the loss from the hidden states alone
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    for (name, p), q in zip(plain.named_parameters(), patched.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "phi3"])
def test_mlp_holds_gate_and_up_only(model_type):
    # The patched MLP's autograd holds gate and up (and the weights), not act(gate) * up: one
    # (tokens x intermediate) tensor less per layer than the plain MLP, and the same gradients.
    x = torch.randn(2, 5, COMMON["hidden_size"], requires_grad=True)

    def held(mlp):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = mlp(x)
        inter = COMMON["intermediate_size"]
        return out, sum(t.numel() for t in saved if t.shape[-1:] == (inter,) and t.numel() == 10 * inter)

    plain = build(model_type).model.layers[0].mlp
    want, plain_held = held(plain)
    patched_model = build(model_type)
    tt.apply_tessera(patched_model)
    got, patched_held = held(patched_model.model.layers[0].mlp)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    inter = COMMON["intermediate_size"]
    assert patched_held == 2 * 10 * inter and plain_held >= 3 * 10 * inter, (patched_held, plain_held)


def test_mlp_under_autocast():
    # Under autocast the MLP takes down_proj's own call (autocast casts its input), as the plain one.
    x = torch.randn(2, 5, COMMON["hidden_size"], requires_grad=True)
    plain = build("llama").model.layers[0].mlp
    model = build("llama")
    tt.apply_tessera(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = plain(x), model.model.layers[0].mlp(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    (gw,), (gg,) = torch.autograd.grad(want.float().sum(), x), torch.autograd.grad(got.float().sum(), x)
    torch.testing.assert_close(gg, gw, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_gradient_checkpointing(model_type):
    # transformers' activation checkpointing runs each layer's forward again in the backward, the
    # patched MLP's Function included: the same loss and gradients as the plain model's.
    ids, labels = batch(model_type)
    grads = []
    for patched in (False, True):
        model = build(model_type).train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if patched:
            tt.apply_tessera(model)
        model(input_ids=ids, labels=labels).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_num_items_and_shift_labels(model_type):
    ids, labels = batch(model_type)
    plain, patched = build(model_type).train(), build(model_type).train()
    tt.apply_tessera(patched)
    n = torch.tensor(37)  # gradient accumulation: the whole batch's count of labelled tokens
    want = plain(input_ids=ids, labels=labels, num_items_in_batch=n).loss
    torch.testing.assert_close(patched(input_ids=ids, labels=labels, num_items_in_batch=n).loss, want)
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    torch.testing.assert_close(patched(input_ids=ids, shift_labels=shift).loss,
                               plain(input_ids=ids, labels=labels).loss)


@pytest.mark.parametrize("fused", [True, False])
def test_token_accuracy(fused):
    # TRL's SFTTrainer asks Liger's models for it: return_token_accuracy=True in the call.
    ids, labels = batch("llama")
    plain, patched = build("llama").train(), build("llama").train()
    tt.apply_tessera(patched, cross_entropy=not fused, fused_linear_cross_entropy=fused)
    with torch.no_grad():
        pred = plain(input_ids=ids).logits.argmax(-1)
    labels[:, 1::2] = pred[:, :-1:2]  # every other next token the model's own argmax: hits
    target = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    keep = target != -100
    want = (pred == target)[keep].float().mean()
    assert 0.3 < want < 1
    out = patched(input_ids=ids, labels=labels, return_token_accuracy=True)
    assert isinstance(out, tt.TesseraCausalLMOutputWithPast)
    torch.testing.assert_close(out.token_accuracy, want)
    torch.testing.assert_close(out.loss, plain(input_ids=ids, labels=labels).loss)
    assert not hasattr(patched(input_ids=ids, labels=labels), "token_accuracy")
    patched.eval()  # the original forward: the keyword is not passed on
    assert patched(input_ids=ids, labels=labels, return_token_accuracy=True).logits is not None


def test_eval_and_no_labels_return_logits():
    ids, labels = batch("llama")
    plain, patched = build("llama").eval(), build("llama").eval()
    tt.apply_tessera(patched)
    out, want = patched(input_ids=ids, labels=labels), plain(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, want.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-5)
    patched.train()
    assert patched(input_ids=ids).logits.shape == (2, 11, COMMON["vocab_size"])


def test_cross_entropy_on_the_logits():
    ids, labels = batch("gemma2")
    plain, patched = build("gemma2").train(), build("gemma2").train()
    tt.apply_tessera(patched, cross_entropy=True, fused_linear_cross_entropy=False)
    out = patched(input_ids=ids, labels=labels)
    assert out.logits is not None
    torch.testing.assert_close(out.loss, plain(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rope_as_transformers_calls_it(unsqueeze_dim, rotary_dim):
    phi3 = tt.modeling(tt.FAMILIES["phi3"])  # its apply_rotary_pos_emb takes a partial rotary
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 7, 16, generator=g), torch.randn(2, 2, 7, 16, generator=g)
    angles = torch.randn(2, 7, rotary_dim // 2, generator=g)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    want = phi3.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = tt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_keywords_and_families():
    with pytest.raises(TypeError, match="geglu"):
        tt.apply_tessera_to_llama(geglu=True)
    with pytest.raises(ValueError, match="one"):
        tt.apply_tessera_to_llama(cross_entropy=True)
    model = build("gemma2")
    tt.apply_tessera(model, swiglu=False, geglu=False, rms_norm=True)  # swiglu is not Gemma's: dropped
    _, _, _, mlp_cls, _, _ = expected("gemma2")
    assert all("forward" not in vars(m) for m in model.modules() if isinstance(m, mlp_cls))

    class Other:
        config = transformers.GPT2Config()

    with pytest.raises(ValueError, match="llama, mistral"):
        tt.apply_tessera(Other())


def test_attention_by_default_and_kept_on_request():
    # By instance: the model switches to tessera's attention unless attention=False; revert()
    # restores the model's own.
    model = build("llama")
    tt.apply_tessera(model)
    assert model.config._attn_implementation == "tessera"
    tt.revert()
    assert model.config._attn_implementation == "eager"
    kept = build("llama")
    tt.apply_tessera(kept, attention=False)
    assert kept.config._attn_implementation == "eager"
    # By class: a model built afterwards without an implementation of its own takes tessera's;
    # one that names its own keeps it.
    tt.apply_tessera_to_llama()
    assert transformers.AutoModelForCausalLM.from_config(config_of("llama")).config._attn_implementation == "tessera"
    assert build("llama").config._attn_implementation == "eager"
    tt.revert()
    assert transformers.AutoModelForCausalLM.from_config(config_of("llama")).config._attn_implementation == "sdpa"
    tt.apply_tessera_to_llama(attention=False)
    assert transformers.AutoModelForCausalLM.from_config(config_of("llama")).config._attn_implementation == "sdpa"
    tt.revert()
    # Attention dropout, which tessera's kernels do not apply, keeps the model's attention.
    dropout = config_of("llama")
    dropout.attention_dropout = 0.1
    tt.apply_tessera_to_llama()
    assert transformers.AutoModelForCausalLM.from_config(dropout).config._attn_implementation == "sdpa"
    tt.revert()
    model = transformers.AutoModelForCausalLM.from_config(dropout, attn_implementation="eager")
    tt.apply_tessera(model)
    assert model.config._attn_implementation == "eager"


def _mask_is_none_compiled(model_type, **call):
    """Whether the family's create_causal_mask, traced by torch.compile (aot_eager), returns None."""
    module = tt.modeling(tt.FAMILIES[model_type])
    config = config_of(model_type)
    config._attn_implementation = "sdpa"
    embeds = torch.zeros(2, 11, COMMON["hidden_size"])

    def probe(embeds):
        mask = module.create_causal_mask(config=config, inputs_embeds=embeds, **call)
        return embeds.new_ones(()) if mask is None else embeds.new_zeros(())

    torch._dynamo.reset()
    return bool(torch.compile(probe, backend="aot_eager")(embeds))


def test_sdpa_keeps_its_causal_kernels_under_compile():
    # transformers materializes the causal mask whenever it traces; the patched family leaves it out
    # where it is plainly causal, so that compiled sdpa runs is_causal as eager sdpa does.
    plain = dict(attention_mask=None, past_key_values=transformers.DynamicCache(), position_ids=None)
    assert not _mask_is_none_compiled("llama", **plain)
    tt.apply_tessera_to_llama(attention=False)
    assert _mask_is_none_compiled("llama", **plain)
    assert _mask_is_none_compiled("llama", **{**plain, "attention_mask": torch.ones(2, 11, dtype=torch.long)})
    padded = torch.ones(2, 11, dtype=torch.long)
    padded[1, -2:] = 0
    assert not _mask_is_none_compiled("llama", **{**plain, "attention_mask": padded})
    packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]] * 2)
    assert not _mask_is_none_compiled("llama", attention_mask=None, past_key_values=None, position_ids=packed)
    assert _mask_is_none_compiled("llama", attention_mask=None, past_key_values=None,
                                  position_ids=torch.arange(11).expand(2, 11))
    # The compiled sdpa model's loss and gradients are the eager model's.
    ids, labels = batch("llama")
    want = build_attn("llama", "sdpa").train()
    want_loss = want(input_ids=ids, labels=labels).loss
    model = build_attn("llama", "sdpa").train()
    torch._dynamo.reset()
    got = torch.compile(model, backend="aot_eager")(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(got, want_loss, rtol=1e-5, atol=1e-5)


def test_auto_class_patches_at_from_config():
    module, norm_cls, norm_fn, mlp_cls, mlp_fn, lm_cls = expected("qwen3")
    model = tt.AutoTesseraForCausalLM.from_config(config_of("qwen3"), swiglu=False)
    assert isinstance(model, lm_cls)
    assert norm_cls.forward is norm_fn and mlp_cls.forward is not mlp_fn


# ---- attn_implementation="tessera" (on the CPU: the torch path of the same contract, which also
# carries the padding and packing logic the CUDA path shares) ---------------------------------------

def build_attn(model_type, implementation, seed=0, **extra):
    name, family_extra = CONFIGS[model_type]
    config = getattr(transformers, name)(**{**COMMON, **family_extra, **extra})
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=implementation).float().eval()


@pytest.mark.parametrize("model_type,extra", [("llama", {}), ("mistral", {"sliding_window": 4}),
                                              ("gemma2", {"sliding_window": 4, "attn_logit_softcapping": 5.0}),
                                              ("qwen3", {})])
def test_tessera_attention_as_eager(model_type, extra):
    ids, labels = batch(model_type)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # the second row padded on the right
    want = build_attn(model_type, "eager", **extra)
    got = build_attn(model_type, "tessera", **extra)
    assert got.config._attn_implementation == "tessera"
    for kwargs in ({}, {"attention_mask": mask}):
        a, b = got(input_ids=ids, **kwargs).logits, want(input_ids=ids, **kwargs).logits
        keep = kwargs.get("attention_mask", torch.ones_like(ids)).bool()
        torch.testing.assert_close(a[keep], b[keep], rtol=1e-4, atol=1e-5)


def test_tessera_attention_packed_sequences():
    # Two sequences in one row, position_ids restarting: each attends within itself, as when run
    # alone (DataCollatorWithFlattening's batches).
    model = build_attn("llama", "tessera")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(3, 97, (1, 7), generator=g), torch.randint(3, 97, (1, 5), generator=g)
    packed = model(input_ids=torch.cat((a, b), 1),
                   position_ids=torch.cat((torch.arange(7), torch.arange(5)))[None]).logits
    torch.testing.assert_close(packed[:, :7], model(input_ids=a).logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[:, 7:], model(input_ids=b).logits, rtol=1e-4, atol=1e-5)
    # worked out once per forward (each layer is passed the same position_ids), again for another
    from tessera import _transformers_attention as ta
    calls = []
    real = ta._restarts
    try:
        ta._restarts = lambda p: calls.append(1) or real(p)
        pos = torch.cat((torch.arange(7), torch.arange(5)))[None]
        again = model(input_ids=torch.cat((a, b), 1), position_ids=pos).logits
        assert len(calls) == 1  # two layers
        pos[0, 7:] += 7  # one sequence now: the cached packing must not be taken
        whole = model(input_ids=torch.cat((a, b), 1), position_ids=pos).logits
        assert len(calls) == 2
    finally:
        ta._restarts = real
    torch.testing.assert_close(again, packed)
    torch.testing.assert_close(whole[:, :7], packed[:, :7])
    assert not torch.allclose(whole[:, 7:], packed[:, 7:])
    # the collator's offsets, where it gives them, say the same
    cu = torch.tensor([0, 7, 12], dtype=torch.int32)
    given = model(input_ids=torch.cat((a, b), 1), position_ids=torch.cat((torch.arange(7), torch.arange(5)))[None],
                  cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7).logits
    torch.testing.assert_close(given, packed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("model_type,extra", [("llama", {}), ("mistral", {"sliding_window": 4}),
                                              ("gemma2", {"sliding_window": 4, "attn_logit_softcapping": 5.0}),
                                              ("qwen3", {})])
def test_tessera_attention_kernels_as_eager(model_type, extra):
    # The CUDA path: tessera.flash_attention for the dense batch, flash_attention_varlen for the
    # padded one (unpadded) and the packed one (position_ids restarting), in float32 against eager.
    ids, labels = batch(model_type)
    ids = ids.cuda()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    want = build_attn(model_type, "eager", **extra).cuda()
    got = build_attn(model_type, "tessera", **extra).cuda()
    for kwargs in ({}, {"attention_mask": mask}):
        a, b = got(input_ids=ids, **kwargs).logits, want(input_ids=ids, **kwargs).logits
        keep = kwargs.get("attention_mask", torch.ones_like(ids)).bool()
        torch.testing.assert_close(a[keep], b[keep], rtol=2e-3, atol=2e-3)
    a, b = ids[:1, :7], ids[1:, :5]
    packed = got(input_ids=torch.cat((a, b), 1),
                 position_ids=torch.cat((torch.arange(7), torch.arange(5))).cuda()[None]).logits
    torch.testing.assert_close(packed[:, :7], want(input_ids=a).logits, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(packed[:, 7:], want(input_ids=b).logits, rtol=2e-3, atol=2e-3)


# ---- torch.compile ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["llama", "gemma2", "phi3"])
def test_compiled_patched_model_traces_whole(model_type):
    # fullgraph: the patched forwards (the loss's included) trace without a graph break; aot_eager
    # runs the traced graphs without compiling kernels (the CPU has none of tessera's).
    ids, labels = batch(model_type)
    want = build(model_type).train()(input_ids=ids, labels=labels).loss
    model = build(model_type).train()
    tt.apply_tessera(model)
    torch._dynamo.reset()
    got = torch.compile(model, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # every gradient the eager patched model's (an autograd.Function's output aliasing an input
    # of its own gets a zero gradient under torch.compile)
    eager = build(model_type).train()
    tt.apply_tessera(eager)
    eager(input_ids=ids, labels=labels).loss.backward()
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("model_type,recipe", [("llama", "rowwise"), ("llama", "tensorwise"), ("gemma2", "rowwise"),
                                              ("phi3", "rowwise")])
def test_fp8_converts_the_projections_and_keeps_the_head(model_type, recipe):
    """apply_tessera(model, fp8=...): the layers' Linears become tessera.float8's Float8Linear, the
    MLP keeps tessera's gated forward on them (silu_mul; Gemma's geglu; Phi-3's halves of
    gate_up_proj), the output head stays under the fused loss; the loss and gradients are those of
    the plain model with the same Linears converted (its own MLP: act(gate) * up in torch), the
    names and the state_dict unchanged."""
    import tessera.float8 as f8
    ids, labels = batch(model_type)
    plain = build(model_type).train()
    f8.convert_to_float8_training(plain, recipe=recipe, module_filter_fn=lambda m, fqn: "layers" in fqn)
    loss = plain(input_ids=ids, labels=labels).loss
    loss.backward()
    patched = build(model_type).train()
    keys = list(patched.state_dict())
    tt.apply_tessera(patched, fp8=recipe)
    assert list(patched.state_dict()) == keys
    converted = {n for n, m in patched.named_modules() if isinstance(m, f8.Float8Linear)}
    assert converted == {n for n, m in plain.named_modules() if isinstance(m, f8.Float8Linear)}
    assert type(patched.lm_head) is torch.nn.Linear
    if model_type == "llama":
        assert len(converted) == 7 * COMMON["num_hidden_layers"]
    mlp_cls, mlp_fn = expected(model_type)[3:5]
    mlps = [m for m in patched.modules() if isinstance(m, mlp_cls)]
    assert len(mlps) == COMMON["num_hidden_layers"] and all(m.forward.__func__ is mlp_fn for m in mlps)
    assert all(isinstance(m.down_proj, f8.Float8Linear) for m in mlps)
    # the norms before the attention and the MLP quantize their outputs for the projections
    mlp_norm = "pre_feedforward_layernorm" if model_type == "gemma2" else "post_attention_layernorm"
    marked = {n: m._tessera_fp8 for n, m in patched.named_modules() if hasattr(m, "_tessera_fp8")}
    assert marked == {f"model.layers.{i}.{k}": f8._OPERANDS[recipe][0]
                      for i in range(COMMON["num_hidden_layers"]) for k in ("input_layernorm", mlp_norm)}
    out = patched(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    for (name, p), q in zip(plain.named_parameters(), patched.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("how", ["keyword", "by hand"])
def test_fp8_head_takes_the_fused_loss_in_float8(monkeypatch, how):
    """An lm_head converted to a Float8Linear (apply_tessera(model, fp8=..., fp8_head=True), or
    tessera.float8.convert_to_float8_training(model.lm_head)) under the fused loss:
    tessera.float8.linear_cross_entropy, the loss and the gradients those of the plain model with
    the same Linears converted (its logits by the Float8Linear, torch's cross-entropy); the head's
    own gradient, taken in the weight's dtype rather than quantized, within float8's rounding of
    the plain model's."""
    import tessera.float8 as f8
    ids, labels = batch("llama")

    def build_112():
        config = config_of("llama")
        config.vocab_size, config.tie_word_embeddings = 112, False  # V a multiple of 16
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().train()
    plain = build_112()
    f8.convert_to_float8_training(plain, recipe="rowwise",
                                  module_filter_fn=lambda m, fqn: fqn == "lm_head" or how == "keyword")
    loss = plain(input_ids=ids, labels=labels).loss
    loss.backward()
    patched = build_112()
    if how == "keyword":
        tt.apply_tessera(patched, fp8="rowwise", fp8_head=True)
    else:
        f8.convert_to_float8_training(patched.lm_head, recipe="rowwise")
        tt.apply_tessera(patched)
    assert isinstance(patched.lm_head, f8.Float8Linear)
    calls, original = [], f8.linear_cross_entropy
    monkeypatch.setattr(f8, "linear_cross_entropy", lambda *a, **k: calls.append(k["recipe"]) or original(*a, **k))
    out = patched(input_ids=ids, labels=labels)
    assert calls == ["rowwise"]
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    for (name, p), q in zip(plain.named_parameters(), patched.parameters()):
        if name == "lm_head.weight":
            assert (q.grad - p.grad).norm() < 0.1 * p.grad.norm()
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_fp8_needs_the_model_and_a_recipe():
    with pytest.raises(ValueError, match="'fp8'"):
        tt.apply_tessera_to_llama(fp8="rowwise")  # the classes: no Linear to convert
    with pytest.raises(ValueError, match="'fp8'"):
        tt.apply_tessera(build("llama"), fp8="float8")
    with pytest.raises(ValueError, match="'fp8_head'"):
        tt.apply_tessera(build("llama"), fp8_head=True)  # no recipe
    with pytest.raises(ValueError, match="'fp8_head'.*out_features must be a multiple of 16"):
        tt.apply_tessera(build("llama"), fp8="rowwise", fp8_head=True)  # V = 97
    model = tt.AutoTesseraForCausalLM.from_config(config_of("llama"), fp8="rowwise")
    import tessera.float8 as f8
    assert isinstance(model.model.layers[0].mlp.down_proj, f8.Float8Linear)
    assert type(model.model.layers[0].mlp).forward is tt.swiglu_forward  # tessera's gate on the converted MLP
