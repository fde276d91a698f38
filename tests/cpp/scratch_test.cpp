// runtime::Scratch with an installed allocator (runtime::set_scratch_allocator, what the torch ops
// install): each Scratch takes its memory from it and gives it back to it once, on its stream.
// The allocator here hands out host memory and never calls CUDA, so these run without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "gpu.hpp"
#include "runtime/scratch.hpp"

namespace {

struct Call {
  void* ptr;
  std::size_t bytes;
  cudaStream_t stream;
};
std::vector<Call> allocated, released;

void* host_allocate(std::size_t bytes, cudaStream_t stream) {
  void* p = std::malloc(bytes);
  allocated.push_back({p, bytes, stream});
  return p;
}

void host_release(void* ptr, cudaStream_t stream) {
  released.push_back({ptr, 0, stream});
  std::free(ptr);
}

const tessera::runtime::ScratchAllocator kHost{host_allocate, host_release};

class ScratchAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    allocated.clear(), released.clear();
    tessera::runtime::set_scratch_allocator(&kHost);
  }
  void TearDown() override { tessera::runtime::set_scratch_allocator(nullptr); }
};

TEST_F(ScratchAllocatorTest, TakesAndGivesBackThroughTheAllocatorOnItsStream) {
  const auto stream = reinterpret_cast<cudaStream_t>(0x10);
  {
    tessera::runtime::Scratch s(256, stream);
    ASSERT_EQ(allocated.size(), 1u);
    EXPECT_EQ(s.data(), allocated[0].ptr);
    EXPECT_EQ(s.bytes(), 256u);
    EXPECT_EQ(allocated[0].bytes, 256u);
    EXPECT_EQ(allocated[0].stream, stream);
    EXPECT_TRUE(released.empty());
  }
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].ptr, allocated[0].ptr);
  EXPECT_EQ(released[0].stream, stream);
}

TEST_F(ScratchAllocatorTest, EmptyScratchAsksForNothing) {
  { tessera::runtime::Scratch s(0, nullptr); }
  EXPECT_TRUE(allocated.empty());
  EXPECT_TRUE(released.empty());
}

TEST_F(ScratchAllocatorTest, MovesGiveBackOnce) {
  {
    tessera::runtime::Scratch a(64, nullptr);
    tessera::runtime::Scratch b(std::move(a));
    EXPECT_EQ(a.data(), nullptr);
    tessera::runtime::Scratch c(32, nullptr);
    c = std::move(b);  // c's own memory goes back now, b's when c goes
    ASSERT_EQ(released.size(), 1u);
    EXPECT_EQ(released[0].ptr, allocated[1].ptr);
    EXPECT_EQ(c.data(), allocated[0].ptr);
  }
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[1].ptr, allocated[0].ptr);
}

TEST_F(ScratchAllocatorTest, MemoryGoesBackToTheAllocatorThatGaveItAfterUninstalling) {
  {
    tessera::runtime::Scratch s(128, nullptr);
    tessera::runtime::set_scratch_allocator(nullptr);  // later Scratch from the pool; s still ours
  }
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].ptr, allocated[0].ptr);
}

// Counters lent zero (runtime::zeroed_counters): a stream's buffer is handed out zeroed, reused
// while the kernels leave it zero, and grown zeroed; a stream being captured into a graph gets
// scratch instead, zeroed by a memset the graph records.
TEST(ZeroedCountersGpu, ZeroOnEveryLoanAndScratchUnderCapture) {
  TESSERA_REQUIRE_GPU();
  using tessera::runtime::Scratch;
  using tessera::runtime::zeroed_counters;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const auto all_zero = [&](const int* p, int n) {
    std::vector<int> h(n, -1);
    EXPECT_EQ(cudaMemcpyAsync(h.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (int v : h)
      if (v != 0) return false;
    return true;
  };
  Scratch unused;
  int* a = zeroed_counters(16, s, unused);
  EXPECT_EQ(unused.data(), nullptr);
  EXPECT_TRUE(all_zero(a, 16));
  EXPECT_EQ(zeroed_counters(8, s, unused), a);  // the same buffer, still zero
  int* b = zeroed_counters(4096, s, unused);     // grown, zeroed
  EXPECT_TRUE(all_zero(b, 4096));
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  {
    Scratch captured;
    int* c = zeroed_counters(4, s, captured);
    EXPECT_EQ(c, captured.as<int>());
  }  // freed inside the capture, as the graph's own allocation
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
