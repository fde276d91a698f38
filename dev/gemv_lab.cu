// The GEMV lab: the sm90 GEMV kernel (src/ops/matrix/gemv_sm90.cuh) against cuBLAS and a copy of
// the weight's bytes, built apart from the library (dev/gemm_lab.sh gemv builds it) and run in one
// short device call. Not part of the build.
//
//   gemv_lab [--rounds R] M,N,K ...      (M <= 16, K a multiple of 64; C = A W^T, bf16)
//
// Per shape: the largest difference from cuBLAS relative to cuBLAS's largest value, whether a
// second launch without zeroing the counters gives the same bits (the kernel leaves them zero),
// then interleaved rounds (cuBLAS, ours, a device-to-device copy of W's bytes), each after an L2
// flush, timed by events: the medians, W's bytes over our time against the copy's rate (bytes read
// and written over its time), cuBLAS's time over ours, and the time of a kernel that only reads W.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ops/matrix/gemv_sm90.cuh"
#include "lab.cuh"

using namespace tessera;
using namespace tessera::matrix;

// W's bytes read once and nothing written (but a value no input makes): what reading alone reaches.
__global__ void read_only(const uint4* p, int64_t n, uint4* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * int64_t(blockDim.x)) {
    const uint4 v = __ldcs(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u && threadIdx.x == 1023) sink->x = x;
}

int main(int argc, char** argv) {
  int rounds = 20;
  std::vector<std::array<int64_t, 3>> shapes;
  for (int i = 1; i < argc; ++i) {
    long long m, n, k;
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (std::sscanf(argv[i], "%lld,%lld,%lld", &m, &n, &k) == 3) shapes.push_back({m, n, k});
    else return std::fprintf(stderr, "shape '%s': expected M,N,K\n", argv[i]), 2;
  }
  if (shapes.empty()) shapes = {{1, 14336, 4096}, {16, 14336, 4096}, {16, 4096, 4096}};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = size_t(512) << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  Timer timer;
  auto time_us = [&](auto&& f) { return timer.us(f, flush, flush_bytes); };
  const auto kernel = gemv::gemv_kernel<__nv_bfloat16, __nv_bfloat16>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(gemv::smem_bytes())));
  std::printf("%-18s %-10s %9s %9s %9s %9s %9s %6s %7s %9s %-9s %s\n", "M,N,K", "plan", "cublas_us", "ours_us",
              "copy_us", "ours_GB/s", "copy_GB/s", "%copy", "ratio", "max_err", "rerun", "read_us");
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    if (m > gemv::kMaxM || k % gemv::kSub) {
      std::printf("%lld,%lld,%lld: M <= 16 and K a multiple of 64 only\n", (long long)m, (long long)n, (long long)k);
      continue;
    }
    __nv_bfloat16 *a, *w, *c, *ref, *copy;
    CK(cudaMalloc(&a, m * k * 2)), CK(cudaMalloc(&w, n * k * 2)), CK(cudaMalloc(&copy, n * k * 2));
    CK(cudaMalloc(&c, m * n * 2)), CK(cudaMalloc(&ref, m * n * 2));
    fill<<<1024, 256>>>(a, m * k, 1), fill<<<1024, 256>>>(w, n * k, 2);
    gemv::Args p{};
    p.a = a, p.a_sm = k, p.w = w, p.w_sn = k, p.m = int(m), p.n = n, p.k = k;
    gemv::plan(p, prop.multiProcessorCount);
    float* partial = nullptr;
    unsigned* counters = nullptr;
    CK(cudaMalloc(&partial, std::max<int64_t>(1, p.splits * m * n) * 4));
    CK(cudaMalloc(&counters, p.blocks * 4));
    CK(cudaMemset(counters, 0, p.blocks * 4));  // once: the kernel leaves them zero
    p.partial = partial, p.counters = counters;
    GemmArgs g;
    g.a = a, g.b = w, g.c = c, g.m = m, g.n = n, g.k = k;
    g.a_sm = k, g.a_sk = 1, g.b_sn = k, g.b_sk = 1, g.c_sm = n, g.c_sn = 1;
    const auto epi = Epilogue<__nv_bfloat16>::from(g);
    const int grid = int(std::min<int64_t>(int64_t(p.blocks) * p.splits, prop.multiProcessorCount));
    const gemv::Maps maps = gemv::make_maps(DType::bfloat16, p);
    auto ours = [&] { kernel<<<grid, gemv::kThreads, gemv::smem_bytes()>>>(p, maps, epi); };
    const float one = 1.0f, zero = 0.0f;
    auto peer = [&] {
      CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, CUDA_R_16BF, int(k), a,
                      CUDA_R_16BF, int(k), &zero, ref, CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto copy_w = [&] { CK(cudaMemcpyAsync(copy, w, n * k * 2, cudaMemcpyDeviceToDevice)); };
    auto read_w = [&] { read_only<<<4 * prop.multiProcessorCount, 1024>>>(reinterpret_cast<const uint4*>(w), n * k / 8,
                                                                        reinterpret_cast<uint4*>(copy)); };
    CK(cudaMemset(c, 0xff, m * n * 2));
    peer(), ours();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> hc(m * n), hr(m * n), h2(m * n);
    CK(cudaMemcpy(hc.data(), c, m * n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hr.data(), ref, m * n * 2, cudaMemcpyDeviceToHost));
    double err = 0, big = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      const double x = __bfloat162float(hc[i]), y = __bfloat162float(hr[i]);
      err = std::isfinite(x) ? std::max(err, std::fabs(x - y)) : INFINITY;
      big = std::max(big, std::fabs(y));
    }
    CK(cudaMemset(c, 0xff, m * n * 2));
    ours();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h2.data(), c, m * n * 2, cudaMemcpyDeviceToHost));
    const bool same = std::memcmp(hc.data(), h2.data(), m * n * 2) == 0;
    for (int i = 0; i < 3; ++i) peer(), ours(), copy_w();
    std::vector<float> tp, to, tc, tr;
    for (int r = 0; r < rounds; ++r)
      tp.push_back(time_us(peer)), to.push_back(time_us(ours)), tc.push_back(time_us(copy_w)), tr.push_back(time_us(read_w));
    CK(cudaDeviceSynchronize());
    const float mp = median(tp), mo = median(to), mc = median(tc);
    const double bytes = double(n * k * 2);
    char shape[64], plan[32];
    std::snprintf(shape, sizeof shape, "%lld,%lld,%lld", (long long)m, (long long)n, (long long)k);
    std::snprintf(plan, sizeof plan, "%dx%d/g%d", p.blocks, p.splits, grid);
    // W's bytes over our time; the copy reads and writes them, so its rate counts both.
    const double ours_gbps = bytes / mo / 1e3, copy_gbps = 2 * bytes / mc / 1e3;
    std::printf("%-18s %-10s %9.1f %9.1f %9.1f %9.0f %9.0f %6.1f %7.3f %9.2e %-9s %.1f\n", shape, plan, mp, mo, mc,
                ours_gbps, copy_gbps, 100 * ours_gbps / copy_gbps, mp / mo, err / big, same ? "same bits" : "DIFFERENT",
                median(tr));
    std::fflush(stdout);
    CK(cudaFree(a)), CK(cudaFree(w)), CK(cudaFree(copy)), CK(cudaFree(c)), CK(cudaFree(ref));
    CK(cudaFree(partial)), CK(cudaFree(counters));
  }
  return 0;
}
