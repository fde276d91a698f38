// The Hopper GEMM kernel's instances for float8 e4m3 inputs with block-wise scales (the
// block-scaled schedule, gemm_sm90_work.cuh; gemm_sm90_instance.cuh).
#include "ops/matrix/gemm_sm90_instance.cuh"

namespace tessera::matrix::sm90 {

template void launch_layout<__nv_fp8_e4m3, BlockScaled>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);

}  // namespace tessera::matrix::sm90
