// LayerNorm and RMSNorm backward, bfloat16 (norm_backward.cuh).
#include "ops/rowwise/norm_backward.cuh"

namespace tessera::norm {

template void launch_backward(const BwdArgs<__nv_bfloat16>&, const BwdPlan<BwdParams<__nv_bfloat16>>&, cudaStream_t);
template void launch_backward(const BwdArgs<__nv_bfloat16>&, const BwdPlan<AddBwdParams<__nv_bfloat16>>&, cudaStream_t);
template void backward<__nv_bfloat16>(const char*, const BwdArgs<__nv_bfloat16>&, bool, bool, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
