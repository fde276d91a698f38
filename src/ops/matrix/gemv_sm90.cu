// The GEMV tier (GemvTier): when it applies, its plan, and the launch of gemv_sm90.cuh's kernel.
#include <string>

#include "ops/matrix/gemv_sm90.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"

namespace tessera::matrix {
namespace {

bool is_16bit(DType dt) { return dt == DType::bfloat16 || dt == DType::float16; }

template <class T, class OutT>
void launch_typed(const GemmArgs& g, const GemvTier::Plan& p, const gemv::Args& args, cudaStream_t stream) {
  auto kernel = gemv::gemv_kernel<T, OutT>;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), gemv::smem_bytes());
  kernel<<<p.grid, gemv::kThreads, gemv::smem_bytes(), stream>>>(args, gemv::make_maps(g.dtype, args),
                                                                  Epilogue<OutT>::from(g));
  TESSERA_LAUNCH_CHECK();
}

template <class T>
void launch_out(const GemmArgs& g, const GemvTier::Plan& p, const gemv::Args& args, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_typed<T, float>(g, p, args, stream);
  else launch_typed<T, T>(g, p, args, stream);
}

// The kernels hold sm_90 code (bulk copies) only where the build asked for sm_90a.
bool has_code() {
  return runtime::has_sm90a_code(reinterpret_cast<const void*>(gemv::gemv_kernel<__nv_bfloat16, __nv_bfloat16>));
}

}  // namespace

std::string GemvTier::Plan::describe() const {
  return std::to_string(blocks) + " blocks of " + std::to_string(gemv::kBlockRows) + " columns x " +
         std::to_string(splits) + " segments of " + std::to_string(seg_stages * gemv::kStageK) + " K, " +
         std::to_string(gemv::kStages) + " stages, " + std::to_string(grid) + " persistent CTAs";
}

bool GemvTier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major != 9 || !(g.config == GemmConfig{}) || g.batch != 1 || g.m > gemv::kMaxM || g.k == 0)
    return false;
  if (is_gated(g.activation) || !is_16bit(g.dtype)) return false;
  if (g.out_dtype != g.dtype && g.out_dtype != DType::float32) return false;
  if (g.k % gemv::kSub != 0 || g.a_sk != 1 || g.b_sk != 1 || g.n > INT32_MAX) return false;
  gemv::Args a{};
  a.a = g.a, a.a_sm = g.a_sm, a.w = g.b, a.w_sn = g.b_sn, a.m = int(g.m), a.n = g.n, a.k = g.k;
  return gemv::can_map(g.dtype, a) && has_code();
}

GemvTier::Plan GemvTier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  gemv::Args a{};
  a.m = int(g.m), a.n = g.n, a.k = g.k;
  gemv::plan(a, ctx.sms);
  Plan p;
  p.blocks = a.blocks, p.splits = a.splits, p.seg_stages = a.seg_stages, p.k_stages = a.k_stages;
  p.grid = int(std::min<int64_t>(int64_t(p.blocks) * p.splits, ctx.sms));
  return p;
}

void GemvTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  gemv::Args args{};
  args.a = g.a, args.a_sm = g.a_sm, args.w = g.b, args.w_sn = g.b_sn;
  args.m = int(g.m), args.n = g.n, args.k = g.k;
  args.blocks = p.blocks, args.splits = p.splits, args.seg_stages = p.seg_stages, args.k_stages = p.k_stages;
  const runtime::SplitScratch split(p.splits, std::size_t(p.splits * g.m * g.n), std::size_t(p.blocks), stream);
  args.partial = split.partials();
  args.counters = split.counters<unsigned>();
  if (g.dtype == DType::float16) launch_out<__half>(g, p, args, stream);
  else launch_out<__nv_bfloat16>(g, p, args, stream);
}

}  // namespace tessera::matrix
