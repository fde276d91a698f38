// tessera._torch_fast: the public functions' calls on plain CUDA tensors, from Python to the torch
// ops without torch.ops. A call through torch.ops converts every argument to an IValue and back
// (after Python's OpOverload.__call__, pybind11's argument handling and a release of the GIL) and
// passes the dispatcher twice (the autograd kernel, then the CUDA one). Here the arguments are
// read from Python directly, and
//   - a call autograd will not record runs the op's CUDA kernel at once (fast.hpp);
//   - a call autograd records (grad mode on, a tensor argument requiring grad) calls the
//     registered op through the dispatcher (the generic ops' plan handle boxed, the hand-written
//     ones' typed handles, found once): the op's autograd kernel makes the same node, saves the
//     same tensors and has the same backward as a call through torch.ops.
//
// Each function returns None where it does not take the call, and the Python function then takes
// the registered op: a tensor that is not an exact torch.Tensor (or nn.Parameter, which torch's C++
// takes as one) such as FakeTensor, FunctionalTensor, DTensor or any other subclass; not a strided
// CUDA tensor of float32/float16/bfloat16; one carrying dispatch keys beyond a plain CUDA tensor's
// (functorch wrappers, Python keys); any dispatch or torch-function mode, or dispatch keys included
// thread-locally (vmap, ...): all of those must see the op through torch.ops. The profiler still
// sees the op's name (RECORD_FUNCTION here; the dispatcher's own for a recorded call). Under
// torch.compile the Python functions skip this module (torch.compiler.is_dynamo_compiling()).
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <vector>

#include "binding.hpp"
#include "fast.hpp"
#include "generic.hpp"

namespace {

namespace fast = tessera::torch_ops::fast;
using tessera::torch_ops::handle;  // the typed handle of a registered op (keep it in a static)
using OptTensor = std::optional<at::Tensor>;

// Keys on a tensor that ask for more than its CUDA kernel: Python (subclasses, modes), functorch's
// transforms, functionalization, lazy conjugate/negative views, zero tensors, nested tensors.
const c10::DispatchKeySet kWrapped =
    c10::python_ks | c10::functorch_transforms_ks |
    c10::DispatchKeySet({c10::DispatchKey::Functionalize, c10::DispatchKey::Conjugate,
                         c10::DispatchKey::Negative, c10::DispatchKey::ZeroTensor,
                         c10::DispatchKey::NestedTensor});

// Keys a thread includes while something must see every call: Python modes, functorch's
// transforms (vmap, grad), functionalization. (BackendSelect and ADInplaceOrView are always in.)
const c10::DispatchKeySet kModeKeys =
    c10::python_ks | c10::functorch_transforms_ks |
    c10::DispatchKeySet({c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                         c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::PreDispatch});

// Nothing in this thread that must see calls in the dispatcher.
bool quiet() {
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 && !at::impl::torch_function_mode_enabled() &&
         !c10::impl::tls_local_dispatch_key_set().included_.has_any(kModeKeys);
}

// The tensor of `o` where it is a plain CUDA tensor the kernels take; nullptr otherwise. `grad`
// becomes true where it requires grad (whether autograd records the call: records(grad), once
// every argument is read).
const at::Tensor* dense(PyObject* o, bool& grad) {
  if (!THPVariable_CheckExact(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  const bool ok = t.is_cuda() && t.layout() == at::kStrided && !t.key_set().has_any(kWrapped);
  grad = grad || t.requires_grad();
  return ok ? &t : nullptr;
}

// ... of a float dtype the kernels take (the hand-written fast entries).
const at::Tensor* plain(PyObject* o, bool& grad) {
  const at::Tensor* t = dense(o, grad);
  const auto s = t ? t->scalar_type() : at::kDouble;
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 ? t : nullptr;
}

// A plain tensor of `like`'s dtype and device.
const at::Tensor* plain_like(PyObject* o, const at::Tensor& like, bool& grad) {
  const at::Tensor* t = plain(o, grad);
  return t && t->scalar_type() == like.scalar_type() && t->device() == like.device() ? t : nullptr;
}

// None, or a plain tensor of `like`'s dtype and device, into `out`; false for anything else.
bool optional_like(PyObject* o, const at::Tensor& like, OptTensor& out, bool& grad) {
  if (o == Py_None) return true;
  const at::Tensor* t = plain_like(o, like, grad);
  if (t) out = *t;
  return t != nullptr;
}

// Whether autograd records a call whose tensor arguments were read with `grad`: then the call goes
// through the dispatcher to the registered op's autograd kernel, as torch.ops would take it.
bool records(bool grad) { return grad && at::GradMode::is_enabled(); }

bool as_int(PyObject* o, int64_t& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  v = PyLong_AsLongLongAndOverflow(o, &overflow);
  return overflow == 0 && !(v == -1 && PyErr_Occurred());
}

bool as_double(PyObject* o, double& v) {
  if (PyFloat_CheckExact(o)) {
    v = PyFloat_AS_DOUBLE(o);
    return true;
  }
  int64_t i = 0;
  if (!as_int(o, i)) return false;
  v = static_cast<double>(i);
  return true;
}

PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

// A tuple of the tensors, None for an undefined one.
PyObject* wrap_all(std::vector<at::Tensor> outs) {
  PyObject* r = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (!r) return nullptr;
  for (size_t i = 0; i < outs.size(); ++i) PyTuple_SET_ITEM(r, static_cast<Py_ssize_t>(i), wrap(std::move(outs[i])));
  return r;
}

// The op's public outputs (its internal ones left out): one as itself, several as a tuple.
PyObject* wrap_outputs(const tessera::torch_ops::generic::Plan& p, tessera::torch_ops::generic::Outputs outs) {
  size_t n = 0;
  for (size_t i = 0; i < outs.size(); ++i)
    if (!p.internal[i]) outs[n++] = std::move(outs[i]);
  if (n == 1) return wrap(std::move(outs[0]));
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (!t) return nullptr;
  for (size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), wrap(std::move(outs[i])));
  return t;
}

// An int or a list/tuple of at most kMaxDims ints (an int[] argument).
bool as_ints(PyObject* o, tessera::torch_ops::generic::Value& v) {
  if (as_int(o, v.ints[0])) {
    v.num = 1;
    return true;
  }
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;  // torch.Size is a tuple
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  if (n > tessera::kMaxDims) return false;
  PyObject** items = PySequence_Fast_ITEMS(o);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!as_int(items[i], v.ints[i])) return false;
  v.num = static_cast<int>(n);
  return true;
}

// A list/tuple of Python bools (a bool[] argument).
bool as_bools(PyObject* o, tessera::torch_ops::generic::Value& v) {
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  if (n > 32) return false;
  PyObject** items = PySequence_Fast_ITEMS(o);
  v.bools = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyBool_Check(items[i])) return false;
    v.bools |= static_cast<uint32_t>(items[i] == Py_True) << i;
  }
  v.num = static_cast<int>(n);
  return true;
}

// call(op, *args): an op of generic.cpp's kernel (op: its index(name)), one positional argument
// per schema argument.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  namespace generic = tessera::torch_ops::generic;
  const auto& plans = generic::plans();
  int64_t k = -1;
  if (n < 1 || !as_int(args[0], k) || k < 0 || k >= static_cast<int64_t>(plans.size())) Py_RETURN_NONE;
  const generic::Plan& p = plans[static_cast<size_t>(k)];
  if (n - 1 != p.num_args || !quiet()) Py_RETURN_NONE;
  generic::Value v[generic::kMaxArgs];
  const at::Tensor* first = nullptr;
  bool grad = false;
  for (int i = 0; i < p.num_args; ++i) {
    PyObject* o = args[i + 1];
    bool ok = true;
    switch (p.args[static_cast<size_t>(i)]) {
      case generic::Plan::From::optional_tensor:
        if (o == Py_None) break;
        [[fallthrough]];
      case generic::Plan::From::tensor: {
        // One dtype of the description's, on one device; statistics float32 and class indices
        // their own (the library checks those).
        const at::Tensor* t = dense(o, grad);
        const size_t a = static_cast<size_t>(i);
        ok = t && (!first || t->device() == first->device()) &&
             (p.float32[a]     ? t->scalar_type() == at::kFloat
              : p.own_dtype[a] ? true
              : first          ? t->scalar_type() == first->scalar_type()
                               : p.takes(t->scalar_type()));
        v[i].tensor = t;
        if (ok && !first && !p.float32[a] && !p.own_dtype[a]) first = t;
        break;
      }
      case generic::Plan::From::ints: ok = as_ints(o, v[i]); break;
      case generic::Plan::From::bools: ok = as_bools(o, v[i]); break;
      case generic::Plan::From::dtype:
        ok = o == Py_None || THPDtype_Check(o);
        v[i].integer = o == Py_None ? -1 : static_cast<int64_t>(reinterpret_cast<THPDtype*>(o)->scalar_type);
        break;
      case generic::Plan::From::real: ok = as_double(o, v[i].real); break;
      case generic::Plan::From::integer: ok = as_int(o, v[i].integer); break;
      case generic::Plan::From::boolean:
        ok = PyBool_Check(o);
        v[i].boolean = o == Py_True;
        break;
      case generic::Plan::From::string: {
        Py_ssize_t size = 0;
        const char* text = PyUnicode_Check(o) ? PyUnicode_AsUTF8AndSize(o, &size) : nullptr;
        ok = text != nullptr;
        if (ok) v[i].string = std::string_view(text, static_cast<size_t>(size));
        else PyErr_Clear();
        break;
      }
      case generic::Plan::From::output: break;
    }
    if (!ok) Py_RETURN_NONE;
  }
  if (records(grad)) return wrap_outputs(p, generic::dispatch(p, v));
  RECORD_FUNCTION(p.qualified.c_str(), std::vector<c10::IValue>());
  return wrap_outputs(p, generic::run(p, v, /*internal=*/false));
  END_HANDLE_TH_ERRORS
}

// index(name): the op's index for call(), or -1 where it has no generic kernel.
PyObject* index(PyObject*, PyObject* name) {
  HANDLE_TH_ERRORS
  const char* s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  if (!s) return nullptr;
  return PyLong_FromLong(tessera::torch_ops::generic::index(s));
  END_HANDLE_TH_ERRORS
}

// matmul(input, other[, bias]) and linear(input, weight[, bias]) (other = weight.T): operands of
// one dtype, 2-d or 3-d (the op's ranks; torch's others take torch's path). A call autograd
// records takes 2-d operands only: the Python function hands those to the op as they are (3-d ones
// it first broadcasts, views autograd records too).
template <bool Linear>
PyObject* matmul(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* a = n == 2 || n == 3 ? plain(args[0], grad) : nullptr;
  const at::Tensor* b = a ? plain_like(args[1], *a, grad) : nullptr;
  OptTensor bias;
  if (!b || !quiet() || a->dim() < 2 || a->dim() > 3 || b->dim() < 2 || b->dim() > (Linear ? 2 : 3) ||
      (n == 3 && !optional_like(args[2], *a, bias, grad)))
    Py_RETURN_NONE;
  if (records(grad)) {
    if (a->dim() != 2 || b->dim() != 2) Py_RETURN_NONE;
    static const auto op =
        handle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                              c10::string_view, double, std::optional<at::ScalarType>, std::optional<bool>)>(
            "matmul");
    // linear's other as tessera.linear makes it, weight.transpose(-1, -2) (a view autograd records)
    return wrap(op.call(*a, Linear ? b->transpose(-1, -2) : *b, bias, std::nullopt, "none", 1.0, std::nullopt,
                        std::nullopt));
  }
  RECORD_FUNCTION("tessera::matmul", std::vector<c10::IValue>());
  return wrap(fast::matmul(*a, Linear ? b->t() : *b, bias));
  END_HANDLE_TH_ERRORS
}

// mlp(input, w_in, w_out, activation): the weights of input's dtype and device, activation a str
// (the library checks its value).
PyObject* mlp(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* x = n == 4 ? plain(args[0], grad) : nullptr;
  const at::Tensor* w_in = x ? plain_like(args[1], *x, grad) : nullptr;
  const at::Tensor* w_out = w_in ? plain_like(args[2], *x, grad) : nullptr;
  Py_ssize_t size = 0;
  const char* activation = w_out && PyUnicode_Check(args[3]) ? PyUnicode_AsUTF8AndSize(args[3], &size) : nullptr;
  if (!activation) PyErr_Clear();
  if (!activation || !quiet()) Py_RETURN_NONE;
  const c10::string_view act(activation, static_cast<size_t>(size));
  if (records(grad)) {
    static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                             c10::string_view, std::optional<bool>)>("mlp");
    return wrap(op.call(*x, *w_in, *w_out, act, std::nullopt));
  }
  RECORD_FUNCTION("tessera::mlp", std::vector<c10::IValue>());
  return wrap(fast::mlp(*x, *w_in, *w_out, act));
  END_HANDLE_TH_ERRORS
}

// scaled_mm(input, other, scale_a, scale_b, out_dtype): float8 operands and float32 scales, plain
// CUDA tensors on one device, out_dtype a torch.dtype or None; no bias. Float8 tensors do not
// require grad, so autograd never records the call: the op's CUDA kernel at once.
PyObject* scaled_mm(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* t[4] = {};
  bool ok = n == 5 && quiet() && (args[4] == Py_None || THPDtype_Check(args[4]));
  for (int i = 0; ok && i < 4; ++i) {
    t[i] = dense(args[i], grad);
    ok = t[i] && t[i]->device() == t[0]->device() && (i < 2) != (t[i]->scalar_type() == at::kFloat);
  }
  if (!ok || grad) Py_RETURN_NONE;
  const std::optional<at::ScalarType> dtype =
      args[4] == Py_None ? std::nullopt : std::optional(reinterpret_cast<THPDtype*>(args[4])->scalar_type);
  RECORD_FUNCTION("tessera::scaled_mm", std::vector<c10::IValue>());
  return wrap(fast::scaled_mm(*t[0], *t[1], *t[2], *t[3], dtype));
  END_HANDLE_TH_ERRORS
}

// float8_quantize(input, granularity, columns[, rows]): a plain float tensor, granularity a str
// (the library checks its value), columns and rows (default True) bools: (q, scale), with columns
// (q, scale, q_t, scale_t), with columns and not rows (q_t, scale_t). The op has no autograd: a
// call on a tensor requiring grad takes it as a constant, as the registered op does.
PyObject* float8_quantize(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const bool flags = (n == 3 || n == 4) && PyBool_Check(args[2]) && (n == 3 || PyBool_Check(args[3]));
  const bool rows = flags && (n == 3 || args[3] == Py_True);  // args[3] read only where it exists
  const at::Tensor* x = flags && (rows || args[2] == Py_True) ? plain(args[0], grad) : nullptr;
  Py_ssize_t size = 0;
  const char* g = x && PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8AndSize(args[1], &size) : nullptr;
  if (!g) PyErr_Clear();
  if (!g || grad || !quiet()) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::float8_quantize", std::vector<c10::IValue>());
  std::vector<at::Tensor> outs = fast::float8_quantize(*x, c10::string_view(g, static_cast<size_t>(size)),
                                                       args[2] == Py_True, rows);
  return wrap_all(std::move(outs));
  END_HANDLE_TH_ERRORS
}

// float8_quantize_gated(gate, up, activation, granularity, columns): plain tensors, two strs, a
// bool: (q, scale), with columns (q, scale, q_t, scale_t), of act(gate) * up. Like
// float8_quantize, no autograd; None where either tensor is not plain (the caller quantizes the
// gated op's output instead).
PyObject* float8_quantize_gated(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* gate = n == 5 && PyBool_Check(args[4]) ? plain(args[0], grad) : nullptr;
  const at::Tensor* up = gate ? plain(args[1], grad) : nullptr;
  Py_ssize_t na = 0, ng = 0;
  const char* act = up && PyUnicode_Check(args[2]) ? PyUnicode_AsUTF8AndSize(args[2], &na) : nullptr;
  const char* g = act && PyUnicode_Check(args[3]) ? PyUnicode_AsUTF8AndSize(args[3], &ng) : nullptr;
  if (!g) PyErr_Clear();
  if (!g || grad || !quiet()) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::float8_quantize_gated", std::vector<c10::IValue>());
  std::vector<at::Tensor> outs =
      fast::float8_quantize_gated(*gate, *up, c10::string_view(act, static_cast<size_t>(na)),
                                  c10::string_view(g, static_cast<size_t>(ng)), args[4] == Py_True);
  return wrap_all(std::move(outs));
  END_HANDLE_TH_ERRORS
}

// rms_norm_float8(input, residual, weight, eps, weight_offset, granularity, columns): plain tensors
// of one dtype and device (residual None or one), numbers, a str, a bool: (y, residual_out, rstd,
// q, scale, q_t, scale_t), None for what is not asked for. The library checks shapes, dtypes and
// the granularity's value. No autograd: its caller, an autograd Function's forward, records it.
PyObject* rms_norm_float8(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* x = n == 7 && PyBool_Check(args[6]) ? plain(args[0], grad) : nullptr;
  OptTensor residual;
  const at::Tensor* w = x && optional_like(args[1], *x, residual, grad) ? plain_like(args[2], *x, grad) : nullptr;
  double eps = 0.0, offset = 0.0;
  Py_ssize_t size = 0;
  const char* g = w && as_double(args[3], eps) && as_double(args[4], offset) && PyUnicode_Check(args[5])
                      ? PyUnicode_AsUTF8AndSize(args[5], &size) : nullptr;
  if (!g) PyErr_Clear();
  if (!g || records(grad) || !quiet()) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::rms_norm_float8", std::vector<c10::IValue>());
  return wrap_all(fast::rms_norm_float8(*x, residual ? &*residual : nullptr, *w, eps, offset,
                                        c10::string_view(g, static_cast<size_t>(size)), args[6] == Py_True));
  END_HANDLE_TH_ERRORS
}

// float8_quantize_gated_backward(grad_output, gate, up, activation, granularity): plain tensors of
// one dtype and device, two strs: (grad_gate, grad_up, then q, scale, q_t, scale_t of each). No
// autograd: a backward calls it, and a tensor requiring grad is taken as a constant.
PyObject* float8_quantize_gated_backward(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  bool grad = false;
  const at::Tensor* dy = n == 5 ? plain(args[0], grad) : nullptr;
  const at::Tensor* gate = dy ? plain_like(args[1], *dy, grad) : nullptr;
  const at::Tensor* up = gate ? plain_like(args[2], *dy, grad) : nullptr;
  Py_ssize_t na = 0, ng = 0;
  const char* act = up && PyUnicode_Check(args[3]) ? PyUnicode_AsUTF8AndSize(args[3], &na) : nullptr;
  const char* g = act && PyUnicode_Check(args[4]) ? PyUnicode_AsUTF8AndSize(args[4], &ng) : nullptr;
  if (!g) PyErr_Clear();
  if (!g || !quiet()) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::float8_quantize_gated_backward", std::vector<c10::IValue>());
  return wrap_all(fast::float8_quantize_gated_backward(*dy, *gate, *up, c10::string_view(act, static_cast<size_t>(na)),
                                                       c10::string_view(g, static_cast<size_t>(ng))));
  END_HANDLE_TH_ERRORS
}

// Whether a call on `x` may take this module (for tests): a plain tensor in a quiet thread. Where
// autograd records the call, it goes through the dispatcher (records(x)).
PyObject* takes(PyObject*, PyObject* x) {
  HANDLE_TH_ERRORS
  bool grad = false;
  return PyBool_FromLong(plain(x, grad) != nullptr && quiet());
  END_HANDLE_TH_ERRORS
}

// Whether a call on a plain tensor `x` is one autograd records (for tests): grad mode on and x
// requiring grad.
PyObject* records_(PyObject*, PyObject* x) {
  HANDLE_TH_ERRORS
  bool grad = false;
  return PyBool_FromLong(plain(x, grad) != nullptr && records(grad));
  END_HANDLE_TH_ERRORS
}

#define FAST(name, fn) {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn)), METH_FASTCALL, nullptr}
PyMethodDef methods[] = {
    FAST("call", call),
    FAST("matmul", matmul<false>),
    FAST("linear", matmul<true>),
    FAST("mlp", mlp),
    FAST("scaled_mm", scaled_mm),
    FAST("float8_quantize", float8_quantize),
    FAST("float8_quantize_gated", float8_quantize_gated),
    FAST("rms_norm_float8", rms_norm_float8),
    FAST("float8_quantize_gated_backward", float8_quantize_gated_backward),
    {"takes", takes, METH_O, nullptr},
    {"records", records_, METH_O, nullptr},
    {"index", index, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr}};
#undef FAST

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast",
                      "Calls on plain CUDA tensors, straight to the torch ops' kernels (or, where autograd "
                      "records them, to the registered ops through the dispatcher).", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast() { return PyModule_Create(&module); }
