// The ceilings every benchmark row is compared with, measured on this GPU in this run: a large
// device-to-device copy (bandwidth) and a large cuBLAS bf16 GEMM (tensor-core throughput).
#include <string>

#include "bench/bench.hpp"
#include "bench/cublas.hpp"
#include "bench/fill.hpp"
#include "bench/toolkit_lib.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "runtime/nvtx.hpp"

namespace tessera::bench {
namespace {

// 1 GiB: far beyond any L2, long enough (~0.5 ms at 4 TB/s) that launch cost is noise.
constexpr std::size_t kCopyBytes = std::size_t{1} << 30;
// 8192^3: large enough for cuBLAS to reach its best tile configuration on every recent GPU.
constexpr int kGemmDim = 8192;

double measure_copy_gbps(cudaStream_t stream) {
  runtime::DeviceBuffer src(kCopyBytes), dst(kCopyBytes);
  bench::fill_uniform(src.data(), DType::float32, kCopyBytes / sizeof(float), -1, 1, 0x5eed, stream);
  const Stats st = time_op(
      [&](cudaStream_t s) {
        TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), kCopyBytes, cudaMemcpyDeviceToDevice, s));
      },
      stream);
  // Every byte is read once and written once.
  return 2.0 * static_cast<double>(kCopyBytes) / st.median_ms * 1e-6;
}

double measure_bf16_tflops(cudaStream_t stream) {
  const int64_t n = kGemmDim;
  const std::size_t bytes = static_cast<std::size_t>(n * n) * 2;  // bf16
  runtime::DeviceBuffer a(bytes), b(bytes), c(bytes);
  // Random inputs, never zeros: tensor-core power (and so clocks) depend on the data.
  bench::fill_uniform(a.data(), DType::bfloat16, n * n, -1, 1, 0xa11ce, stream);
  bench::fill_uniform(b.data(), DType::bfloat16, n * n, -1, 1, 0xb0b, stream);
  const CublasGemm gemm;
  const Stats st = time_op(
      [&](cudaStream_t s) { gemm.run(DType::bfloat16, false, n, n, n, a.data(), b.data(), c.data(), s); },
      stream);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         st.median_ms * 1e-9;
}

}  // namespace

Peaks measure_peaks(cudaStream_t stream) {
  runtime::NvtxRange range("tessera.bench.measure_peaks");
  Peaks p;
  TESSERA_CUDA_CHECK(cudaGetDevice(&p.device));
  const cudaDeviceProp& props = runtime::device_props(p.device);
  p.gpu = props.name;
  p.sm_count = props.multiProcessorCount;
  p.l2_mb = static_cast<double>(props.l2CacheSize) / (1 << 20);
  // GiB, the unit nvidia-smi and torch report memory in.
  p.memory_gb = static_cast<double>(props.totalGlobalMem) / (1ull << 30);
  TESSERA_CUDA_CHECK(cudaDriverGetVersion(&p.driver_version));
  TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&p.runtime_version));
  // One after the other, each freeing its buffers: 2 GiB then 384 MiB, never both at once.
  p.copy_gbps = measure_copy_gbps(stream);
  // Without cuBLAS (a machine with a driver and no toolkit) the GEMM peak stays 0, "not measured":
  // the tables then leave out the % of GEMM column.
  if (cublas_library().available()) p.bf16_tflops = measure_bf16_tflops(stream);
  return p;
}

}  // namespace tessera::bench
