#include "runtime/tier.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

namespace tessera::runtime {
namespace {
std::mutex trace_mu, forced_mu;

// TESSERA_FORCE_TIER's "op=tier" items, separated by commas; malformed items are skipped.
std::map<std::string, std::string> forced_from_env() {
  std::map<std::string, std::string> out;
  const char* e = std::getenv("TESSERA_FORCE_TIER");
  const std::string s = e ? e : "";
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    const std::size_t eq = item.find('=');
    if (eq != std::string::npos && eq > 0 && eq + 1 < item.size())
      out[item.substr(0, eq)] = item.substr(eq + 1);
    i = j + 1;
  }
  return out;
}

std::map<std::string, std::string>& forced() {
  static std::map<std::string, std::string> f = forced_from_env();
  return f;
}
}  // namespace

namespace detail {
std::atomic<bool> tier_trace_enabled{false};
std::atomic<bool> any_tier_forced{!forced().empty()};
}  // namespace detail

namespace {
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

void set_forced_tier(const std::string& op, const std::string& tier) {
  std::lock_guard<std::mutex> lock(forced_mu);
  if (tier.empty()) forced().erase(op);
  else forced()[op] = tier;
  detail::any_tier_forced.store(!forced().empty(), std::memory_order_relaxed);
}

std::string forced_tier(const char* op) {
  std::lock_guard<std::mutex> lock(forced_mu);
  const auto it = forced().find(op);
  return it == forced().end() ? std::string() : it->second;
}

std::vector<TierChoice> take_tier_trace() {
  std::lock_guard<std::mutex> lock(trace_mu);
  return std::exchange(trace(), {});
}

}  // namespace tessera::runtime
