// softmax and log_softmax, forward and backward, float16 (softmax_tiers.cuh).
#include "ops/rowwise/softmax_tiers.cuh"

namespace tessera::softmax_detail {

template void run<SoftmaxOp<false>, __half>(const TensorView&, const std::array<TensorView, 1>&, int, cudaStream_t);
template void run<SoftmaxOp<true>, __half>(const TensorView&, const std::array<TensorView, 1>&, int, cudaStream_t);
template void run<SoftmaxBackwardOp<false>, __half>(const TensorView&, const std::array<TensorView, 2>&, int, cudaStream_t);
template void run<SoftmaxBackwardOp<true>, __half>(const TensorView&, const std::array<TensorView, 2>&, int, cudaStream_t);

}  // namespace tessera::softmax_detail
