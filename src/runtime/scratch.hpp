// Stream-ordered scratch memory for operators that need a temporary buffer (partial sums of a
// deterministic reduction, a contiguous copy of a strided input). Allocated from a tessera-owned
// memory pool per device with cudaMallocFromPoolAsync and returned with cudaFreeAsync on the same
// stream, so it is safe across streams and costs no device synchronization; the pool keeps freed
// memory for reuse (release threshold: unlimited) instead of handing it back to the driver.
// A framework with its own stream-ordered caching allocator (the torch ops) installs it instead
// (set_scratch_allocator): scratch memory is then reused with the framework's and counted in its
// memory statistics, and a call skips the pool's driver calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tessera::runtime {

// Stream-ordered allocation: memory from `allocate` is usable by work enqueued on `stream` after
// the call; `release` may hand it to later work on that stream at once.
struct ScratchAllocator {
  void* (*allocate)(std::size_t bytes, cudaStream_t stream);
  void (*release)(void* ptr, cudaStream_t stream);
};
// Every Scratch made after this call comes from `a` (nullptr: tessera's pool again). `a` must
// outlive them.
void set_scratch_allocator(const ScratchAllocator* a);

class Scratch {
 public:
  Scratch() = default;
  // `bytes` on the current device, usable by work enqueued on `stream` after this call.
  Scratch(std::size_t bytes, cudaStream_t stream);
  ~Scratch();  // frees on the same stream: work already enqueued may still use the memory
  Scratch(Scratch&& o) noexcept;
  Scratch& operator=(Scratch&& o) noexcept;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  void* data() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  const ScratchAllocator* from_ = nullptr;  // the installed allocator that gave ptr_, if any
};

// Counters for kernels whose CTAs count themselves in (a split of K meeting on a counter per
// output block): `ints` ints on the current device, zero for work enqueued on `stream` after the
// call, lent on the condition that the kernels leave them zero (the last CTA to use a counter sets
// it back), so that no call pays a memset. One buffer per device and stream, kept for the
// process and grown in stream order (the old one freed after the work that used it). While the
// stream is captured into a graph the counters come from `fallback` instead, zeroed by a memset
// the graph records.
int* zeroed_counters(std::size_t ints, cudaStream_t stream, Scratch& fallback);

// What a launch that splits its work over CTAs meeting on counters holds for the call: `floats`
// float32 partial sums (Scratch) and `counters` zeroed counters (zeroed_counters). Empty (null
// pointers, nothing taken) where the launch does not split, `splits` <= 1.
class SplitScratch {
 public:
  SplitScratch() = default;
  SplitScratch(int splits, std::size_t floats, std::size_t counters, cudaStream_t stream) {
    if (splits <= 1) return;
    partials_ = Scratch(floats * sizeof(float), stream);
    counters_ = zeroed_counters(counters, stream, fallback_);
  }
  float* partials() const { return partials_.as<float>(); }
  template <class C = int>
  C* counters() const { return reinterpret_cast<C*>(counters_); }

 private:
  Scratch partials_, fallback_;
  int* counters_ = nullptr;
};

// The high-water mark of the scratch memory in use on `device` since the last reset (the pool's
// own counter), and the reset, which sets it to what is in use now: what a call holds beyond its
// arguments, for memory reports (tessera.bench.do_bench(memory=True)). Memory an installed
// allocator gave is not counted here (the framework counts it).
std::size_t scratch_peak_bytes(int device);
void reset_scratch_peak(int device);

}  // namespace tessera::runtime
