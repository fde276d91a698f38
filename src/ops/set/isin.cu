// isin: out[i] = elements[i] in test_elements, as torch.isin.
//
// Every path works on keys, not values: each element is mapped to an unsigned integer of its
// width whose order is the value's order (integers: flip the sign bit; floats: flip the sign bit
// of positives and every bit of negatives), with -0.0 mapped to the key of +0.0 and every NaN to
// the all-ones key. Equality of keys is then equality of values as torch defines it for isin
// (-0.0 == 0.0), and a NaN element, which is never found, is caught by its own test before any
// lookup. One set of kernels thus serves all dtypes, reading raw bits.
//
// Paths (IsinOptions picks one; the crossovers measured on an H200 by benchmarks/set.py's scan):
//  - brute_force: one kernel; each CTA streams test_elements through shared memory in chunks and
//    every thread compares its elements against each key (a broadcast read). M x N compares, no
//    M x N matrix. Best when N is small: one launch, nothing to prepare.
//  - sort: keys of test_elements radix-sorted once (CUB), then one kernel binary-searches each
//    element. The first levels of the search run on a sample of the sorted keys held in shared
//    memory (every stride-th key), so only the last log2(stride) steps touch global memory.
//  - hash: an open-addressing (linear probing) hash set of the test keys at load <= 1/2, built
//    with atomicCAS, then one probe sequence per element: ~1-2 random 32-byte sectors per
//    element, against ~log2(N) for the search. Pays for large N.
//  - bitmap: 8- and 16-bit dtypes have at most 65536 keys: a presence bit per key (8 KB) built
//    in shared memory per CTA and ORed into global memory, then looked up from shared memory.
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <string>
#include <type_traits>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/set.hpp"
#include "tile/indexing.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

constexpr int kThreads = 256;

// ---- keys -------------------------------------------------------------------------------------
template <class K, int ExpBits, int ManBits>
struct FloatKey {
  using Raw = K;
  __device__ __forceinline__ static K key(K b, bool& nan) {
    constexpr K sign = K(K(1) << (8 * sizeof(K) - 1));
    constexpr K inf = K(((K(1) << ExpBits) - 1) << ManBits);
    const K mag = K(b & K(~sign));
    nan = mag > inf;
    if (nan) return K(~K(0));
    if (mag == 0) return sign;  // -0.0 and +0.0: the key of +0.0
    return (b & sign) ? K(~b) : K(b | sign);
  }
};

template <class K, bool Signed>
struct IntKey {
  using Raw = K;
  __device__ __forceinline__ static K key(K b, bool& nan) {
    nan = false;
    return Signed ? K(b ^ K(K(1) << (8 * sizeof(K) - 1))) : b;
  }
};

// Offsets of element i in out (slot 0) and elements (slot 1).
template <bool Dense>
__device__ __forceinline__ void element_offsets(int64_t i, const tile::StridedIndexer<2>& idx,
                                                int64_t (&off)[2]) {
  if constexpr (Dense) off[0] = off[1] = i;
  else idx.offsets(i, off);
}

// ---- key preparation (sort and hash paths) ---------------------------------------------------
template <class Tr, class K>
__global__ __launch_bounds__(kThreads) void test_keys_kernel(const typename Tr::Raw* test, int64_t n,
                                                             tile::StridedIndexer<1> idx, K* keys) {
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[1];
    idx.offsets(i, off);
    bool nan;
    keys[i] = Tr::key(test[off[0]], nan);
  }
}

// ---- brute force ------------------------------------------------------------------------------
constexpr int kBruteChunk = 2048;  // test keys per shared-memory chunk
constexpr int kBrutePer = 4;       // elements per thread: each shared read feeds 4 compares

template <class Tr, bool Dense>
__global__ __launch_bounds__(kThreads) void brute_force_kernel(
    const typename Tr::Raw* __restrict__ elements, bool* __restrict__ out, int64_t m,
    tile::StridedIndexer<2> idx, const typename Tr::Raw* __restrict__ test, int64_t n,
    tile::StridedIndexer<1> tidx, bool invert) {
  using K = typename Tr::Raw;
  __shared__ K tile_keys[kBruteChunk];
  const int64_t first = blockIdx.x * int64_t(kThreads * kBrutePer) + threadIdx.x;
  K key[kBrutePer];
  bool found[kBrutePer], skip[kBrutePer];
  int64_t off[kBrutePer][2];
#pragma unroll
  for (int j = 0; j < kBrutePer; ++j) {
    const int64_t i = first + j * kThreads;
    found[j] = false;
    skip[j] = i >= m;
    key[j] = 0;
    if (!skip[j]) {
      element_offsets<Dense>(i, idx, off[j]);
      bool nan;
      key[j] = Tr::key(elements[off[j][1]], nan);
      skip[j] = nan;  // NaN is never found
    }
  }
  for (int64_t c0 = 0; c0 < n; c0 += kBruteChunk) {
    const int count = static_cast<int>(n - c0 < kBruteChunk ? n - c0 : kBruteChunk);
    __syncthreads();  // the previous chunk is consumed
    for (int t = threadIdx.x; t < count; t += kThreads) {
      int64_t toff[1];
      tidx.offsets(c0 + t, toff);
      bool nan;
      tile_keys[t] = Tr::key(test[toff[0]], nan);
    }
    __syncthreads();
#pragma unroll 8
    for (int t = 0; t < count; ++t) {
      const K v = tile_keys[t];
#pragma unroll
      for (int j = 0; j < kBrutePer; ++j) found[j] |= key[j] == v;
    }
  }
#pragma unroll
  for (int j = 0; j < kBrutePer; ++j)
    if (first + j * kThreads < m) out[off[j][0]] = (found[j] && !skip[j]) != invert;
}

// ---- sort + binary search ---------------------------------------------------------------------
constexpr int kSamples = 2048;  // sorted keys kept in shared memory for the first search levels

template <class Tr, bool Dense>
__global__ __launch_bounds__(kThreads) void search_kernel(
    const typename Tr::Raw* __restrict__ elements, bool* __restrict__ out, int64_t m,
    tile::StridedIndexer<2> idx, const typename Tr::Raw* __restrict__ sorted, int64_t n,
    int64_t stride, bool invert) {
  using K = typename Tr::Raw;
  __shared__ K sample[kSamples];
  const int samples = static_cast<int>((n + stride - 1) / stride);
  for (int s = threadIdx.x; s < samples; s += kThreads) sample[s] = sorted[s * stride];
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < m; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[2];
    element_offsets<Dense>(i, idx, off);
    bool nan;
    const K k = Tr::key(elements[off[1]], nan);
    // Samples <= k: the key can only be in the window that starts at the last of them.
    int lo = 0, hi = samples;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (sample[mid] <= k) lo = mid + 1;
      else hi = mid;
    }
    bool found = false;
    if (lo > 0 && !nan) {
      int64_t a = int64_t(lo - 1) * stride, b = a + stride < n ? a + stride : n;
      while (a < b) {  // lower_bound in [a, b)
        const int64_t mid = (a + b) >> 1;
        if (sorted[mid] < k) a = mid + 1;
        else b = mid;
      }
      found = a < n && sorted[a] == k;
    }
    out[off[0]] = found != invert;
  }
}

// ---- hash set ---------------------------------------------------------------------------------
template <class H>
__device__ __forceinline__ uint64_t slot_of(H k, int shift) {
  return (static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull) >> shift;  // Fibonacci hashing
}

template <class H>
__device__ __forceinline__ H cas(H* p, H expected, H desired) {
  if constexpr (sizeof(H) == 8)
    return atomicCAS(reinterpret_cast<unsigned long long*>(p), expected, desired);
  else
    return atomicCAS(reinterpret_cast<unsigned*>(p), expected, desired);
}

// The all-ones key marks an empty slot. For integer dtypes it is also a real value (the maximum
// of the type); it is recorded in `has_empty_key` instead of the table. NaN test keys are skipped.
template <class Tr, class H>
__global__ __launch_bounds__(kThreads) void hash_insert_kernel(const typename Tr::Raw* test, int64_t n,
                                                               tile::StridedIndexer<1> idx, H* table,
                                                               uint64_t mask, int shift,
                                                               int* has_empty_key) {
  constexpr H kEmpty = H(~H(0));
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[1];
    idx.offsets(i, off);
    bool nan;
    const H k = static_cast<H>(Tr::key(test[off[0]], nan));
    if (nan) continue;
    if (k == kEmpty) {
      *has_empty_key = 1;
      continue;
    }
    for (uint64_t s = slot_of(k, shift);; s = (s + 1) & mask) {
      const H prev = cas(&table[s], kEmpty, k);
      if (prev == kEmpty || prev == k) break;
    }
  }
}

template <class Tr, bool Dense, class H>
__global__ __launch_bounds__(kThreads) void hash_lookup_kernel(
    const typename Tr::Raw* __restrict__ elements, bool* __restrict__ out, int64_t m,
    tile::StridedIndexer<2> idx, const H* __restrict__ table, uint64_t mask, int shift,
    const int* has_empty_key, bool invert) {
  constexpr H kEmpty = H(~H(0));
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < m; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[2];
    element_offsets<Dense>(i, idx, off);
    bool nan;
    const H k = static_cast<H>(Tr::key(elements[off[1]], nan));
    bool found = false;
    if (nan) {
      found = false;
    } else if (k == kEmpty) {
      found = *has_empty_key != 0;
    } else {
      for (uint64_t s = slot_of(k, shift);; s = (s + 1) & mask) {
        const H v = table[s];
        if (v == k) { found = true; break; }
        if (v == kEmpty) break;
      }
    }
    out[off[0]] = found != invert;
  }
}

// ---- bitmap (8- and 16-bit keys) --------------------------------------------------------------
constexpr int kBitmapWords = 65536 / 32;

template <class Tr>
__global__ __launch_bounds__(kThreads) void bitmap_build_kernel(const typename Tr::Raw* test, int64_t n,
                                                                tile::StridedIndexer<1> idx,
                                                                unsigned* bitmap) {
  __shared__ unsigned local[kBitmapWords];
  for (int w = threadIdx.x; w < kBitmapWords; w += kThreads) local[w] = 0;
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[1];
    idx.offsets(i, off);
    bool nan;
    const unsigned k = Tr::key(test[off[0]], nan);
    if (!nan) atomicOr(&local[k >> 5], 1u << (k & 31));
  }
  __syncthreads();
  // Only words with bits set go to global memory: a few atomics per CTA, not one per element.
  for (int w = threadIdx.x; w < kBitmapWords; w += kThreads)
    if (local[w]) atomicOr(&bitmap[w], local[w]);
}

template <class Tr, bool Dense>
__global__ __launch_bounds__(kThreads) void bitmap_lookup_kernel(
    const typename Tr::Raw* __restrict__ elements, bool* __restrict__ out, int64_t m,
    tile::StridedIndexer<2> idx, const unsigned* __restrict__ bitmap, bool invert) {
  __shared__ unsigned local[kBitmapWords];
  for (int w = threadIdx.x; w < kBitmapWords; w += kThreads) local[w] = bitmap[w];
  __syncthreads();
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < m; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[2];
    element_offsets<Dense>(i, idx, off);
    bool nan;
    const unsigned k = Tr::key(elements[off[1]], nan);
    out[off[0]] = (!nan && ((local[k >> 5] >> (k & 31)) & 1u)) != invert;
  }
}

// ---- empty test set ---------------------------------------------------------------------------
template <bool Dense>
__global__ __launch_bounds__(kThreads) void fill_kernel(bool* out, int64_t m, tile::StridedIndexer<2> idx,
                                                        bool value) {
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < m; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[2];
    element_offsets<Dense>(i, idx, off);
    out[off[0]] = value;
  }
}

// ---- host side --------------------------------------------------------------------------------
struct Launch {
  const TensorView& elements;
  const TensorView& test;
  const TensorView& out;
  bool invert;
  cudaStream_t stream;
  int sms;
  int64_t m, n;
  tile::StridedIndexer<2> idx;   // out, elements
  tile::StridedIndexer<1> tidx;  // test_elements
  bool dense;
};

unsigned grid_for_elements(int64_t work, int sms, int per_thread = 1) {
  const long long blocks = (work + int64_t(kThreads) * per_thread - 1) / (int64_t(kThreads) * per_thread);
  const long long cap = 64LL * sms;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

template <class Tr, bool Dense>
void run_brute_force(const Launch& L) {
  using Raw = typename Tr::Raw;
  const long long blocks = (L.m + kThreads * kBrutePer - 1) / (kThreads * kBrutePer);
  brute_force_kernel<Tr, Dense><<<static_cast<unsigned>(blocks), kThreads, 0, L.stream>>>(
      static_cast<const Raw*>(L.elements.data), static_cast<bool*>(L.out.data), L.m, L.idx,
      static_cast<const Raw*>(L.test.data), L.n, L.tidx, L.invert);
}

template <class Tr, bool Dense>
void run_sort(const Launch& L) {
  using K = typename Tr::Raw;
  runtime::Scratch keys(L.n * sizeof(K), L.stream), sorted(L.n * sizeof(K), L.stream);
  test_keys_kernel<Tr, K><<<grid_for_elements(L.n, L.sms), kThreads, 0, L.stream>>>(
      static_cast<const K*>(L.test.data), L.n, L.tidx, keys.as<K>());
  TESSERA_LAUNCH_CHECK();
  std::size_t temp_bytes = 0;
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, keys.as<K>(), sorted.as<K>(),
                                                    L.n, 0, int(8 * sizeof(K)), L.stream));
  runtime::Scratch temp(temp_bytes, L.stream);
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.data(), temp_bytes, keys.as<K>(), sorted.as<K>(),
                                                    L.n, 0, int(8 * sizeof(K)), L.stream));
  const int64_t stride = (L.n + kSamples - 1) / kSamples;
  search_kernel<Tr, Dense><<<grid_for_elements(L.m, L.sms), kThreads, 0, L.stream>>>(
      static_cast<const K*>(L.elements.data), static_cast<bool*>(L.out.data), L.m, L.idx,
      sorted.as<K>(), L.n, stride, L.invert);
}

template <class Tr, bool Dense>
void run_hash(const Launch& L) {
  using Raw = typename Tr::Raw;
  using H = std::conditional_t<sizeof(Raw) == 8, uint64_t, uint32_t>;
  int log2 = 10;
  while ((int64_t(1) << log2) < 2 * L.n) ++log2;  // load factor <= 1/2
  const int64_t slots = int64_t(1) << log2;
  runtime::Scratch table(slots * sizeof(H) + sizeof(int), L.stream);
  int* flag = reinterpret_cast<int*>(table.as<H>() + slots);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(table.data(), 0xFF, slots * sizeof(H), L.stream));
  TESSERA_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), L.stream));
  hash_insert_kernel<Tr, H><<<grid_for_elements(L.n, L.sms), kThreads, 0, L.stream>>>(
      static_cast<const Raw*>(L.test.data), L.n, L.tidx, table.as<H>(), uint64_t(slots - 1),
      64 - log2, flag);
  TESSERA_LAUNCH_CHECK();
  hash_lookup_kernel<Tr, Dense, H><<<grid_for_elements(L.m, L.sms), kThreads, 0, L.stream>>>(
      static_cast<const Raw*>(L.elements.data), static_cast<bool*>(L.out.data), L.m, L.idx,
      table.as<H>(), uint64_t(slots - 1), 64 - log2, flag, L.invert);
}

template <class Tr, bool Dense>
void run_bitmap(const Launch& L) {
  using Raw = typename Tr::Raw;
  runtime::Scratch bitmap(kBitmapWords * sizeof(unsigned), L.stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(bitmap.data(), 0, bitmap.bytes(), L.stream));
  // Few CTAs: each one clears and ORs an 8 KB bitmap.
  const long long want = (L.n + 16LL * kThreads - 1) / (16LL * kThreads);
  const auto grid = static_cast<unsigned>(want < 1 ? 1 : want < 2LL * L.sms ? want : 2LL * L.sms);
  bitmap_build_kernel<Tr><<<grid, kThreads, 0, L.stream>>>(static_cast<const Raw*>(L.test.data), L.n,
                                                          L.tidx, bitmap.as<unsigned>());
  TESSERA_LAUNCH_CHECK();
  bitmap_lookup_kernel<Tr, Dense><<<grid_for_elements(L.m, L.sms, 8), kThreads, 0, L.stream>>>(
      static_cast<const Raw*>(L.elements.data), static_cast<bool*>(L.out.data), L.m, L.idx,
      bitmap.as<unsigned>(), L.invert);
}

// Calls f(Tr{}, std::bool_constant<dense>{}) with the key traits Tr of dtype `dt`.
template <class F>
void with_keys(DType dt, bool dense, F&& f) {
  const auto go = [&](auto tr) {
    if (dense) f(tr, std::true_type{});
    else f(tr, std::false_type{});
  };
  switch (dt) {
    case DType::float32: return go(FloatKey<uint32_t, 8, 23>{});
    case DType::float64: return go(FloatKey<uint64_t, 11, 52>{});
    case DType::float16: return go(FloatKey<uint16_t, 5, 10>{});
    case DType::bfloat16: return go(FloatKey<uint16_t, 8, 7>{});
    case DType::int8: return go(IntKey<uint8_t, true>{});
    case DType::int16: return go(IntKey<uint16_t, true>{});
    case DType::int32: return go(IntKey<uint32_t, true>{});
    case DType::int64: return go(IntKey<uint64_t, true>{});
    default: return go(IntKey<uint8_t, false>{});  // uint8, bool
  }
}

// ---- the tiers, in the order they are tried ------------------------------------------------------
// Each takes the call when its path is asked for, or when the automatic choice falls to it.
struct Call {
  const Launch& L;
  DType dtype;
  const IsinOptions& o;
  bool automatic() const { return o.path == IsinPath::automatic; }
  bool small_work() const {
    return L.n <= o.brute_force_max_test && (L.n == 0 || L.m <= o.brute_force_max_work / L.n);
  }
};

struct GridPlan {
  int64_t m, n;
  std::string describe() const {
    return std::to_string(m) + " elements, " + std::to_string(n) + " test elements";
  }
};
// What every isin tier's plan is: the sizes (each path sizes its grids from them at launch).
struct SizesPlanned {
  static GridPlan plan(const Call& c, int) { return {c.L.m, c.L.n}; }
};

struct EmptyTier : SizesPlanned {
  static constexpr const char* kName = "empty";
  static constexpr const char* kWhen = "no test elements: nothing is found";
  static bool can_implement(const Call& c, int) { return c.L.n == 0; }
  static void launch(const Call& c, const GridPlan&, cudaStream_t s) {
    const Launch& L = c.L;
    bool* out = static_cast<bool*>(L.out.data);
    if (L.dense) fill_kernel<true><<<grid_for_elements(L.m, L.sms), kThreads, 0, s>>>(out, L.m, L.idx, L.invert);
    else fill_kernel<false><<<grid_for_elements(L.m, L.sms), kThreads, 0, s>>>(out, L.m, L.idx, L.invert);
  }
};

struct BruteForceTier : SizesPlanned {
  static constexpr const char* kName = "brute_force";
  static constexpr const char* kWhen = "few test elements and little work: compare against each";
  static bool can_implement(const Call& c, int) {
    return c.o.path == IsinPath::brute_force || (c.automatic() && c.small_work());
  }
  static void launch(const Call& c, const GridPlan&, cudaStream_t) {
    with_keys(c.dtype, c.L.dense, [&](auto tr, auto d) { run_brute_force<decltype(tr), d()>(c.L); });
  }
};

struct BitmapTier : SizesPlanned {
  static constexpr const char* kName = "bitmap";
  static constexpr const char* kWhen = "8- and 16-bit dtypes: a presence bit per key";
  static bool can_implement(const Call& c, int) {
    return c.o.path == IsinPath::bitmap || (c.automatic() && dtype_size(c.dtype) <= 2);
  }
  static void launch(const Call& c, const GridPlan&, cudaStream_t) {
    with_keys(c.dtype, c.L.dense, [&](auto tr, auto d) {
      using Tr = decltype(tr);
      if constexpr (sizeof(typename Tr::Raw) <= 2) run_bitmap<Tr, d()>(c.L);
    });
  }
};

struct HashTier : SizesPlanned {
  static constexpr const char* kName = "hash";
  static constexpr const char* kWhen = "32- and 64-bit dtypes, many test elements: a hash set";
  static bool can_implement(const Call& c, int) {
    return c.o.path == IsinPath::hash || (c.automatic() && c.L.n >= c.o.hash_min_test);
  }
  static void launch(const Call& c, const GridPlan&, cudaStream_t) {
    with_keys(c.dtype, c.L.dense, [&](auto tr, auto d) { run_hash<decltype(tr), d()>(c.L); });
  }
};

struct SortTier : SizesPlanned {
  static constexpr const char* kName = "sort";
  static constexpr const char* kWhen = "otherwise: sorted test keys and a binary search";
  static bool can_implement(const Call&, int) { return true; }
  static void launch(const Call& c, const GridPlan&, cudaStream_t) {
    with_keys(c.dtype, c.L.dense, [&](auto tr, auto d) { run_sort<decltype(tr), d()>(c.L); });
  }
};

bool is_dense_pair(const TensorView& out, const TensorView& elements) {
  return out.is_contiguous() && elements.is_contiguous();
}

}  // namespace

const char* isin_path_name(IsinPath path) {
  switch (path) {
    case IsinPath::automatic: return "automatic";
    case IsinPath::brute_force: return "brute_force";
    case IsinPath::sort: return "sort";
    case IsinPath::hash: return "hash";
    case IsinPath::bitmap: return "bitmap";
  }
  return "?";
}

IsinPath isin_choose_path(DType dtype, int64_t num_elements, int64_t num_test,
                          const IsinOptions& o) {
  if (o.path != IsinPath::automatic) return o.path;
  const TensorView none{};
  const Launch L{none, none, none, false, nullptr, 0, num_elements, num_test, {}, {}, true};
  const Call c{L, dtype, o};
  if (BruteForceTier::can_implement(c, 0)) return IsinPath::brute_force;
  if (BitmapTier::can_implement(c, 0)) return IsinPath::bitmap;
  return HashTier::can_implement(c, 0) ? IsinPath::hash : IsinPath::sort;
}

void isin(const TensorView& elements, const TensorView& test_elements, const TensorView& out,
          bool assume_unique, bool invert, cudaStream_t stream, const IsinOptions& options) {
  (void)assume_unique;  // see the header: no path depends on it
  runtime::NvtxRange range("tessera::isin");
  const char* op = "isin";
  detail::check_cuda_tensor(op, "elements", elements);
  detail::check_dtype_in(op, "elements", elements,
                         {DType::int8, DType::int16, DType::int32, DType::int64, DType::uint8,
                          DType::bool_, DType::float16, DType::bfloat16, DType::float32, DType::float64});
  detail::check_cuda_tensor(op, "test_elements", test_elements);
  detail::check_same_device(op, "test_elements", test_elements, "elements", elements);
  detail::check_same_dtype(op, "test_elements", test_elements, "elements", elements);
  detail::check_cuda_tensor(op, "out", out);
  detail::check_same_device(op, "out", out, "elements", elements);
  detail::check_dtype_in(op, "out", out, {DType::bool_});
  detail::check_same_shape(op, "out", out, "elements", elements);
  detail::check_no_internal_overlap(op, "out", out);
  detail::check_no_overlap(op, "out", out, "elements", elements, false);
  detail::check_no_overlap(op, "out", out, "test_elements", test_elements, false);
  if (options.path == IsinPath::bitmap && dtype_size(elements.dtype) > 2)
    detail::throw_arg(ErrorKind::value, op, "options.path",
                      "a path other than bitmap for a dtype wider than 16 bits",
                      std::string("bitmap for ") + dtype_name(elements.dtype));
  const int64_t m = elements.numel(), n = test_elements.numel();
  if (m == 0) return;

  runtime::DeviceGuard guard(elements.device.index);
  const int sms = runtime::device_props(elements.device.index).multiProcessorCount;
  Launch L{elements, test_elements, out, invert, stream, sms, m, n,
           runtime::make_indexer<2>({&out, &elements}), runtime::make_indexer<1>({&test_elements}),
           is_dense_pair(out, elements)};
  runtime::run_first<EmptyTier, BruteForceTier, BitmapTier, HashTier, SortTier>(
      "isin", Call{L, elements.dtype, options}, elements.device.index, stream);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace tessera

namespace tessera {

void parse(const char* op, std::string_view name, IsinPath& out) {
  for (IsinPath p : {IsinPath::automatic, IsinPath::brute_force, IsinPath::sort, IsinPath::hash, IsinPath::bitmap})
    if (name == isin_path_name(p)) return void(out = p);
  detail::throw_arg(ErrorKind::value, op, "path", "'automatic', 'brute_force', 'sort', 'hash' or 'bitmap'",
                    "'" + std::string(name) + "'");
}

namespace {
// isin with its options as the schema's arguments: the description's kernel.
void isin_op(const TensorView& elements, const TensorView& test_elements, const TensorView& out, bool assume_unique,
             bool invert, IsinPath path, int64_t brute_force_max_test, int64_t brute_force_max_work,
             int64_t hash_min_test, cudaStream_t stream) {
  IsinOptions o;
  o.path = path;
  o.brute_force_max_test = brute_force_max_test;
  o.brute_force_max_work = brute_force_max_work;
  o.hash_min_test = hash_min_test;
  isin(elements, test_elements, out, assume_unique, invert, stream, o);
}

const IsinOptions kIsinDefaults;
const OpRegistrar kIsin = describe("isin", "set", "torch.isin: elements in test_elements")
    .schema("isin(Tensor elements, Tensor test_elements, *, bool assume_unique=False, bool invert=False, "
            "str path='automatic', int brute_force_max_test=" + std::to_string(kIsinDefaults.brute_force_max_test) +
            ", int brute_force_max_work=" + std::to_string(kIsinDefaults.brute_force_max_work) +
            ", int hash_min_test=" + std::to_string(kIsinDefaults.hash_min_test) + ") -> Tensor")
    .kernel<&isin_op>({"elements", "test_elements", "out", "assume_unique", "invert", "path", "brute_force_max_test",
                       "brute_force_max_work", "hash_min_test"},
                      {out::mask("out", "elements")})
    .dtypes({DType::int32, DType::int64, DType::int8, DType::int16, DType::uint8, DType::float16,
             DType::bfloat16, DType::float32, DType::float64})
    .torch("torch.isin");
}  // namespace
}  // namespace tessera
