// The torch ops' CUDA kernels that tessera._torch_fast calls without the dispatcher (fast.cpp):
// the public functions' calls that need no autograd, on plain CUDA tensors. Defined by the family
// files next to the ops' kernels; each is the op's CUDA kernel, except that the norms compute no
// statistics (nothing will ask for them).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace tessera::torch_ops::fast {

at::Tensor add(const at::Tensor& input, const at::Tensor& other, double alpha);
at::Tensor add_scalar(const at::Tensor& input, double other, double alpha);
at::Tensor layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                      double eps);
at::Tensor rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                    const std::optional<at::Tensor>& weight, double eps);
// (out, residual_out)
std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& input, const at::Tensor& residual,
                                                  const std::optional<at::Tensor>& weight,
                                                  const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                const std::optional<at::Tensor>& weight, double eps);
at::Tensor matmul(const at::Tensor& input, const at::Tensor& other,
                  const std::optional<at::Tensor>& bias);
at::Tensor mlp(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out, c10::string_view activation);

}  // namespace tessera::torch_ops::fast
