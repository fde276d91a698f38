"""Rotary at the Llama step's sizes: GPU time per kernel of tessera's forward and backward, Liger's,
and a copy of the same bytes, from torch.profiler (dev tool; device: python3 dev/rotary_lab.py)."""
import torch
import tessera
from torch.profiler import profile, ProfilerActivity

B, S, H, KV, D = 2, 4096, 16, 4, 128


def gpu_us(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows[e.name[:90]] = rows.get(e.name[:90], 0) + e.device_time / reps
    return rows


def show(name, fn):
    rows = gpu_us(fn)
    total = sum(rows.values())
    print(f"{name}: {total:.1f} us")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1])[:6]:
        print(f"   {v:7.1f}  {k}")


angles = torch.outer(torch.arange(S, device="cuda").float(),
                     10000.0 ** -(torch.arange(0, D, 2, device="cuda").float() / D))
cos, sin = angles.cos(), angles.sin()
for layout in ("bshd", "bhsd-view"):
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, KV, D, device="cuda", dtype=torch.bfloat16)
    lay = "bshd"
    if layout == "bhsd-view":
        q, k, lay = q.transpose(1, 2), k.transpose(1, 2), "bhsd"
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    show(f"tessera fwd {layout}", lambda: tessera.rotary_embedding(q, k, cos, sin, layout=lay))
    show(f"tessera bwd {layout}", lambda: torch.ops.tessera.rotary_embedding_backward(gq, gk, cos, sin, layout=lay))
    show(f"clone q,k {layout}", lambda: (q.clone(), k.clone()))
try:
    from liger_kernel.ops.rope import LigerRopeFunction
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16)
    c2, s2 = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    qt, kt = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
    show("liger fwd (in place)", lambda: LigerRopeFunction.apply(qt, kt, c2, s2))
    qa, ka = qt.detach().requires_grad_(), kt.detach().requires_grad_()
    oq, ok = LigerRopeFunction.apply(qa, ka, c2, s2)
    gq, gk = torch.randn_like(oq), torch.randn_like(ok)
    show("liger fwd+bwd", lambda: torch.autograd.grad(LigerRopeFunction.apply(qa, ka, c2, s2), (qa, ka), (gq, gk)))
except ImportError as e:
    print("no liger:", e)
