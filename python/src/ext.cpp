// tessera._C: the nanobind extension under the Python package. It turns Python tensors into
// TensorViews (tensors.hpp), calls the library through one wrapper template (op_binding.hpp), and
// maps tessera::Error to ValueError/TypeError/RuntimeError with the library's message. It also
// carries the benchmark engine and the operators' descriptions (bench_bindings.hpp). The
// torch-facing API (broadcast shapes, output allocation, stream choice, autograd) lives in the
// pure-Python modules next to it.
// Outputs for DLPack inputs are DeviceArrays: cudaMalloc'd memory that exports itself by DLPack.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "bench_bindings.hpp"
#include "op_binding.hpp"
#include "runtime/scratch.hpp"
#include "tensors.hpp"
#include "tessera/op.hpp"
#include "tessera/tessera.hpp"

namespace tessera::python {
namespace {

// ---- adapters: Python signatures that are not the library's -----------------------------------
// torch's argument order puts out before dim; the library takes dim first.
template <void (*Fn)(const TensorView&, int, const TensorView&, cudaStream_t)>
void out_before_dim(const TensorView& input, const TensorView& out, int dim, cudaStream_t stream) {
  Fn(input, dim, out, stream);
}

template <void (*Fn)(const TensorView&, const TensorView&, int, const TensorView&, cudaStream_t)>
void backward_out_before_dim(const TensorView& grad_output, const TensorView& output,
                             const TensorView& out, int dim, cudaStream_t stream) {
  Fn(grad_output, output, dim, out, stream);
}

// The Python layer has parsed approximate= into a flag.
GeluApproximate approximate(bool tanh) { return tanh ? GeluApproximate::tanh : GeluApproximate::none; }

void gelu_flag(const TensorView& input, const TensorView& out, bool tanh, cudaStream_t stream) {
  gelu(input, out, approximate(tanh), stream);
}

void gelu_backward_flag(const TensorView& grad_output, const TensorView& input, const TensorView& out,
                        bool tanh, cudaStream_t stream) {
  gelu_backward(grad_output, input, out, approximate(tanh), stream);
}

IsinOptions isin_options(int64_t brute_force_max_test, int64_t brute_force_max_work,
                         int64_t hash_min_test) {
  IsinOptions o;
  o.brute_force_max_test = brute_force_max_test;
  o.brute_force_max_work = brute_force_max_work;
  o.hash_min_test = hash_min_test;
  return o;
}

// The options arrive as plain arguments (tessera.set keeps the thresholds in Python).
void isin_flat(const TensorView& elements, const TensorView& test, const TensorView& out,
               bool assume_unique, bool invert, const std::string& path,
               int64_t brute_force_max_test, int64_t brute_force_max_work, int64_t hash_min_test,
               cudaStream_t stream) {
  IsinOptions o = isin_options(brute_force_max_test, brute_force_max_work, hash_min_test);
  parse("isin", path, o.path);
  isin(elements, test, out, assume_unique, invert, stream, o);
}

Activation activation_from(const std::string& name) {
  for (Activation a : kActivations)
    if (name == activation_name(a)) return a;
  detail::throw_arg(ErrorKind::value, "matmul", "activation",
                    "None, 'relu', 'gelu', 'gelu_tanh', 'silu', 'swiglu' or 'geglu'", "'" + name + "'");
}

// MatmulOptions as plain arguments ('none' for no activation).
void matmul_flat(const TensorView& input, const TensorView& other, const TensorView& out,
                 const TensorView* bias, const TensorView* residual, const std::string& activation,
                 double alpha, double beta, bool allow_tf32, cudaStream_t stream) {
  MatmulOptions o;
  o.bias = bias, o.residual = residual, o.activation = activation_from(activation);
  o.alpha = alpha, o.beta = beta, o.allow_tf32 = allow_tf32;
  matmul(input, other, out, o, stream);
}

void scaled_mm_flat(const TensorView& input, const TensorView& other, const TensorView& scale_a,
                    const TensorView& scale_b, const TensorView& out, const TensorView* bias, double beta,
                    const TensorView* residual, const std::string& activation, cudaStream_t stream) {
  ScaledMmOptions o;
  o.bias = bias, o.beta = beta, o.residual = residual, o.activation = activation_from(activation);
  scaled_mm(input, other, scale_a, scale_b, out, o, stream);
}

// The granularity by name ('row', 'tensor'); q_t and scale_t None for rows alone.
void float8_quantize_flat(const TensorView& input, const TensorView& q, const TensorView& scale,
                          const TensorView* q_t, const TensorView* scale_t, const std::string& granularity,
                          cudaStream_t stream) {
  Float8Granularity g = Float8Granularity::row;
  parse("float8_quantize", granularity, g);
  float8_quantize(input, q, scale, q_t, scale_t, g, stream);
}

// float8_quantize_gated_backward with its outputs as plain arguments, the names parsed.
void float8_quantize_gated_backward_flat(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                                         const std::string& activation, const TensorView& grad_gate,
                                         const TensorView& grad_up, const TensorView& q_gate,
                                         const TensorView& scale_gate, const TensorView* q_t_gate,
                                         const TensorView* scale_t_gate, const TensorView& q_up,
                                         const TensorView& scale_up, const TensorView* q_t_up,
                                         const TensorView* scale_t_up, const std::string& granularity,
                                         cudaStream_t stream) {
  constexpr const char* op = "float8_quantize_gated_backward";
  Float8Granularity g = Float8Granularity::row;
  parse(op, granularity, g);
  float8_quantize_gated_backward(grad_output, gate, up, activation_from(activation), grad_gate, grad_up,
                                 Float8Copy{q_gate, scale_gate, q_t_gate, scale_t_gate},
                                 Float8Copy{q_up, scale_up, q_t_up, scale_t_up}, g, stream);
}

// rms_norm_float8 with its float8 outputs as plain arguments, the granularity by name.
void rms_norm_float8_flat(const TensorView& input, const TensorView* residual, const TensorView* weight, double eps,
                          double weight_offset, const TensorView& out, const TensorView* residual_out,
                          const TensorView* rstd, const TensorView& q, const TensorView& scale, const TensorView* q_t,
                          const TensorView* scale_t, const std::string& granularity, cudaStream_t stream) {
  Float8Granularity g = Float8Granularity::row;
  parse("rms_norm_float8", granularity, g);
  rms_norm_float8(input, residual, weight, eps, weight_offset, out, residual_out, rstd,
                  NormFloat8{q, scale, q_t, scale_t, g}, stream);
}

// ---- add: b may be a number, and the output takes the broadcast shape ------------------------
// torch's broadcasting; false when the shapes do not broadcast (the operator then says so).
bool broadcast_shape(const TensorView& a, const TensorView& b, int64_t* out, int& ndim) {
  ndim = a.ndim > b.ndim ? a.ndim : b.ndim;
  for (int i = 0; i < ndim; ++i) {
    const int ia = a.ndim - ndim + i, ib = b.ndim - ndim + i;
    const int64_t sa = ia >= 0 ? a.shape[ia] : 1, sb = ib >= 0 ? b.shape[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    out[i] = sa == 1 ? sb : sa;
  }
  return true;
}

bool is_number(nb::handle h) { return PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr()); }

nb::object py_add(nb::handle a, nb::handle b, nb::handle out, double alpha, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView av = to_view("add", "input", a, stream, keep);
  const bool scalar = is_number(b);
  const double b_value = scalar ? PyFloat_AsDouble(b.ptr()) : 0.0;
  if (scalar && b_value == -1.0 && PyErr_Occurred()) throw nb::python_error();
  const TensorView bv = scalar ? TensorView{} : to_view("add", "other", b, stream, keep);

  TensorView ov;
  nb::object result = nb::none();
  if (out.is_none()) {
    int64_t shape[kMaxDims];
    int ndim = av.ndim;
    std::copy(av.shape, av.shape + kMaxDims, shape);
    const bool ok = scalar || broadcast_shape(av, bv, shape, ndim);
    result = new_output(av, av.dtype, shape, ndim, ok && ndim <= kMaxDims, ov);
  } else {
    ov = to_view("add", "out", out, stream, keep);
  }
  if (scalar) tessera::add(av, b_value, ov, alpha, stream);
  else tessera::add(av, bv, ov, alpha, stream);
  set_producer(result, stream);
  return result;
}

// One description as Python reads it (_C.op_descriptions()).
nb::dict description(const OpDesc& o) {
  nb::dict d;
  d["name"] = o.name;
  d["family"] = o.family;
  d["summary"] = o.summary;
  std::vector<std::string> dtypes;
  for (DType t : o.dtypes) dtypes.emplace_back(dtype_name(t));
  d["dtypes"] = dtypes;
  d["schemas"] = o.schemas;
  d["params"] = o.params;
  nb::dict outputs, rules;
  for (const OpDesc::Output& out : o.outputs) {
    using O = OpDesc::Output;
    outputs[out.param.c_str()] = out.like;
    nb::dict r;
    r["like"] = out.like;
    r["dtype"] = out.dtype == O::Dtype::like ? "like" : out.dtype == O::Dtype::float32 ? "float32" : "bool";
    r["shape"] = out.shape == O::Shape::like      ? "like"
                 : out.shape == O::Shape::leading ? "leading"
                 : out.shape == O::Shape::reduced ? "reduced"
                 : out.shape == O::Shape::scalar  ? "scalar"
                                                  : "broadcast";
    r["dtype_from"] = out.dtype_from;
    r["other"] = out.other;
    r["drop"] = out.drop;
    r["internal"] = out.internal;
    r["mask"] = out.mask;
    r["mask_index"] = out.mask_index;
    r["needs"] = out.needs;
    rules[out.param.c_str()] = r;
  }
  d["outputs"] = outputs;
  d["output_rules"] = rules;
  nb::dict trailing;
  for (const OpDesc::Trailing& t : o.trailing) trailing[t.arg.c_str()] = t.of;
  d["trailing"] = trailing;
  d["float32_args"] = o.float32_args;
  d["own_dtype_args"] = o.own_dtype_args;
  d["generic"] = o.call != nullptr;
  d["backward"] = o.backward;
  d["backward_args"] = o.backward_args;
  d["grads"] = o.grads;
  d["torch_function"] = o.torch_function;
  nb::list overloads;
  for (const OpDesc& v : o.overloads) overloads.append(description(v));
  d["overloads"] = overloads;
  return d;
}

}  // namespace
}  // namespace tessera::python

NB_MODULE(_C, m) {
  using namespace tessera;
  using namespace tessera::python;
  m.doc() = "tessera's compiled core: operators on tensor views, the benchmark engine, devices.";
  m.attr("__version__") = kVersion;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tessera::Error& e) {
      PyObject* type = e.kind() == ErrorKind::value  ? PyExc_ValueError
                       : e.kind() == ErrorKind::type ? PyExc_TypeError
                                                     : PyExc_RuntimeError;
      PyErr_SetString(type, e.what());
    }
  });

  nb::dict dtypes;
  for (std::size_t i = 0; i < std::size(kDTypes); ++i) dtypes[dtype_name(kDTypes[i])] = i;
  m.attr("DTYPES") = dtypes;
  nb::list view_fields;
  for (const char* f : kViewFields) view_fields.append(f);
  m.attr("VIEW_FIELDS") = nb::tuple(view_fields);

  m.def("device_count", &runtime::device_count, "Number of usable CUDA devices (0 without a GPU).");
  m.def("no_gpu_reason", &runtime::no_gpu_reason,
        "Why device_count() is 0 ('no CUDA GPU present', ...); empty when GPUs exist.");
  m.def("scratch_peak_bytes", &runtime::scratch_peak_bytes, "device"_a,
        "Most bytes of tessera's scratch memory in use on `device` at once since reset_scratch_peak.");
  m.def("reset_scratch_peak", &runtime::reset_scratch_peak, "device"_a,
        "Restarts scratch_peak_bytes from what is in use now.");

  // ---- operators: tensors are view tuples or DLPack objects (see tensors.hpp) ----
  const Alloc none{};
  m.def("add", &py_add, "input"_a.none(), "other"_a.none(), "out"_a.none(), "alpha"_a, "stream"_a,
        "out = input + alpha * other. input, other, out: view tuples or DLPack tensors (other "
        "may be a float); out None allocates a DeviceArray (DLPack input only), which is returned.");
  def_op<&gelu_flag>(m, "gelu", {"input", "out", "tanh", "stream"}, {"out", "input"},
                     "out = gelu(input); returns a new DeviceArray when out is None.");
  def_op<&gelu_backward_flag>(m, "gelu_backward", {"grad_output", "input", "out", "tanh", "stream"},
                              {"out", "input"},
                              "out = grad_output * gelu'(input); returns a new DeviceArray when "
                              "out is None.");
  def_op<&silu>(m, "silu", {"input", "out", "stream"}, {"out", "input"},
                "out = silu(input); returns a new DeviceArray when out is None.");
  def_op<&silu_backward>(m, "silu_backward", {"grad_output", "input", "out", "stream"}, {"out", "input"},
                         "out = grad_output * silu'(input); returns a new DeviceArray when out is None.");
  def_op<&out_before_dim<&softmax>>(m, "softmax", {"input", "out", "dim", "stream"}, {"out", "input"},
                                    "out = softmax(input) along dim; returns a new DeviceArray when "
                                    "out is None.");
  def_op<&out_before_dim<&log_softmax>>(m, "log_softmax", {"input", "out", "dim", "stream"},
                                        {"out", "input"},
                                        "out = log_softmax(input) along dim; returns a new DeviceArray "
                                        "when out is None.");
  def_op<&backward_out_before_dim<&softmax_backward>>(
      m, "softmax_backward", {"grad_output", "output", "out", "dim", "stream"}, {"out", "output"},
      "out = output * (grad_output - sum_dim(grad_output * output)), output = softmax(input); returns a new "
      "DeviceArray when out is None.");
  def_op<&backward_out_before_dim<&log_softmax_backward>>(
      m, "log_softmax_backward", {"grad_output", "output", "out", "dim", "stream"}, {"out", "output"},
      "out = grad_output - exp(output) * sum_dim(grad_output), output = log_softmax(input); returns a new "
      "DeviceArray when out is None.");
  def_op<&layer_norm>(
      m, "layer_norm",
      {"input", "normalized_ndim", "weight", "bias", "eps", "out", "mean", "rstd", "stream"},
      {"out", "input"},
      "LayerNorm over the last normalized_ndim dimensions; mean and rstd (float32, the leading "
      "shape) are written where given. Returns a new DeviceArray when out is None.");
  def_op<&layer_norm_backward>(
      m, "layer_norm_backward",
      {"grad_output", "input", "normalized_ndim", "mean", "rstd", "weight", "grad_input", "grad_weight",
       "grad_bias", "stream"},
      none, "Gradients of layer_norm into the given outputs (None: not computed).");
  def_op<&rms_norm>(m, "rms_norm",
                    {"input", "normalized_ndim", "weight", "eps", "weight_offset", "out", "rstd", "stream"},
                    {"out", "input"},
                    "RMSNorm over the last normalized_ndim dimensions; rstd is written where "
                    "given. Returns a new DeviceArray when out is None.");
  def_op<&rms_norm_backward>(
      m, "rms_norm_backward",
      {"grad_output", "input", "normalized_ndim", "rstd", "weight", "weight_offset", "grad_input", "grad_weight",
       "stream"},
      none, "Gradients of rms_norm into the given outputs (None: not computed).");
  def_op<&dropout>(m, "dropout", {"input", "out", "p", "seed", "offset", "stream"}, {"out", "input"},
                   "Inverted dropout with the Philox stream (seed, offset); returns a new "
                   "DeviceArray when out is None.");
  def_op<&dropout_backward>(m, "dropout_backward",
                            {"grad_output", "out", "p", "seed", "offset", "stream"},
                            {"out", "grad_output"},
                            "out = grad_output * mask(seed, offset) / (1 - p); returns a new "
                            "DeviceArray when out is None.");
  m.def("dropout_offset_increment", &tessera::dropout_offset_increment, "numel"_a,
        "Philox counters one dropout call over numel elements consumes.");
  def_op<&copy>(m, "copy", {"src", "dst", "stream"}, none,
                "dst = src between any two layouts of one shape and dtype.");
  def_op<&isin_flat>(m, "isin",
                     {"elements", "test_elements", "out", "assume_unique", "invert", "path",
                      "brute_force_max_test", "brute_force_max_work", "hash_min_test", "stream"},
                     {"out", "elements", DType::bool_, true},
                     "out = elements in test_elements (bool); returns a new DeviceArray when out "
                     "is None.");
  def_op<&matmul_flat>(m, "matmul",
                       {"input", "other", "out", "bias", "residual", "activation", "alpha", "beta",
                        "allow_tf32", "stream"},
                       none,
                       "out = activation(alpha * input @ other + bias) + residual + beta * out, "
                       "into the given out (2-d or 3-d views).");
  def_op<&scaled_mm_flat>(m, "scaled_mm",
                          {"input", "other", "scale_a", "scale_b", "out", "bias", "beta", "residual", "activation",
                           "stream"},
                          none,
                          "out = activation(scale_a * scale_b * (input @ other) + bias) + residual + beta * out "
                          "for float8 inputs, into the given out (2-d views; N / 2 columns with 'swiglu' or "
                          "'geglu'); scales of one element each, row-wise (scale_a [M, 1] and scale_b [1, N]) "
                          "or block-wise (beta 0).");
  def_op<&float8_quantize_flat>(m, "float8_quantize",
                                {"input", "q", "scale", "q_t", "scale_t", "granularity", "stream"}, none,
                                "input [M, K] to float8_e4m3fn into q with float32 scales about amax / 448 "
                                "('row': scale [M, 1]; 'tensor': one element), and where q_t and scale_t "
                                "are given input's columns quantized along M into q_t [K, M] (scale_t "
                                "[1, K] or one element).");
  def_op<&float8_quantize_gated_backward_flat>(
      m, "float8_quantize_gated_backward",
      {"grad_output", "gate", "up", "activation", "grad_gate", "grad_up", "q_gate", "scale_gate", "q_t_gate",
       "scale_t_gate", "q_up", "scale_up", "q_t_up", "scale_t_up", "granularity", "stream"},
      none,
      "grad_gate and grad_up of act(gate) * up ('silu', 'gelu_tanh') from grad_output, each written and "
      "quantized as float8_quantize quantizes it (q, scale and where given q_t, scale_t), in one read of the "
      "inputs.");
  def_op<&rms_norm_float8_flat>(m, "rms_norm_float8",
                                {"input", "residual", "weight", "eps", "weight_offset", "out", "residual_out", "rstd",
                                 "q", "scale", "q_t", "scale_t", "granularity", "stream"},
                                none,
                                "rms_norm (add_rms_norm with residual and residual_out) into out, and out as "
                                "[M, K] quantized as float8_quantize quantizes it into q and scale (and q_t, "
                                "scale_t where given), the maxima taken by the norm's kernel as it writes out.");
  m.def("set_autotune", &tessera::set_autotune, "on"_a,
        "Tune GEMM configs on first use of each shape bucket (TESSERA_AUTOTUNE=1 at start).");
  m.def("autotune_enabled", &tessera::autotune_enabled,
        "Whether configs are tuned on first use.");
  m.def("isin_choose_path",
        [](const std::string& dtype, int64_t m, int64_t n, int64_t bmax, int64_t bwork, int64_t hmin) {
          const DType d = dtype_from_name("isin_choose_path", "dtype", dtype);
          return std::string(isin_path_name(isin_choose_path(d, m, n, isin_options(bmax, bwork, hmin))));
        },
        "dtype"_a, "num_elements"_a, "num_test"_a, "brute_force_max_test"_a, "brute_force_max_work"_a,
        "hash_min_test"_a, "The path isin's automatic dispatch takes for these sizes.");
  {
    const IsinOptions o;
    nb::dict d;
    d["brute_force_max_test"] = o.brute_force_max_test;
    d["brute_force_max_work"] = o.brute_force_max_work;
    d["hash_min_test"] = o.hash_min_test;
    m.attr("ISIN_DEFAULTS") = d;
  }

  nb::class_<DeviceArray>(m, "DeviceArray",
                          "Row-major CUDA memory owned by tessera, exported by DLPack "
                          "(cupy.from_dlpack, torch.from_dlpack, ...).")
      .def("__init__",
           [](DeviceArray* self, std::vector<int64_t> shape, const std::string& dtype, int device) {
             const DType d = dtype_from_name("DeviceArray", "dtype", dtype);
             check_ndim("DeviceArray", "shape", static_cast<Py_ssize_t>(shape.size()));
             for (int64_t s : shape)
               if (s < 0)
                 detail::throw_arg(ErrorKind::value, "DeviceArray", "shape", "non-negative sizes",
                                   std::to_string(s));
             new (self) DeviceArray(d, shape.data(), static_cast<int>(shape.size()), device);
           },
           "shape"_a, "dtype"_a = "float32", "device"_a = 0, "Uninitialized memory on a CUDA device.")
      .def_prop_ro("shape", &DeviceArray::shape)
      .def_prop_ro("dtype", [](const DeviceArray& a) { return std::string(dtype_name(a.dtype())); })
      .def_prop_ro("device", &DeviceArray::device)
      .def_prop_ro("nbytes", &DeviceArray::nbytes)
      .def_prop_ro("data_ptr", &DeviceArray::data_ptr)
      .def("__dlpack__", &device_array_dlpack, "stream"_a.none() = nb::none(),
           "max_version"_a.none() = nb::none(), "dl_device"_a.none() = nb::none(),
           "copy"_a.none() = nb::none())
      .def("__dlpack_device__",
           [](const DeviceArray& a) { return nb::make_tuple(kDLCUDA, a.device()); })
      .def("__repr__", [](const DeviceArray& a) {
        return "tessera.DeviceArray(shape=" + a.view().shape_str() + ", dtype=" +
               dtype_name(a.dtype()) + ", device=cuda:" + std::to_string(a.device()) + ")";
      });

  m.def("op_descriptions",
        [] {
          nb::list ops;
          for (const OpDesc& o : op_descriptions()) ops.append(description(o));
          return ops;
        },
        "Every op's description (tessera/op.hpp), as dicts: name, family, summary, dtypes, "
        "schemas, params, outputs (param -> like), output_rules (param -> its rule as a dict: like, dtype, "
        "shape, other, drop, internal, mask, mask_index, needs; tessera/op.hpp's Output), trailing (int[] argument -> "
        "the tensor argument whose trailing dimensions it names), float32_args, own_dtype_args, generic, backward, "
        "backward_args, grads, torch_function, overloads (the overloads with a kernel of their own, as dicts "
        "of the same keys).");

  bind_bench(m);
}
