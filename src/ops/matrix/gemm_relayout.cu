// TF32 in any layout: wgmma reads tf32 operands K-major only, so an operand whose K is not
// contiguous (a row-major `other`, a column-major `input`) is first copied K-contiguous into
// scratch by tessera::copy's transpose tier, and the product runs on the sm90 tiers. The copy moves
// each such operand once each way at about the copy rate, against a product of 2 M N K FLOPs at the
// tf32 rate: from a few thousand on in each dimension, a few percent of the product's time, where
// the exact float32 tier it replaces runs several times slower.
#include "ops/matrix/gemm.cuh"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::matrix {
namespace {

bool k_major_a(const GemmArgs& g) { return g.a_sk == 1; }
bool k_major_b(const GemmArgs& g) { return g.b_sk == 1; }

// An operand's matrices (one, where its batch stride is 0) as a view: rows (M or N) x K with
// strides sr, sk, and the same shape contiguous in `dst`.
TensorView operand_view(const void* p, int64_t batches, int64_t rows, int64_t k, int64_t sb,
                        int64_t sr, int64_t sk, int device) {
  const int64_t shape[3] = {batches, rows, k}, strides[3] = {sb, sr, sk};
  return TensorView::make(const_cast<void*>(p), DType::float32, shape, strides, 3, {DeviceType::cuda, device});
}

// `g` with its operands that are not K-major pointed at K-contiguous copies at `a` and `b`.
GemmArgs relaid(const GemmArgs& g, void* a, void* b) {
  GemmArgs r = g;
  if (!k_major_a(g)) {
    r.a = a, r.a_sk = 1, r.a_sm = g.k, r.a_sb = g.a_sb != 0 ? g.m * g.k : 0;
  }
  if (!k_major_b(g)) {
    r.b = b, r.b_sk = 1, r.b_sn = g.k, r.b_sb = g.b_sb != 0 ? g.n * g.k : 0;
  }
  return r;
}

}  // namespace

std::string RelayoutTier::Plan::describe() const {
  return std::string("copied K-contiguous: ") + (a ? "input" : "") + (a && b ? " and " : "") +
         (b ? "other" : "") + "; then the sm90 tiers";
}

bool RelayoutTier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major != 9 || g.dtype != DType::float32 || !g.allow_tf32 || g.k == 0) return false;
  if (is_gated(g.activation)) return false;  // 16-bit outputs only (gemm_sm90.cu)
  if (k_major_a(g) && k_major_b(g)) return false;
  // Scratch is 256-byte aligned: a stand-in pointer of that alignment asks the sm90 tier.
  alignas(256) static const float probe[1] = {};
  const GemmArgs r = relaid(g, const_cast<float*>(probe), const_cast<float*>(probe));
  return Sm90Tier::can_implement(r, ctx);  // K-major rows 16-byte aligned, as TMA needs
}

RelayoutTier::Plan RelayoutTier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  return {!k_major_a(g), !k_major_b(g), ctx};
}

void RelayoutTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  const int64_t batches_a = g.a_sb != 0 ? g.batch : 1, batches_b = g.b_sb != 0 ? g.batch : 1;
  runtime::Scratch a, b;
  if (p.a) {
    a = runtime::Scratch(std::size_t(batches_a * g.m * g.k) * sizeof(float), stream);
    copy(operand_view(g.a, batches_a, g.m, g.k, g.a_sb, g.a_sm, g.a_sk, g.device),
         operand_view(a.data(), batches_a, g.m, g.k, g.m * g.k, g.k, 1, g.device), stream);
  }
  if (p.b) {
    b = runtime::Scratch(std::size_t(batches_b * g.n * g.k) * sizeof(float), stream);
    copy(operand_view(g.b, batches_b, g.n, g.k, g.b_sb, g.b_sn, g.b_sk, g.device),
         operand_view(b.data(), batches_b, g.n, g.k, g.n * g.k, g.k, 1, g.device), stream);
  }
  const GemmArgs r = relaid(g, a.data(), b.data());
  runtime::run_first<Sm90Tier>("matmul", r, p.ctx, stream);
}

}  // namespace tessera::matrix
