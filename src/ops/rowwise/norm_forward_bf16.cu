// LayerNorm and RMSNorm forward, bfloat16 (norm_forward.cuh).
#include "ops/rowwise/norm_forward.cuh"

namespace tessera::norm {

template void forward<__nv_bfloat16>(const char*, const AddFwdParams<__nv_bfloat16>&, bool, bool, const Ctx&, cudaStream_t);
template bool forward_float8<__nv_bfloat16>(const char*, const MaxFwdParams<__nv_bfloat16>&, const Ctx&, cudaStream_t);

}  // namespace tessera::norm
