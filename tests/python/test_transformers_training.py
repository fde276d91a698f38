"""tessera.transformers with what trains a model (CPU): transformers' Trainer with gradient
accumulation, TRL's SFT, DPO and GRPO trainers, PEFT's LoRA, packed batches, and FSDP2 on two gloo
ranks (plain and fp8 projections); the tiny models and batches of test_transformers_patch.py."""

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0")
torch = pytest.importorskip("torch")

import tessera.transformers as tt  # noqa: E402
from test_transformers_patch import COMMON, batch, build, build_attn, unpatched  # noqa: E402,F401 (the fixture)


# ---- the Trainer ---------------------------------------------------------------------------------

def test_trainer_gradient_accumulation_equals_one_large_batch(tmp_path):
    # 4 micro-batches of 4 accumulated and one batch of 16 take the same step: the patched loss is
    # summed over the whole batch's labelled tokens (num_items_in_batch) either way.
    pytest.importorskip("accelerate")
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, COMMON["vocab_size"], (16, 9), generator=g)
    labels = ids.clone()
    labels[torch.rand(ids.shape, generator=g) < 0.3] = -100  # uneven counts per micro-batch
    data = [{"input_ids": i, "labels": lb} for i, lb in zip(ids, labels)]

    def trained(batch, accumulate):
        model = build("llama")
        tt.apply_tessera(model)
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"{batch}x{accumulate}"), per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulate, max_steps=1, learning_rate=0.1, optim="sgd",
            lr_scheduler_type="constant", report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
            dataloader_drop_last=False, seed=0)
        transformers.Trainer(model=model, args=args, train_dataset=data).train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    small, large = trained(4, 4), trained(16, 1)
    moved = False
    for name, p in large.items():
        torch.testing.assert_close(small[name], p, rtol=1e-5, atol=1e-6, msg=name)
    for name, p in build("llama").named_parameters():
        moved = moved or not torch.equal(p, large[name])
    assert moved  # the step changed the weights


def _word_tokenizer(tokenizers):
    """A tokenizer of the tiny models' vocabulary: the words t0 ... t96, split at spaces."""
    vocab = {f"t{i}": i for i in range(COMMON["vocab_size"])}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="t0", bos_token="t1", eos_token="t2",
                                                unk_token="t0")


def test_trl_sft_trainer_trains_a_patched_model(tmp_path):
    # TRL's SFTTrainer on a patched model: it puts its own fused LM head over the causal LM's
    # forward (log-probabilities, entropy and token accuracy in chunks); tessera's norms, RoPE and
    # MLP stay. Two steps give the plain model's losses, and the metrics are logged.
    trl = pytest.importorskip("trl", minversion="1.16")
    datasets = pytest.importorskip("datasets")
    tok = _word_tokenizer(pytest.importorskip("tokenizers"))
    g = torch.Generator().manual_seed(3)
    rows = [{"input_ids": torch.randint(3, COMMON["vocab_size"], (12,), generator=g).tolist()} for _ in range(8)]

    def losses(patched):
        model = build("llama")
        if patched:
            tt.apply_tessera(model)
        args = trl.SFTConfig(output_dir=str(tmp_path / str(patched)), per_device_train_batch_size=4, max_steps=2,
                             learning_rate=1e-2, report_to=[], use_cpu=True, logging_steps=1, save_strategy="no")
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                 processing_class=tok)
        trainer.train()
        if patched:
            assert type(model.model.norm).forward is tt.rms_norm_forward or model.model.norm.forward.__func__ \
                is tt.rms_norm_forward
        logs = [h for h in trainer.state.log_history if "loss" in h]
        assert len(logs) == 2 and all("mean_token_accuracy" in h for h in logs), logs
        return torch.tensor([h["loss"] for h in logs])

    # The patched model's attention (tessera's, in float32 on the CPU) rounds otherwise than eager's,
    # and AdamW's first step moves each weight by about the learning rate whatever its gradient's
    # size, so the second step's loss differs in its fourth digit.
    torch.testing.assert_close(losses(True), losses(False), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("trainer", ["dpo", "grpo"])
def test_trl_preference_and_rl_trainers_train_a_patched_model(tmp_path, trainer):
    # TRL's DPOTrainer and GRPOTrainer (>= 1.16) score tokens with their own fused LM head over the
    # backbone; a patched model's norms, RoPE, MLP and attention are tessera's. Two steps give the
    # plain model's losses (GRPO's generation seeded alike).
    trl = pytest.importorskip("trl", minversion="1.16")
    datasets = pytest.importorskip("datasets")
    tok = _word_tokenizer(pytest.importorskip("tokenizers"))
    g = torch.Generator().manual_seed(3)

    def words(n):
        return " ".join(f"t{int(i)}" for i in torch.randint(3, COMMON["vocab_size"], (n,), generator=g))
    if trainer == "dpo":
        rows = [{"prompt": words(5), "chosen": " " + words(4), "rejected": " " + words(4)} for _ in range(8)]
    else:
        rows = [{"prompt": words(5)} for _ in range(8)]
    common = dict(per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2, report_to=[], use_cpu=True,
                  logging_steps=1, save_strategy="no", seed=0)

    def losses(patched):
        torch.manual_seed(0)
        model = build("llama")
        if patched:
            tt.apply_tessera(model)
        out = str(tmp_path / str(patched))
        data = datasets.Dataset.from_list(rows)
        if trainer == "dpo":
            run = trl.DPOTrainer(model=model, ref_model=build("llama"), args=trl.DPOConfig(output_dir=out, **common),
                                 train_dataset=data, processing_class=tok)
        else:  # beta 0: no reference model (one from a path only)
            args = trl.GRPOConfig(output_dir=out, num_generations=4, max_completion_length=6, beta=0.0, **common)
            run = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                                  args=args, train_dataset=data, processing_class=tok)
        run.train()
        if patched:
            assert model.model.layers[0].mlp.forward.__func__ is tt.swiglu_forward
        logs = [h["loss"] for h in run.state.log_history if "loss" in h]
        assert len(logs) == 2, run.state.log_history
        return torch.tensor(logs)

    # as the SFT test: the attention's rounding moves the second step's loss in its fourth digit
    torch.testing.assert_close(losses(True), losses(False), rtol=1e-3, atol=1e-5)


# ---- PEFT ----------------------------------------------------------------------------------------

def test_peft_lora_and_modules_to_save():
    peft = pytest.importorskip("peft")
    ids, labels = batch("llama")

    def lora(patch, **kw):
        model = build("llama").train()
        if patch:
            tt.apply_tessera(model)
        torch.manual_seed(1)
        return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **kw))

    for kw in ({"target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj"]},  # down_proj: LoRA's own call
               {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}):
        plain, patched = lora(False, **kw), lora(True, **kw)
        want, got = plain(input_ids=ids, labels=labels).loss, patched(input_ids=ids, labels=labels)
        assert got.logits is None  # the patched causal LM inside the PEFT model took the call
        torch.testing.assert_close(got.loss, want, rtol=1e-5, atol=1e-5)
        want.backward()
        got.loss.backward()
        grads = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
        for n, p in patched.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
    model = build("llama").train()
    tt.apply_tessera(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(TypeError, match="lm_head.*target_modules"):
        wrapped(input_ids=ids, labels=labels)


def test_packed_batch_loss_equals_the_padded_one():
    # DataCollatorWithFlattening's padding-free batch (one row, position_ids restarting, the first
    # label of each sequence -100) on the patched model with tessera's attention, against the padded
    # batch of the same sequences on the plain model with eager attention.
    g = torch.Generator().manual_seed(9)
    seqs = [torch.randint(3, COMMON["vocab_size"], (n,), generator=g) for n in (7, 5, 9)]
    packed = transformers.DataCollatorWithFlattening()([{"input_ids": s.tolist()} for s in seqs])
    patched = build_attn("llama", "tessera").train()
    tt.apply_tessera(patched)
    got = patched(input_ids=packed["input_ids"], labels=packed["labels"], position_ids=packed["position_ids"]).loss
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    labels = ids.masked_fill(mask == 0, -100)
    want = build_attn("llama", "eager").train()(input_ids=ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- FSDP2 ---------------------------------------------------------------------------------------

def test_fsdp2_sharded_lm_head_on_two_gloo_ranks():
    # Two CPU processes (gloo), FSDP2 over the decoder layers, lm_head alone or with the root: the
    # fused loss and every gradient equal the unsharded model's on the whole batch
    # (tests/python/dist_transformers_fsdp.py).
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed without gloo")
    script = Path(__file__).resolve().parent / "dist_transformers_fsdp.py"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(script)], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    out = p.stdout + p.stderr
    assert p.returncode == 0 and re.search(r"^ok$", out, re.M), out[-3000:]
