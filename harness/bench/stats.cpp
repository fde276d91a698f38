// Statistics of timing samples and the throughput derived from them.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "bench/bench.hpp"
#include "runtime/check.hpp"

namespace tessera::bench {

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty())
    detail::throw_arg(ErrorKind::value, "bench.quantile", "sorted", "at least one sample", "none");
  if (!(q >= 0.0 && q <= 1.0))  // also rejects NaN
    detail::throw_arg(ErrorKind::value, "bench.quantile", "q", "a value in [0, 1]", std::to_string(q));
  // An unsorted input would give a plausible but wrong number; checking is O(n) and cheap next
  // to the GPU time the samples cost.
  if (!std::is_sorted(sorted.begin(), sorted.end()))
    detail::throw_arg(ErrorKind::value, "bench.quantile", "sorted", "samples in ascending order",
                      "unsorted samples");
  // numpy's default ("linear"): the q-th point of the n - 1 gaps between ranks.
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Stats summarize(std::vector<double> samples_ms) {
  if (samples_ms.empty())
    detail::throw_arg(ErrorKind::value, "bench.summarize", "samples_ms", "at least one sample", "none");
  for (double s : samples_ms)
    if (!std::isfinite(s))
      detail::throw_arg(ErrorKind::value, "bench.summarize", "samples_ms", "finite times",
                        std::to_string(s));
  std::sort(samples_ms.begin(), samples_ms.end());
  Stats st;
  st.median_ms = quantile(samples_ms, 0.5);
  st.p20_ms = quantile(samples_ms, 0.2);
  st.p80_ms = quantile(samples_ms, 0.8);
  st.min_ms = samples_ms.front();
  st.max_ms = samples_ms.back();
  st.mean_ms = std::accumulate(samples_ms.begin(), samples_ms.end(), 0.0) /
               static_cast<double>(samples_ms.size());
  st.reps = static_cast<int>(samples_ms.size());
  return st;
}

// bytes / ms / 1e6 = bytes / s / 1e9. A row never timed (median 0) has no throughput: 0, not inf.
double gbps(const Row& r) {
  return r.stats.median_ms > 0 ? r.bytes / r.stats.median_ms * 1e-6 : 0.0;
}

double tflops(const Row& r) {
  return r.stats.median_ms > 0 ? r.flops / r.stats.median_ms * 1e-9 : 0.0;
}

}  // namespace tessera::bench
