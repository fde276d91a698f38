// The SIMT GEMM lab: the float32 kernel of gemm_simt.cu (exact float32 FMAs) against cuBLAS's
// float32 GEMM (no TF32), every layout, built apart from the library so that a variant of the
// kernel is compiled in a minute and measured in one short device call. Not part of the build:
//   nvcc ... -Isrc dev/simt_lab.cu (dev/gemm_lab.sh simt)
//   simt_lab [--rounds R] M,N,K[,LAYOUT] ...      (LAYOUT as in gemm_lab.cu; default NT)
// Per shape: the largest difference from cuBLAS relative to its largest value (a check), then
// interleaved rounds (cuBLAS, ours, cuBLAS), each after an L2 flush; medians as gemm_lab prints.
#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lab.cuh"
#include "ops/matrix/gemm_simt.cu"

namespace tessera::matrix {
// The generic kernel is not measured here.
void launch_simt_generic(const GemmArgs&, dim3, cudaStream_t) { std::abort(); }
}  // namespace tessera::matrix

using namespace tessera;
using namespace tessera::matrix;

int main(int argc, char** argv) {
  int rounds = 15;
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else shapes.push_back(argv[i]);
  }
  if (shapes.empty()) shapes = {"4096,4096,4096,NT", "4096,4096,4096,NN", "4096,4096,4096,TN", "4096,4096,4096,TT"};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = size_t(512) << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  Timer timer;
  std::printf("%-20s %9s %9s %7s %7s %9s %9s\n", "M,N,K,LAYOUT", "cublas_us", "ours_us", "ratio", "TFLOP/s", "peer/peer",
              "max_err");
  for (const std::string& spec : shapes) {
    long long m, n, k;
    char lay[3] = "NT";
    if (std::sscanf(spec.c_str(), "%lld,%lld,%lld,%2[NT]", &m, &n, &k, lay) < 3) {
      std::fprintf(stderr, "shape '%s': expected M,N,K[,LAYOUT]\n", spec.c_str());
      return 2;
    }
    const bool ta = lay[0] == 'T', tb = lay[1] == 'T';
    float *a, *w, *c, *ref;
    CK(cudaMalloc(&a, m * k * 4)), CK(cudaMalloc(&w, n * k * 4));
    CK(cudaMalloc(&c, m * n * 4)), CK(cudaMalloc(&ref, m * n * 4));
    fill<<<1024, 256>>>(a, m * k, 1), fill<<<1024, 256>>>(w, n * k, 2);
    const float one = 1.0f, zero = 0.0f;
    auto peer = [&] {
      CK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
                      &one, w, CUDA_R_32F, int(tb ? k : n), a, CUDA_R_32F, int(ta ? m : k), &zero, ref,
                      CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    GemmArgs g;
    g.dtype = g.out_dtype = DType::float32;
    g.a = a, g.b = w, g.c = c, g.m = m, g.n = n, g.k = k;
    g.a_sm = ta ? 1 : k, g.a_sk = ta ? m : 1, g.b_sn = tb ? k : 1, g.b_sk = tb ? 1 : n;
    g.c_sm = n, g.c_sn = 1;
    const SimtTier::Plan p = SimtTier::plan(g, GemmCtx{prop.multiProcessorCount, prop.major});
    auto ours = [&] { SimtTier::launch(g, p, 0); };
    peer(), ours();
    CK(cudaDeviceSynchronize());
    std::vector<float> hc(m * n), hr(m * n);
    CK(cudaMemcpy(hc.data(), c, m * n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hr.data(), ref, m * n * 4, cudaMemcpyDeviceToHost));
    double err = 0, big = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      err = std::isfinite(hc[i]) ? std::max(err, std::fabs(double(hc[i]) - hr[i])) : INFINITY;
      big = std::max(big, std::fabs(double(hr[i])));
    }
    for (int i = 0; i < 3; ++i) peer(), ours();
    std::vector<float> tp, to, tp2, ratio, self;
    for (int r = 0; r < rounds; ++r) {
      tp.push_back(timer.us(peer, flush, flush_bytes));
      to.push_back(timer.us(ours, flush, flush_bytes));
      tp2.push_back(timer.us(peer, flush, flush_bytes));
      ratio.push_back(tp.back() / to.back()), self.push_back(tp.back() / tp2.back());
    }
    const float mo = median(to);
    std::printf("%-20s %9.1f %9.1f %7.3f %7.1f %9.3f %9.2e\n", spec.c_str(), median(tp), mo, median(ratio),
                2.0 * m * n * k / mo / 1e6, median(self), err / big);
    std::fflush(stdout);
    CK(cudaFree(a)), CK(cudaFree(w)), CK(cudaFree(c)), CK(cudaFree(ref));
  }
  return 0;
}
