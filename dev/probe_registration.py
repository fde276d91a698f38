"""Per-call host cost of the ways a torch user can reach a tessera kernel (issue 17's choice).

Variants, each a loop of N calls on a 64 x 256 float32 tensor with one sync at the end, the
median of 5 repetitions, interleaved:
  torch           torch.add / torch.softmax (the bar)
  public          tessera.add / tessera.softmax as they are
  c_direct        _C.add with view tuples built per call (the nanobind floor)
  pylib           torch.library define + Python impl for CUDA, through torch.ops
  cpp             TORCH_LIBRARY op in C++ (at::empty, tessera C++ API), through torch.ops .default
  cpp_boxed       the same op registered as a boxed kernel
and with autograd (softmax forward + backward):
  torch           torch.softmax + backward
  public          tessera.softmax (Python autograd.Function)
  cpp_autograd    a C++ torch::autograd::Function registered for the Autograd key
Usage: python3 dev/probe_registration.py  (needs the wheel and devbin/ with the headers)
"""
import os
import statistics
import sys
import time

import torch
from torch.utils.cpp_extension import load_inline

try:  # the public API where the wheel is installed; the C++ variants need only devbin/
    import tessera
    from tessera import _C
    from tessera._interop import torch_stream, torch_view
except ImportError:
    tessera = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 2000

CPP = r"""
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include <torch/autograd.h>
#include <tessera/tessera.hpp>

namespace {
tessera::TensorView view(const at::Tensor& t) {
  tessera::TensorView v;
  v.data = t.data_ptr();
  v.dtype = t.scalar_type() == at::kFloat ? tessera::DType::float32
          : t.scalar_type() == at::kHalf ? tessera::DType::float16 : tessera::DType::bfloat16;
  v.ndim = int(t.dim());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = t.size(i), v.strides[i] = t.stride(i);
  v.device = {tessera::DeviceType::cuda, int(t.get_device())};
  return v;
}
cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
}
at::Tensor t_add(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty_like(a);
  tessera::add(view(a), view(b), view(out), 1.0, stream_of(a));
  return out;
}
void add_boxed(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  at::Tensor b = stack->back().toTensor(); stack->pop_back();
  at::Tensor a = stack->back().toTensor(); stack->pop_back();
  stack->emplace_back(t_add(a, b));
}
at::Tensor t_softmax(const at::Tensor& x, int64_t dim) {
  at::Tensor out = at::empty_like(x);
  tessera::softmax(view(x), int(dim), view(out), stream_of(x));
  return out;
}
at::Tensor t_softmax_backward(const at::Tensor& g, const at::Tensor& y, int64_t dim) {
  at::Tensor out = at::empty_like(g);
  tessera::softmax_backward(view(g), view(y), int(dim), view(out), stream_of(g));
  return out;
}
struct SoftmaxFn : torch::autograd::Function<SoftmaxFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("tprobe_cpp::softmax", "")
                         .typed<at::Tensor(const at::Tensor&, int64_t)>();
    at::Tensor y = op.call(x, dim);
    ctx->save_for_backward({y});
    ctx->saved_data["dim"] = dim;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("tprobe_cpp::softmax_backward", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
    auto y = ctx->get_saved_variables()[0];
    return {op.call(g[0].contiguous(), y, ctx->saved_data["dim"].toInt()), at::Tensor()};
  }
};
at::Tensor softmax_autograd(const at::Tensor& x, int64_t dim) { return SoftmaxFn::apply(x, dim); }
}  // namespace

TORCH_LIBRARY(tprobe_cpp, m) {
  m.def("add(Tensor a, Tensor b) -> Tensor");
  m.def("add_boxed(Tensor a, Tensor b) -> Tensor");
  m.def("softmax(Tensor x, int dim) -> Tensor");
  m.def("softmax_backward(Tensor g, Tensor y, int dim) -> Tensor");
}
TORCH_LIBRARY_IMPL(tprobe_cpp, CUDA, m) {
  m.impl("add", &t_add);
  m.impl("add_boxed", torch::CppFunction::makeFromBoxedFunction<&add_boxed>());
  m.impl("softmax", &t_softmax);
  m.impl("softmax_backward", &t_softmax_backward);
}
TORCH_LIBRARY_IMPL(tprobe_cpp, Autograd, m) { m.impl("softmax", &softmax_autograd); }
"""


def per_call(fns, rounds=5):
    """Median per-call microseconds of each function, rounds interleaved."""
    times = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(100):
            f()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for k, f in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(N):
                f()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) / N * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    t0 = time.time()
    load_inline("tprobe_cpp", CPP, is_python_module=False, verbose=False,
                extra_include_paths=[os.path.join(ROOT, "include")],
                extra_ldflags=[f"-L{os.path.join(ROOT, 'devbin')}", "-ltessera",
                               f"-Wl,-rpath,{os.path.join(ROOT, 'devbin')}"],
                extra_cflags=["-O2"], with_cuda=True)
    print(f"load_inline: {time.time() - t0:.1f} s", flush=True)

    lib = torch.library.Library("tprobe_py", "DEF")
    lib.define("add(Tensor a, Tensor b) -> Tensor")
    # The Python impl calls the C++ op (the work of cpp, plus a Python kernel's dispatch).
    inner = torch.ops.tprobe_cpp.add.default
    lib.impl("add", lambda a, b: inner(a, b), "CUDA")

    x = torch.randn(64, 256, device="cuda")
    y = torch.randn_like(x)
    cpp_add = torch.ops.tprobe_cpp.add.default
    cpp_boxed = torch.ops.tprobe_cpp.add_boxed.default
    py_add = torch.ops.tprobe_py.add.default
    assert torch.equal(cpp_add(x, y), x + y) and torch.equal(cpp_boxed(x, y), x + y)
    assert torch.equal(py_add(x, y), x + y)

    def c_direct():
        av, bv = torch_view(x), torch_view(y)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _C.add(av, bv, torch_view(out), 1.0, torch_stream(av))
        return out

    fns = {"torch": lambda: torch.add(x, y), "pylib": lambda: py_add(x, y),
           "cpp": lambda: cpp_add(x, y), "cpp_packet": lambda: torch.ops.tprobe_cpp.add(x, y),
           "cpp_boxed": lambda: cpp_boxed(x, y)}
    if tessera is not None:
        fns.update(public=lambda: tessera.add(x, y), c_direct=c_direct)
    r = per_call(fns)
    print("add, no grad (us per call):", {k: round(v, 2) for k, v in r.items()})

    sm = torch.ops.tprobe_cpp.softmax.default
    fns = {"torch": lambda: torch.softmax(x, -1), "cpp": lambda: sm(x, -1)}
    if tessera is not None:
        fns["public"] = lambda: tessera.softmax(x, -1)
    r = per_call(fns)
    print("softmax, no grad (us per call):", {k: round(v, 2) for k, v in r.items()})

    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)
    got = torch.autograd.grad(sm(xg, -1), xg, g)[0]
    want = torch.autograd.grad(torch.softmax(xg, -1), xg, g)[0]
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()

    def fb(f):
        return lambda: f(xg, -1).backward(g)
    fns = {"torch": fb(torch.softmax), "cpp_autograd": fb(sm)}
    if tessera is not None:
        fns["public"] = fb(tessera.softmax)
    r = per_call(fns)
    print("softmax forward + backward (us per call):", {k: round(v, 2) for k, v in r.items()})

    # torch.compile over the C++ op (fake impl in Python).
    @torch.library.register_fake("tprobe_cpp::add")
    def _(a, b):
        return torch.empty_like(a)
    f = torch.compile(lambda a, b: cpp_add(a, b) * 2, fullgraph=True)
    assert torch.equal(f(x, y), (x + y) * 2)
    print("torch.compile fullgraph over the C++ op: ok")


if __name__ == "__main__":
    sys.exit(main())
