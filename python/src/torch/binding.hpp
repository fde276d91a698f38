// What every torch-registered tessera op shares: at::Tensor to TensorView, the current stream,
// outputs, and the library's errors as torch's (ValueError/TypeError/RuntimeError in Python).
//
// The ops whose description has a kernel take generic.cpp's kernels (CUDA, Meta and, with a
// backward formula, Autograd). What no rule says is registered by its family's file: matmul, mlp
// and attention's kernels (matrix.cpp, attention.cpp: the library's checks, then its launch on
// torch's current stream), and the Autograd kernels of those and of add and the losses
// (elementwise.cpp, loss.cpp: a torch::autograd::Function whose backward calls the family's
// backward op through the dispatcher). The schemas are the op descriptions' own (tessera/op.hpp,
// defined by library.cpp); the fakes of the hand-written kernels are Python's (tessera/_torch.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>

#include "tessera/tessera.hpp"

namespace tessera::torch_ops {

// The library's dtype for a torch dtype; false where it has none (complex, unsigned 16-64, ...).
bool dtype_of(c10::ScalarType t, DType& out);

// The view of a tensor (any device: the library refuses what it cannot run, by name). A dtype the
// library does not represent is refused here, naming the op and the argument; so a kernel views
// its arguments in the order the library checks them (inputs first: C++ evaluates function
// arguments in no set order), and allocates its outputs after.
TensorView view(const char* op, const char* arg, const at::Tensor& t);

// The view of an optional tensor argument, kept in `slot`; nullptr where it is absent.
inline const TensorView* optional_view(const char* op, const char* arg,
                                       const std::optional<at::Tensor>& t, TensorView& slot) {
  if (!t || !t->defined()) return nullptr;
  slot = view(op, arg, *t);
  return &slot;
}

// torch's current stream on the tensor's device (0 for a tensor not on a CUDA device).
cudaStream_t stream_of(const at::Tensor& t);

// Runs `f`, turning tessera::Error into torch's error of the same kind.
template <class F>
decltype(auto) guarded(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::value) TORCH_CHECK_VALUE(false, e.what());
    if (e.kind() == ErrorKind::type) TORCH_CHECK_TYPE(false, e.what());
    TORCH_CHECK(false, e.what());
  }
}

// The typed handle of op `tessera::name` (or its overload; looked up once per call site: keep it
// in a static).
template <class Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string("tessera::") + name).c_str(), overload)
      .template typed<Sig>();
}

// Whether autograd records a call with these tensor arguments: grad mode on and one of them
// requiring grad. Where it does not, an autograd kernel calls the op below autograd at once,
// without a torch::autograd::Function's bookkeeping (which costs more than the launch).
inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t && requires_grad(*t); }
template <class... T>
bool records(const T&... tensors) {
  return at::GradMode::is_enabled() && (requires_grad(tensors) || ...);
}

// The op's kernel below autograd (the CUDA one, or a fake one while tracing).
template <class Sig, class... Args>
decltype(auto) call_below_autograd(const c10::TypedOperatorHandle<Sig>& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(std::forward<Args>(args)...);
}

}  // namespace tessera::torch_ops

// Registers `register_kernels(torch::Library&)` (a family's CUDA kernels) for CUDA tensors and
// for CPU ones, which then reach the library's own message (a CUDA tensor expected) instead of
// torch's missing-kernel error.
#define TESSERA_TORCH_KERNELS(register_kernels)                   \
  TORCH_LIBRARY_IMPL(tessera, CUDA, m) { register_kernels(m); }   \
  TORCH_LIBRARY_IMPL(tessera, CPU, m) { register_kernels(m); }
