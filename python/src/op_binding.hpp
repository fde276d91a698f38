// One wrapper for every operator binding. Included once, by ext.cpp.
//
//   def_op<&fn>(m, "name", {"input", "out", "dim", "stream"}, {"out", "input"}, "doc");
//
// binds a library function `void fn(P...)` as _C.name with one Python argument per parameter, in
// the same order, each taken as its type says:
//   const TensorView&   a tensor: a view tuple or a DLPack object (None is refused by the
//                       conversion, with the library's message), except the allocated output
//   const TensorView*   an optional tensor: None passes nullptr
//   cudaStream_t        the stream handle, an int; converted first, since DLPack imports use it
//   anything else       a scalar, converted by nanobind
// The names are both the Python keywords and the argument names of the error messages, so the two
// cannot drift apart. The allocated output ({"out", "like"}; {} for none) is the tensor argument
// that, when None, becomes a new DeviceArray shaped like the input `like` (for DLPack inputs; see
// new_output), returned to the caller; the function otherwise returns None. Where the Python
// signature is not the library's (torch's argument order, a flag for an enum), an adapter function
// with the Python signature is bound instead.
//
// The cost per call is that of the hand-written wrappers this replaces: the names and indices are
// read from per-function statics, the conversions are a fold over the parameters.
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensors.hpp"

namespace tessera::python {
namespace {

template <class T>
constexpr bool kIsTensor = std::is_same_v<T, const TensorView&>;
template <class T>
constexpr bool kIsOptional = std::is_same_v<T, const TensorView*>;
template <class T>
constexpr bool kIsStream = std::is_same_v<T, cudaStream_t>;

// The Python-side type of a library parameter.
template <class T>
struct PyParam {
  using type = T;
};
template <>
struct PyParam<const TensorView&> {
  using type = nb::handle;
};
template <>
struct PyParam<const TensorView*> {
  using type = nb::handle;
};
template <>
struct PyParam<cudaStream_t> {
  using type = uintptr_t;
};

// The allocated output: the names of the output argument and of the input it is shaped like.
struct Alloc {
  const char* out = nullptr;
  const char* like = nullptr;
  DType dtype = DType::float32;
  bool own_dtype = false;  // the output's dtype is `dtype`, not like's
};

// Storage for one converted view, which to_view's result initializes in place: no zeroing before,
// no copy after (a required tensor is always converted before it is read; an optional one only
// where given).
union Slot {
  Slot() {}
  TensorView view;
};
static_assert(std::is_trivially_destructible_v<TensorView>);

template <auto Fn, class Sig = decltype(Fn)>
struct OpBinding;

template <auto Fn, class... P>
struct OpBinding<Fn, void (*)(P...)> {
  static constexpr std::size_t kArgs = sizeof...(P);
  static constexpr bool kTensorAt[] = {(kIsTensor<P> || kIsOptional<P>)...};

  // Slot of each parameter among the tensor parameters (-1: not a tensor), and the stream's index.
  static constexpr auto kSlots = [] {
    std::array<int, kArgs> slots{};
    int next = 0;
    for (std::size_t i = 0; i < kArgs; ++i) slots[i] = kTensorAt[i] ? next++ : -1;
    return slots;
  }();
  static constexpr std::size_t kTensors = (std::size_t{0} + ... + (kIsTensor<P> || kIsOptional<P>));
  static constexpr std::size_t kStream = [] {
    constexpr bool is_stream[] = {kIsStream<P>...};
    std::size_t at = kArgs;
    for (std::size_t i = 0; i < kArgs; ++i)
      if (is_stream[i]) at = i;
    return at;
  }();
  static_assert(kStream < kArgs, "an operator takes a cudaStream_t");

  static inline const char* op = nullptr;
  static inline const char* names[kArgs] = {};
  static inline int out = -1, like = -1;
  static inline Alloc alloc;

  static nb::object call(typename PyParam<P>::type... args) {
    return run(std::index_sequence_for<P...>{}, args...);
  }

  template <std::size_t... I>
  static nb::object run(std::index_sequence<I...>, typename PyParam<P>::type... py) {
    const auto args = std::forward_as_tuple(py...);
    const cudaStream_t stream = as_stream(std::get<kStream>(args));
    std::vector<nb::object> keep;  // DLPack capsules, alive until the call returns
    nb::object result = nb::none();
    Slot views[kTensors > 0 ? kTensors : 1];
    bool given[kTensors > 0 ? kTensors : 1] = {};
    // A comma fold runs left to right: the arguments convert in order, as the library checks them.
    (convert<I, P>(std::get<I>(args), stream, keep, views, given, result), ...);
    Fn(pass<I, P>(std::get<I>(args), views, given)...);
    set_producer(result, stream);
    return result;
  }

  template <std::size_t I, class T, class Py>
  static void convert(const Py& py, cudaStream_t stream, std::vector<nb::object>& keep, Slot* views,
                      bool* given, nb::object& result) {
    if constexpr (kIsTensor<T> || kIsOptional<T>) {
      constexpr int slot = kSlots[I];
      const nb::handle h = py;
      if (h.is_none()) {
        if (static_cast<int>(I) == out) {
          const TensorView& src = views[kSlots[like]].view;
          TensorView* view = new (&views[slot].view) TensorView;
          result = new_output(src, alloc.own_dtype ? alloc.dtype : src.dtype, src.shape, src.ndim,
                              true, *view);
          given[slot] = true;
          return;
        }
        if constexpr (kIsOptional<T>) return;
      }
      new (&views[slot].view) TensorView(to_view(op, names[I], h, stream, keep));
      given[slot] = true;
    }
  }

  template <std::size_t I, class T, class Py>
  static decltype(auto) pass(const Py& py, Slot* views, const bool* given) {
    if constexpr (kIsTensor<T>) {
      return static_cast<const TensorView&>(views[kSlots[I]].view);
    } else if constexpr (kIsOptional<T>) {
      return given[kSlots[I]] ? &views[kSlots[I]].view : static_cast<const TensorView*>(nullptr);
    } else if constexpr (kIsStream<T>) {
      return as_stream(py);
    } else {
      return static_cast<T>(py);
    }
  }

  static int index_of(const char* name) {
    if (name == nullptr) return -1;
    for (std::size_t i = 0; i < kArgs; ++i)
      if (std::string(name) == names[i]) {
        if (!kTensorAt[i]) break;
        return static_cast<int>(i);
      }
    throw std::logic_error(std::string("_C.") + op + ": '" + name + "' is no tensor argument");
  }

  // A tensor argument accepts None at the binding: the conversion refuses it with the message.
  template <std::size_t I>
  static auto annotation() {
    if constexpr (kTensorAt[I]) return nb::arg(names[I]).none();
    else return nb::arg(names[I]);
  }

  template <std::size_t... I>
  static void def(nb::module_& m, const char* doc, std::index_sequence<I...>) {
    m.def(op, &call, annotation<I>()..., doc);
  }
};

template <auto Fn>
void def_op(nb::module_& m, const char* name, std::initializer_list<const char*> args,
            Alloc alloc, const char* doc) {
  using B = OpBinding<Fn>;
  // Mistakes here are the binding's, found when the module is imported.
  if (B::op != nullptr) throw std::logic_error(std::string("_C.") + name + ": bound twice");
  if (args.size() != B::kArgs)
    throw std::logic_error(std::string("_C.") + name + ": " + std::to_string(args.size()) +
                           " names for " + std::to_string(B::kArgs) + " parameters");
  B::op = name;
  std::size_t i = 0;
  for (const char* a : args) B::names[i++] = a;
  B::alloc = alloc;
  B::out = B::index_of(alloc.out);
  B::like = B::index_of(alloc.like);
  if ((B::out < 0) != (B::like < 0) || (B::out >= 0 && B::like >= B::out))
    throw std::logic_error(std::string("_C.") + name + ": the allocated output needs an input before it");
  B::def(m, doc, std::make_index_sequence<B::kArgs>{});
}

}  // namespace
}  // namespace tessera::python
