// GPU-side tests of the benchmark engine: time_op (eager and CUDA graph), measure_peaks and
// profile_kernels on a kernel of known launch shape. They check structure and sanity, never
// speed (speed belongs in docs/PERF.md). They skip on machines without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "bench/bench.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "tessera/error.hpp"

namespace tb = tessera::bench;

namespace {

// A kernel with a recognizable name, a 2-D grid and block, static and dynamic shared memory.
__global__ void bench_probe_kernel(float* out, int n) {
  __shared__ float tile[32];
  extern __shared__ float dyn[];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y + t;
  if (t < 32) tile[t] = static_cast<float>(t);
  dyn[t % 32] = 1.0f;
  __syncthreads();
  if (i < n) out[i] = tile[t % 32] + dyn[t % 32];
}

constexpr int kN = 3 * 2 * 64 * 2;

void launch_probe(float* out, cudaStream_t stream) {
  bench_probe_kernel<<<dim3(3, 2, 1), dim3(64, 2, 1), 128, stream>>>(out, kN);
  TESSERA_LAUNCH_CHECK();
}

void expect_ordered(const tb::Stats& s) {
  EXPECT_GT(s.min_ms, 0.0);
  EXPECT_LE(s.min_ms, s.p20_ms);
  EXPECT_LE(s.p20_ms, s.median_ms);
  EXPECT_LE(s.median_ms, s.p80_ms);
  EXPECT_LE(s.p80_ms, s.max_ms);
  EXPECT_GE(s.mean_ms, s.min_ms);
  EXPECT_LE(s.mean_ms, s.max_ms);
}

tb::TimingOptions quick() {
  tb::TimingOptions o;
  o.warmup_ms = 2;
  o.min_reps = 5;
  o.max_reps = 40;
  o.budget_ms = 5;
  return o;
}

}  // namespace

TEST(BenchTiming, TimesAKernelWithinRepBounds) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  tessera::runtime::DeviceBuffer out(kN * sizeof(float));
  int calls = 0;
  const tb::TimingOptions o = quick();
  const tb::Stats s = tb::time_op(
      [&](cudaStream_t st) {
        ++calls;
        launch_probe(static_cast<float*>(out.data()), st);
      },
      nullptr, o);
  EXPECT_GE(s.reps, o.min_reps);
  EXPECT_LE(s.reps, o.max_reps);
  EXPECT_GT(calls, s.reps);  // plus the first call and the warm-up
  expect_ordered(s);
}

TEST(BenchTiming, TimesAMemsetOnAUserStreamWithoutFlush) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  tessera::runtime::DeviceBuffer buf(std::size_t{64} << 20);
  cudaStream_t stream = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&stream));
  tb::TimingOptions o = quick();
  o.flush_l2 = false;
  o.min_reps = o.max_reps = 7;  // exactly this many
  const tb::Stats s = tb::time_op(
      [&](cudaStream_t st) { TESSERA_CUDA_CHECK(cudaMemsetAsync(buf.data(), 1, buf.bytes(), st)); },
      stream, o);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(s.reps, 7);
  expect_ordered(s);
}

TEST(BenchTiming, GraphModeTimesPerCall) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  tessera::runtime::DeviceBuffer out(kN * sizeof(float));
  cudaStream_t stream = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&stream));
  tb::TimingOptions o = quick();
  o.cuda_graph = true;
  o.graph_batch = 8;
  int calls = 0;
  const tb::Stats s = tb::time_op(
      [&](cudaStream_t st) {
        ++calls;
        launch_probe(static_cast<float*>(out.data()), st);
      },
      stream, o);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_EQ(calls, 1 + o.graph_batch);  // one eager call, then only the capture calls op
  EXPECT_GE(s.reps, o.min_reps);
  expect_ordered(s);
}

TEST(BenchTiming, GraphModeRejectsAnOpThatIgnoresItsStream) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  tessera::runtime::DeviceBuffer out(kN * sizeof(float));
  tb::TimingOptions o = quick();
  o.cuda_graph = true;
  cudaStream_t own = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  // Enqueues on a stream of its own: nothing lands in the capture.
  EXPECT_THROW(tb::time_op([&](cudaStream_t) { launch_probe(static_cast<float*>(out.data()), own); },
                           nullptr, o),
               tessera::Error);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(own));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(own));
}

TEST(BenchTiming, PropagatesTheOpsException) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  int calls = 0;
  EXPECT_THROW(tb::time_op(
                   [&](cudaStream_t) {
                     if (++calls == 3) throw std::runtime_error("from the op");
                   },
                   nullptr, quick()),
               std::runtime_error);
  // The GPU is still usable afterwards.
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(BenchPeaks, ReportsThisGpu) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  const tb::Peaks p = tb::measure_peaks(nullptr);
  const cudaDeviceProp& props = tessera::runtime::device_props(p.device);
  EXPECT_EQ(p.gpu, std::string(props.name));
  EXPECT_EQ(p.sm_count, props.multiProcessorCount);
  EXPECT_GT(p.l2_mb, 0.0);
  EXPECT_GT(p.memory_gb, 0.0);
  EXPECT_GT(p.driver_version, 0);
  EXPECT_GT(p.runtime_version, 0);
  EXPECT_TRUE(std::isfinite(p.copy_gbps) && p.copy_gbps > 0) << p.copy_gbps;
  EXPECT_TRUE(std::isfinite(p.bf16_tflops) && p.bf16_tflops > 0) << p.bf16_tflops;
}

TEST(BenchProfile, SeesANamedKernelWithItsLaunchShape) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  tessera::runtime::DeviceBuffer out(kN * sizeof(float));
  // Twice: the CUPTI session must be reusable within one process.
  for (int round = 0; round < 2; ++round) {
    const auto kernels = tb::profile_kernels([&] {
      launch_probe(static_cast<float*>(out.data()), nullptr);
      launch_probe(static_cast<float*>(out.data()), nullptr);
    });
    ASSERT_EQ(kernels.size(), 2u) << "round " << round;
    for (const tb::KernelRecord& k : kernels) {
      EXPECT_NE(k.name.find("bench_probe_kernel"), std::string::npos) << k.name;
      EXPECT_NE(k.name.find("(float*, int)"), std::string::npos) << "not demangled: " << k.name;
      EXPECT_EQ(k.grid[0], 3u);
      EXPECT_EQ(k.grid[1], 2u);
      EXPECT_EQ(k.grid[2], 1u);
      EXPECT_EQ(k.block[0], 64u);
      EXPECT_EQ(k.block[1], 2u);
      EXPECT_EQ(k.block[2], 1u);
      EXPECT_EQ(k.dynamic_smem, 128);
      EXPECT_GE(k.static_smem, static_cast<int>(32 * sizeof(float)));
      EXPECT_GT(k.registers, 0);
      EXPECT_GT(k.duration_us, 0.0);
    }
    const std::string table = tb::profile_table(kernels);
    EXPECT_NE(table.find("bench_probe_kernel"), std::string::npos) << table;
    EXPECT_NE(table.find("total (2 kernels)"), std::string::npos) << table;
  }
}

TEST(BenchProfile, NothingLaunchedGivesNoRecords) {
  if (tessera::runtime::device_count() == 0) GTEST_SKIP() << tessera::runtime::no_gpu_reason();
  EXPECT_TRUE(tb::profile_kernels([] {}).empty());
}
