// The torch surface of every op whose description has a kernel (tessera/op.hpp): one CUDA kernel
// and one autograd kernel for all of them, registered from the descriptions by generic.cpp, and the
// plan they share with the fast path (fast.cpp): where each of the library function's parameters
// comes from in the schema's arguments, and how each output is allocated (its description's rule).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessera/op.hpp"

namespace tessera::torch_ops::generic {

struct Plan {
  const OpDesc* desc = nullptr;
  std::string qualified;  // "tessera::silu", the profiler's name
  enum class From : uint8_t { tensor, optional_tensor, real, integer, boolean, string, output };
  struct Param {
    From from;
    int arg;         // the schema argument it reads; for an output, its rule's `like` argument
    int out;         // for an output, its place among the op's returns
    int other = -1;  // for an output, its rule's `other` argument (-1: none)
  };
  std::vector<Param> params;
  std::vector<From> args;  // the schema's arguments' kinds
  int num_args = 0;
  int num_outputs = 0;
  // The op's own handle, found on first use (the fast path's calls that autograd records).
  const c10::OperatorHandle& op() const;
  mutable std::once_flag found;
  mutable std::optional<c10::OperatorHandle> handle;

  // Autograd (ops with a backward): the schema positions of the arguments the backward's outputs
  // are gradients of, and where each of the backward's arguments comes from.
  std::vector<int> grad_args;
  struct BackwardArg {
    enum Kind : uint8_t { grad, result, tensor, value } kind;
    int arg;   // tensor, value: the forward's schema argument; grad: the forward's output
    int slot;  // tensor, result: its place among the saved tensors; value: among the saved values
  };
  std::vector<BackwardArg> backward_args;
  int num_saved = 0, num_values = 0;
  // The backward op's handle, found on first use (its schema may be defined after this one's).
  const c10::OperatorHandle& backward_op() const;
  mutable std::once_flag backward_found;
  mutable std::optional<c10::OperatorHandle> backward_handle;
};

// The plans of the ops with a generic kernel, in op_descriptions() order; `index` finds one by name
// (-1 where the op has none).
const std::deque<Plan>& plans();
int index(const std::string& name);

// A schema argument's value as run() reads it.
struct Value {
  const at::Tensor* tensor = nullptr;  // tensor, optional tensor (nullptr: None)
  double real = 0;
  int64_t integer = 0;
  bool boolean = false;
  std::string_view string;
};

// Runs the op's library function on the arguments (one Value per schema argument, in order) on
// torch's current stream: outputs allocated, the library's errors as torch's. Returns the outputs.
using Outputs = c10::SmallVector<at::Tensor, 2>;
Outputs run(const Plan& plan, const Value* args);

// The registered op on the same arguments, through the dispatcher (a boxed call, as torch.ops
// makes after converting Python's arguments): its autograd kernel records the call. Returns the
// outputs.
Outputs dispatch(const Plan& plan, const Value* args);

inline constexpr int kMaxArgs = 12;  // of a schema, and of a library function

}  // namespace tessera::torch_ops::generic
