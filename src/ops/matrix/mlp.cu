// mlp: two matmul calls, activation(input @ w_in^T) @ w_out^T, the hidden activation in a
// workspace between them. Its own checks first, so that errors name mlp's arguments (w_in, w_out)
// rather than the products' operands. No kernels of its own.
#include <string>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/matrix.hpp"

namespace tessera {
namespace {

constexpr const char* kOp = "mlp";

using runtime::transposed;  // a linear layer's weight [N, K] as the [K, N] operand, K contiguous

// input's shape with its last dimension `cols`.
TensorView rows_of(const TensorView& input, void* data, int64_t cols) {
  int64_t shape[kMaxDims];
  for (int d = 0; d < input.ndim; ++d) shape[d] = input.shape[d];
  shape[input.ndim - 1] = cols;
  return TensorView::make(data, input.dtype, shape, nullptr, input.ndim, input.device);
}

void check_shape(const char* arg, const TensorView& t, const TensorView& want, const std::string& what) {
  bool same = t.ndim == want.ndim;
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == want.shape[d];
  if (!same) detail::throw_arg(ErrorKind::value, kOp, arg, want.shape_str() + " (" + what + ")", t.shape_str());
}

void check(const TensorView& input, const TensorView& w_in, const TensorView& w_out, const TensorView& out,
           const MlpOptions& o) {
  for (auto [arg, t] : {std::pair{"input", &input}, std::pair{"w_in", &w_in}, std::pair{"w_out", &w_out},
                        std::pair{"out", &out}})
    detail::check_cuda_tensor(kOp, arg, *t);
  if (input.ndim != 2 && input.ndim != 3)
    detail::throw_arg(ErrorKind::value, kOp, "input", "a 2-d or 3-d tensor", detail::dims(input));
  for (auto [arg, t] : {std::pair{"w_in", &w_in}, std::pair{"w_out", &w_out}})
    if (t->ndim != 2) detail::throw_arg(ErrorKind::value, kOp, arg, "a 2-d tensor (a linear layer's weight)", detail::dims(*t));
  detail::check_dtype_in(kOp, "input", input, {DType::float32, DType::float16, DType::bfloat16});
  for (auto [arg, t] : {std::pair{"w_in", &w_in}, std::pair{"w_out", &w_out}, std::pair{"out", &out}}) {
    detail::check_same_dtype(kOp, arg, *t, "input", input);
    detail::check_same_device(kOp, arg, *t, "input", input);
  }
  const int64_t k = input.shape[input.ndim - 1], n = w_in.shape[0];
  const bool gated = is_gated(o.activation);
  const int64_t hidden = gated ? n / 2 : n;
  if (w_in.shape[1] != k)
    detail::throw_arg(ErrorKind::value, kOp, "w_in",
                      "[N, K] with K = " + std::to_string(k) + " (the last dimension of 'input')", w_in.shape_str());
  if (gated && n % 2 != 0)
    detail::throw_arg(ErrorKind::value, kOp, "w_in",
                      std::string("N even with activation '") + activation_name(o.activation) +
                          "' (gate and up in blocks of 64 features)",
                      w_in.shape_str());
  if (w_out.shape[1] != hidden)
    detail::throw_arg(ErrorKind::value, kOp, "w_out",
                      "[D, " + std::to_string(hidden) + "] (the rows of 'w_in'" + (gated ? ", halved by the gated activation)" : ")"),
                      w_out.shape_str());
  check_shape("out", out, rows_of(input, nullptr, w_out.shape[0]), "input's rows, the rows of 'w_out'");
  detail::check_no_internal_overlap(kOp, "out", out);
  using Arg = std::pair<const char*, const TensorView*>;
  const Arg ins[] = {{"input", &input}, {"w_in", &w_in}, {"w_out", &w_out}};
  for (const Arg& a : ins) detail::check_no_overlap(kOp, "out", out, a.first, *a.second, false);
  if (const TensorView* z = o.preactivation) {
    detail::check_cuda_tensor(kOp, "preactivation", *z);
    detail::check_same_dtype(kOp, "preactivation", *z, "input", input);
    detail::check_same_device(kOp, "preactivation", *z, "input", input);
    check_shape("preactivation", *z, rows_of(input, nullptr, n), "input's rows, the rows of 'w_in'");
    detail::check_no_internal_overlap(kOp, "preactivation", *z);
    for (const Arg& a : ins) detail::check_no_overlap(kOp, "preactivation", *z, a.first, *a.second, false);
    detail::check_no_overlap(kOp, "preactivation", *z, "out", out, false);
  }
  if (const TensorView* h = o.hidden) {
    detail::check_cuda_tensor(kOp, "hidden", *h);
    detail::check_same_dtype(kOp, "hidden", *h, "input", input);
    detail::check_same_device(kOp, "hidden", *h, "input", input);
    const int64_t need = rows_of(input, nullptr, hidden).numel();
    if (!h->is_contiguous() || h->numel() < need)
      detail::throw_arg(ErrorKind::value, kOp, "hidden",
                        "a contiguous tensor of at least " + std::to_string(need) + " elements", detail::dims(*h));
    for (const Arg& a : ins) detail::check_no_overlap(kOp, "hidden", *h, a.first, *a.second, false);
    detail::check_no_overlap(kOp, "hidden", *h, "out", out, false);
    if (o.preactivation) detail::check_no_overlap(kOp, "hidden", *h, "preactivation", *o.preactivation, false);
  }
}

}  // namespace

void mlp(const TensorView& input, const TensorView& w_in, const TensorView& w_out, const TensorView& out,
         const MlpOptions& options, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::mlp");
  check(input, w_in, w_out, out, options);
  runtime::DeviceGuard guard(input.device.index);
  const int64_t hidden = is_gated(options.activation) ? w_in.shape[0] / 2 : w_in.shape[0];
  const TensorView shape = rows_of(input, nullptr, hidden);
  runtime::Scratch own(options.hidden ? 0 : shape.nbytes(), stream);
  const TensorView h = rows_of(input, options.hidden ? options.hidden->data : own.data(), hidden);
  MatmulOptions first, second;
  first.activation = options.activation;
  first.allow_tf32 = second.allow_tf32 = options.allow_tf32;
  first.preactivation = options.preactivation;
  matmul(input, transposed(w_in), h, first, stream);
  matmul(h, transposed(w_out), out, second, stream);
}

namespace {
// Output shapes from the weights: torch kernels written by hand (python/src/torch/matrix.cpp).
// input [..., K] (the torch op flattens the leading dimensions into rows); allow_tf32=None:
// torch's float32 matmul precision, as matmul's. mlp.preactivation: the output and the first
// product before the activation ([..., N]), what the autograd forward keeps so that the backward
// recomputes the hidden activation instead of keeping it.
const OpRegistrar kMlp = describe("mlp", "matrix", "two-layer MLP without biases: activation(input @ w_in^T) @ w_out^T")
    .schema("mlp(Tensor input, Tensor w_in, Tensor w_out, *, str activation='swiglu', bool? allow_tf32=None) -> Tensor")
    .schema("mlp.preactivation(Tensor input, Tensor w_in, Tensor w_out, *, str activation='swiglu', "
            "bool? allow_tf32=None) -> (Tensor, Tensor)");
}  // namespace
}  // namespace tessera
