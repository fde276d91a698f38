"""Run under torchrun by test_transformers_training.py: a tiny Llama patched by tessera.transformers
and sharded with FSDP2 (fully_shard on every decoder layer, on lm_head alone or not, and the root),
each rank training on its half of the batch with num_items_in_batch the whole batch's labelled
tokens, against the unsharded model on the whole batch: the summed loss and every gradient (FSDP2
averages the ranks' gradients, so times the world size). The fused loss reads lm_head's weight
inside lm_head's own forward where lm_head is sharded alone. Then the same with the layers'
projections in fp8 (apply_tessera(fp8="rowwise"), emulated on the CPU): the loss equal (every
forward scale is a token's or a weight row's, the same on any split of the batch), the gradients
within the recipe's rounding (wgrad's scales are the tokens' columns, each rank's half of them);
and with the output head converted too (the fused loss's GEMMs in fp8, lm_head sharded alone).
Exits 1 on a mismatch; rank 0 prints "ok".

    torchrun --standalone --nproc-per-node 2 tests/python/dist_transformers_fsdp.py
"""
import os

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import tessera.transformers as tt
from dist_report import exit_now, finish

CONFIG = dict(vocab_size=112, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def model(fp8=None, head=False):
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**CONFIG), attn_implementation="sdpa")
    m = m.float().train()
    tt.apply_tessera(m, fp8=fp8)
    if head:  # the output head in fp8 too: the fused loss's GEMMs (V a multiple of 16)
        import tessera.float8 as f8
        f8.convert_to_float8_training(m.lm_head, recipe=fp8)
    return m


def sharded(mesh, fp8=None, head_alone=True, head=False):
    """model(fp8, head) with FSDP2 on every decoder layer, on lm_head alone or not, and the root."""
    m = model(fp8, head)
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    if head_alone:
        fully_shard(m.lm_head, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def compare(m, ids, labels, items, mine, want, grads, label, world, grads_close):
    """m (sharded) on this rank's rows against the unsharded loss and gradients: problems found."""
    bad = []
    out = m(input_ids=ids[mine], labels=labels[mine], num_items_in_batch=items)
    if out.logits is not None:
        bad.append(f"{label}: the patched forward did not take the call")
    out.loss.backward()
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    if not torch.allclose(loss, want.detach(), rtol=1e-5, atol=1e-6):
        bad.append(f"{label}: loss {loss.item()} != {want.item()}")
    for n, p in m.named_parameters():
        problem = grads_close(p.grad.full_tensor() * world, grads[n])
        if problem:
            bad.append(f"{label}: {n}: {problem}")
    return bad


def reference(fp8, ids, labels, items, head=False):
    """The unsharded model's loss on the whole batch and its gradients."""
    ref = model(fp8, head)
    want = ref(input_ids=ids, labels=labels, num_items_in_batch=items).loss
    want.backward()
    return want, {n: p.grad for n, p in ref.named_parameters()}


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, CONFIG["vocab_size"], (2 * world, 10), generator=g)
    labels = ids.clone()
    labels[torch.rand(ids.shape, generator=g) < 0.25] = -100
    items = torch.tensor(int((labels[:, 1:] != -100).sum()))  # what the shifted labels count
    mine = slice(2 * rank, 2 * rank + 2)
    batch = (ids, labels, items)

    def exact(got, want):
        return None if torch.allclose(got, want, rtol=1e-4, atol=1e-6) else f"max diff {(got - want).abs().max().item():.3g}"

    def rounded(got, want):  # the recipe's rounding: wgrad's scales over each rank's tokens
        err = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
        return None if err < 0.1 else f"relative error {err:.3g}"

    bad = []
    want, grads = reference(None, *batch)
    for head_alone in (True, False):
        bad += compare(sharded(mesh, head_alone=head_alone), *batch, mine, want, grads,
                       f"rank {rank}: lm_head alone={head_alone}", world, exact)
    # fp8 (row-wise): sharded against unsharded, both converted
    want, grads = reference("rowwise", *batch)
    m = sharded(mesh, "rowwise")
    if not any(type(mod).__name__ == "Float8Linear" for mod in m.modules()):
        bad.append(f"rank {rank}: fp8: no Float8Linear in the converted model")
    bad += compare(m, *batch, mine, want, grads, f"rank {rank}: fp8", world, rounded)
    # the head in fp8 as well, sharded alone: the fused loss inside its forward, the weight whole
    want, grads = reference("rowwise", *batch, head=True)
    bad += compare(sharded(mesh, "rowwise", head=True), *batch, mine, want, grads, f"rank {rank}: fp8 head",
                   world, rounded)
    return finish(dist, rank, world, bad)


if __name__ == "__main__":
    exit_now(main())
