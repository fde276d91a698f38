// The Mixture-of-Experts family as torch ops: moe_permute and moe_unpermute, whose outputs have
// rows' count of rows (T k pairs, T tokens) and so take kernels written here; their backwards are
// described with kernels (generic.cpp). Each forward's autograd calls its
// backward op through the dispatcher, so torch.compile and the profiler see it. Schemas: the
// descriptions' (src/ops/moe/permute.cu).
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <tuple>
#include <vector>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Library = void (*)(const TensorView&, const TensorView&, const TensorView*, const TensorView&, cudaStream_t);

// out [rows, H] for input [*, H] and rows [T, k]: T k rows (permute) or T (unpermute); other
// ranks a 0-d stand-in, which the library refuses after naming the argument at fault.
at::Tensor pairs_call(const char* op, Library fn, bool permute, const at::Tensor& input, const at::Tensor& rows,
                      const OptTensor& weight) {
  TensorView w;
  const TensorView x = view(op, "input", input), r = view(op, "rows", rows);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  const bool ok = input.dim() == 2 && rows.dim() == 2;
  std::vector<int64_t> shape;
  if (ok) shape = {permute ? rows.size(0) * rows.size(1) : rows.size(0), input.size(1)};
  at::Tensor out = at::empty(shape, input.options());
  guarded([&] { fn(x, r, wp, view(op, "out", out), stream_of(input)); });
  return out;
}

at::Tensor moe_permute(const at::Tensor& input, const at::Tensor& rows, const OptTensor& weight) {
  return pairs_call("moe_permute", &tessera::moe_permute, true, input, rows, weight);
}

at::Tensor moe_unpermute(const at::Tensor& input, const at::Tensor& rows, const OptTensor& weight) {
  return pairs_call("moe_unpermute", &tessera::moe_unpermute, false, input, rows, weight);
}

using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                       const OptTensor&);

// One autograd node for either op: the backward op `Backward` (moe_<op>_backward) gives the
// input's gradient and, where weight is given, the weight's.
template <const char* Forward, const char* Backward>
struct PairsFunction : torch::autograd::Function<PairsFunction<Forward, Backward>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rows,
                            const OptTensor& weight) {
    static const auto op = handle<ForwardSig>(Forward);
    ctx->save_for_backward({input, rows, weight.value_or(at::Tensor())});
    return call_below_autograd(op, input, rows, weight);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = handle<BackwardSig>(Backward);
    const auto saved = ctx->get_saved_variables();
    const OptTensor weight = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    auto [grad_input, grad_weight] = op.call(grads[0].contiguous(), saved[0], saved[1], weight);
    // An absent weight is no input of the node: needs_input_grad(2) would index past its inputs.
    return {grad_input, at::Tensor(), weight && ctx->needs_input_grad(2) ? grad_weight : at::Tensor()};
  }
};

constexpr char kPermute[] = "moe_permute", kPermuteBackward[] = "moe_permute_backward";
constexpr char kUnpermute[] = "moe_unpermute", kUnpermuteBackward[] = "moe_unpermute_backward";

template <const char* Forward, const char* Backward>
at::Tensor autograd_of(const at::Tensor& input, const at::Tensor& rows, const OptTensor& weight) {
  static const auto op = handle<ForwardSig>(Forward);
  if (!records(input, weight)) return call_below_autograd(op, input, rows, weight);
  return PairsFunction<Forward, Backward>::apply(input, rows, weight);
}

void kernels(torch::Library& m) {
  m.impl("moe_permute", &moe_permute);
  m.impl("moe_unpermute", &moe_unpermute);
}

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)
TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops;
  m.impl("moe_permute", &autograd_of<kPermute, kPermuteBackward>);
  m.impl("moe_unpermute", &autograd_of<kUnpermute, kUnpermuteBackward>);
}
