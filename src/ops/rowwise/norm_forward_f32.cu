// LayerNorm and RMSNorm forward, float32 (norm_forward.cuh).
#include "ops/rowwise/norm_forward.cuh"

namespace tessera::norm {

template void forward<float>(const char*, const AddFwdParams<float>&, bool, bool, const Ctx&, cudaStream_t);
template bool forward_float8<float>(const char*, const MaxFwdParams<float>&, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
