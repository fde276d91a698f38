"""Float8 training converges as bf16 does (GPU): a small Llama (transformers) trained for 300 AdamW
steps on a learnable corpus (a Markov chain of 4 successors a token, so the loss can fall from
ln V to about ln 4), in bf16 and under each of tessera.float8's recipes, under tessera.transformers
with the output head in float8 too, and under torchao's float8 where torchao installs (the
calibration). Each fp8 run's final loss (the mean of its last
20 steps) within 1% of bf16's, and no step's loss non-finite or past twice the first step's."""

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5.0")

import tessera.float8 as f8  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VOCAB, SUCCESSORS, BATCH, SEQ, STEPS, LR = 512, 4, 16, 128, 300, 1e-3
CONFIG = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=SEQ, tie_word_embeddings=False)


def corpus(gen):
    """A batch of the chain: each token's next one of its SUCCESSORS, uniformly."""
    table = torch.randint(0, VOCAB, (VOCAB, SUCCESSORS), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(7))
    ids = torch.empty(BATCH, SEQ, dtype=torch.long, device="cuda")
    ids[:, 0] = torch.randint(0, VOCAB, (BATCH,), device="cuda", generator=gen)
    pick = torch.randint(0, SUCCESSORS, (BATCH, SEQ), device="cuda", generator=gen)
    for t in range(1, SEQ):
        ids[:, t] = table[ids[:, t - 1], pick[:, t]]
    return ids


def train(convert):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).cuda().to(torch.bfloat16)
    convert(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    gen = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    for _ in range(STEPS):
        ids = corpus(gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return torch.tensor(losses)


def keep_body(module, fqn):
    return fqn != "lm_head"  # the head stays bf16, as under the fused loss


def torchao_float8(model):
    from torchao.float8 import convert_to_float8_training
    convert_to_float8_training(model, module_filter_fn=keep_body)


@pytest.fixture(scope="module")
def bf16():
    return train(lambda model: None)


@pytest.mark.parametrize("recipe", [*f8.RECIPES, "torchao", "rowwise head"])
def test_float8_training_converges_as_bf16(bf16, recipe):
    if recipe == "torchao":
        pytest.importorskip("torchao.float8")
        losses = train(torchao_float8)
    elif recipe == "rowwise head":  # tessera.transformers with the head in float8 under its fused loss
        import tessera.transformers as tt
        losses = train(lambda model: tt.apply_tessera(model, fp8="rowwise", fp8_head=True))
    else:
        losses = train(lambda model: f8.convert_to_float8_training(model, recipe=recipe, module_filter_fn=keep_body))
    assert bf16[-20:].mean() < 0.5 * math.log(VOCAB)  # the corpus is learned
    assert torch.isfinite(losses).all() and (losses <= 2 * losses[0]).all()
    final, want = losses[-20:].mean().item(), bf16[-20:].mean().item()
    assert abs(final - want) <= 0.01 * want, (recipe, final, want)
