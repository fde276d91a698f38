// LayerNorm and RMSNorm forward, float16 (norm_forward.cuh).
#include "ops/rowwise/norm_forward.cuh"

namespace tessera::norm {

template void forward<__half>(const char*, const AddFwdParams<__half>&, bool, bool, const Ctx&, cudaStream_t);
template bool forward_float8<__half>(const char*, const MaxFwdParams<__half>&, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
