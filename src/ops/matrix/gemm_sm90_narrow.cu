// The Hopper GEMM kernel's tf32 (float32 inputs, where TF32 is allowed) and fp8 instances, both
// schedules (gemm_sm90_instance.cuh).
#include "ops/matrix/gemm_sm90_instance.cuh"

namespace tessera::matrix::sm90 {

template void launch_layout<float, Cooperative>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_layout<float, PingPong>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_layout<__nv_fp8_e4m3, Cooperative>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_layout<__nv_fp8_e4m3, PingPong>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_layout<__nv_fp8_e5m2, Cooperative>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_layout<__nv_fp8_e5m2, PingPong>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);

}  // namespace tessera::matrix::sm90
