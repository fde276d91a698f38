// LayerNorm and RMSNorm backward, float16 (norm_backward.cuh).
#include "ops/rowwise/norm_backward.cuh"

namespace tessera::norm {

template void launch_backward(const BwdArgs<__half>&, const BwdPlan<BwdParams<__half>>&, cudaStream_t);
template void launch_backward(const BwdArgs<__half>&, const BwdPlan<AddBwdParams<__half>>&, cudaStream_t);
template void backward<__half>(const char*, const BwdArgs<__half>&, bool, bool, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
