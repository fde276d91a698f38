#include "ops/verify.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>

#include "bench/fill.hpp"
#include "bench/host.hpp"
#include "runtime/check.hpp"

namespace tessera::ops {

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::contiguous: return "contiguous";
    case Layout::strided: return "strided";
    case Layout::transposed: return "transposed";
    case Layout::offset: return "misaligned";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return detail::shape_str(shape.data(), static_cast<int>(shape.size()));
}

TestTensor make_tensor(DType dtype, const std::vector<int64_t>& shape, Layout layout) {
  const int nd = static_cast<int>(shape.size());
  if (layout == Layout::transposed && nd < 2)
    detail::throw_arg(ErrorKind::value, "make_tensor", "layout", "ndim >= 2 for transposed",
                      std::to_string(nd));
  std::vector<int64_t> strides(nd);
  int64_t offset = 0, extent = 1;
  if (layout == Layout::transposed) {
    // Storage is row-major in the order (..., n-1, n-2): swap the last two dims.
    std::vector<int64_t> order(nd);
    for (int i = 0; i < nd; ++i) order[i] = i;
    std::swap(order[nd - 1], order[nd - 2]);
    int64_t s = 1;
    for (int k = nd - 1; k >= 0; --k) {
      strides[order[k]] = s;
      s *= std::max<int64_t>(shape[order[k]], 1);
    }
    extent = s;
  } else {
    int64_t s = layout == Layout::strided ? 2 : 1;
    for (int i = nd - 1; i >= 0; --i) {
      strides[i] = s;
      s *= std::max<int64_t>(shape[i], 1);
    }
    extent = s;
    if (layout == Layout::offset) offset = 1;
  }
  TestTensor t;
  t.storage_elems = extent + offset;
  t.storage = runtime::DeviceBuffer(static_cast<std::size_t>(t.storage_elems) * dtype_size(dtype));
  char* base = static_cast<char*>(t.storage.data()) + offset * dtype_size(dtype);
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  t.view = TensorView::make(base, dtype, shape.data(), strides.data(), nd, Device{DeviceType::cuda, dev});
  return t;
}

namespace {
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
std::atomic<uint64_t> g_seed{0x7e55e7a};
std::atomic<uint64_t> g_run_seed{0};

// splitmix64's finaliser: nearby seeds give unrelated streams.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

void set_verify_seed(uint64_t seed) {
  g_run_seed = seed;
  g_seed = seed == 0 ? 0x7e55e7a : mix(seed);
}

uint64_t case_seed(uint64_t salt) { return g_run_seed == 0 ? salt : mix(g_run_seed.load() ^ mix(salt)); }

void fill_random(TestTensor& t, double lo, double hi, cudaStream_t stream) {
  bench::fill_uniform(t.storage.data(), t.view.dtype, t.storage_elems, lo, hi,
                        g_seed.fetch_add(kGolden), stream);
}

void fill_poison(TestTensor& t, cudaStream_t stream) {
  bench::poison(t.storage.data(), t.storage.bytes(), stream);
}

HostCopy to_host(const TestTensor& t) {
  HostCopy h;
  h.bytes = bench::to_host(t.storage.data(), t.storage.bytes());
  const auto off = static_cast<const char*>(t.view.data) - static_cast<const char*>(t.storage.data());
  h.view = t.view;
  h.view.data = h.bytes.data() + off;
  h.view.device = Device{DeviceType::cpu, 0};
  return h;
}

void to_device(TestTensor& t, const HostCopy& h) {
  TESSERA_CUDA_CHECK(cudaMemcpy(t.storage.data(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice));
}

TestTensor upload(DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& values) {
  TestTensor d = make_tensor(dtype, shape, Layout::contiguous);
  HostCopy h = to_host(d);
  for (int64_t i = 0; i < h.view.numel(); ++i) {
    if (dtype == DType::int64) static_cast<int64_t*>(h.view.data)[i] = int64_t(values[size_t(i)]);
    else if (dtype == DType::int32) static_cast<int32_t*>(h.view.data)[i] = int32_t(values[size_t(i)]);
    else host::store_double(h.view, i, values[size_t(i)]);
  }
  to_device(d, h);
  return d;
}

void keep_worst(VerifyResult& worst, const VerifyResult& r) {
  if (worst.passed && (!r.passed || r.rel_err > worst.rel_err)) worst = r;
}

VerifyResult compare(const std::string& op, const std::string& name, const TestTensor& out,
                     const std::vector<double>& ref, cudaStream_t stream, const ErrorModel& model) {
  VerifyResult r;
  r.op = op;
  r.name = name;
  const OpInfo* info = find_op(op);
  if (info == nullptr)
    detail::throw_arg(ErrorKind::value, "compare", "op", "the name of a registered operator", op);
  const int64_t n = out.view.numel();
  if (static_cast<int64_t>(ref.size()) != n) {
    r.detail = "reference has " + std::to_string(ref.size()) + " elements, output " + std::to_string(n);
    return r;
  }
  r.unwritten = bench::count_poisoned(out.view, stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const HostCopy h = to_host(out);
  std::mutex mu;
  const DType dt = out.view.dtype;
  const bool rounds = dt == DType::float16 || dt == DType::bfloat16 || dt == DType::float32;
  double err2 = 0, ref2 = 0, floor2 = 0, max_abs = 0;
  int64_t bad = 0;
  host::parallel_for(n, [&](int64_t b, int64_t e) {
    double le = 0, lr = 0, lf = 0, lm = 0;
    int64_t lb = 0;
    for (int64_t i = b; i < e; ++i) {
      const double v = host::load_double(h.view, i), want = ref[i];
      if (!std::isfinite(v) && std::isfinite(want)) {
        ++lb;
        continue;
      }
      const double d = std::isfinite(want) ? v - want : (v == want || (std::isnan(v) && std::isnan(want)) ? 0.0 : INFINITY);
      le += d * d;
      if (std::isfinite(want)) {
        lr += want * want;
        const double f = rounds ? round_to(dt, want) - want : 0.0;
        lf += std::isfinite(f) ? f * f : 0.0;  // beyond the dtype's range: the NaN/Inf check's
      }
      lm = std::max(lm, std::fabs(d));
    }
    std::lock_guard<std::mutex> lock(mu);
    err2 += le;
    ref2 += lr;
    floor2 += lf;
    max_abs = std::max(max_abs, lm);
    bad += lb;
  });
  r.rel_err = n == 0 ? 0.0 : (ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2));
  ErrorModel m = model;
  m.floor = ref2 > 0 ? std::sqrt(floor2 / ref2) : 0.0;
  r.tolerance = info->tolerance(dt, m);
  r.max_abs = max_abs;
  if (r.unwritten > 0) {
    r.detail = std::to_string(r.unwritten) + " output elements never written";
  } else if (bad > 0) {
    r.detail = std::to_string(bad) + " outputs are NaN/Inf where the reference is finite";
  } else if (!(r.rel_err <= r.tolerance)) {
    r.detail = "relative error above tolerance";
  } else {
    r.passed = true;
  }
  return r;
}

double round_to(DType dt, double v) {
  const auto f = static_cast<float>(v);
  switch (dt) {
    case DType::float16: return __half2float(__float2half_rn(f));
    case DType::bfloat16: return __bfloat162float(__float2bfloat16_rn(f));
    default: return f;
  }
}

void check_exact(VerifyResult& r, const TestTensor& out, const std::vector<double>& ref) {
  const HostCopy h = to_host(out);
  const int64_t n = out.view.numel();
  std::mutex mu;
  int64_t differ = 0, flipped = 0;
  double max_abs = 0;
  host::parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t ld = 0, lf = 0;
    double lm = 0;
    for (int64_t i = b; i < e; ++i) {
      const double v = host::load_double(h.view, i), want = round_to(out.view.dtype, ref[i]);
      if (!(v == want)) {
        ++ld;
        lm = std::max(lm, std::isnan(v) ? INFINITY : std::fabs(v - want));
      }
      if ((v == 0) != (ref[i] == 0)) ++lf;
    }
    std::lock_guard<std::mutex> lock(mu);
    differ += ld;
    flipped += lf;
    max_abs = std::max(max_abs, lm);
  });
  r.max_abs = max_abs;
  if (r.passed && differ > 0) {
    r.passed = false;
    r.detail = std::to_string(differ) + " elements differ from the exact result in " +
               dtype_name(out.view.dtype) + " (" + std::to_string(flipped) +
               " zero where it should not be or not zero where it should)";
  }
}

BenchCase bench_case(const std::string& op, DType dtype, int64_t size, const BenchShape& shape) {
  BenchCase c;
  c.op = op;
  c.dtype = dtype_name(dtype);
  c.shape = shape.shape;
  c.size = size;
  c.bytes = shape.bytes;
  c.flops = shape.flops;
  return c;
}

}  // namespace tessera::ops
