// copy: dst = src between any two layouts of one shape. Two tiers: dense-to-dense is one
// cudaMemcpyAsync; anything else moves raw elements (any dtype, as 1-, 2-, 4- or 8-byte words)
// through the strided indexer. The row-wise operators use it to gather a strided input into
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

struct Copy {
  const TensorView& src;
  const TensorView& dst;
};

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
    switch (dtype_size(c.dst.dtype)) {
      case 1: run<uint8_t>(c, p, s); break;
      case 2: run<uint16_t>(c, p, s); break;
      case 4: run<uint32_t>(c, p, s); break;
      default: run<uint64_t>(c, p, s); break;
    }
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
  runtime::run_first<MemcpyTier, StridedTier>("copy", Copy{src, dst}, dst.device.index, stream);
}

}  // namespace tessera
