#include "runtime/tuner.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "tessera/tune.hpp"

namespace tessera::runtime {
namespace {

std::atomic<bool>& autotune_flag() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("TESSERA_AUTOTUNE");
    return e && std::string(e) == "1";
  }()};
  return on;
}

struct DeviceCache {
  std::unique_ptr<TuneCache> cache;
  std::set<std::string> ops;  // ops with a record of this identity
};

std::mutex caches_mu;
std::map<int, DeviceCache>& caches() {
  static std::map<int, DeviceCache> c;
  return c;
}

DeviceCache& device_cache(int device) {
  std::lock_guard<std::mutex> lock(caches_mu);
  DeviceCache& d = caches()[device];
  if (!d.cache) {
    d.cache = std::make_unique<TuneCache>(default_cache_path(), current_tune_identity(device));
    for (const TuneRecord& r : d.cache->list())
      if (r.id == d.cache->identity()) d.ops.insert(r.op);
  }
  return d;
}

// One launch's time in microseconds: the median of `reps` after a warm-up.
double time_us(const std::function<void()>& launch, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  launch();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    TESSERA_CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    TESSERA_CUDA_CHECK(cudaEventRecord(stop, stream));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

std::mutex listener_mu;
std::function<void(const std::string&, int, int)> listener;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // unknown: do not tune
  }
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace

void set_tune_listener(std::function<void(const std::string& key, int done, int of)> l) {
  std::lock_guard<std::mutex> lock(listener_mu);
  listener = std::move(l);
}

bool autotune_enabled() { return autotune_flag().load(std::memory_order_relaxed); }
void set_autotune(bool on) { autotune_flag().store(on, std::memory_order_relaxed); }

TuneCache& tune_cache(int device) { return *device_cache(device).cache; }

bool has_tuned(int device, const std::string& op) {
  DeviceCache& d = device_cache(device);
  std::lock_guard<std::mutex> lock(caches_mu);
  return d.ops.count(op) != 0;
}

std::optional<std::string> tuned_config(int device, const std::string& op, const std::string& key,
                                        bool tune, const std::vector<std::string>& candidates,
                                        const std::function<void(const std::string&)>& run,
                                        cudaStream_t stream, const TuneProgress& progress) {
  DeviceCache& d = device_cache(device);
  if (auto hit = d.cache->find(op, key)) return hit->config;
  if (!tune || candidates.empty() || capturing(stream)) return std::nullopt;
  // Few launches for long ones, more for short ones: about 20 ms a candidate at most.
  const double first = time_us([&] { run(candidates[0]); }, stream, 1);
  const int reps = int(std::clamp(20000.0 / std::max(first, 1.0), 3.0, 25.0));
  std::string best;
  double best_us = INFINITY;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const double us = time_us([&] { run(candidates[i]); }, stream, reps);
    if (us < best_us) best_us = us, best = candidates[i];
    if (progress) progress(int(i + 1), int(candidates.size()));
    std::lock_guard<std::mutex> lock(listener_mu);
    if (listener) listener(op + " " + key, int(i + 1), int(candidates.size()));
  }
  d.cache->put(op, key, {best, best_us});
  std::lock_guard<std::mutex> lock(caches_mu);
  d.ops.insert(op);
  return best;
}

}  // namespace tessera::runtime

namespace tessera {
void set_autotune(bool on) { runtime::set_autotune(on); }
bool autotune_enabled() { return runtime::autotune_enabled(); }
}  // namespace tessera
