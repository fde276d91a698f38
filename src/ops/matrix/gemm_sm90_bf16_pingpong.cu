// The Hopper GEMM kernel's bfloat16 instances, pingpong schedule: every operand layout, both output
// dtypes (gemm_sm90_instance.cuh).
#include "ops/matrix/gemm_sm90_instance.cuh"

template void tessera::matrix::sm90::launch_layout<__nv_bfloat16, tessera::matrix::sm90::PingPong>(
    const tessera::matrix::GemmArgs&, const tessera::matrix::Sm90Tier::Plan&, cudaStream_t);
