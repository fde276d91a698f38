// softmax and log_softmax over one dimension, forward and backward, with torch's semantics.
//
// Bytes: forward reads x and writes out once, 2 * rows * N * sizeof(T); backward reads grad_out
// and y and writes grad_in, 3 * rows * N * sizeof(T). The arithmetic (two MUFU exps and ~10 other
// instructions per element) is far under the memory time, so the design is about moving each byte
// exactly once with enough of them in flight.
//
// Dense rows: a group of threads (a warp, a CTA or a cluster of CTAs: the tiers below) holds a
// whole row in registers, packed in the storage type (tile::Frag): one read from HBM, then the
// thread's max (taken in the storage type), its sum of exp(x - max), ONE group reduction of the
// (max, sum) pair (tile::SoftmaxState), and exp(x - M) / S written from the same registers. Each
// thread holds at most 128 bytes of row data (8 vectors of 16 bytes forward, 4 + 4 backward),
// which keeps every kernel at <= 64 registers with no spills: 1024 threads x 128 B = 128 KB of
// loads in flight per SM, against the ~32 KB that Little's law asks (4.2 TB/s x ~1 us / 132 SMs).
// Rows too long for a cluster take the split tier (two kernels, three passes). Rows whose start
// is not 16-byte aligned (odd N) still use 16-byte vectors through an aligned frame (row_lead)
// when all tensors share the misalignment; otherwise V = 1.
//
// Strided layouts: with the reduced dimension strided but many rows adjacent in memory, one thread
// per row (the column tier); any other layout is gathered to contiguous scratch memory
// (tessera::copy), done on a dense tier and copied back.
//
// Every launch is planned on the host from N, the dtype, the layout and the device; nothing is
// tuned at run time except the occupancy query that admits a cluster size (cached).
//
// Semantics: -inf gives 0; a row of all -inf, or with a NaN or a +inf, gives NaN (the max is +inf
// and exp(inf - inf) enters the sum, as in torch's max-then-sum kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <string>

#include "ops/rowwise/softmax.cuh"
#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/rowwise.hpp"
#include "tessera/op.hpp"

namespace tessera {
namespace {

using softmax_detail::run;
using softmax_detail::SoftmaxBackwardOp;
using softmax_detail::SoftmaxOp;

template <class Op, int NIN>
void dispatch(const TensorView& out, const std::array<TensorView, NIN>& in, int d, cudaStream_t s) {
  runtime::DeviceGuard guard(out.device.index);
  switch (out.dtype) {
    case DType::float32: return run<Op, float>(out, in, d, s);
    case DType::float16: return run<Op, __half>(out, in, d, s);
    default: return run<Op, __nv_bfloat16>(out, in, d, s);
  }
}

// ---- argument checks ----------------------------------------------------------------------------------
// dim wrapped into [0, max(ndim, 1)): a 0-d tensor has one dimension of size 1, as in torch.
int wrap_dim(const char* op, int dim, int ndim) {
  const int nd = std::max(ndim, 1);
  if (dim < -nd || dim >= nd)
    detail::throw_arg(ErrorKind::value, op, "dim",
                      "a dimension in [" + std::to_string(-nd) + ", " + std::to_string(nd - 1) +
                          "] for a " + std::to_string(ndim) + "-d tensor",
                      std::to_string(dim));
  return dim < 0 ? dim + nd : dim;
}

// A 0-d view as the 1-d view of its element.
TensorView at_least_1d(const TensorView& t) {
  if (t.ndim > 0) return t;
  TensorView r = t;
  r.ndim = 1;
  r.shape[0] = 1;
  r.strides[0] = 1;
  return r;
}

template <bool Log>
void forward(const char* op, const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  detail::check_cuda_tensor(op, "input", x);
  detail::check_dtype_in(op, "input", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "out", out, "input", x);
  const int d = wrap_dim(op, dim, x.ndim);
  detail::check_no_internal_overlap(op, "out", out);
  detail::check_no_overlap(op, "out", out, "input", x, /*allow_identical=*/true);
  if (out.numel() == 0) return;
  dispatch<SoftmaxOp<Log>, 1>(at_least_1d(out), {at_least_1d(x)}, d, stream);
}

template <bool Log>
void backward(const char* op, const TensorView& grad_out, const TensorView& y, int dim,
              const TensorView& grad_in, cudaStream_t stream) {
  detail::check_cuda_tensor(op, "grad_output", grad_out);
  detail::check_dtype_in(op, "grad_output", grad_out, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "output", y, "grad_output", grad_out);
  detail::check_like(op, "out", grad_in, "grad_output", grad_out);
  const int d = wrap_dim(op, dim, grad_out.ndim);
  detail::check_no_internal_overlap(op, "out", grad_in);
  detail::check_no_overlap(op, "out", grad_in, "grad_output", grad_out, /*allow_identical=*/true);
  detail::check_no_overlap(op, "out", grad_in, "output", y, /*allow_identical=*/false);
  if (grad_in.numel() == 0) return;
  dispatch<SoftmaxBackwardOp<Log>, 2>(at_least_1d(grad_in), {at_least_1d(grad_out), at_least_1d(y)}, d, stream);
}

}  // namespace

void softmax(const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::softmax");
  forward<false>("softmax", x, dim, out, stream);
}

void log_softmax(const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::log_softmax");
  forward<true>("log_softmax", x, dim, out, stream);
}

void softmax_backward(const TensorView& grad_out, const TensorView& y, int dim,
                      const TensorView& grad_in, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::softmax_backward");
  backward<false>("softmax_backward", grad_out, y, dim, grad_in, stream);
}

void log_softmax_backward(const TensorView& grad_out, const TensorView& y, int dim,
                          const TensorView& grad_in, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::log_softmax_backward");
  backward<true>("log_softmax_backward", grad_out, y, dim, grad_in, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
const OpRegistrar kSoftmax = describe("softmax", "rowwise", "softmax along one dimension")
    .schema("softmax(Tensor input, int dim) -> Tensor")
    .kernel<&softmax>({"input", "dim", "out"}, {{"out", "input"}})
    .differentiable("softmax_backward", {"grad", "result", "dim"}, {"input"})
    .torch("torch.softmax");
const OpRegistrar kLogSoftmax = describe("log_softmax", "rowwise", "log-softmax along one dimension")
    .schema("log_softmax(Tensor input, int dim) -> Tensor")
    .kernel<&log_softmax>({"input", "dim", "out"}, {{"out", "input"}})
    .differentiable("log_softmax_backward", {"grad", "result", "dim"}, {"input"})
    .torch("torch.log_softmax");
const OpRegistrar kSoftmaxBackward = describe("softmax_backward", "rowwise", "softmax backward from the forward's output")
    .schema("softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor")
    .kernel<&softmax_backward>({"grad_output", "output", "dim", "out"}, {{"out", "output"}});
const OpRegistrar kLogSoftmaxBackward = describe("log_softmax_backward", "rowwise", "log-softmax backward from the forward's output")
    .schema("log_softmax_backward(Tensor grad_output, Tensor output, int dim) -> Tensor")
    .kernel<&log_softmax_backward>({"grad_output", "output", "dim", "out"}, {{"out", "output"}});
}  // namespace
}  // namespace tessera
