// The torch ops' CUDA kernels that tessera._torch_fast calls without the dispatcher (fast.cpp):
// the public functions' calls that autograd will not record, on plain CUDA tensors. Defined by the
// family files next to the ops' kernels; each is the op's CUDA kernel. (The ops of the generic
// kernel need none of these: fast.cpp runs their plan.)
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace tessera::torch_ops::fast {

at::Tensor matmul(const at::Tensor& input, const at::Tensor& other,
                  const std::optional<at::Tensor>& bias);
at::Tensor mlp(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out, c10::string_view activation);
at::Tensor scaled_mm(const at::Tensor& input, const at::Tensor& other, const at::Tensor& scale_a,
                     const at::Tensor& scale_b, std::optional<at::ScalarType> out_dtype);
std::vector<at::Tensor> float8_quantize(const at::Tensor& input, c10::string_view granularity, bool columns,
                                        bool rows);
std::vector<at::Tensor> float8_quantize_gated(const at::Tensor& gate, const at::Tensor& up,
                                              c10::string_view activation, c10::string_view granularity,
                                              bool columns);
// (y, residual_out, rstd, q, scale, q_t, scale_t): undefined where not asked for.
std::vector<at::Tensor> rms_norm_float8(const at::Tensor& input, const at::Tensor* residual, const at::Tensor& weight,
                                        double eps, double weight_offset, c10::string_view granularity, bool columns);
// (grad_gate, grad_up, then q, scale, q_t, scale_t of each).
std::vector<at::Tensor> float8_quantize_gated_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                                       const at::Tensor& up, c10::string_view activation,
                                                       c10::string_view granularity);

}  // namespace tessera::torch_ops::fast
