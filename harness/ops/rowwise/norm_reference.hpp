// CPU references for LayerNorm and RMSNorm, in double precision. Inputs are host views of any
// float dtype and any strides (float64 too, for gradient checks); x's last `normalized_ndim`
// dimensions form rows of N elements, weight/bias have the normalized shape, mean/rstd the
// leading shape. Results are row-major: out and grad_in over x's shape, mean and rstd over the
// leading shape, grad_weight and grad_bias over the normalized shape.
#pragma once

#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

struct LayerNormResult {
  std::vector<double> out, mean, rstd;
};
// weight, bias: nullptr for none. Biased variance, computed around the mean (two passes).
LayerNormResult layer_norm(const TensorView& x, int normalized_ndim, const TensorView* weight,
                           const TensorView* bias, double eps);

struct LayerNormGrads {
  std::vector<double> grad_in, grad_weight, grad_bias;
};
// Gradients given the saved mean and rstd (used as given, as the operator does).
LayerNormGrads layer_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                                   const TensorView& mean, const TensorView& rstd, const TensorView* weight);

struct RmsNormResult {
  std::vector<double> out, rstd;
};
// weight_offset is added to each weight (rms_norm's Gemma offset).
RmsNormResult rms_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, double eps,
                       double weight_offset = 0);

struct RmsNormGrads {
  std::vector<double> grad_in, grad_weight;
};
RmsNormGrads rms_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                               const TensorView& rstd, const TensorView* weight, double weight_offset = 0);

// add_layer_norm and add_rms_norm: residual_out = input + residual rounded to input's dtype (as
// torch's input + residual, and the operator, store it), normalized over the last dimension.
struct AddNormResult {
  std::vector<double> residual_out, out, mean, rstd;  // mean: add_layer_norm only
};
AddNormResult add_layer_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                             const TensorView* bias, double eps);
AddNormResult add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                           double eps);

// Their gradients, given residual_out and the saved statistics: grad_in is the norm's gradient
// plus grad_residual_out (nullptr: none), the gradient of both input and residual.
LayerNormGrads add_layer_norm_backward(const TensorView& grad_out, const TensorView* grad_residual_out,
                                       const TensorView& residual_out, const TensorView& mean,
                                       const TensorView& rstd, const TensorView* weight);
RmsNormGrads add_rms_norm_backward(const TensorView& grad_out, const TensorView* grad_residual_out,
                                   const TensorView& residual_out, const TensorView& rstd, const TensorView* weight);

}  // namespace tessera::reference
