// Autotuning: the ops with configs (matmul first) use what the tune cache holds for their shape
// (written by `tessera tune` or by an earlier process), and, where tuning on first use is on,
// measure their candidates for a shape the cache lacks, in the call that first meets it.
// The cache: $TESSERA_CACHE_DIR/tune.cache, else $XDG_CACHE_HOME/tessera/tune.cache, else
// ~/.cache/tessera/tune.cache; `tessera tune --show` lists it.
#pragma once

namespace tessera {

// Tuning on first use; off unless the environment's TESSERA_AUTOTUNE=1 turned it on.
void set_autotune(bool on);
bool autotune_enabled();

}  // namespace tessera
