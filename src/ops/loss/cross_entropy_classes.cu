// cross_entropy's per-class mode (cross_entropy.cuh, Mode::classes): probability targets, and
// class weights with label smoothing. Each pass reads the class weights (4 bytes a class, shared
// by every row, so from L2) and the row's probabilities beside its logits (as many bytes again);
// the cap is a runtime test here. One kernel for every CTA size, its size a launch argument, as
// the soft-capped one: a rarer call than the plain kernels', not worth a copy per size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/loss/cross_entropy.cuh"

namespace tessera::ce {

template <class T, int VW, bool kSplit>
void launch_classes(const CeArgs& a, int threads, unsigned grid, cudaStream_t stream) {
  cross_entropy_kernel<T, VW, 0, kSplit, Mode::classes><<<grid, threads, 0, stream>>>(a);
}

#define TESSERA_CE_CLASSES(T)                                                           \
  template void launch_classes<T, 1, false>(const CeArgs&, int, unsigned, cudaStream_t); \
  template void launch_classes<T, 16 / sizeof(T), false>(const CeArgs&, int, unsigned, cudaStream_t); \
  template void launch_classes<T, 16 / sizeof(T), true>(const CeArgs&, int, unsigned, cudaStream_t);
TESSERA_CE_CLASSES(float)
TESSERA_CE_CLASSES(__half)
TESSERA_CE_CLASSES(__nv_bfloat16)
#undef TESSERA_CE_CLASSES

}  // namespace tessera::ce
