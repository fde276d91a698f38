// The autotuner's memory: the best configuration measured for each (op, key), kept on disk so that
// a process does not re-measure what an earlier one already did on the same machine.
//
// A result is only valid where it was measured: every record carries the identity of the machine
// (GPU model and SM count, driver, CUDA runtime, tessera version) and find() returns only records
// of this process's identity. Records of other identities stay in the file, since a home directory
// may be shared by machines with other GPUs or software.
//
// The file is a cache, never a source of truth: one that cannot be read or parsed is ignored with
// one warning, one that cannot be written leaves results in memory with one warning; neither
// throws. Writers serialise on a lock file and replace the cache by rename, so concurrent
// processes lose no result and readers never see half a file.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tessera::runtime {

// What a tuning result is valid for. Two identities match only if every field is equal.
struct TuneIdentity {
  std::string gpu_name;         // "NVIDIA H200"
  int sm_count = 0;             // tells apart variants of one name (and MIG slices)
  int driver_version = 0;       // cudaDriverGetVersion: 12080 for 12.8
  int runtime_version = 0;      // cudaRuntimeGetVersion
  std::string tessera_version;  // kernels change between versions; so do their best configs
};
bool operator==(const TuneIdentity& a, const TuneIdentity& b);
inline bool operator!=(const TuneIdentity& a, const TuneIdentity& b) { return !(a == b); }

// The identity of `device` in this process (needs a GPU; throws tessera::Error without one).
TuneIdentity current_tune_identity(int device);

struct TuneEntry {
  std::string config;  // what the tuner chose, in its own words: "bn=256,stages=4,cluster=2"
  double time_us = 0;  // what it measured
};

struct TuneRecord {
  TuneIdentity id;
  std::string op;   // "matmul"
  std::string key;  // built by the caller: "sm90|bf16,bf16->bf16|NT|m4096-n4096-k4096"
  TuneEntry entry;
};

// $TESSERA_CACHE_DIR/tune.cache, else $XDG_CACHE_HOME/tessera/tune.cache, else
// $HOME/.cache/tessera/tune.cache; empty (no file: a cache in memory) when none is set. Empty
// variables, and a relative XDG_CACHE_HOME (as the XDG spec says), count as unset.
std::string default_cache_path();

// One object per process and cache file; its methods may be called from several threads.
class TuneCache {
 public:
  // Reads `path` if it exists (a missing file is an empty cache). An empty path keeps everything
  // in memory. Throws tessera::Error (value) if a string of `id` is empty or holds a tab or line
  // break.
  TuneCache(std::string path, TuneIdentity id);
  TuneCache(const TuneCache&) = delete;
  TuneCache& operator=(const TuneCache&) = delete;

  // The entry for (op, key) measured under this cache's identity.
  std::optional<TuneEntry> find(const std::string& op, const std::string& key) const;

  // Stores the entry (replacing any for (op, key) of this identity) and writes the file: under the
  // lock it re-reads the file, merges, and replaces it. Throws tessera::Error (value) naming the
  // argument if op or key is empty, op, key or config holds a tab or line break, or time_us is
  // not a finite number >= 0; never throws for I/O.
  void put(const std::string& op, const std::string& key, TuneEntry entry);

  // Every record known, of every identity, in file order (sorted by identity, op, key).
  std::vector<TuneRecord> list() const;
  // What was ignored or could not be done: at most one line about reading the file and one about
  // writing it, each also printed to stderr after "tessera: ".
  std::vector<std::string> warnings() const;

  const std::string& path() const { return path_; }
  const TuneIdentity& identity() const { return id_; }

 private:
  using Records = std::map<std::string, TuneRecord>;  // by identity, op, key: the line's prefix
  void warn_once(bool& warned, const std::string& message);
  bool load(Records& out);  // false (and a warning) if the file is there but not usable

  std::string path_;
  TuneIdentity id_;
  mutable std::mutex mu_;
  Records records_;
  Records unsaved_;  // put() but not yet written: written with the next put() that can write
  std::vector<std::string> warnings_;
  bool warned_read_ = false, warned_write_ = false;
};

}  // namespace tessera::runtime
