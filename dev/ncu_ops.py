"""The transformers step's memory-bound ops once each (tessera's silu_mul forward and backward,
rotary forward, at the Llama step's sizes), for ncu (dev tool; device:
ncu --metrics ... python3 dev/ncu_ops.py)."""
import torch
import tessera

t, f = 8192, 5632
g = torch.randn(t, f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
u = torch.randn(t, f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
y = tessera.silu_mul(g, u)
y.backward(torch.randn_like(y))
angles = torch.outer(torch.arange(4096, device="cuda").float(),
                     10000.0 ** -(torch.arange(0, 128, 2, device="cuda").float() / 128))
q = torch.randn(2, 4096, 16, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 4096, 4, 128, device="cuda", dtype=torch.bfloat16)
tessera.rotary_embedding(q, k, angles.cos(), angles.sin())
torch.cuda.synchronize()
