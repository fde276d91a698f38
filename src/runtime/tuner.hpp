// The autotuner's process-wide half, shared by every op that has configs: whether tuning on first
// use is on, each device's tune cache, and measuring candidates. The op's half (its candidate
// space, its key, what a config means) lives with the op (ops/matrix/gemm_tune.cu for matmul).
//
// A config found in the cache is used whether or not tuning is on, so `tessera tune` ahead of
// time serves every later process; tuning on first use (TESSERA_AUTOTUNE=1, set_autotune(true))
// measures the candidates of a key the cache lacks, in the call that first meets it. A stream
// being captured into a CUDA graph is never tuned on: the call takes the op's default.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/tune_cache.hpp"

namespace tessera::runtime {

// v rounded up to a power of two: the shape buckets of tune keys (shapes of one bucket share a
// result).
inline int64_t shape_bucket(int64_t v) {
  int64_t b = 1;
  while (b < v) b *= 2;
  return b;
}

// Tuning on first use: TESSERA_AUTOTUNE=1 (read once), or set_autotune.
bool autotune_enabled();
void set_autotune(bool on);

// The cache of `device`: default_cache_path(), this process's identity; opened on first use.
TuneCache& tune_cache(int device);

// Whether the cache of `device` holds any record of `op` for this process's identity: ops skip
// building their key when it does not and tuning is off.
bool has_tuned(int device, const std::string& op);

// Called after each candidate measured: (done, of).
using TuneProgress = std::function<void(int done, int of)>;

// Told of every tuning's progress in this process (key, done, of): `tessera tune`'s display.
// An empty function removes it.
void set_tune_listener(std::function<void(const std::string& key, int done, int of)> listener);

// The config of (op, key): the cache's, else, where `tune` and `stream` is not capturing, the
// fastest of `candidates` (configs as the cache spells them), each run by `run(config)` on
// `stream` (timed as the median of a few launches after a warm-up), stored in the cache; else
// none. The first candidate should be the op's default, so that tuning never picks worse.
std::optional<std::string> tuned_config(int device, const std::string& op, const std::string& key,
                                        bool tune, const std::vector<std::string>& candidates,
                                        const std::function<void(const std::string&)>& run,
                                        cudaStream_t stream, const TuneProgress& progress = {});

}  // namespace tessera::runtime
