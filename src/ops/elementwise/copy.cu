// copy: dst = src between any two layouts of one shape. Three tiers: dense-to-dense is one
// cudaMemcpyAsync; a transpose (src's contiguous dimension is another of dst's, as in a
// column-major view copied into a row-major one) goes through shared-memory tiles, so that both
// the reads and the writes are coalesced; anything else moves raw elements (any dtype, as 1-, 2-,
// 4- or 8-byte words) through the strided indexer. The row-wise operators use it to gather a strided input into
// contiguous scratch memory and to scatter a result back.
#include <cstdint>
#include <string>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/indexing.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

constexpr int kCopyThreads = 256;

template <class W>
__global__ __launch_bounds__(kCopyThreads) void copy_strided_kernel(const W* __restrict__ src,
                                                                    W* __restrict__ dst, int64_t n,
                                                                    tile::StridedIndexer<2> idx) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    idx.offsets(i, off);
    dst[off[0]] = src[off[1]];
  }
}

// A transpose of up to one batch dimension: dst[b, r, c] = src[b, r, c] where dst's columns c and
// src's rows r are contiguous. A CTA moves a kTile x kTile tile: it reads src a column of the tile
// per warp instruction (along r, contiguous), and writes dst a row (along c, contiguous); the
// shared tile's rows are padded by one word so that both passes hit distinct banks.
constexpr int kTile = 32, kTileRows = 8;

struct Transposed {
  int64_t batch, rows, cols;
  int64_t src_b, src_c;  // src's strides (its row stride is 1)
  int64_t dst_b, dst_r;  // dst's strides (its column stride is 1)
};

template <class W>
__global__ __launch_bounds__(kTile * kTileRows) void copy_transpose_kernel(const W* __restrict__ src,
                                                                         W* __restrict__ dst,
                                                                         Transposed t) {
  __shared__ W tile[kTile][kTile + 1];
  const int64_t r0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile;
  const int64_t b = blockIdx.z;
  const int tx = threadIdx.x, ty = threadIdx.y;
  src += b * t.src_b;
  dst += b * t.dst_b;
  for (int j = ty; j < kTile; j += kTileRows) {  // tile[c][r] from src column c0 + j
    const int64_t r = r0 + tx, c = c0 + j;
    if (r < t.rows && c < t.cols) tile[j][tx] = src[r + c * t.src_c];
  }
  __syncthreads();
  for (int j = ty; j < kTile; j += kTileRows) {  // dst row r0 + j
    const int64_t r = r0 + j, c = c0 + tx;
    if (r < t.rows && c < t.cols) dst[r * t.dst_r + c] = tile[tx][j];
  }
}

struct Copy {
  const TensorView& src;
  const TensorView& dst;
};

// Calls f(W{}) with the unsigned word type of an element of `dtype`: copies move raw bits.
template <class F>
void with_word(DType dtype, F&& f) {
  switch (dtype_size(dtype)) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f(uint64_t{}); break;
  }
}

// The transpose that `c` is, if it is one: at most three dimensions once merged, dst's last one
// contiguous and src's second to last.
bool as_transpose(const Copy& c, Transposed& t) {
  const auto idx = runtime::make_indexer<2>({&c.dst, &c.src});
  const int nd = idx.ndim;
  if (nd < 2 || nd > 3 || idx.strides[0][nd - 1] != 1 || idx.strides[1][nd - 2] != 1) return false;
  t.batch = nd == 3 ? idx.shape[0] : 1;
  t.rows = idx.shape[nd - 2], t.cols = idx.shape[nd - 1];
  t.src_b = nd == 3 ? idx.strides[1][0] : 0, t.src_c = idx.strides[1][nd - 1];
  t.dst_b = nd == 3 ? idx.strides[0][0] : 0, t.dst_r = idx.strides[0][nd - 2];
  return t.batch <= 65535 && runtime::ceil_div(t.cols, kTile) <= 65535;
}

struct CopyPlan {
  int64_t bytes = 0;  // memcpy tier
  unsigned grid = 0;  // strided tier
  std::string describe() const {
    return grid ? std::to_string(grid) + " CTAs of " + std::to_string(kCopyThreads) + " threads"
                : std::to_string(bytes) + " bytes";
  }
};

struct MemcpyTier {
  static constexpr const char* kName = "memcpy";
  static constexpr const char* kWhen = "both dense: one device-to-device copy";
  static bool can_implement(const Copy& c, int) { return c.src.is_contiguous() && c.dst.is_contiguous(); }
  static CopyPlan plan(const Copy& c, int) { return {c.dst.numel() * int64_t(dtype_size(c.dst.dtype)), 0}; }
  static void launch(const Copy& c, const CopyPlan& p, cudaStream_t s) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(c.dst.data, c.src.data, static_cast<std::size_t>(p.bytes),
                                       cudaMemcpyDeviceToDevice, s));
  }
};

struct TransposeTier {
  static constexpr const char* kName = "transpose";
  static constexpr const char* kWhen =
      "a transpose of the last two dimensions (after merging), at most one batch dimension: "
      "32 x 32 tiles through shared memory";
  static bool can_implement(const Copy& c, int) {
    Transposed t;
    return as_transpose(c, t);
  }
  static CopyPlan plan(const Copy& c, int) {
    Transposed t;
    as_transpose(c, t);
    return {0, static_cast<unsigned>(runtime::ceil_div(t.rows, kTile) * runtime::ceil_div(t.cols, kTile) * t.batch)};
  }
  template <class W>
  static void run(const Copy& c, const Transposed& t, cudaStream_t s) {
    const dim3 grid(unsigned(runtime::ceil_div(t.rows, kTile)), unsigned(runtime::ceil_div(t.cols, kTile)),
                    unsigned(t.batch));
    copy_transpose_kernel<W><<<grid, dim3(kTile, kTileRows), 0, s>>>(
        static_cast<const W*>(c.src.data), static_cast<W*>(c.dst.data), t);
  }
  static void launch(const Copy& c, const CopyPlan&, cudaStream_t s) {
    Transposed t;
    as_transpose(c, t);
    with_word(c.dst.dtype, [&](auto w) { run<decltype(w)>(c, t, s); });
    TESSERA_LAUNCH_CHECK();
  }
};

// Raw elements (any dtype, as words of its width) through the strided indexer.
struct StridedTier {
  static constexpr const char* kName = "strided";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const Copy&, int) { return true; }
  static CopyPlan plan(const Copy& c, int device) {
    const long long blocks = runtime::ceil_div(c.dst.numel(), kCopyThreads);
    const long long cap = 32LL * runtime::device_props(device).multiProcessorCount;
    return {0, static_cast<unsigned>(blocks < cap ? blocks : cap)};
  }
  template <class W>
  static void run(const Copy& c, const CopyPlan& p, cudaStream_t s) {
    copy_strided_kernel<W><<<p.grid, kCopyThreads, 0, s>>>(static_cast<const W*>(c.src.data),
                                                            static_cast<W*>(c.dst.data), c.dst.numel(),
                                                            runtime::make_indexer<2>({&c.dst, &c.src}));
  }
  static void launch(const Copy& c, const CopyPlan& p, cudaStream_t s) {
    with_word(c.dst.dtype, [&](auto w) { run<decltype(w)>(c, p, s); });
    TESSERA_LAUNCH_CHECK();
  }
};

}  // namespace

void copy(const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::copy");
  detail::check_cuda_tensor("copy", "src", src);
  detail::check_like("copy", "dst", dst, "src", src);
  detail::check_no_internal_overlap("copy", "dst", dst);
  detail::check_no_overlap("copy", "dst", dst, "src", src, /*allow_identical=*/true);
  if (dst.numel() == 0 || detail::same_view(src, dst)) return;
  runtime::DeviceGuard guard(dst.device.index);
  runtime::run_first<MemcpyTier, TransposeTier, StridedTier>("copy", Copy{src, dst}, dst.device.index, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
const OpRegistrar kCopy = describe("copy", "elementwise", "dst = src between any two layouts of one shape")
    .schema("copy(Tensor src, Tensor(a!) dst) -> ()")
    .kernel<&copy>({"src", "dst"}, {});
}  // namespace
}  // namespace tessera
