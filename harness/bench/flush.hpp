// L2 flush for time_op (flush.cu says why it reads rather than writes).
#pragma once

#include <cuda_runtime.h>

#include "runtime/memory.hpp"

namespace tessera::bench {

class L2Flush {
 public:
  L2Flush() = default;
  explicit L2Flush(int device);  // a buffer of twice the device's L2 (none if it reports no L2)
  // Enqueues the read of the whole buffer on `stream`; nothing without a buffer.
  void run(cudaStream_t stream) const;

 private:
  runtime::DeviceBuffer buffer_;
  int blocks_ = 0;
};

}  // namespace tessera::bench
