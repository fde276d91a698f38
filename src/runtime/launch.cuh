// Programmatic dependent launch (sm_90): a kernel that consumes the previous kernel's output on the
// same stream can be launched so that its CTAs are scheduled while that kernel's last CTAs are
// still running, instead of after the whole grid has retired and the launch has gone through the
// front end (~2-4 us on an H200, a few percent of a 60 us op whose second kernel is short). The
// dependent kernel calls wait_for_previous_grid() before it reads what the previous one wrote:
// that returns once the previous grid has completed and its memory operations are visible.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "runtime/check.hpp"
#include "runtime/device.hpp"

namespace tessera::runtime {

// In the dependent kernel, before its first read of the previous kernel's results. A no-op
// before sm_90 and when the kernel was launched normally.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// In the kernel that a launch_dependent kernel follows: lets the dependent grid be scheduled now
// (its CTAs take SMs as this grid's CTAs leave them and then wait in wait_for_previous_grid),
// rather than when every CTA of this grid has exited. A no-op before sm_90 and when no dependent
// launch follows.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the
// previous work on `stream` where `device` supports it (sm_90+), normally elsewhere.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                      cudaStream_t stream, int device, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = device_props(device).major >= 9 ? 1 : 0;
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace tessera::runtime
