// The Hopper GEMM tier (sm90_wgmma): when it applies, how it is planned (schedule, grid, raster
// group), and the 16-bit kernels. The kernel itself is in gemm_sm90.cuh; its tf32 and fp8
// instances compile in gemm_sm90_narrow.cu.
#include "ops/matrix/gemm_sm90.cuh"

#include <cstdlib>

namespace tessera::matrix {
namespace sm90 {

extern template void launch_sm90<float>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
extern template void launch_sm90<__nv_fp8_e4m3>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
extern template void launch_sm90<__nv_fp8_e5m2>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_sm90<__half>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);
template void launch_sm90<__nv_bfloat16>(const GemmArgs&, const Sm90Tier::Plan&, cudaStream_t);

}  // namespace sm90

namespace {
using namespace sm90;

int tiles(const GemmArgs& g, int bn) {
  return int(std::min<int64_t>(INT32_MAX, ((g.m + kBM - 1) / kBM) * ((g.n + bn - 1) / bn) * g.batch));
}

// Whether the kernels hold sm_90a code (the build asked for it) on this GPU: a process's GPUs
// that pass `major == 9` share the answer.
bool has_sm90a_code() {
  return runtime::has_sm90a_code(reinterpret_cast<const void*>(
      gemm_sm90_kernel<__nv_bfloat16, __nv_bfloat16, Cooperative, true, true>));
}

// The tuner's choice where it made one; else TESSERA_MATMUL_SCHEDULE=pingpong or cooperative (for
// measuring them against each other); else pingpong where 256-wide tiles come in fewer than four
// waves or the epilogue computes a transcendental activation per element: cooperative consumers
// run the epilogue together while the tensor cores wait, pingpong ones under each other's main
// loop, which pays where the epilogues are a larger share of the time (short K per tile in few
// waves) and where a partial last wave leaves SMs idle; in many waves the 256-wide tiles' lower
// shared-memory traffic per FLOP wins.
bool plan_pingpong(const GemmArgs& g, const GemmCtx& ctx) {
  if (g.config.schedule) return g.config.schedule == 2;
  // 0: by the rule, 1: pingpong, 2: cooperative; read once per process.
  static const int forced = [] {
    const char* e = std::getenv("TESSERA_MATMUL_SCHEDULE");
    const std::string v = e ? e : "";
    return v == "pingpong" ? 1 : v == "cooperative" ? 2 : 0;
  }();
  if (forced) return forced == 1;
  const bool costly_epilogue = g.activation == Activation::gelu ||
                               g.activation == Activation::gelu_tanh || g.activation == Activation::silu;
  return costly_epilogue || tiles(g, Cooperative::BN) < 4 * ctx.sms;
}

bool out_ok(DType in, DType out) {
  if (out == DType::float32) return true;
  if (in == DType::float8_e4m3fn || in == DType::float8_e5m2)
    return out == DType::bfloat16 || out == DType::float16;
  return out == in && in != DType::float32;
}

}  // namespace

std::string Sm90Tier::Plan::describe() const {
  return std::string(pingpong ? "pingpong, " : "cooperative, ") + std::to_string(kBM) + " x " +
         std::to_string(pingpong ? PingPong::BN : Cooperative::BN) + " tiles, " +
         std::to_string(pingpong ? PingPong::kStages : Cooperative::kStages) + " stages, group " +
         std::to_string(group) + ", " + std::to_string(grid) + " persistent CTAs";
}

bool Sm90Tier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major != 9 || g.k == 0) return false;
  switch (g.dtype) {
    case DType::bfloat16: case DType::float16: case DType::float8_e4m3fn: case DType::float8_e5m2:
      break;
    case DType::float32:
      if (!g.allow_tf32) return false;
      break;
    default: return false;
  }
  if (!out_ok(g.dtype, g.out_dtype) || !has_sm90a_code()) return false;
  return operand_ok(g.dtype, layout_a(g), g.batch, kBM) && operand_ok(g.dtype, layout_b(g), g.batch, 256);
}

Sm90Tier::Plan Sm90Tier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  Plan p;
  p.pingpong = plan_pingpong(g, ctx);
  p.group = g.config.group > 0 ? g.config.group : 8;
  p.grid = std::max(1, std::min(tiles(g, p.pingpong ? PingPong::BN : Cooperative::BN), ctx.sms));
  return p;
}

void Sm90Tier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  switch (g.dtype) {
    case DType::float16: launch_sm90<__half>(g, p, stream); break;
    case DType::float32: launch_sm90<float>(g, p, stream); break;
    case DType::float8_e4m3fn: launch_sm90<__nv_fp8_e4m3>(g, p, stream); break;
    case DType::float8_e5m2: launch_sm90<__nv_fp8_e5m2>(g, p, stream); break;
    default: launch_sm90<__nv_bfloat16>(g, p, stream); break;
  }
}

}  // namespace tessera::matrix
