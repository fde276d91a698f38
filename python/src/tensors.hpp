// Python tensors as TensorViews, and the DeviceArray that DLPack inputs get as output. Included
// once, by ext.cpp (the extension is one translation unit; see python/CMakeLists.txt).
//
// A tensor argument arrives in one of two forms, neither of them copied:
//  - a view tuple, whose layout kViewFields below defines (exported as _C.VIEW_FIELDS, which
//    tessera/_interop.py builds from a torch tensor): plain ints and tuples, a fraction of the cost
//    of a DLPack round trip per call;
//  - any object with __dlpack__ and __dlpack_device__ (cupy, numpy, jax, a DeviceArray). Its
//    capsule is held for the duration of the call and released after: the library keeps no
//    pointer past a call, so the producer's memory only needs to live that long.
#pragma once

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "tessera/tessera.hpp"

namespace tessera::python {
namespace nb = nanobind;
using namespace nb::literals;

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
                             DType::uint8,   DType::bool_, DType::float8_e4m3fn,
                             DType::float8_e5m2};

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
// The view tuple's one definition: its fields, in order. _C.VIEW_FIELDS exports the names, and
// tessera/_interop.py builds its tuples in that order (it checks the names at import).
//   data_ptr      the address of element 0, an int
//   dtype         a code of _C.DTYPES (kDTypes' order) or, for a dtype tessera does not
//                 represent, its name (for the error message)
//   shape         a tuple of ints
//   strides       a tuple of ints, in elements, as many as shape
//   device_index  the CUDA device, or -1 for a tensor that is not on one (any negative int)
enum ViewField : Py_ssize_t { kViewData, kViewDtype, kViewShape, kViewStrides, kViewDevice, kViewSize };
constexpr const char* kViewFields[kViewSize] = {"data_ptr", "dtype", "shape", "strides",
                                                "device_index"};
std::string view_tuple_description() {
  std::string s = "a view tuple (";
  for (Py_ssize_t i = 0; i < kViewSize; ++i) s += (i ? ", " : "") + std::string(kViewFields[i]);
  return s + ")";
}

TensorView view_from_tuple(const char* op, const char* arg, PyObject* t) {
  if (PyTuple_GET_SIZE(t) != kViewSize)
    fail(ErrorKind::type, op, arg, view_tuple_description(),
         "a tuple of " + std::to_string(PyTuple_GET_SIZE(t)) + " items");
  PyObject* shape = PyTuple_GET_ITEM(t, kViewShape);
  PyObject* strides = PyTuple_GET_ITEM(t, kViewStrides);
  if (!PyTuple_Check(shape) || !PyTuple_Check(strides) ||
      PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(strides))
    fail(ErrorKind::type, op, arg, "shape and strides as tuples of equal length",
         "something else");
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  check_ndim(op, arg, ndim);

  TensorView v;
  v.data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, kViewData));
  if (v.data == nullptr && PyErr_Occurred()) throw nb::python_error();
  const int64_t device = as_int64(PyTuple_GET_ITEM(t, kViewDevice));
  const bool on_cuda = device >= 0;
  v.device = on_cuda ? Device{DeviceType::cuda, static_cast<int>(device)} : Device{DeviceType::cpu, 0};
  PyObject* dtype = PyTuple_GET_ITEM(t, kViewDtype);
  if (PyLong_Check(dtype)) {
    const int64_t code = as_int64(dtype);
    const bool known = code >= 0 && code < static_cast<int64_t>(std::size(kDTypes));
    v.dtype = known_dtype_or_fail(known, known ? kDTypes[code] : DType::uint8, on_cuda, op, arg,
                                  "dtype code " + std::to_string(code));
  } else {
    v.dtype = known_dtype_or_fail(false, DType::uint8, on_cuda, op, arg,
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
// ---- outputs ----------------------------------------------------------------------------------
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// For a DLPack input without out=: a new DeviceArray of `dtype` and `shape`, or, when `like` is not
// a CUDA tensor or the shape is not one (shape_ok false), nothing: `like` then stands in for the
// output, and the operator's own checks (which run before any write) refuse the call with the
// library's message.
nb::object new_output(const TensorView& like, DType dtype, const int64_t* shape, int ndim,
                      bool shape_ok, TensorView& out_view) {
  out_view = like;
  if (like.device.type != DeviceType::cuda || like.device.index < 0 || !shape_ok) return nb::none();
  nb::object arr = nb::cast(new DeviceArray(dtype, shape, ndim, like.device.index),
                            nb::rv_policy::take_ownership);
  out_view = nb::cast<const DeviceArray&>(arr).view();
  return arr;
}

void set_producer(nb::handle arr, cudaStream_t stream) {
  if (!arr.is_none()) nb::cast<DeviceArray&>(arr).producer_stream = stream;
}

// A dtype by its name in _C.DTYPES ("float32", ...), for arguments that name one.
DType dtype_from_name(const char* op, const char* arg, const std::string& name) {
  for (DType d : kDTypes)
    if (name == dtype_name(d)) return d;
  fail(ErrorKind::type, op, arg, "a tessera dtype name", "'" + name + "'");
}

}  // namespace
}  // namespace tessera::python
