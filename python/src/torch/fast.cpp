// tessera._torch_fast: the public functions' calls that autograd will not record, on plain CUDA
// tensors, straight from Python to the torch ops' CUDA kernels (fast.hpp). A call through
// torch.ops converts every argument to an IValue and back and passes the dispatcher twice (the
// autograd kernel, then the CUDA one); here the arguments are read from Python directly.
//
// Each function returns None where it does not take the call, and the Python function then takes
// the registered op: a tensor that is not an exact torch.Tensor (FakeTensor, FunctionalTensor, any
// subclass), not a strided CUDA tensor of float32/float16/bfloat16, one autograd would record, one
// carrying dispatch keys beyond a plain CUDA tensor's (functorch wrappers, Python keys), or any
// dispatch or torch-function mode, or dispatch keys included thread-locally (vmap, ...): all of
// those must see the op in the dispatcher. The profiler still sees the op's name
// (RECORD_FUNCTION). Under torch.compile the Python functions skip this module
// (torch.compiler.is_dynamo_compiling()).
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <tuple>
#include <vector>

#include "fast.hpp"
#include "generic.hpp"

namespace {

namespace fast = tessera::torch_ops::fast;
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

// The tensor of `o` where it is a plain CUDA tensor the kernels take; nullptr otherwise.
const at::Tensor* plain(PyObject* o) {
  if (!THPVariable_CheckExact(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  const auto s = t.scalar_type();
  const bool ok = t.is_cuda() && t.layout() == at::kStrided &&
                  (s == at::kFloat || s == at::kHalf || s == at::kBFloat16) &&
                  !t.key_set().has_any(kWrapped) && !(t.requires_grad() && at::GradMode::is_enabled());
  return ok ? &t : nullptr;
}

// A plain tensor of `like`'s dtype and device.
const at::Tensor* plain_like(PyObject* o, const at::Tensor& like) {
  const at::Tensor* t = plain(o);
  return t && t->scalar_type() == like.scalar_type() && t->device() == like.device() ? t : nullptr;
}

// None, or a plain tensor of `like`'s dtype and device, into `out`; false for anything else.
bool optional_like(PyObject* o, const at::Tensor& like, OptTensor& out) {
  if (o == Py_None) return true;
  const at::Tensor* t = plain_like(o, like);
  if (t) out = *t;
  return t != nullptr;
}

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

// An int or a list/tuple of ints.
bool as_shape(PyObject* o, std::vector<int64_t>& shape) {
  int64_t d = 0;
  if (as_int(o, d)) {
    shape.assign(1, d);
    return true;
  }
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;  // torch.Size is a tuple
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  shape.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!as_int(items[i], shape[static_cast<size_t>(i)])) return false;
  return true;
}

PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

// add(input, other[, alpha]): other a tensor of input's dtype and device, or a Python number.
PyObject* add(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  double alpha = 1.0;
  const at::Tensor* x = n == 2 || n == 3 ? plain(args[0]) : nullptr;
  if (!x || !quiet() || (n == 3 && !as_double(args[2], alpha))) Py_RETURN_NONE;
  double number = 0.0;
  if (as_double(args[1], number)) {
    RECORD_FUNCTION("tessera::add.Scalar", std::vector<c10::IValue>());
    return wrap(fast::add_scalar(*x, number, alpha));
  }
  const at::Tensor* y = plain_like(args[1], *x);
  if (!y) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::add", std::vector<c10::IValue>());
  return wrap(fast::add(*x, *y, alpha));
  END_HANDLE_TH_ERRORS
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
  for (int i = 0; i < p.num_args; ++i) {
    PyObject* o = args[i + 1];
    bool ok = true;
    switch (p.args[static_cast<size_t>(i)]) {
      case generic::Plan::From::optional_tensor:
        if (o == Py_None) break;
        [[fallthrough]];
      case generic::Plan::From::tensor:
        v[i].tensor = first ? plain_like(o, *first) : plain(o);
        ok = v[i].tensor != nullptr;
        if (!first) first = v[i].tensor;
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
  RECORD_FUNCTION(p.qualified.c_str(), std::vector<c10::IValue>());
  generic::Outputs outs = generic::run(p, v);
  if (outs.size() == 1) return wrap(std::move(outs[0]));
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  for (size_t i = 0; i < outs.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), wrap(std::move(outs[i])));
  return t;
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

// layer_norm(input, normalized_shape, weight, bias, eps)
PyObject* layer_norm(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* x = n == 5 ? plain(args[0]) : nullptr;
  std::vector<int64_t> shape;
  OptTensor w, b;
  double eps = 0.0;
  if (!x || !quiet() || !as_shape(args[1], shape) || !optional_like(args[2], *x, w) ||
      !optional_like(args[3], *x, b) || !as_double(args[4], eps))
    Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::layer_norm", std::vector<c10::IValue>());
  return wrap(fast::layer_norm(*x, shape, w, b, eps));
  END_HANDLE_TH_ERRORS
}

// rms_norm(input, normalized_shape, weight, eps)
PyObject* rms_norm(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* x = n == 4 ? plain(args[0]) : nullptr;
  std::vector<int64_t> shape;
  OptTensor w;
  double eps = 0.0;
  if (!x || !quiet() || !as_shape(args[1], shape) || !optional_like(args[2], *x, w) ||
      !as_double(args[3], eps))
    Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::rms_norm", std::vector<c10::IValue>());
  return wrap(fast::rms_norm(*x, shape, w, eps));
  END_HANDLE_TH_ERRORS
}

PyObject* wrap_pair(std::tuple<at::Tensor, at::Tensor> p) {
  PyObject* t = PyTuple_New(2);
  PyTuple_SET_ITEM(t, 0, wrap(std::move(std::get<0>(p))));
  PyTuple_SET_ITEM(t, 1, wrap(std::move(std::get<1>(p))));
  return t;
}

// add_layer_norm(input, residual, weight, bias, eps) -> (out, residual_out)
PyObject* add_layer_norm(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* x = n == 5 ? plain(args[0]) : nullptr;
  const at::Tensor* r = x ? plain_like(args[1], *x) : nullptr;
  OptTensor w, b;
  double eps = 0.0;
  if (!r || !quiet() || !optional_like(args[2], *x, w) || !optional_like(args[3], *x, b) || !as_double(args[4], eps))
    Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::add_layer_norm", std::vector<c10::IValue>());
  return wrap_pair(fast::add_layer_norm(*x, *r, w, b, eps));
  END_HANDLE_TH_ERRORS
}

// add_rms_norm(input, residual, weight, eps) -> (out, residual_out)
PyObject* add_rms_norm(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* x = n == 4 ? plain(args[0]) : nullptr;
  const at::Tensor* r = x ? plain_like(args[1], *x) : nullptr;
  OptTensor w;
  double eps = 0.0;
  if (!r || !quiet() || !optional_like(args[2], *x, w) || !as_double(args[3], eps)) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::add_rms_norm", std::vector<c10::IValue>());
  return wrap_pair(fast::add_rms_norm(*x, *r, w, eps));
  END_HANDLE_TH_ERRORS
}

// matmul(input, other[, bias]) and linear(input, weight[, bias]) (other = weight.T): operands of
// one dtype, 2-d or 3-d (the op's ranks; torch's others take torch's path).
template <bool Linear>
PyObject* matmul(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* a = n == 2 || n == 3 ? plain(args[0]) : nullptr;
  const at::Tensor* b = a ? plain_like(args[1], *a) : nullptr;
  OptTensor bias;
  if (!b || !quiet() || a->dim() < 2 || a->dim() > 3 || b->dim() < 2 || b->dim() > (Linear ? 2 : 3) ||
      (n == 3 && !optional_like(args[2], *a, bias)))
    Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::matmul", std::vector<c10::IValue>());
  return wrap(fast::matmul(*a, Linear ? b->t() : *b, bias));
  END_HANDLE_TH_ERRORS
}

// mlp(input, w_in, w_out, activation): the weights of input's dtype and device, activation a str
// (the library checks its value).
PyObject* mlp(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  const at::Tensor* x = n == 4 ? plain(args[0]) : nullptr;
  const at::Tensor* w_in = x ? plain_like(args[1], *x) : nullptr;
  const at::Tensor* w_out = w_in ? plain_like(args[2], *x) : nullptr;
  Py_ssize_t size = 0;
  const char* activation = w_out && PyUnicode_Check(args[3]) ? PyUnicode_AsUTF8AndSize(args[3], &size) : nullptr;
  if (!activation) PyErr_Clear();
  if (!activation || !quiet()) Py_RETURN_NONE;
  RECORD_FUNCTION("tessera::mlp", std::vector<c10::IValue>());
  return wrap(fast::mlp(*x, *w_in, *w_out, c10::string_view(activation, static_cast<size_t>(size))));
  END_HANDLE_TH_ERRORS
}

// Whether a call on `x` may take this module (for tests): a plain tensor in a quiet thread.
PyObject* takes(PyObject*, PyObject* x) {
  HANDLE_TH_ERRORS
  return PyBool_FromLong(plain(x) != nullptr && quiet());
  END_HANDLE_TH_ERRORS
}

#define FAST(name, fn) {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn)), METH_FASTCALL, nullptr}
PyMethodDef methods[] = {
    FAST("add", add),
    FAST("call", call),
    FAST("layer_norm", layer_norm),
    FAST("rms_norm", rms_norm),
    FAST("add_layer_norm", add_layer_norm),
    FAST("add_rms_norm", add_rms_norm),
    FAST("matmul", matmul<false>),
    FAST("linear", matmul<true>),
    FAST("mlp", mlp),
    {"takes", takes, METH_O, nullptr},
    {"index", index, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr}};
#undef FAST

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_torch_fast",
                      "No-grad calls on plain CUDA tensors, straight to the torch ops' kernels.", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast() { return PyModule_Create(&module); }
