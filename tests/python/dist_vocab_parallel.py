"""Run under torchrun by test_distributed.py: tessera.linear_cross_entropy with the output weight a
DTensor sharded over the vocabulary (an uneven split), against torch's cross-entropy of the whole
logits on every rank: the loss, d_hidden and the gathered d_weight, for 'mean', 'sum' and 'none',
with ignored rows and chunks smaller than the rows. Exits 1 on any mismatch; rank 0 prints "ok".

    torchrun --standalone --nproc-per-node 2 tests/python/dist_vocab_parallel.py [--device cuda]
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import tessera
from dist_report import exit_now, finish, setup


def main():
    rank, world, device = setup(dist)
    if device.type == "cuda":
        dtype, tol, (n, h, v) = torch.bfloat16, 2e-2, (512, 256, 32003)
    else:
        dtype, tol, (n, h, v) = torch.float32, 1e-5, (96, 32, 1001)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)  # the same tensors on every rank
    hidden = torch.randn(n, h).to(device, dtype)
    weight = (torch.randn(v, h) / h ** 0.5).to(device, dtype)
    target = torch.randint(0, v, (n,)).to(device)
    target[::7] = -100
    problems = []
    for reduction in ("mean", "sum", "none"):
        grad = torch.randn(n).to(device) if reduction == "none" else torch.tensor(1.5, device=device)
        h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        want = F.cross_entropy(F.linear(h_ref, w_ref).float(), target, reduction=reduction)
        want.backward(grad)
        h_tp = hidden.clone().requires_grad_()
        w_tp = torch.nn.Parameter(distribute_tensor(weight.clone(), mesh, [Shard(0)]))
        got = tessera.linear_cross_entropy(h_tp, w_tp, target, reduction=reduction, chunk_size=40)
        got.backward(grad)
        for what, a, b in (("loss", got, want), ("d_hidden", h_tp.grad, h_ref.grad),
                           ("d_weight", w_tp.grad.full_tensor(), w_ref.grad)):
            err = (a.float() - b.float()).abs().max().item()
            scale = b.float().abs().max().item()
            if not err <= tol * max(scale, 1e-6):
                problems.append(f"rank {rank} {reduction} {what}: off by {err:.3g} (largest {scale:.3g})")
    return finish(dist, rank, world, problems)


if __name__ == "__main__":
    exit_now(main())
