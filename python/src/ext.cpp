// tessera._C: the nanobind extension under the Python package. It turns Python tensors into
// TensorViews, calls the library, and maps tessera::Error to ValueError/TypeError/RuntimeError
// with the library's message. The torch-facing API (broadcast shapes, output allocation, stream
// choice, autograd) lives in the pure-Python modules next to it.
//
// A tensor argument arrives in one of two forms, neither of them copied:
//  - a view tuple (data_ptr, dtype, shape, strides, device_index) built by the Python layer from a
//    torch tensor: plain ints and tuples, a fraction of the cost of a DLPack round trip per call.
//    dtype is a tessera dtype code (see DTYPES) or, for a dtype tessera does not represent, its
//    name; device_index is -1 for a tensor that is not on a CUDA device;
//  - any object with __dlpack__ and __dlpack_device__ (cupy, numpy, jax, a DeviceArray). Its
//    capsule is held for the duration of the call and released after: the library keeps no
//    pointer past a call, so the producer's memory only needs to live that long.
// Outputs for DLPack inputs are DeviceArrays: cudaMalloc'd memory that exports itself by DLPack.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench/bench.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "tessera/tessera.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

// ---- DLPack ABI, as the DLPack specification (v1.x) lays it out --------------------------------
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAManaged = 13;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6;
constexpr const char* kCapsule = "dltensor";
constexpr const char* kCapsuleVersioned = "dltensor_versioned";

constexpr DType kDTypes[] = {DType::float32, DType::float16, DType::bfloat16, DType::float64,
                             DType::int8,    DType::int16,   DType::int32,    DType::int64,
                             DType::uint8,   DType::bool_};

[[noreturn]] void fail(ErrorKind kind, const char* op, const char* arg, const std::string& expected,
                       const std::string& got) {
  detail::throw_arg(kind, op, arg, expected, got);
}

std::string py_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// ---- dtypes ---------------------------------------------------------------------------------
bool dtype_from_dlpack(DLDataType t, DType& out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return out = DType::float32, true;
      if (t.bits == 16) return out = DType::float16, true;
      if (t.bits == 64) return out = DType::float64, true;
      return false;
    case kDLBfloat:
      return t.bits == 16 ? (out = DType::bfloat16, true) : false;
    case kDLInt:
      if (t.bits == 8) return out = DType::int8, true;
      if (t.bits == 16) return out = DType::int16, true;
      if (t.bits == 32) return out = DType::int32, true;
      if (t.bits == 64) return out = DType::int64, true;
      return false;
    case kDLUInt:
      return t.bits == 8 ? (out = DType::uint8, true) : false;
    case kDLBool:
      return t.bits == 8 ? (out = DType::bool_, true) : false;
    default:
      return false;
  }
}

DLDataType dtype_to_dlpack(DType d) {
  const auto bits = static_cast<uint8_t>(8 * dtype_size(d));
  switch (d) {
    case DType::float32: case DType::float16: case DType::float64: return {kDLFloat, bits, 1};
    case DType::bfloat16: return {kDLBfloat, bits, 1};
    case DType::uint8: return {kDLUInt, bits, 1};
    case DType::bool_: return {kDLBool, bits, 1};
    default: return {kDLInt, bits, 1};
  }
}

std::string dlpack_dtype_name(DLDataType t) {
  const char* kind = t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint"
                     : t.code == kDLFloat ? "float" : t.code == kDLBfloat ? "bfloat"
                     : t.code == kDLComplex ? "complex" : t.code == kDLBool ? "bool" : "code ";
  std::string s = kind;
  if (std::strcmp(kind, "code ") == 0) s += std::to_string(t.code) + " of ";
  s += std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

// A dtype tessera does not represent is refused here for a CUDA tensor. For any other tensor the
// device check the operator runs first is the more useful message, so the view gets a stand-in
// dtype and goes on to be refused there.
DType known_dtype_or_fail(bool known, DType dtype, bool on_cuda, const char* op, const char* arg,
                          const std::string& name) {
  if (known) return dtype;
  if (!on_cuda) return DType::uint8;
  fail(ErrorKind::type, op, arg, "a dtype tessera supports (float32, float16, bfloat16, ...)", name);
}

void check_ndim(const char* op, const char* arg, Py_ssize_t ndim) {
  if (ndim > kMaxDims)
    fail(ErrorKind::value, op, arg, "at most " + std::to_string(kMaxDims) + " dimensions",
         std::to_string(ndim));
}

int64_t as_int64(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

// ---- view tuples (torch fast path) ------------------------------------------------------------
TensorView view_from_tuple(const char* op, const char* arg, PyObject* t) {
  if (PyTuple_GET_SIZE(t) != 5)
    fail(ErrorKind::type, op, arg, "a view tuple (data_ptr, dtype, shape, strides, device_index)",
         "a tuple of " + std::to_string(PyTuple_GET_SIZE(t)) + " items");
  PyObject* shape = PyTuple_GET_ITEM(t, 2);
  PyObject* strides = PyTuple_GET_ITEM(t, 3);
  if (!PyTuple_Check(shape) || !PyTuple_Check(strides) ||
      PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides))
    fail(ErrorKind::type, op, arg, "shape and strides as tuples of equal length",
         "something else");
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  check_ndim(op, arg, ndim);

  TensorView v;
  v.data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, 0));
  if (v.data == nullptr && PyErr_Occurred()) throw nb::python_error();
  const int64_t device = as_int64(PyTuple_GET_ITEM(t, 4));
  v.device = device >= 0 ? Device{DeviceType::cuda, static_cast<int>(device)} : Device{DeviceType::cpu, 0};
  PyObject* dtype = PyTuple_GET_ITEM(t, 1);
  if (PyLong_Check(dtype)) {
    const int64_t code = as_int64(dtype);
    const bool known = code >= 0 && code < static_cast<int64_t>(std::size(kDTypes));
    v.dtype = known_dtype_or_fail(known, known ? kDTypes[code] : DType::uint8, device >= 0, op, arg,
                                  "dtype code " + std::to_string(code));
  } else {
    v.dtype = known_dtype_or_fail(false, DType::uint8, device >= 0, op, arg,
                                  std::string(nb::str(nb::handle(dtype)).c_str()));
  }
  v.ndim = static_cast<int>(ndim);
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    v.shape[i] = as_int64(PyTuple_GET_ITEM(shape, i));
    v.strides[i] = as_int64(PyTuple_GET_ITEM(strides, i));
  }
  return v;
}

// ---- DLPack import ----------------------------------------------------------------------------
// The stream argument of __dlpack__ for a consumer working on `stream`: 0 is ambiguous in the
// protocol, 1 names the legacy default stream.
nb::object dlpack_stream_arg(cudaStream_t stream) {
  const auto s = reinterpret_cast<uintptr_t>(stream);
  return nb::int_(s == 0 ? 1 : s);
}

TensorView view_from_dlpack(const char* op, const char* arg, nb::handle obj, cudaStream_t stream,
                            std::vector<nb::object>& keep) {
  if (!nb::hasattr(obj, "__dlpack__") || !nb::hasattr(obj, "__dlpack_device__"))
    fail(ErrorKind::type, op, arg,
         "a tensor (a torch tensor, or an array with __dlpack__ and __dlpack_device__)",
         py_type_name(obj));
  nb::object dev = obj.attr("__dlpack_device__")();
  const int dev_type = nb::cast<int>(dev[0]);
  const bool on_cuda = dev_type == kDLCUDA || dev_type == kDLCUDAManaged;
  // A tensor that is not on a CUDA device is refused by the operator's device check whatever its
  // contents; if its producer cannot export it, a stand-in view still gets that message to the user.
  TensorView cpu_stand_in;
  cpu_stand_in.device = Device{DeviceType::cpu, 0};

  nb::object export_fn = obj.attr("__dlpack__");
  nb::object stream_arg = on_cuda ? dlpack_stream_arg(stream) : nb::none();
  nb::object capsule;
  try {
    capsule = export_fn("stream"_a = stream_arg, "max_version"_a = nb::make_tuple(1, 0));
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError)) {  // TypeError: a producer older than max_version
      if (!on_cuda) return cpu_stand_in;
      throw;
    }
    try {
      capsule = export_fn("stream"_a = stream_arg);
    } catch (nb::python_error&) {
      if (!on_cuda) return cpu_stand_in;
      throw;
    }
  }

  const DLTensor* t = nullptr;
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name && std::strcmp(name, kCapsuleVersioned) == 0) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), name));
    if (!m) throw nb::python_error();
    if (m->version.major != 1)
      fail(ErrorKind::type, op, arg, "a DLPack 1.x tensor",
           "DLPack version " + std::to_string(m->version.major));
    t = &m->dl_tensor;
  } else if (name && std::strcmp(name, kCapsule) == 0) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), name));
    if (!m) throw nb::python_error();
    t = &m->dl_tensor;
  } else {
    fail(ErrorKind::type, op, arg, "a DLPack capsule from __dlpack__()", py_type_name(capsule));
  }
  keep.push_back(std::move(capsule));  // the producer's memory lives until the call returns

  check_ndim(op, arg, t->ndim);
  const bool cuda = t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged;
  DType dtype = DType::uint8;
  const bool known = dtype_from_dlpack(t->dtype, dtype);
  dtype = known_dtype_or_fail(known, dtype, cuda, op, arg, dlpack_dtype_name(t->dtype));
  const Device device = cuda ? Device{DeviceType::cuda, t->device.device_id} : Device{DeviceType::cpu, 0};
  void* data = static_cast<char*>(t->data) + t->byte_offset;
  return TensorView::make(data, dtype, t->shape, t->strides, t->ndim, device);
}

// A tensor argument in either form.
TensorView to_view(const char* op, const char* arg, nb::handle obj, cudaStream_t stream,
                   std::vector<nb::object>& keep) {
  if (PyTuple_CheckExact(obj.ptr())) return view_from_tuple(op, arg, obj.ptr());
  return view_from_dlpack(op, arg, obj, stream, keep);
}

// ---- DeviceArray: the output for DLPack inputs ---------------------------------------------
class DeviceArray {
 public:
  DeviceArray(DType dtype, const int64_t* shape, int ndim, int device)
      : dtype_(dtype), ndim_(ndim), device_(device) {
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      shape_[i] = shape[i];
      strides_[i] = stride;
      stride *= shape[i] > 1 ? shape[i] : 1;
    }
    runtime::DeviceGuard guard(device);
    buffer_ = runtime::DeviceBuffer(static_cast<std::size_t>(numel()) * dtype_size(dtype));
  }

  TensorView view() const {
    return TensorView::make(buffer_.data(), dtype_, shape_, strides_, ndim_,
                            Device{DeviceType::cuda, device_});
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  nb::tuple shape() const {
    nb::list l;
    for (int i = 0; i < ndim_; ++i) l.append(shape_[i]);
    return nb::tuple(l);
  }
  DType dtype() const { return dtype_; }
  int device() const { return device_; }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(buffer_.data()); }
  std::size_t nbytes() const { return buffer_.bytes(); }
  // The stream the array's contents were last written on; a consumer on another stream is made to
  // wait for it when it imports the array.
  cudaStream_t producer_stream = nullptr;

  template <class Managed>
  Managed* export_to(PyObject* owner) const;

 private:
  runtime::DeviceBuffer buffer_;
  DType dtype_;
  int ndim_;
  int64_t shape_[kMaxDims] = {}, strides_[kMaxDims] = {};
  int device_;
};

// What a DLPack consumer holds: shape and strides it may read, and a reference to the Python
// DeviceArray that owns the memory, dropped by the deleter.
struct ExportContext {
  PyObject* owner;
  int64_t shape[kMaxDims], strides[kMaxDims];
};

template <class Managed>
void export_deleter(Managed* m) {
  auto* ctx = static_cast<ExportContext*>(m->manager_ctx);
  if (Py_IsInitialized()) {  // a consumer may call this from any thread
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(ctx->owner);
    PyGILState_Release(gil);
  }
  delete ctx;
  delete m;
}

template <class Managed>
Managed* DeviceArray::export_to(PyObject* owner) const {
  auto ctx = std::make_unique<ExportContext>();
  std::copy(shape_, shape_ + kMaxDims, ctx->shape);
  std::copy(strides_, strides_ + kMaxDims, ctx->strides);
  auto m = std::make_unique<Managed>();
  DLTensor& t = m->dl_tensor;
  t.data = buffer_.data();
  t.device = {kDLCUDA, device_};
  t.ndim = ndim_;
  t.dtype = dtype_to_dlpack(dtype_);
  t.shape = ctx->shape;
  t.strides = ctx->strides;
  t.byte_offset = 0;
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
    m->version = {1, 0};
    m->flags = 0;
  }
  Py_INCREF(owner);
  ctx->owner = owner;
  m->manager_ctx = ctx.release();
  m->deleter = &export_deleter<Managed>;
  return m.release();
}

// An unconsumed capsule (the consumer renames the ones it takes) frees its tensor itself.
template <class Managed>
void capsule_destructor(PyObject* capsule) {
  constexpr bool versioned = std::is_same_v<Managed, DLManagedTensorVersioned>;
  const char* name = versioned ? kCapsuleVersioned : kCapsule;
  if (PyCapsule_IsValid(capsule, name)) {
    auto* m = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
    m->deleter(m);
  }
}

cudaStream_t stream_from_dlpack_arg(int64_t s) {
  if (s == 1) return cudaStreamLegacy;
  if (s == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s));
}

nb::object device_array_dlpack(nb::handle self, nb::handle stream, nb::handle max_version,
                               nb::handle dl_device, nb::handle copy) {
  const DeviceArray& a = nb::cast<const DeviceArray&>(self);
  if (copy.is_valid() && !copy.is_none() && nb::cast<bool>(copy))
    throw nb::buffer_error("DeviceArray.__dlpack__: copy=True is not supported");
  if (dl_device.is_valid() && !dl_device.is_none()) {
    nb::tuple d = nb::cast<nb::tuple>(dl_device);
    if (nb::cast<int>(d[0]) != kDLCUDA || nb::cast<int>(d[1]) != a.device())
      throw nb::buffer_error("DeviceArray.__dlpack__: the array lives on its own CUDA device only");
  }
  // Make the consumer's stream wait for the writes on the producer's. -1: the consumer asks for
  // no synchronization; None: it uses the legacy default stream.
  const int64_t s = stream.is_valid() && !stream.is_none() ? nb::cast<int64_t>(stream) : 1;
  if (s != -1) {
    cudaStream_t consumer = stream_from_dlpack_arg(s);
    cudaStream_t producer = a.producer_stream ? a.producer_stream : cudaStreamLegacy;
    if (consumer != producer) {
      runtime::DeviceGuard guard(a.device());
      cudaEvent_t ev = nullptr;
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      cudaError_t err = cudaEventRecord(ev, producer);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(consumer, ev, 0);
      cudaEventDestroy(ev);
      TESSERA_CUDA_CHECK(err);
    }
  }
  const bool versioned = max_version.is_valid() && !max_version.is_none() &&
                         nb::cast<int>(nb::cast<nb::tuple>(max_version)[0]) >= 1;
  PyObject* capsule;
  if (versioned) {
    auto* m = a.export_to<DLManagedTensorVersioned>(self.ptr());
    capsule = PyCapsule_New(m, kCapsuleVersioned, &capsule_destructor<DLManagedTensorVersioned>);
    if (!capsule) m->deleter(m);
  } else {
    auto* m = a.export_to<DLManagedTensor>(self.ptr());
    capsule = PyCapsule_New(m, kCapsule, &capsule_destructor<DLManagedTensor>);
    if (!capsule) m->deleter(m);
  }
  if (!capsule) throw nb::python_error();
  return nb::steal(capsule);
}

// ---- operators --------------------------------------------------------------------------------
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

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

// For a DLPack input without out=: a new DeviceArray with `shape`, or, when `like` is not a CUDA
// tensor or the shapes do not broadcast, nothing: `like` then stands in for the output, and the
// operator's own checks (which run before any write) refuse the call with the library's message.
nb::object new_output(const TensorView& like, const int64_t* shape, int ndim, bool shape_ok,
                      TensorView& out_view) {
  out_view = like;
  if (like.device.type != DeviceType::cuda || like.device.index < 0 || !shape_ok) return nb::none();
  nb::object arr = nb::cast(new DeviceArray(like.dtype, shape, ndim, like.device.index),
                            nb::rv_policy::take_ownership);
  out_view = nb::cast<const DeviceArray&>(arr).view();
  return arr;
}

void set_producer(nb::handle arr, cudaStream_t stream) {
  if (!arr.is_none()) nb::cast<DeviceArray&>(arr).producer_stream = stream;
}

// The view of output argument `out`, or, when it is None, of a new DeviceArray shaped like `like`
// (for DLPack inputs; see new_output), which goes to `result`.
TensorView output_view(const char* op, const char* arg, nb::handle out, const TensorView& like,
                       cudaStream_t stream, std::vector<nb::object>& keep, nb::object& result) {
  TensorView view;
  if (out.is_none()) result = new_output(like, like.shape, like.ndim, true, view);
  else view = to_view(op, arg, out, stream, keep);
  return view;
}

bool is_number(nb::handle h) {
  return PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr());
}

nb::object py_add(nb::handle a, nb::handle b, nb::handle out, double alpha, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView av = to_view("add", "a", a, stream, keep);
  const bool scalar = is_number(b);
  const double b_value = scalar ? PyFloat_AsDouble(b.ptr()) : 0.0;
  if (scalar && b_value == -1.0 && PyErr_Occurred()) throw nb::python_error();
  const TensorView bv = scalar ? TensorView{} : to_view("add", "b", b, stream, keep);

  TensorView ov;
  nb::object result = nb::none();
  if (out.is_none()) {
    int64_t shape[kMaxDims];
    int ndim = av.ndim;
    std::copy(av.shape, av.shape + kMaxDims, shape);
    const bool ok = scalar || broadcast_shape(av, bv, shape, ndim);
    result = new_output(av, shape, ndim, ok && ndim <= kMaxDims, ov);
  } else {
    ov = to_view("add", "out", out, stream, keep);
  }
  if (scalar) tessera::add(av, b_value, ov, alpha, stream);
  else tessera::add(av, bv, ov, alpha, stream);
  set_producer(result, stream);
  return result;
}

nb::object py_gelu(nb::handle x, nb::handle out, bool tanh, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView xv = to_view("gelu", "x", x, stream, keep);
  nb::object result = nb::none();
  const TensorView ov = output_view("gelu", "out", out, xv, stream, keep, result);
  tessera::gelu(xv, ov, tanh ? GeluApproximate::tanh : GeluApproximate::none, stream);
  set_producer(result, stream);
  return result;
}

nb::object py_gelu_backward(nb::handle grad_out, nb::handle x, nb::handle grad_in, bool tanh,
                            uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView gv = to_view("gelu_backward", "grad_out", grad_out, stream, keep);
  const TensorView xv = to_view("gelu_backward", "x", x, stream, keep);
  nb::object result = nb::none();
  const TensorView iv = output_view("gelu_backward", "grad_in", grad_in, xv, stream, keep, result);
  tessera::gelu_backward(gv, xv, iv, tanh ? GeluApproximate::tanh : GeluApproximate::none, stream);
  set_producer(result, stream);
  return result;
}

// ---- row-wise ---------------------------------------------------------------------------------
using RowwiseForward = void (*)(const TensorView&, int, const TensorView&, cudaStream_t);
using RowwiseBackward = void (*)(const TensorView&, const TensorView&, int, const TensorView&,
                                 cudaStream_t);

// An optional tensor argument: nullptr for None, else its view (kept in `storage`).
const TensorView* optional_view(const char* op, const char* arg, nb::handle obj,
                                cudaStream_t stream, std::vector<nb::object>& keep,
                                TensorView& storage) {
  if (obj.is_none()) return nullptr;
  storage = to_view(op, arg, obj, stream, keep);
  return &storage;
}

nb::object py_softmax_forward(const char* op, RowwiseForward fn, nb::handle x, nb::handle out,
                              int dim, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView xv = to_view(op, "x", x, stream, keep);
  nb::object result = nb::none();
  const TensorView ov = output_view(op, "out", out, xv, stream, keep, result);
  fn(xv, dim, ov, stream);
  set_producer(result, stream);
  return result;
}

nb::object py_softmax_backward_common(const char* op, RowwiseBackward fn, nb::handle grad_out,
                                      nb::handle y, nb::handle grad_in, int dim,
                                      uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView gv = to_view(op, "grad_out", grad_out, stream, keep);
  const TensorView yv = to_view(op, "y", y, stream, keep);
  nb::object result = nb::none();
  const TensorView iv = output_view(op, "grad_in", grad_in, yv, stream, keep, result);
  fn(gv, yv, dim, iv, stream);
  set_producer(result, stream);
  return result;
}

nb::object py_softmax(nb::handle x, nb::handle out, int dim, uintptr_t stream) {
  return py_softmax_forward("softmax", &tessera::softmax, x, out, dim, stream);
}
nb::object py_log_softmax(nb::handle x, nb::handle out, int dim, uintptr_t stream) {
  return py_softmax_forward("log_softmax", &tessera::log_softmax, x, out, dim, stream);
}
nb::object py_softmax_backward(nb::handle grad_out, nb::handle y, nb::handle grad_in, int dim,
                               uintptr_t stream) {
  return py_softmax_backward_common("softmax_backward", &tessera::softmax_backward, grad_out, y,
                                    grad_in, dim, stream);
}
nb::object py_log_softmax_backward(nb::handle grad_out, nb::handle y, nb::handle grad_in, int dim,
                                   uintptr_t stream) {
  return py_softmax_backward_common("log_softmax_backward", &tessera::log_softmax_backward,
                                    grad_out, y, grad_in, dim, stream);
}

// Norms: out None allocates a DeviceArray (DLPack x); mean and rstd are computed only where given.
nb::object py_layer_norm(nb::handle x, int normalized_ndim, nb::handle weight, nb::handle bias,
                         double eps, nb::handle out, nb::handle mean, nb::handle rstd,
                         uintptr_t stream_) {
  const char* op = "layer_norm";
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView xv = to_view(op, "x", x, stream, keep);
  TensorView wv, bv, mv, rv, ov;
  const TensorView* w = optional_view(op, "weight", weight, stream, keep, wv);
  const TensorView* b = optional_view(op, "bias", bias, stream, keep, bv);
  nb::object result = nb::none();
  ov = output_view(op, "out", out, xv, stream, keep, result);
  const TensorView* m = optional_view(op, "mean", mean, stream, keep, mv);
  const TensorView* r = optional_view(op, "rstd", rstd, stream, keep, rv);
  tessera::layer_norm(xv, normalized_ndim, w, b, eps, ov, m, r, stream);
  set_producer(result, stream);
  return result;
}

void py_layer_norm_backward(nb::handle grad_out, nb::handle x, int normalized_ndim,
                            nb::handle mean, nb::handle rstd, nb::handle weight,
                            nb::handle grad_in, nb::handle grad_weight, nb::handle grad_bias,
                            uintptr_t stream_) {
  const char* op = "layer_norm_backward";
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView gv = to_view(op, "grad_out", grad_out, stream, keep);
  const TensorView xv = to_view(op, "x", x, stream, keep);
  const TensorView mv = to_view(op, "mean", mean, stream, keep);
  const TensorView rv = to_view(op, "rstd", rstd, stream, keep);
  TensorView wv, iv, gwv, gbv;
  const TensorView* w = optional_view(op, "weight", weight, stream, keep, wv);
  const TensorView* gi = optional_view(op, "grad_in", grad_in, stream, keep, iv);
  const TensorView* gw = optional_view(op, "grad_weight", grad_weight, stream, keep, gwv);
  const TensorView* gb = optional_view(op, "grad_bias", grad_bias, stream, keep, gbv);
  tessera::layer_norm_backward(gv, xv, normalized_ndim, mv, rv, w, gi, gw, gb, stream);
}

nb::object py_rms_norm(nb::handle x, int normalized_ndim, nb::handle weight, double eps,
                       nb::handle out, nb::handle rstd, uintptr_t stream_) {
  const char* op = "rms_norm";
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView xv = to_view(op, "x", x, stream, keep);
  TensorView wv, rv, ov;
  const TensorView* w = optional_view(op, "weight", weight, stream, keep, wv);
  nb::object result = nb::none();
  ov = output_view(op, "out", out, xv, stream, keep, result);
  const TensorView* r = optional_view(op, "rstd", rstd, stream, keep, rv);
  tessera::rms_norm(xv, normalized_ndim, w, eps, ov, r, stream);
  set_producer(result, stream);
  return result;
}

void py_rms_norm_backward(nb::handle grad_out, nb::handle x, int normalized_ndim, nb::handle rstd,
                          nb::handle weight, nb::handle grad_in, nb::handle grad_weight,
                          uintptr_t stream_) {
  const char* op = "rms_norm_backward";
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView gv = to_view(op, "grad_out", grad_out, stream, keep);
  const TensorView xv = to_view(op, "x", x, stream, keep);
  const TensorView rv = to_view(op, "rstd", rstd, stream, keep);
  TensorView wv, iv, gwv;
  const TensorView* w = optional_view(op, "weight", weight, stream, keep, wv);
  const TensorView* gi = optional_view(op, "grad_in", grad_in, stream, keep, iv);
  const TensorView* gw = optional_view(op, "grad_weight", grad_weight, stream, keep, gwv);
  tessera::rms_norm_backward(gv, xv, normalized_ndim, rv, w, gi, gw, stream);
}

// ---- dropout and copy -------------------------------------------------------------------------
nb::object py_dropout(nb::handle x, nb::handle out, double p, uint64_t seed, uint64_t offset,
                      uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView xv = to_view("dropout", "x", x, stream, keep);
  nb::object result = nb::none();
  const TensorView ov = output_view("dropout", "out", out, xv, stream, keep, result);
  tessera::dropout(xv, ov, p, seed, offset, stream);
  set_producer(result, stream);
  return result;
}

nb::object py_dropout_backward(nb::handle grad_out, nb::handle grad_in, double p, uint64_t seed,
                               uint64_t offset, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView gv = to_view("dropout_backward", "grad_out", grad_out, stream, keep);
  nb::object result = nb::none();
  const TensorView iv = output_view("dropout_backward", "grad_in", grad_in, gv, stream, keep, result);
  tessera::dropout_backward(gv, iv, p, seed, offset, stream);
  set_producer(result, stream);
  return result;
}

void py_copy(nb::handle src, nb::handle dst, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView sv = to_view("copy", "src", src, stream, keep);
  const TensorView dv = to_view("copy", "dst", dst, stream, keep);
  tessera::copy(sv, dv, stream);
}

// ---- isin -------------------------------------------------------------------------------------
IsinPath isin_path(const std::string& name) {
  for (IsinPath p : {IsinPath::automatic, IsinPath::brute_force, IsinPath::sort, IsinPath::hash,
                     IsinPath::bitmap})
    if (name == isin_path_name(p)) return p;
  detail::throw_arg(ErrorKind::value, "isin", "path",
                    "'automatic', 'brute_force', 'sort', 'hash' or 'bitmap'", "'" + name + "'");
}

// out None (DLPack elements only): a new bool DeviceArray of elements' shape.
nb::object py_isin(nb::handle elements, nb::handle test, nb::handle out, bool assume_unique,
                   bool invert, const std::string& path, int64_t brute_force_max_test,
                   int64_t brute_force_max_work, int64_t hash_min_test, uintptr_t stream_) {
  const cudaStream_t stream = as_stream(stream_);
  std::vector<nb::object> keep;
  const TensorView ev = to_view("isin", "elements", elements, stream, keep);
  const TensorView tv = to_view("isin", "test_elements", test, stream, keep);
  IsinOptions o;
  o.path = isin_path(path);
  o.brute_force_max_test = brute_force_max_test;
  o.brute_force_max_work = brute_force_max_work;
  o.hash_min_test = hash_min_test;
  TensorView ov;
  nb::object result = nb::none();
  if (out.is_none()) {
    ov = ev;
    if (ev.device.type == DeviceType::cuda && ev.device.index >= 0) {
      result = nb::cast(new DeviceArray(DType::bool_, ev.shape, ev.ndim, ev.device.index),
                        nb::rv_policy::take_ownership);
      ov = nb::cast<const DeviceArray&>(result).view();
    }
  } else {
    ov = to_view("isin", "out", out, stream, keep);
  }
  tessera::isin(ev, tv, ov, assume_unique, invert, stream, o);
  set_producer(result, stream);
  return result;
}

// ---- benchmark engine ---------------------------------------------------------------------
nb::dict stats_to_dict(const bench::Stats& s) {
  nb::dict d;
  d["median_ms"] = s.median_ms;
  d["p20_ms"] = s.p20_ms;
  d["p80_ms"] = s.p80_ms;
  d["min_ms"] = s.min_ms;
  d["max_ms"] = s.max_ms;
  d["mean_ms"] = s.mean_ms;
  d["reps"] = s.reps;
  return d;
}

bench::Stats stats_from_dict(nb::handle h) {
  nb::dict d = nb::cast<nb::dict>(h);
  bench::Stats s;
  s.median_ms = nb::cast<double>(d["median_ms"]);
  auto get = [&](const char* key, double fallback) {
    return d.contains(key) ? nb::cast<double>(d[key]) : fallback;
  };
  s.p20_ms = get("p20_ms", s.median_ms);
  s.p80_ms = get("p80_ms", s.median_ms);
  s.min_ms = get("min_ms", s.median_ms);
  s.max_ms = get("max_ms", s.median_ms);
  s.mean_ms = get("mean_ms", s.median_ms);
  s.reps = d.contains("reps") ? nb::cast<int>(d["reps"]) : 0;
  return s;
}

nb::dict peaks_to_dict(const bench::Peaks& p) {
  nb::dict d;
  d["gpu"] = p.gpu;
  d["device"] = p.device;
  d["sm_count"] = p.sm_count;
  d["l2_mb"] = p.l2_mb;
  d["memory_gb"] = p.memory_gb;
  d["driver_version"] = p.driver_version;
  d["runtime_version"] = p.runtime_version;
  d["copy_gbps"] = p.copy_gbps;
  d["bf16_tflops"] = p.bf16_tflops;
  return d;
}

bench::Peaks peaks_from_dict(nb::handle h) {
  nb::dict d = nb::cast<nb::dict>(h);
  bench::Peaks p;
  auto num = [&](const char* key, double fallback) {
    return d.contains(key) ? nb::cast<double>(d[key]) : fallback;
  };
  if (d.contains("gpu")) p.gpu = nb::cast<std::string>(d["gpu"]);
  p.device = static_cast<int>(num("device", 0));
  p.sm_count = static_cast<int>(num("sm_count", 0));
  p.l2_mb = num("l2_mb", 0);
  p.memory_gb = num("memory_gb", 0);
  p.driver_version = static_cast<int>(num("driver_version", 0));
  p.runtime_version = static_cast<int>(num("runtime_version", 0));
  p.copy_gbps = num("copy_gbps", 0);
  p.bf16_tflops = num("bf16_tflops", 0);
  return p;
}

nb::dict row_to_dict(const bench::Row& r) {
  nb::dict d;
  d["op"] = r.op;
  d["provider"] = r.provider;
  d["dtype"] = r.dtype;
  d["shape"] = r.shape;
  d["size"] = r.size;
  d["bytes"] = r.bytes;
  d["flops"] = r.flops;
  d["stats"] = stats_to_dict(r.stats);
  d["gbps"] = bench::gbps(r);
  d["tflops"] = bench::tflops(r);
  return d;
}

nb::dict time_op(nb::callable fn, uintptr_t stream, double warmup_ms, int min_reps, int max_reps,
                 double budget_ms, bool flush_l2, bool cuda_graph, int graph_batch,
                 bool pass_stream) {
  bench::TimingOptions o;
  o.warmup_ms = warmup_ms;
  o.min_reps = min_reps;
  o.max_reps = max_reps;
  o.budget_ms = budget_ms;
  o.flush_l2 = flush_l2;
  o.cuda_graph = cuda_graph;
  o.graph_batch = graph_batch;
  // The GIL stays held: every rep calls back into Python. A Python exception unwinds through
  // time_op as nb::python_error and reaches the caller unchanged.
  const auto op = [&](cudaStream_t s) {
    if (pass_stream) fn(reinterpret_cast<uintptr_t>(s));
    else fn();
  };
  return stats_to_dict(bench::time_op(op, as_stream(stream), o));
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

  m.def("device_count", &runtime::device_count, "Number of usable CUDA devices (0 without a GPU).");
  m.def("no_gpu_reason", &runtime::no_gpu_reason,
        "Why device_count() is 0 ('no CUDA GPU present', ...); empty when GPUs exist.");

  m.def("add", &py_add, "a"_a.none(), "b"_a.none(), "out"_a.none(), "alpha"_a, "stream"_a,
        "out = a + alpha * b. a, b, out: view tuples or DLPack tensors (b may be a float); "
        "out None allocates a DeviceArray (DLPack a only), which is returned.");
  m.def("gelu", &py_gelu, "x"_a.none(), "out"_a.none(), "tanh"_a, "stream"_a,
        "out = gelu(x); returns a new DeviceArray when out is None.");
  m.def("gelu_backward", &py_gelu_backward, "grad_out"_a.none(), "x"_a.none(), "grad_in"_a.none(),
        "tanh"_a, "stream"_a, "grad_in = grad_out * gelu'(x); returns a new DeviceArray when grad_in is None.");
  m.def("softmax", &py_softmax, "x"_a.none(), "out"_a.none(), "dim"_a, "stream"_a,
        "out = softmax(x) along dim; returns a new DeviceArray when out is None.");
  m.def("log_softmax", &py_log_softmax, "x"_a.none(), "out"_a.none(), "dim"_a, "stream"_a,
        "out = log_softmax(x) along dim; returns a new DeviceArray when out is None.");
  m.def("softmax_backward", &py_softmax_backward, "grad_out"_a.none(), "y"_a.none(),
        "grad_in"_a.none(), "dim"_a, "stream"_a,
        "grad_in = y * (grad_out - sum_dim(grad_out * y)), y = softmax(x); returns a new "
        "DeviceArray when grad_in is None.");
  m.def("log_softmax_backward", &py_log_softmax_backward, "grad_out"_a.none(), "y"_a.none(),
        "grad_in"_a.none(), "dim"_a, "stream"_a,
        "grad_in = grad_out - exp(y) * sum_dim(grad_out), y = log_softmax(x); returns a new "
        "DeviceArray when grad_in is None.");
  m.def("layer_norm", &py_layer_norm, "x"_a.none(), "normalized_ndim"_a, "weight"_a.none(),
        "bias"_a.none(), "eps"_a, "out"_a.none(), "mean"_a.none(), "rstd"_a.none(), "stream"_a,
        "LayerNorm over the last normalized_ndim dimensions; mean and rstd (float32, the leading "
        "shape) are written where given. Returns a new DeviceArray when out is None.");
  m.def("layer_norm_backward", &py_layer_norm_backward, "grad_out"_a.none(), "x"_a.none(),
        "normalized_ndim"_a, "mean"_a.none(), "rstd"_a.none(), "weight"_a.none(),
        "grad_in"_a.none(), "grad_weight"_a.none(), "grad_bias"_a.none(), "stream"_a,
        "Gradients of layer_norm into the given outputs (None: not computed).");
  m.def("rms_norm", &py_rms_norm, "x"_a.none(), "normalized_ndim"_a, "weight"_a.none(), "eps"_a,
        "out"_a.none(), "rstd"_a.none(), "stream"_a,
        "RMSNorm over the last normalized_ndim dimensions; rstd is written where given. Returns a "
        "new DeviceArray when out is None.");
  m.def("rms_norm_backward", &py_rms_norm_backward, "grad_out"_a.none(), "x"_a.none(),
        "normalized_ndim"_a, "rstd"_a.none(), "weight"_a.none(), "grad_in"_a.none(),
        "grad_weight"_a.none(), "stream"_a,
        "Gradients of rms_norm into the given outputs (None: not computed).");
  m.def("dropout", &py_dropout, "x"_a.none(), "out"_a.none(), "p"_a, "seed"_a, "offset"_a,
        "stream"_a,
        "Inverted dropout with the Philox stream (seed, offset); returns a new DeviceArray when out "
        "is None.");
  m.def("dropout_backward", &py_dropout_backward, "grad_out"_a.none(), "grad_in"_a.none(), "p"_a,
        "seed"_a, "offset"_a, "stream"_a,
        "grad_in = grad_out * mask(seed, offset) / (1 - p); returns a new DeviceArray when grad_in "
        "is None.");
  m.def("dropout_offset_increment", &tessera::dropout_offset_increment, "numel"_a,
        "Philox counters one dropout call over numel elements consumes.");
  m.def("copy", &py_copy, "src"_a.none(), "dst"_a.none(), "stream"_a,
        "dst = src between any two layouts of one shape and dtype.");

  m.def("isin", &py_isin, "elements"_a.none(), "test_elements"_a.none(), "out"_a.none(),
        "assume_unique"_a, "invert"_a, "path"_a, "brute_force_max_test"_a, "brute_force_max_work"_a,
        "hash_min_test"_a, "stream"_a,
        "out = elements in test_elements (bool); returns a new DeviceArray when out is None.");
  m.def("isin_choose_path",
        [](const std::string& dtype, int64_t m, int64_t n, int64_t bmax, int64_t bwork, int64_t hmin) {
          DType d = DType::int32;
          bool found = false;
          for (DType k : kDTypes)
            if (dtype == dtype_name(k)) d = k, found = true;
          if (!found)
            detail::throw_arg(ErrorKind::type, "isin_choose_path", "dtype", "a tessera dtype name", "'" + dtype + "'");
          IsinOptions o;
          o.brute_force_max_test = bmax;
          o.brute_force_max_work = bwork;
          o.hash_min_test = hmin;
          return std::string(isin_path_name(isin_choose_path(d, m, n, o)));
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
             DType d = DType::float32;
             bool found = false;
             for (DType k : kDTypes)
               if (dtype == dtype_name(k)) d = k, found = true;
             if (!found)
               detail::throw_arg(ErrorKind::type, "DeviceArray", "dtype", "a tessera dtype name",
                                 "'" + dtype + "'");
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

  // ---- benchmark engine ----
  m.def("time_op", &time_op, "fn"_a, "stream"_a, "warmup_ms"_a, "min_reps"_a, "max_reps"_a,
        "budget_ms"_a, "flush_l2"_a, "cuda_graph"_a, "graph_batch"_a, "pass_stream"_a = false,
        "Times fn (called with no argument, or with the stream handle when pass_stream) with CUDA "
        "events on `stream`; returns the stats as a dict.");
  m.def("measure_peaks",
        [](uintptr_t stream) {
          bench::Peaks p;
          {
            nb::gil_scoped_release release;
            p = bench::measure_peaks(as_stream(stream));
          }
          return peaks_to_dict(p);
        },
        "stream"_a = 0, "Device-to-device copy GB/s and cuBLAS bf16 GEMM TFLOP/s on this GPU.");
  m.def("summarize", [](std::vector<double> samples) { return stats_to_dict(bench::summarize(std::move(samples))); },
        "samples_ms"_a, "Median, p20, p80, min, max, mean of raw times (ms).");
  m.def("quantile", &bench::quantile, "sorted"_a, "q"_a,
        "Quantile q of ascending samples, linear interpolation (numpy's default).");

  nb::class_<bench::Report>(m, "Report", "Benchmark rows, measured ceilings and their writers.")
      .def(nb::init<>())
      .def("add",
           [](bench::Report& r, const std::string& op, const std::string& provider,
              const std::string& dtype, const std::string& shape, int64_t size, double bytes,
              double flops, nb::handle stats) {
             bench::Row row;
             row.op = op;
             row.provider = provider;
             row.dtype = dtype;
             row.shape = shape;
             row.size = size;
             row.bytes = bytes;
             row.flops = flops;
             row.stats = stats_from_dict(stats);
             r.add(row);
           },
           "op"_a, "provider"_a, "dtype"_a, "shape"_a, "size"_a, "bytes"_a, "flops"_a, "stats"_a)
      .def("set_peaks", [](bench::Report& r, nb::handle d) { r.set_peaks(peaks_from_dict(d)); },
           "peaks"_a)
      .def("peaks", [](const bench::Report& r) -> nb::object {
        return r.has_peaks() ? nb::object(peaks_to_dict(r.peaks())) : nb::none();
      })
      .def("rows", [](const bench::Report& r) {
        nb::list l;
        for (const bench::Row& row : r.rows()) l.append(row_to_dict(row));
        return l;
      })
      .def("table", &bench::Report::table)
      .def("write_csv", &bench::Report::write_csv, "path"_a)
      .def("write_json", &bench::Report::write_json, "path"_a)
      .def("write_svgs", &bench::Report::write_svgs, "dir"_a)
      .def("svg", &bench::Report::svg, "op"_a, "dtype"_a);
}
