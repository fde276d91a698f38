#include "runtime/scratch.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/check.hpp"

namespace tessera::runtime {
namespace {

cudaMemPool_t pool_for(int device) {
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(pools.size())) pools.resize(device + 1, nullptr);
  if (!pools[device]) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool;
    TESSERA_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    uint64_t keep = UINT64_MAX;
    TESSERA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    pools[device] = pool;  // lives as long as the process
  }
  return pools[device];
}

std::atomic<const ScratchAllocator*> installed{nullptr};

}  // namespace

void set_scratch_allocator(const ScratchAllocator* a) { installed.store(a); }

Scratch::Scratch(std::size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  if (const ScratchAllocator* a = installed.load(std::memory_order_acquire)) {
    ptr_ = a->allocate(bytes, stream);
    from_ = a;
    return;
  }
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr_, bytes, pool_for(device), stream));
}

void Scratch::release() noexcept {
  if (ptr_ && from_) from_->release(ptr_, stream_);
  else if (ptr_) cudaFreeAsync(ptr_, stream_);
  from_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Scratch::~Scratch() { release(); }

Scratch::Scratch(Scratch&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), stream_(o.stream_), from_(o.from_) {
  o.ptr_ = nullptr;
  o.from_ = nullptr;
  o.bytes_ = 0;
}

Scratch& Scratch::operator=(Scratch&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    stream_ = o.stream_;
    from_ = o.from_;
    o.ptr_ = nullptr;
    o.from_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

int* zeroed_counters(std::size_t ints, cudaStream_t stream, Scratch& fallback) {
  const std::size_t bytes = std::max<std::size_t>(ints, 1) * sizeof(int);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    fallback = Scratch(bytes, stream);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(fallback.data(), 0, bytes, stream));
    return fallback.as<int>();
  }
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  struct Buffer {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Buffer> buffers;  // never freed: the process's
  std::lock_guard<std::mutex> lock(mu);
  Buffer& b = buffers[{device, stream}];
  if (b.bytes < bytes) {
    const std::size_t grown = std::max<std::size_t>(bytes, 2 * b.bytes);
    if (b.ptr) TESSERA_CUDA_CHECK(cudaFreeAsync(b.ptr, stream));
    TESSERA_CUDA_CHECK(cudaMallocFromPoolAsync(&b.ptr, grown, pool_for(device), stream));
    TESSERA_CUDA_CHECK(cudaMemsetAsync(b.ptr, 0, grown, stream));
    b.bytes = grown;
  }
  return static_cast<int*>(b.ptr);
}

std::size_t scratch_peak_bytes(int device) {
  unsigned long long high = 0;  // the attribute is a 64-bit count
  TESSERA_CUDA_CHECK(cudaMemPoolGetAttribute(pool_for(device), cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<std::size_t>(high);
}

void reset_scratch_peak(int device) {
  unsigned long long zero = 0;  // the driver takes 0 as "the current use"
  TESSERA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_for(device), cudaMemPoolAttrUsedMemHigh, &zero));
}

}  // namespace tessera::runtime
