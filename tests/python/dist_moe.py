"""Run under torchrun by test_distributed.py: tessera.moe_experts with expert parallelism (each
rank its share of the experts, the tokens exchanged by all-to-all) against the same layer on the
whole weights in one process: every rank's output, the gradients of its tokens and routing
weights, and of its experts' weights (the one-process gradients summed over the ranks' tokens).
Exits 1 on any mismatch; rank 0 prints "ok".

    torchrun --standalone --nproc-per-node 2 tests/python/dist_moe.py [--device cuda]
"""
import torch
import torch.distributed as dist

import tessera
from dist_report import exit_now, finish, setup


def main():
    rank, world, device = setup(dist)
    if device.type == "cuda":
        dtype, tol, (t, h, f, e, k) = torch.bfloat16, 3e-2, (512, 256, 128, 8 * world, 4)
    else:
        dtype, tol, (t, h, f, e, k) = torch.float32, 1e-5, (40, 16, 8, 4 * world, 2)
    local = e // world
    problems = []
    for activation in ("swiglu", "gpt_oss"):
        torch.manual_seed(0)  # the same weights on every rank
        w1 = (torch.randn(e, 2 * f, h) / h ** 0.5).to(device, dtype)
        w2 = (torch.randn(e, h, f) / f ** 0.5).to(device, dtype)
        b1 = torch.randn(e, 2 * f).to(device, dtype) if activation == "gpt_oss" else None
        torch.manual_seed(1 + rank)  # each rank its own tokens, routed unevenly
        x = torch.randn(t, h).to(device, dtype)
        p = torch.tensor([1.0 / (i + 1) for i in range(e)])
        index = torch.multinomial(p.expand(t, -1), k).to(device)
        index[0, 0] = e + 3  # an index out of range drops its pair
        weights = torch.softmax(torch.randn(t, k), -1).to(device)

        def run(w1, w2, b1, **kw):
            xs, ws = x.clone().requires_grad_(), weights.clone().requires_grad_()
            w1, w2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
            out = tessera.moe_experts(xs, w1, w2, index, ws, activation=activation, gate_up_bias=b1, **kw)
            out.backward(torch.ones_like(out))
            return out, xs.grad, ws.grad, w1.grad, w2.grad

        want = run(w1, w2, b1)
        mine = slice(rank * local, (rank + 1) * local)
        got = run(w1[mine], w2[mine], None if b1 is None else b1[mine], group=dist.group.WORLD)
        for g in want[3:]:  # the whole-weight gradients of every rank's tokens
            dist.all_reduce(g)
        for what, a, b in zip(("out", "d_hidden", "d_weights", "d_gate_up", "d_down"), got,
                              want[:3] + (want[3][mine], want[4][mine])):
            err = (a.float() - b.float()).abs().max().item()
            scale = b.float().abs().max().item()
            if not err <= tol * max(scale, 1e-6):
                problems.append(f"rank {rank} {activation} {what}: off by {err:.3g} (largest {scale:.3g})")
    return finish(dist, rank, world, problems)


if __name__ == "__main__":
    exit_now(main())
