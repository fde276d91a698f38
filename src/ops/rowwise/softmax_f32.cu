// softmax and log_softmax, forward and backward, float32 (softmax_tiers.cuh).
#include "ops/rowwise/softmax_tiers.cuh"

namespace tessera::softmax_detail {

template void run<SoftmaxOp<false>, float>(const TensorView&, const std::array<TensorView, 1>&, int, cudaStream_t);
template void run<SoftmaxOp<true>, float>(const TensorView&, const std::array<TensorView, 1>&, int, cudaStream_t);
template void run<SoftmaxBackwardOp<false>, float>(const TensorView&, const std::array<TensorView, 2>&, int, cudaStream_t);
template void run<SoftmaxBackwardOp<true>, float>(const TensorView&, const std::array<TensorView, 2>&, int, cudaStream_t);

}  // namespace tessera::softmax_detail
