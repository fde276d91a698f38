// The L2 flush of time_op: read a buffer of twice the L2 before each timed rep.
//
// Reading, not writing: a memset leaves the L2 full of dirty lines, and the op timed next pays for
// writing them back to HBM as its own traffic displaces them. After a read the L2 holds clean
// lines of this buffer: the op finds none of its data there and evicts for free, as after ncu's
// cache control.
#include <cstdint>

#include "bench/flush.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"

namespace tessera::bench {
namespace {

// Grid-stride 16-byte loads. The XOR of all words is stored only if it equals `key`, which the
// caller picks so that the store practically never happens; the loads cannot be dropped because
// the comparison depends on every one of them.
__global__ void read_flush_kernel(const uint4* buf, int64_t n, uint32_t key, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = buf[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == key) *sink = acc;
}

}  // namespace

L2Flush::L2Flush(int device) {
  const std::size_t l2 = static_cast<std::size_t>(runtime::device_props(device).l2CacheSize);
  if (l2 == 0) return;
  buffer_ = runtime::DeviceBuffer(2 * l2 + sizeof(uint4));
  blocks_ = 4 * runtime::device_props(device).multiProcessorCount;
}

void L2Flush::run(cudaStream_t stream) const {
  if (!buffer_.data()) return;
  // The sink is the buffer's last 16 bytes, outside the part that is read.
  auto* base = static_cast<unsigned char*>(buffer_.data());
  const std::size_t read_bytes = buffer_.bytes() - sizeof(uint4);
  read_flush_kernel<<<blocks_, 512, 0, stream>>>(reinterpret_cast<const uint4*>(base),
                                                 static_cast<int64_t>(read_bytes / sizeof(uint4)),
                                                 0x5eed1e55u, reinterpret_cast<uint32_t*>(base + read_bytes));
  TESSERA_LAUNCH_CHECK();
}

}  // namespace tessera::bench
