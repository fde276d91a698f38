"""tessera.transformers on the CPU, vision-language models: their language model patched (norms,
MLP, RoPE where theirs is not multimodal, the fused loss) by class and by instance, the vision
tower kept; a text-only batch through the whole model gives the plain model's loss and gradients
in float32. The models that wrap another family's language model (llava, paligemma, internvl,
smolvlm, mistral3) patch their loss, and by instance their language model as its own row."""

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

import tessera.transformers as tt  # noqa: E402
from test_transformers_patch import COMMON  # noqa: E402


@pytest.fixture(autouse=True)
def unpatched():
    tt.revert()
    yield
    tt.revert()


def same_loss_and_gradients(plain, patched, ids, loss):
    """The patched model's fused loss on ids equals the plain model's (whose backward has run),
    and so does every gradient the plain model has."""
    out = patched(input_ids=ids, labels=ids)
    assert out.logits is None  # the fused loss
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    for (name, p), q in zip(plain.named_parameters(), patched.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


# Vision-language models: their language model patched (norms, MLP, loss), the vision tower and the
# multimodal RoPE kept; a text-only batch through the whole model.
MROPE = {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
VLMS = {  # model type: (config class, the text config's own fields)
    "qwen2_vl": ("Qwen2VLConfig", MROPE),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", MROPE),
    "qwen3_vl": ("Qwen3VLConfig", {}),
    "gemma3": ("Gemma3Config", {"query_pre_attn_scalar": 16, "final_logit_softcapping": 5.0}),
    "glm4v": ("Glm4vConfig", {"rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2],
                                                  "partial_rotary_factor": 0.5}}),
    "mllama": ("MllamaConfig", {"cross_attention_layers": [1]}),
}
VISION = {
    "gemma3": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                   patch_size=14),
    "glm4v": dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=14,
                  image_size=28),
    "mllama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                   image_size=28, patch_size=14, vision_output_dim=64, intermediate_layers_indices=[0], max_num_tiles=4),
}


@pytest.mark.parametrize("model_type", [t for t in VLMS if hasattr(transformers, VLMS[t][0])])
def test_vision_language_models_patch_their_language_model(model_type):
    name, extra = VLMS[model_type]
    text = dict(COMMON, head_dim=16, **extra)
    vision = VISION.get(model_type, dict(depth=1, hidden_size=32, embed_dim=32, num_heads=2, intermediate_size=64,
                                         out_hidden_size=64))
    config = getattr(transformers, name)(text_config=text, vision_config=vision)

    def model():
        torch.manual_seed(0)
        return transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").float().train()
    ids = torch.randint(3, COMMON["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    plain = model()
    loss = plain(input_ids=ids, labels=ids).loss
    loss.backward()
    patched = model()
    tt.apply_tessera(patched, attention=False)
    family = tt.FAMILIES[model_type]
    mlp = getattr(tt.modeling(family), family.name("MLP"))
    language = [m for m in patched.modules() if isinstance(m, mlp)]
    assert len(language) == COMMON["num_hidden_layers"] and all("forward" in vars(m) for m in language)
    same_loss_and_gradients(plain, patched, ids, loss)


@pytest.mark.parametrize("model_type", [t for t in VLMS if hasattr(transformers, VLMS[t][0])])
def test_a_language_model_alone_takes_its_models_row(model_type):
    """The language model of a vision-language model (its config's own model type, e.g.
    qwen2_vl_text) patched by instance as its model's row."""
    name, extra = VLMS[model_type]
    vision = VISION.get(model_type, dict(depth=1, hidden_size=32, embed_dim=32, num_heads=2, intermediate_size=64,
                                         out_hidden_size=64))
    config = getattr(transformers, name)(text_config=dict(COMMON, head_dim=16, **extra), vision_config=vision)
    language = transformers.AutoModelForImageTextToText.from_config(config).model.language_model
    family = tt.FAMILIES[model_type]
    tt.apply_tessera(language, attention=False)
    mlp = getattr(tt.modeling(family), family.name("MLP"))
    mlps = [m for m in language.modules() if isinstance(m, mlp)]
    assert mlps and all("forward" in vars(m) for m in mlps)


# Vision-language models around another family's language model: their loss patched here, an
# instance's language model as the row of its text config's model type, the vision tower kept.
TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                   patch_size=14)
AROUND = {  # case: (model type, config class, the text config, the vision config)
    "llava": ("llava", "LlavaConfig", dict(model_type="llama"),
              dict(TINY_VISION, model_type="clip_vision_model", projection_dim=32)),
    "paligemma": ("paligemma", "PaliGemmaConfig", dict(model_type="gemma", head_dim=16),
                  dict(TINY_VISION, model_type="siglip_vision_model")),
    "paligemma2": ("paligemma", "PaliGemmaConfig", dict(model_type="gemma2", head_dim=16, query_pre_attn_scalar=16,
                                                        final_logit_softcapping=5.0),
                   dict(TINY_VISION, model_type="siglip_vision_model")),
    "internvl": ("internvl", "InternVLConfig", dict(model_type="qwen2"),
                 dict(TINY_VISION, image_size=[28, 28], patch_size=[14, 14])),
    "smolvlm": ("smolvlm", "SmolVLMConfig", dict(model_type="llama"), TINY_VISION),
    "mistral3": ("mistral3", "Mistral3Config", dict(model_type="mistral", head_dim=16),
                 dict(TINY_VISION, model_type="pixtral", head_dim=16)),
}


@pytest.mark.parametrize("case", [c for c in AROUND if hasattr(transformers, AROUND[c][1])])
@pytest.mark.parametrize("by_class", [False, True])
def test_models_around_another_familys_language_model(case, by_class):
    """A text-only batch: the patched model's (fused) loss and gradients equal the plain model's;
    by instance the language model's MLPs run tessera's, by class the loss alone is patched."""
    model_type, name, text, vision = AROUND[case]
    config = getattr(transformers, name)(text_config=dict(COMMON, **text), vision_config=vision,
                                         image_token_id=COMMON["vocab_size"] - 1)

    def model():
        torch.manual_seed(0)
        return transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").float().train()
    ids = torch.randint(3, COMMON["vocab_size"] - 1, (2, 11), generator=torch.Generator().manual_seed(1))
    plain = model()
    loss = plain(input_ids=ids, labels=ids).loss
    loss.backward()
    if by_class:
        getattr(tt, f"apply_tessera_to_{model_type}")(attention=False)
    patched = model()
    if not by_class:
        tt.apply_tessera(patched, attention=False)
    language = tt.FAMILIES[text["model_type"]]
    mlp = getattr(tt.modeling(language), language.name("MLP"))
    mlps = [m for m in patched.modules() if isinstance(m, mlp)]
    assert len(mlps) == COMMON["num_hidden_layers"]
    assert all(("forward" in vars(m)) != by_class for m in mlps)
    same_loss_and_gradients(plain, patched, ids, loss)
