// The description of an operator: the one place every surface of it comes from. Each op's own .cu
// registers its description (an OpRegistrar at namespace scope), so no list of ops exists:
//  - the torch library (python/src/torch) defines torch.ops.tessera.<name> from `schemas`, and
//    for an op with a `kernel` registers one generic CUDA kernel (outputs allocated as `outputs`
//    say, the library function run through `call`) and, for one with a `backward`, one generic
//    autograd kernel;
//  - the Python package makes each public function from it: fake kernels, the no-grad fast path,
//    torch's own function where tessera's kernels do not take the call (tessera/_surface.py);
//  - the harness (verify, bench, profile) adds its cases under the same name.
// Ops whose arguments no generic rule allocates (matmul, attention, ...) give schemas only; their
// torch kernels are written by hand in their family's torch file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/tensor.hpp"

namespace tessera {

// One argument of a call made through a description, in the library function's order.
struct Arg {
  enum class Kind : uint8_t { none, tensor, real, integer, boolean, string };
  Kind kind = Kind::none;  // none: an absent optional tensor
  TensorView tensor;
  double real = 0;
  int64_t integer = 0;
  bool boolean = false;
  std::string_view string;
};

struct OpDesc {
  std::string name;     // "silu"
  std::string family;   // "elementwise"
  std::string summary;  // one line
  std::vector<DType> dtypes = {DType::float32, DType::float16, DType::bfloat16};  // its kernels'
  // torch's syntax; the first is the op itself, others overloads ("add.Scalar(...)").
  std::vector<std::string> schemas;

  // The generic kernel of the first schema. `params` names the library function's parameters in
  // order (the stream, last, excluded): an argument of the schema of the same name, or an output.
  // Each output is allocated contiguous on the device of the tensor argument `like`, with its rule's
  // dtype and shape (the out:: helpers below spell the common ones):
  //   dtype: like's, float32 (statistics) or bool (a mask);
  //   shape: like's; like's leading dimensions, without as many trailing ones as `other` names (a
  //   tensor argument: its dimensions; an int[] argument: its length; none: `drop`); the
  //   broadcast of like's and other's shapes; or a loss's (`reduced`): like's rows (its leading
  //   dimensions without the last) where the str argument `other` is "none", else 0-d; or 0-d
  //   (`scalar`). A ScalarType? argument (`dtype_from`) may override the dtype.
  // An output like an optional tensor argument that is None is None too (a gradient of an absent
  // weight), as is one whose `mask` is false: a bool[] argument at `mask_index`, or a bool
  // argument (mask_index -1), or whose `needs` (a Tensor? argument: the gradient it is computed
  // from) is None. An `internal`
  // one (statistics saved for the backward) is not returned by the public function, and a call
  // autograd does not record leaves it out.
  struct Output {
    std::string param, like;
    enum class Dtype : uint8_t { like, float32, boolean } dtype = Dtype::like;
    enum class Shape : uint8_t { like, leading, broadcast, reduced, scalar } shape = Shape::like;
    std::string other;  // leading, broadcast: the second argument
    int drop = 0;       // leading without `other`: the trailing dimensions dropped
    std::string dtype_from;  // a ScalarType? argument that, where given, is the dtype
    bool internal = false;
    std::string mask;
    int mask_index = -1;
    std::string needs;
    Output when(std::string bools, int index = -1) && {
      mask = std::move(bools);
      mask_index = index;
      return std::move(*this);
    }
    Output if_given(std::string tensor) && {
      needs = std::move(tensor);
      return std::move(*this);
    }
  };
  std::vector<std::string> params;
  std::vector<Output> outputs;
  // The library function run on `args` (one per param, in order); `op` names it in errors.
  void (*call)(const char* op, const Arg* args, cudaStream_t stream) = nullptr;
  // int[] arguments that name the trailing dimensions of a tensor argument (a normalized shape):
  // the kernels check that they are, and the library's parameter of that name takes their count.
  struct Trailing {
    std::string arg, of;
  };
  std::vector<Trailing> trailing;
  // Tensor arguments that are float32 whatever the op's dtype (statistics), and those of a dtype
  // of their own that the library checks (class indices); every other tensor argument has the
  // first one's dtype, one of `dtypes`, where tessera's kernels take the call.
  std::vector<std::string> float32_args;
  std::vector<std::string> own_dtype_args;

  // Autograd: the op whose result is the forward's gradients, called with `backward_args`
  // ("grad": the gradient of the forward's first output, made contiguous, "grad1" of its second,
  // and so on; "result": the forward's first output, "result1" its second; "mask": a bool[] with
  // one entry per backward output, true where autograd wants it; any other: the forward's argument
  // of that name), whose outputs are the gradients of the forward's tensor arguments named in
  // `grads`, in order ("input residual": one gradient for both). An output no "gradN" names gets
  // no gradient (statistics). Where every output has a gradient formula, autograd gives zeros to
  // an output that got none; otherwise a missing gradient is None for a `Tensor?` argument of the
  // backward and zeros for a `Tensor` one, and the backward is not run where none came.
  std::string backward;
  std::vector<std::string> backward_args, grads;

  // torch's function of the same contract ("torch.nn.functional.silu"), which takes the calls
  // tessera's kernels do not (CPU tensors, other dtypes); empty where there is none.
  std::string torch_function;

  // The overloads with a generic kernel of their own, each described as an op named
  // "<name>.<overload>" whose one schema is the overload's (also among `schemas`).
  std::vector<OpDesc> overloads;
};

namespace detail {
template <class T, class = void>
struct FromArg;
template <>
struct FromArg<const TensorView&> {
  static const TensorView& get(const Arg& a, const char*) { return a.tensor; }
};
template <>
struct FromArg<const TensorView*> {
  static const TensorView* get(const Arg& a, const char*) {
    return a.kind == Arg::Kind::tensor ? &a.tensor : nullptr;
  }
};
template <>
struct FromArg<bool> {
  static bool get(const Arg& a, const char*) { return a.boolean; }
};
template <class T>
struct FromArg<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static T get(const Arg& a, const char*) {
    return static_cast<T>(a.kind == Arg::Kind::integer ? static_cast<double>(a.integer) : a.real);
  }
};
template <class T>
struct FromArg<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static T get(const Arg& a, const char*) { return static_cast<T>(a.integer); }
};
// An enum from its name: parse(const char* op, std::string_view, E&), declared beside the enum,
// found by ADL; it names `op` in its error.
template <class T>
struct FromArg<T, std::enable_if_t<std::is_enum_v<T>>> {
  static T get(const Arg& a, const char* op) {
    T v{};
    parse(op, a.string, v);
    return v;
  }
};

template <auto Fn, class Sig>
struct Invoke;
// void fn(P0, ..., cudaStream_t): the library's shape of an operator.
template <auto Fn, class... P>
struct Invoke<Fn, void (*)(P...)> {
  using Params = std::tuple<P...>;
  static_assert(std::is_same_v<std::tuple_element_t<sizeof...(P) - 1, Params>, cudaStream_t>,
                "an operator takes its stream last");
  template <size_t... I>
  static void run(const char* op, const Arg* args, cudaStream_t stream, std::index_sequence<I...>) {
    Fn(FromArg<std::tuple_element_t<I, Params>>::get(args[I], op)..., stream);
  }
  static void call(const char* op, const Arg* args, cudaStream_t stream) {
    run(op, args, stream, std::make_index_sequence<sizeof...(P) - 1>{});
  }
};
}  // namespace detail

// A description under construction, registered by OpRegistrar:
//   const OpRegistrar kSilu = describe("silu", "elementwise", "SiLU: x * sigmoid(x)")
//       .schema("silu(Tensor input) -> Tensor")
//       .kernel<&silu>({"input", "out"}, {{"out", "input"}})
//       .differentiable("silu_backward", {"grad", "input"}, {"input"})
//       .torch("torch.nn.functional.silu");
struct describe {
  OpDesc d;
  describe(std::string name, std::string family, std::string summary) {
    d.name = std::move(name);
    d.family = std::move(family);
    d.summary = std::move(summary);
  }
  describe&& schema(std::string s) && {
    d.schemas.push_back(std::move(s));
    return std::move(*this);
  }
  template <auto Fn>
  describe&& kernel(std::vector<std::string> params, std::vector<OpDesc::Output> outputs) && {
    d.params = std::move(params);
    d.outputs = std::move(outputs);
    d.call = &detail::Invoke<Fn, decltype(Fn)>::call;
    return std::move(*this);
  }
  describe&& differentiable(std::string backward, std::vector<std::string> args,
                            std::vector<std::string> grads) && {
    d.backward = std::move(backward);
    d.backward_args = std::move(args);
    d.grads = std::move(grads);
    return std::move(*this);
  }
  // An overload with its own kernel: describe("add.Scalar", ...).schema("add.Scalar(...)").kernel<...>(...)
  describe&& overload(describe&& o) && {
    d.schemas.push_back(o.d.schemas.at(0));
    d.overloads.push_back(std::move(o.d));
    return std::move(*this);
  }
  describe&& trailing(std::string arg, std::string of) && {
    d.trailing.push_back({std::move(arg), std::move(of)});
    return std::move(*this);
  }
  describe&& float32_args(std::vector<std::string> args) && {
    d.float32_args = std::move(args);
    return std::move(*this);
  }
  describe&& own_dtype_args(std::vector<std::string> args) && {
    d.own_dtype_args = std::move(args);
    return std::move(*this);
  }
  describe&& dtypes(std::vector<DType> types) && {
    d.dtypes = std::move(types);
    return std::move(*this);
  }
  describe&& torch(std::string function) && {
    d.torch_function = std::move(function);
    return std::move(*this);
  }
};

struct OpRegistrar {
  OpRegistrar(describe&& op);
};

// Outputs by rule, for describe::kernel: {"out", "input"} is out::like("out", "input").
namespace out {
inline OpDesc::Output like(std::string param, std::string arg) {
  OpDesc::Output o;
  o.param = std::move(param);
  o.like = std::move(arg);
  return o;
}
inline OpDesc::Output mask(std::string param, std::string arg) {
  OpDesc::Output o = like(std::move(param), std::move(arg));
  o.dtype = OpDesc::Output::Dtype::boolean;
  return o;
}
// float32 statistics over like's leading dimensions, one per row of `trailing`'s dimensions (or
// of the last `drop`), saved for the backward (internal).
inline OpDesc::Output stats(std::string param, std::string arg, std::string trailing) {
  OpDesc::Output o = like(std::move(param), std::move(arg));
  o.dtype = OpDesc::Output::Dtype::float32;
  o.shape = OpDesc::Output::Shape::leading;
  o.other = std::move(trailing);
  o.internal = true;
  return o;
}
inline OpDesc::Output stats(std::string param, std::string arg, int drop) {
  OpDesc::Output o = stats(std::move(param), std::move(arg), std::string());
  o.drop = drop;
  return o;
}
// float32, one per row of like (its dimensions but the last), returned to the caller: a loss's
// log-sum-exp.
inline OpDesc::Output per_row(std::string param, std::string arg) {
  OpDesc::Output o = stats(std::move(param), std::move(arg), 1);
  o.internal = false;
  return o;
}
// A loss: float32, per row of like where the str argument `reduction` is "none", else 0-d.
inline OpDesc::Output loss(std::string param, std::string arg, std::string reduction) {
  OpDesc::Output o = like(std::move(param), std::move(arg));
  o.dtype = OpDesc::Output::Dtype::float32;
  o.shape = OpDesc::Output::Shape::reduced;
  o.other = std::move(reduction);
  return o;
}
inline OpDesc::Output broadcast(std::string param, std::string arg, std::string with) {
  OpDesc::Output o = like(std::move(param), std::move(arg));
  o.shape = OpDesc::Output::Shape::broadcast;
  o.other = std::move(with);
  return o;
}
}  // namespace out

// An output's shape by its rule, from the shapes of its `like` argument and of its `other` one
// (its value for an int[] argument; unused for Shape::like), or the value of the str argument of a
// `reduced` rule. Throws tessera::Error naming the op
// where the shapes do not allow it (more dimensions to drop than like has; no broadcast).
std::vector<int64_t> output_shape(const OpDesc& op, const OpDesc::Output& o, const std::vector<int64_t>& like,
                                  const std::vector<int64_t>& other, std::string_view reduction = {});

// Checks an int[] argument of a Trailing rule: `dims` (n of them) must be the trailing part of the
// tensor argument's `shape` (ndim of them), at least one. Throws tessera::Error (ValueError)
// naming the op and the argument otherwise.
void check_trailing(const OpDesc& op, const OpDesc::Trailing& t, const int64_t* shape, int ndim, const int64_t* dims,
                    size_t n);

// The place of a family in DESIGN.md's family table (elementwise, rowwise, matrix, attention,
// loss, moe, set); unknown families after those. The harness orders its table by it too.
int family_rank(std::string_view family);

// Every description, in the order of DESIGN.md's family table (elementwise, rowwise, matrix,
// attention, loss, moe, set), then by name.
const std::vector<OpDesc>& op_descriptions();
const OpDesc* find_op_description(std::string_view name);  // nullptr when unknown

}  // namespace tessera
