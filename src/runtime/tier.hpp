// Kernel tiers: the one shape every operator's kernels share.
//
// An operator has several kernels ("tiers"), each fastest over some range of shapes, layouts and
// GPUs. Each tier is a struct with
//   static constexpr const char* kName;   // "warp", "cluster", "staged", ...
//   static constexpr const char* kWhen;   // the arguments it is for, in words
//   static bool can_implement(const Args&, const Ctx&);
//   static Plan plan(const Args&, const Ctx&);  // Plan: its launch configuration, with
//                                               // std::string describe() const
//   static void launch(const Args&, const Plan&, cudaStream_t);
// and the host launcher runs the first tier of an ordered list that can implement the arguments:
// run_first<TierA, TierB, ...>(op, args, ctx, stream). Args is the operator's kernel arguments
// (pointers, strides, sizes), Ctx what the choice may depend on besides (the device, dtype facts).
//
// `tessera profile` names the tier each call ran and why: while tracing is on (set_tier_trace),
// run_first records (op, tier, kWhen and the plan). Off, the cost is one relaxed atomic load.
//
// Tests and measurements may force a tier: set_forced_tier("matmul", "sm80_mma"), or the
// environment's TESSERA_FORCE_TIER="matmul=sm80_mma,softmax=warp" (read once, at load). A forced
// tier is tried first; where it cannot implement the arguments, the list runs in order as usual
// (the trace says which ran), so forcing never turns a valid call into an error.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>
#include <vector>

#include "tessera/error.hpp"

namespace tessera::runtime {

struct TierChoice {
  std::string op;    // "softmax"
  std::string tier;  // "cluster"
  std::string why;   // kWhen, then the plan: "rows over one CTA, sm_90: cluster of 4 x 512 threads"
};

namespace detail {
extern std::atomic<bool> tier_trace_enabled;
extern std::atomic<bool> any_tier_forced;
}

inline bool tier_trace_on() { return detail::tier_trace_enabled.load(std::memory_order_relaxed); }
// Starts (clearing what was recorded) or stops recording.
void set_tier_trace(bool on);
void record_tier(TierChoice choice);
// What was recorded since tracing started, and clears it.
std::vector<TierChoice> take_tier_trace();

// Forces `tier` (a kName) for `op`; an empty `tier` lifts it.
void set_forced_tier(const std::string& op, const std::string& tier);
// The tier forced for `op`, or empty.
std::string forced_tier(const char* op);

template <class Tier, class Args, class Ctx>
bool try_tier(const char* op, const Args& args, const Ctx& ctx, cudaStream_t stream) {
  if (!Tier::can_implement(args, ctx)) return false;
  const auto plan = Tier::plan(args, ctx);
  if (tier_trace_on()) record_tier({op, Tier::kName, std::string(Tier::kWhen) + ": " + plan.describe()});
  Tier::launch(args, plan, stream);
  return true;
}

// Launches the first of Tiers that can implement `args`. The last tier of every list takes any
// arguments its launcher passes, so none matching is a bug in the launcher, reported as such.
template <class... Tiers, class Args, class Ctx>
void run_first(const char* op, const Args& args, const Ctx& ctx, cudaStream_t stream) {
  if (detail::any_tier_forced.load(std::memory_order_relaxed)) {
    const std::string f = forced_tier(op);
    if (!f.empty() && ((f == Tiers::kName && try_tier<Tiers>(op, args, ctx, stream)) || ...)) return;
  }
  if (!(try_tier<Tiers>(op, args, ctx, stream) || ...))
    throw Error(ErrorKind::runtime, std::string(op) + ": internal error: no kernel tier takes these arguments");
}

}  // namespace tessera::runtime
