// LayerNorm and RMSNorm backward, float32 (norm_backward.cuh).
#include "ops/rowwise/norm_backward.cuh"

namespace tessera::norm {

template void launch_backward(const BwdArgs<float>&, const BwdPlan<BwdParams<float>>&, cudaStream_t);
template void launch_backward(const BwdArgs<float>&, const BwdPlan<AddBwdParams<float>>&, cudaStream_t);
template void backward<float>(const char*, const BwdArgs<float>&, bool, bool, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
