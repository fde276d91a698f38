// The Hopper GEMM kernel's tf32 (float32 inputs, where TF32 is allowed) and fp8 instances, in a
// file of their own so that they compile beside the 16-bit ones (gemm_sm90.cu).
#include "ops/matrix/gemm_sm90_launch.cuh"

namespace tessera::matrix::sm90 {

template void launch_sm90<float>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_sm90<__nv_fp8_e4m3>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_sm90<__nv_fp8_e5m2>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);

}  // namespace tessera::matrix::sm90
