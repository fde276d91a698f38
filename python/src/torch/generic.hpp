// The torch surface of every op whose description has a kernel (tessera/op.hpp): one CUDA kernel
// and one autograd kernel for all of them, registered from the descriptions by generic.cpp and
// generic_autograd.cpp, and the plan they share with the fast path (fast.cpp): where each of the
// library function's parameters comes from in the schema's arguments, and how each output is
// allocated (its description's rule).
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

inline constexpr int kMaxArgs = 20;  // of a schema, and of a library function

struct Plan {
  const OpDesc* desc = nullptr;
  std::string qualified;  // "tessera::silu", the profiler's name
  enum class From : uint8_t { tensor, optional_tensor, real, integer, boolean, string, ints, bools, dtype, output };
  struct Param {
    From from;
    int arg;         // the schema argument it reads; for an output, its rule's `like` argument
    int out;         // for an output, its place among the op's returns
    int other = -1;  // for an output, its rule's `other` argument (-1: none)
    int mask = -1;   // for an output, its rule's bool or bool[] argument (-1: none)
    int dtype = -1;  // for an output, its rule's ScalarType? argument (-1: none)
    int needs = -1;  // for an output, the Tensor? argument it is None without (-1: none)
  };
  std::vector<Param> params;
  std::vector<From> args;        // the schema's arguments' kinds
  std::vector<bool> float32;     // per schema argument: a float32 tensor whatever the op's dtype
  std::vector<bool> own_dtype;   // per schema argument: a tensor of its own dtype (class indices)
  uint64_t dtypes = 0;           // the description's dtypes: bit s for at::ScalarType s
  bool takes(at::ScalarType s) const { return static_cast<int>(s) < 64 && (dtypes >> static_cast<int>(s) & 1u); }
  std::vector<bool> internal;    // per output: left out of the public function's result
  struct Trailing {
    int arg, of;  // an int[] argument, and the tensor argument whose trailing dimensions it names
    const OpDesc::Trailing* rule;
  };
  std::vector<Trailing> trailing;
  int num_args = 0;
  int num_outputs = 0;
  // The op's own handle, found on first use (the fast path's calls that autograd records).
  const c10::OperatorHandle& op() const;
  mutable std::once_flag found;
  mutable std::optional<c10::OperatorHandle> handle;

  // Autograd (ops with a backward): for each tensor argument autograd sees, its schema position
  // and the backward output that is its gradient; where each of the backward's arguments comes
  // from.
  struct GradArg {
    int arg, out;
  };
  std::vector<GradArg> grad_args;
  int num_backward_outputs = 0;
  struct BackwardArg {
    enum Kind : uint8_t { grad, result, tensor, value, mask } kind;
    int arg;   // tensor, value: the forward's schema argument; grad, result: the forward's output
    int slot;  // tensor, result: its place among the saved tensors; value: among the saved values
    bool optional = false;  // grad: the backward takes None for a missing gradient
  };
  std::vector<BackwardArg> backward_args;
  int num_saved = 0, num_values = 0;
  // Whether every output has a gradient formula (autograd then gives zeros for a missing one);
  // otherwise the outputs without one are marked non-differentiable, and `zeros` lists the
  // outputs whose missing gradient the backward takes as zeros (their shape saved by the forward).
  bool materialize = true;
  std::vector<bool> differentiable;
  std::vector<int> zeros;
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
  int64_t integer = 0;  // integer; dtype: an at::ScalarType, -1 for None
  bool boolean = false;
  std::string_view string;
  int num = 0;                  // ints, bools: how many
  uint32_t bools = 0;           // bools: bit i is entry i
  int64_t ints[kMaxDims];       // ints: the first `num`
};

// Runs the op's library function on the arguments (one Value per schema argument, in order) on
// torch's current stream: outputs allocated, the library's errors as torch's. Returns the outputs;
// without `internal`, those the description calls internal are left out (undefined).
using Outputs = c10::SmallVector<at::Tensor, 4>;
Outputs run(const Plan& plan, const Value* args, bool internal = true);

// The registered op on the same arguments, through the dispatcher (a boxed call, as torch.ops
// makes after converting Python's arguments): its autograd kernel records the call. Returns the
// outputs.
Outputs dispatch(const Plan& plan, const Value* args);

}  // namespace tessera::torch_ops::generic
