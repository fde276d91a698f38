// matmul's half of the autotuner (runtime/tuner.hpp has the other): the key a result is kept
// under, the candidate space, and the config each call runs with.
//
// Key: the tier family and arch, the dtypes (float32 marked where TF32 is allowed), each
// operand's layout (k: K contiguous, r: its rows contiguous, s: neither), the shape bucket (each
// of M, N, K and the batch rounded up to a power of two: shapes of one bucket share a result) and
// the activation where there is one.
// Candidates: the default (the tiers' own rules) first; both sm90 schedules with raster groups of
// 4, 8 and 16 tile-rows; cooperative with the last wave's tiles split into 2, 4 and 8 chunks of K
// where K allows. Tiers other than the sm90
// ones have no configs yet, so elsewhere there is nothing to tune.
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tuner.hpp"

namespace tessera::matrix {
namespace {

std::mutex override_mu;
std::optional<GemmConfig> config_override;

char layout(int64_t rows_stride, int64_t k_stride) {
  return k_stride == 1 ? 'k' : rows_stride == 1 ? 'r' : 's';
}

// The arguments a candidate is timed with: the output into scratch (contiguous, zeroed where beta
// reads it), so that timing runs never touch the caller's output but pay for its epilogue.
GemmArgs timing_args(const GemmArgs& g, void* out) {
  GemmArgs t = g;
  t.c = out;
  t.c_sn = 1, t.c_sm = out_cols(g), t.c_sb = g.m * out_cols(g);
  return t;
}

}  // namespace

std::string tune_key(const GemmArgs& g, const GemmCtx& ctx) {
  std::string key = "sm" + std::to_string(ctx.major) + "0|" + dtype_name(g.dtype);
  if (g.dtype == DType::float32 && g.allow_tf32) key += "+tf32";
  key += std::string(">") + dtype_name(g.out_dtype) + "|a" + layout(g.a_sm, g.a_sk) + "b" +
         layout(g.b_sn, g.b_sk) + "|m" + std::to_string(runtime::shape_bucket(g.m)) + "-n" +
         std::to_string(runtime::shape_bucket(g.n)) + "-k" + std::to_string(runtime::shape_bucket(g.k)) + "-b" +
         std::to_string(runtime::shape_bucket(g.batch));
  // The epilogue's cost moves the best schedule: a per-element activation, or reading the old
  // output (beta), is part of the key.
  if (g.activation != Activation::none) key += std::string("|") + activation_name(g.activation);
  if (g.beta != 0.0f) key += "|beta";
  if (g.z) key += "|preact";
  return key;
}

std::vector<GemmConfig> candidates(const GemmArgs& g, const GemmCtx& ctx) {
  std::vector<GemmConfig> out{GemmConfig{}};
  if (!Sm90Tier::can_implement(g, ctx)) return out;
  for (int schedule : {1, 2})
    for (int group : {4, 8, 16}) out.push_back({schedule, group, 1});
  // Splitting applies to cooperative's last wave, in chunks of 8 K blocks at least; not to the gated
  // (whole tiles only).
  const int64_t k_blocks = g.k * int64_t(dtype_size(g.dtype)) / 128;
  for (int splits : {2, 4, 8})
    if (k_blocks >= 8 * splits && !is_gated(g.activation)) out.push_back({1, 8, splits});
  return out;
}

void set_config_override(std::optional<GemmConfig> config) {
  std::lock_guard<std::mutex> lock(override_mu);
  config_override = config;
}

GemmConfig tuned_config(const char* op, const GemmArgs& g, const GemmCtx& ctx, cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(override_mu);
    if (config_override) return *config_override;
  }
  const bool tune = runtime::autotune_enabled();
  if (!tune && !runtime::has_tuned(g.device, op)) return {};
  std::vector<std::string> names;
  if (tune)
    for (const GemmConfig& c : candidates(g, ctx)) names.push_back(to_string(c));
  std::optional<runtime::Scratch> out;
  const auto run = [&](const std::string& name) {
    if (!out) {
      const std::size_t bytes = std::size_t(g.batch * g.m * out_cols(g)) * dtype_size(g.out_dtype);
      out.emplace(bytes, stream);
      if (g.beta != 0.0f) TESSERA_CUDA_CHECK(cudaMemsetAsync(out->data(), 0, bytes, stream));
    }
    GemmArgs t = timing_args(g, out->data());
    parse_config(name, t.config);
    run_gemm(op, t, ctx, stream);
  };
  const auto found = runtime::tuned_config(g.device, op, tune_key(g, ctx), tune, names, run, stream);
  GemmConfig c;
  if (found && parse_config(*found, c)) return c;
  return {};
}

}  // namespace tessera::matrix
