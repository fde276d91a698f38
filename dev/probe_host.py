"""Where a public call's host time goes: the public function against the registered op called
in several ways, and torch's own op (64 x 256 float32, loops of 2000, median of 5 interleaved
rounds, us per call)."""
import statistics
import time

import torch

import tessera
from tessera import _interop, _state

N = 2000
x = torch.randn(64, 256, device="cuda")
y = torch.randn_like(x)
ops = torch.ops.tessera
add_op, sm_op = ops.add.default, ops.softmax.default
add_raw, sm_raw = add_op._op, sm_op._op
is_compiling = torch.compiler.is_compiling


def fast_add(a, b, *, alpha=1, out=None):
    if out is None and type(a) is _state.Tensor:
        return add_raw(a, b)
    return None


o = torch.empty_like(x)
xv, yv, ov = _interop.torch_view(x), _interop.torch_view(y), _interop.torch_view(o)
stream = torch.cuda.current_stream().cuda_stream
from tessera import _C  # noqa: E402

variants = {
    "torch.add(out=)": lambda: torch.add(x, y, out=o),
    "_C.add(views, out)": lambda: _C.add(xv, yv, ov, 1.0, stream),
    "empty CUDA launch (x.zero_() on o)": lambda: o.zero_(),
    "torch.add": lambda: torch.add(x, y),
    "tessera.add": lambda: tessera.add(x, y),
    "op.default(x, y)": lambda: add_op(x, y),
    "op.default(x, y, alpha=1.)": lambda: add_op(x, y, alpha=1.0),
    "op._op(x, y)": lambda: add_raw(x, y),
    "python fn -> op._op": lambda: fast_add(x, y),
    "is_compiling()": lambda: is_compiling(),
    "torch.empty_like": lambda: torch.empty_like(x),
    "torch.softmax": lambda: torch.softmax(x, -1),
    "tessera.softmax": lambda: tessera.softmax(x, -1),
    "softmax op._op": lambda: sm_raw(x, -1),
}
times = {k: [] for k in variants}
for f in variants.values():
    for _ in range(200):
        f()
for _ in range(5):
    for k, f in variants.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            f()
        torch.cuda.synchronize()
        times[k].append((time.perf_counter() - t0) / N * 1e6)
for k, v in times.items():
    print(f"{k:30s} {statistics.median(v):7.2f} us")
