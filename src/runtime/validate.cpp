#include "runtime/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace tessera::detail {

void check_cuda_tensor(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim < 0 || t.ndim > kMaxDims)
    throw_arg(ErrorKind::value, op, arg, "at most " + std::to_string(kMaxDims) + " dimensions",
              std::to_string(t.ndim));
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] < 0)
      throw_arg(ErrorKind::value, op, arg, "non-negative sizes", "shape " + t.shape_str());
  if (t.device.type != DeviceType::cuda)
    throw_arg(ErrorKind::value, op, arg, "a CUDA tensor", "a tensor on " + to_string(t.device));
  if (t.device.index < 0)
    throw_arg(ErrorKind::value, op, arg, "a device index >= 0", to_string(t.device));
  if (t.data == nullptr && t.numel() > 0)
    throw_arg(ErrorKind::value, op, arg, "a non-null data pointer",
              "nullptr for shape " + t.shape_str());
}

void check_dtype_in(const char* op, const char* arg, const TensorView& t,
                    std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), t.dtype) != allowed.end()) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
  throw_arg(ErrorKind::type, op, arg, "dtype in {" + names + "}", dtype_name(t.dtype));
}

void check_same_dtype(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                      const TensorView& ref) {
  if (t.dtype != ref.dtype)
    throw_arg(ErrorKind::type, op, arg,
              std::string("dtype ") + dtype_name(ref.dtype) + " (that of '" + ref_arg + "')",
              dtype_name(t.dtype));
}

void check_same_device(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                       const TensorView& ref) {
  if (!(t.device == ref.device))
    throw_arg(ErrorKind::value, op, arg,
              "device " + to_string(ref.device) + " (that of '" + ref_arg + "')",
              to_string(t.device));
}

void check_same_shape(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                      const TensorView& ref) {
  bool same = t.ndim == ref.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == ref.shape[i];
  if (!same)
    throw_arg(ErrorKind::value, op, arg,
              "shape " + ref.shape_str() + " (that of '" + ref_arg + "')", t.shape_str());
}

void check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref) {
  check_cuda_tensor(op, arg, t);
  check_same_device(op, arg, t, ref_arg, ref);
  check_same_dtype(op, arg, t, ref_arg, ref);
  check_same_shape(op, arg, t, ref_arg, ref);
}

void check_no_internal_overlap(const char* op, const char* arg, const TensorView& t) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.strides[i] == 0 && t.shape[i] > 1)
      throw_arg(ErrorKind::value, op, arg, "a tensor whose elements do not overlap",
                "stride 0 on dimension " + std::to_string(i) + " of size " +
                    std::to_string(t.shape[i]));
}

namespace {
// Half-open byte range [lo, hi) spanned by a view's elements.
void byte_extent(const TensorView& t, uintptr_t& lo, uintptr_t& hi) {
  int64_t min_off = 0, max_off = 0;
  for (int i = 0; i < t.ndim; ++i) {
    const int64_t span = (t.shape[i] - 1) * t.strides[i];
    (span < 0 ? min_off : max_off) += span;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  lo = base + min_off * es;
  hi = base + (max_off + 1) * es;
}
}  // namespace

bool same_view(const TensorView& x, const TensorView& y) {
  if (x.data != y.data || x.dtype != y.dtype || x.ndim != y.ndim) return false;
  for (int i = 0; i < x.ndim; ++i)
    if (x.shape[i] != y.shape[i] || (x.shape[i] > 1 && x.strides[i] != y.strides[i])) return false;
  return true;
}

void check_no_overlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in, bool allow_identical) {
  if (out.numel() == 0 || in.numel() == 0) return;
  if (allow_identical && same_view(out, in)) return;
  uintptr_t olo, ohi, ilo, ihi;
  byte_extent(out, olo, ohi);
  byte_extent(in, ilo, ihi);
  if (olo < ihi && ilo < ohi)
    throw_arg(ErrorKind::value, op, out_arg,
              std::string("memory that does not overlap '") + in_arg + "'" +
                  (allow_identical ? " (or is exactly '" + std::string(in_arg) + "', for in-place use)" : ""),
              "an overlapping tensor");
}

int broadcast_shapes(const char* op, const char* a_arg, const TensorView& a, const char* b_arg,
                     const TensorView& b, int64_t* out_shape) {
  const int nd = std::max(a.ndim, b.ndim);
  for (int i = 0; i < nd; ++i) {
    const int ia = a.ndim - nd + i, ib = b.ndim - nd + i;
    const int64_t sa = ia >= 0 ? a.shape[ia] : 1, sb = ib >= 0 ? b.shape[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      throw_arg(ErrorKind::value, op, b_arg,
                "a shape broadcastable with " + std::string(a_arg) + "'s " + a.shape_str(),
                b.shape_str());
    out_shape[i] = sa == 1 ? sb : sa;
  }
  return nd;
}

TensorView broadcast_to(const char* op, const char* arg, const TensorView& t, const TensorView& shape_of) {
  TensorView r = t;
  r.ndim = shape_of.ndim;
  bool ok = t.ndim <= shape_of.ndim;
  for (int i = shape_of.ndim - 1, j = t.ndim - 1; ok && i >= 0; --i, --j) {
    r.shape[i] = shape_of.shape[i];
    if (j < 0) {
      r.strides[i] = 0;
    } else if (t.shape[j] == shape_of.shape[i]) {
      r.strides[i] = t.strides[j];
    } else if (t.shape[j] == 1) {
      r.strides[i] = 0;
    } else {
      ok = false;
    }
  }
  if (!ok)
    throw_arg(ErrorKind::value, op, arg, "a shape broadcastable to " + shape_of.shape_str(),
              t.shape_str());
  return r;
}

std::string dims(const TensorView& t) { return std::to_string(t.ndim) + "-d " + t.shape_str(); }

}  // namespace tessera::detail
