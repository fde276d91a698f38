// copy: dst = src between any two layouts of one shape. Dense-to-dense is one cudaMemcpyAsync;
// anything else moves raw elements (any dtype, as 1-, 2-, 4- or 8-byte words) through the strided
// indexer. The row-wise operators use it to gather a strided input into contiguous scratch memory
// and to scatter a result back.
#include <cstdint>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
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

template <class W>
void launch_copy(const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  const int64_t n = dst.numel();
  const int sms = runtime::device_props(dst.device.index).multiProcessorCount;
  const long long blocks = (n + kCopyThreads - 1) / kCopyThreads;
  const auto grid = static_cast<unsigned>(blocks < 32LL * sms ? blocks : 32LL * sms);
  copy_strided_kernel<W><<<grid, kCopyThreads, 0, stream>>>(
      static_cast<const W*>(src.data), static_cast<W*>(dst.data), n,
      runtime::make_indexer<2>({&dst, &src}));
}

}  // namespace

void copy(const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::copy");
  detail::check_cuda_tensor("copy", "src", src);
  detail::check_like("copy", "dst", dst, "src", src);
  detail::check_no_internal_overlap("copy", "dst", dst);
  detail::check_no_overlap("copy", "dst", dst, "src", src, /*allow_identical=*/true);
  if (dst.numel() == 0 || detail::same_view(src, dst)) return;
  runtime::DeviceGuard guard(dst.device.index);
  if (src.is_contiguous() && dst.is_contiguous()) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.numel() * dtype_size(dst.dtype),
                                       cudaMemcpyDeviceToDevice, stream));
    return;
  }
  switch (dtype_size(dst.dtype)) {
    case 1: launch_copy<uint8_t>(src, dst, stream); break;
    case 2: launch_copy<uint16_t>(src, dst, stream); break;
    case 4: launch_copy<uint32_t>(src, dst, stream); break;
    default: launch_copy<uint64_t>(src, dst, stream); break;
  }
  TESSERA_LAUNCH_CHECK();
}

}  // namespace tessera
