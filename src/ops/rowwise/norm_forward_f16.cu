// LayerNorm and RMSNorm forward, float16 (norm_forward.cuh).
#include "ops/rowwise/norm_forward.cuh"

namespace tessera::norm {

template void forward<__half>(const char*, const AddFwdParams<__half>&, bool, bool, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
