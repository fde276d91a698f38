#include "runtime/tier.hpp"

#include <mutex>
#include <utility>

namespace tessera::runtime {
namespace detail {
std::atomic<bool> tier_trace_enabled{false};
}

namespace {
std::mutex trace_mu;
std::vector<TierChoice>& trace() {
  static std::vector<TierChoice> t;
  return t;
}
}  // namespace

void set_tier_trace(bool on) {
  std::lock_guard<std::mutex> lock(trace_mu);
  if (on) trace().clear();
  detail::tier_trace_enabled.store(on, std::memory_order_relaxed);
}

void record_tier(TierChoice choice) {
  std::lock_guard<std::mutex> lock(trace_mu);
  trace().push_back(std::move(choice));
}

std::vector<TierChoice> take_tier_trace() {
  std::lock_guard<std::mutex> lock(trace_mu);
  return std::exchange(trace(), {});
}

}  // namespace tessera::runtime
