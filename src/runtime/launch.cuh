// Launch helpers beyond <<<>>>: thread-block clusters, and programmatic dependent launch.
//
// Programmatic dependent launch (sm_90): a kernel that consumes the previous kernel's output on the
// same stream is launched as soon as that kernel's CTAs have exited, without waiting for the grid's
// completion to go through the front end first; a short second kernel of an op otherwise adds its
// whole launch latency (the norm backward's column sums). The dependent kernel calls
// wait_for_previous_grid() before it reads what the previous one wrote: that returns once the
// previous grid has completed and its memory operations are visible.
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

// kernel<<<grid, block, smem, stream>>>(args...) with launch attributes (cudaLaunchKernelEx).
template <class... Params, class... Args>
void launch_with(const cudaLaunchAttribute* attrs, int num_attrs, void (*kernel)(Params...), dim3 grid,
                 dim3 block, std::size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = const_cast<cudaLaunchAttribute*>(attrs);
  cfg.numAttrs = static_cast<unsigned>(num_attrs);
  TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the
// previous work on `stream` where `device` supports it (sm_90+), normally elsewhere.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                      cudaStream_t stream, int device, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  launch_with(&attr, device_props(device).major >= 9 ? 1 : 0, kernel, grid, block, smem, stream,
              std::forward<Args>(args)...);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) in clusters of `cluster` CTAs along x
// (sm_90; grid.x a multiple of cluster; sizes over 8 need active_clusters to have allowed them).
template <class... Params, class... Args>
void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, int cluster,
                    cudaStream_t stream, Args&&... args) {
  const cudaLaunchAttribute attr = cluster_attribute(cluster);
  launch_with(&attr, 1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace tessera::runtime
