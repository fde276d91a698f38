// NVTX range around each operator call, so Nsight and profilers show tessera's names.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace tessera::runtime {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace tessera::runtime
