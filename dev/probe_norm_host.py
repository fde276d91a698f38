"""Host cost of the norms under autograd, piece by piece (64 x 256 float32; us per call, median of
5 interleaved rounds of 500 calls, the GPU synchronized once a round): which part of
layer_norm's forward + backward costs more than rms_norm's and torch's."""
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import tessera

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from overhead import host_per_call as per_call  # noqa: E402 (the enqueue cost of `calls` calls)

d = "cuda"
x = torch.randn(64, 256, device=d, requires_grad=True)
w = torch.randn(256, device=d, requires_grad=True)
b = torch.randn(256, device=d, requires_grad=True)
w0, b0 = w.detach(), b.detach()
g = torch.randn(64, 256, device=d)
_, mean, rstd = torch.ops.tessera.layer_norm.default(x.detach(), [256], w0, b0, 1e-5)
_, rrstd = torch.ops.tessera.rms_norm.default(x.detach(), [256], w0, 1e-6, 0.0)
T = torch.ops.tessera


def fb(f):
    return lambda: torch.autograd.backward(f(), g)


def grad_only(f, wrt):
    """torch.autograd.grad on one retained graph: the backward pass alone, no AccumulateGrad."""
    o = f()
    return lambda: torch.autograd.grad(o, wrt, g, retain_graph=True)


cases = {
    "ln fb": fb(lambda: tessera.layer_norm(x, (256,), w, b)),
    "ln fb torch": fb(lambda: F.layer_norm(x, (256,), w, b)),
    "ln fb no bias": fb(lambda: tessera.layer_norm(x, (256,), w, None)),
    "ln fb no bias torch": fb(lambda: F.layer_norm(x, (256,), w, None)),
    "ln fb x only": fb(lambda: tessera.layer_norm(x, (256,), w0, b0)),
    "ln fb x only torch": fb(lambda: F.layer_norm(x, (256,), w0, b0)),
    "rms fb": fb(lambda: tessera.rms_norm(x, (256,), w, 1e-6)),
    "rms fb torch": fb(lambda: F.rms_norm(x, (256,), w, 1e-6)),
    "ln grad only": grad_only(lambda: tessera.layer_norm(x, (256,), w, b), (x, w, b)),
    "ln grad only torch": grad_only(lambda: F.layer_norm(x, (256,), w, b), (x, w, b)),
    "ln grad x": grad_only(lambda: tessera.layer_norm(x, (256,), w, b), (x,)),
    "ln grad x torch": grad_only(lambda: F.layer_norm(x, (256,), w, b), (x,)),
    "rms grad only": grad_only(lambda: tessera.rms_norm(x, (256,), w, 1e-6), (x, w)),
    "rms grad only torch": grad_only(lambda: F.rms_norm(x, (256,), w, 1e-6), (x, w)),
    "gelu grad only": grad_only(lambda: tessera.gelu(x), (x,)),
    "gelu grad only torch": grad_only(lambda: F.gelu(x), (x,)),
    "ln fwd (grad)": lambda: tessera.layer_norm(x, (256,), w, b),
    "ln fwd (grad) torch": lambda: F.layer_norm(x, (256,), w, b),
    "rms fwd (grad)": lambda: tessera.rms_norm(x, (256,), w, 1e-6),
    "rms fwd (grad) torch": lambda: F.rms_norm(x, (256,), w, 1e-6),
    "gelu fwd (grad)": lambda: tessera.gelu(x),
    "gelu fwd (grad) torch": lambda: F.gelu(x),
    "ln bwd fast": lambda: tessera.layer_norm_backward(g, x.detach(), (256,), mean, rstd, w0, b0),
    "ln bwd op": lambda: T.layer_norm_backward.default(g, x.detach(), [256], mean, rstd, w0, b0, [True, True, True]),
    "ln bwd op aten": lambda: torch.ops.aten.native_layer_norm_backward(g, x.detach(), [256], mean.view(64, 1), rstd.view(64, 1), w0, b0, [True, True, True]),
    "rms bwd op": lambda: T.rms_norm_backward.default(g, x.detach(), [256], rrstd, w0, [True, True], 0.0),
}


for fn in cases.values():
    per_call(fn, 100)
res = {k: [] for k in cases}
for _ in range(5):
    for k, fn in cases.items():
        res[k].append(per_call(fn, 500))
for k, v in res.items():
    print(f"{k:24s} {statistics.median(v):8.2f}")
