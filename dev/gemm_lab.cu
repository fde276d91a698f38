// The GEMM lab: the sm90 kernel's bf16 instances (bf16 out), or with --tf32 its float32 ones
// (float32 out, TF32 multiplies), against cuBLAS, built apart from the library so that a kernel change is compiled in a minute
// and measured in one short device call. Not part of the build; dev/gemm_lab.sh builds and runs it.
//
//   gemm_lab [--rounds R] [--schedule auto|cooperative|pingpong|all] [--splits S] [--bias] [--gelu]
//            [--preact] [--beta] [--residual] [--tf32]
//            M,N,K[,LAYOUT] ...
//
// LAYOUT names C = A @ B as torch users meet it (default NT, x @ W^T): the first letter T where A
// is a transposed view (stored K x M, M contiguous), the second T where B is (stored N x K, K
// contiguous); N: stored K x N, N contiguous. A weight's gradient G^T X is TN, x @ W is NN.
//
// --bias, --gelu add a bias, GELU to our epilogue only (the error column is then meaningless), to
// compare the schedules' epilogue costs; --preact also stores the pre-activation (implies --gelu).
// --beta: C = A W^T + C on both sides. --residual: C = A W^T + R, ours with R as the residual,
// cuBLAS as beta = 1 over a C holding R.
//
// Per shape: the largest difference from cuBLAS relative to cuBLAS's largest value (a check, not
// a test), then interleaved rounds (cuBLAS, tessera, cuBLAS again), each call after an L2 flush,
// timed by events; the median times and the median of the rounds' ratios. "peer/peer" is cuBLAS
// against itself: the harness's own noise.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/matrix/gemm_sm90_instance.cuh"
#include "lab.cuh"

using namespace tessera;
using namespace tessera::matrix;

struct Options {
  int rounds = 20, splits = 0;
  bool with_bias = false, gelu = false, preact = false, residual = false, tf32 = false;
  float beta = 0.0f;
  std::string schedule = "all";
};

template <class T>
void bench_shape(const Options& o, const std::array<int64_t, 3>& s, const std::string& layout,
                 const cudaDeviceProp& prop, cublasHandle_t h, void* flush, size_t flush_bytes) {
    const int rounds = o.rounds, splits = o.splits;
    const bool with_bias = o.with_bias, gelu = o.gelu, preact = o.preact, residual = o.residual;
    const float beta = o.beta;
    const std::string& schedule = o.schedule;
    constexpr bool kF32 = std::is_same_v<T, float>;
    constexpr cudaDataType_t kType = kF32 ? CUDA_R_32F : CUDA_R_16BF;
    constexpr int64_t E = sizeof(T);
    Timer timer;
    const int64_t m = s[0], n = s[1], k = s[2];
    const bool ta = layout[0] == 'T', tb = layout[1] == 'T';
    T *a, *w, *c, *ref, *bias, *z = nullptr, *res = nullptr;
    CK(cudaMalloc(&a, m * k * E)), CK(cudaMalloc(&w, n * k * E)), CK(cudaMalloc(&bias, n * E));
    fill<<<64, 256>>>(bias, n, 3);
    CK(cudaMalloc(&c, m * n * E)), CK(cudaMalloc(&ref, m * n * E));
    if (preact) CK(cudaMalloc(&z, m * n * E));
    if (residual) CK(cudaMalloc(&res, m * n * E)), fill<<<1024, 256>>>(res, m * n, 4);
    const float peer_beta = residual ? 1.0f : beta;
    fill<<<1024, 256>>>(a, m * k, 1), fill<<<1024, 256>>>(w, n * k, 2);
    const float one = 1.0f;
    auto peer = [&] {
      // Column-major: C^T (n x m) = op(B) op(A), B read as stored (n x k with K contiguous: op T).
      CK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n),
                      int(m), int(k), &one, w, kType, int(tb ? k : n), a, kType,
                      int(ta ? m : k), &peer_beta, ref, kType, int(n),
                      kF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT));
    };
    GemmArgs g;
    g.a = a, g.b = w, g.c = c, g.m = m, g.n = n, g.k = k;
    if (kF32) g.dtype = g.out_dtype = DType::float32;
    g.a_sm = ta ? 1 : k, g.a_sk = ta ? m : 1, g.b_sn = tb ? k : 1, g.b_sk = tb ? 1 : n;
    g.c_sm = n, g.c_sn = 1;
    if (with_bias) g.bias = bias, g.bias_sn = 1;
    if (gelu) g.activation = Activation::gelu;
    if (preact) g.z = z, g.z_sm = n, g.z_sn = 1;
    if (residual) g.residual = res, g.r_sm = n, g.r_sn = 1;
    g.beta = beta;
    const GemmCtx ctx{prop.multiProcessorCount, prop.major};
    for (int sched = 0; sched < 3; ++sched) {
      const char* names[] = {"auto", "cooperative", "pingpong"};
      if (schedule != "all" && schedule != names[sched]) continue;
      g.config.schedule = sched;
      g.config.splits = splits;
      const sm90::Choice ch = sm90::choose(g, ctx);
      Sm90Tier::Plan p;
      p.pingpong = ch.pingpong, p.splits = ch.splits, p.whole = ch.whole, p.group = 8;
      const int64_t t = sm90::tiles(g, p.pingpong ? sm90::PingPong::BN : sm90::Cooperative::BN);
      const int64_t units = p.splits > 1 ? p.whole + (t - p.whole) * p.splits : t;
      p.grid = int(std::min(units, int64_t(ctx.sms)));
      auto ours = [&] { sm90::launch_sm90<T>(g, p, 0); };
      if (beta != 0.0f || residual) fill<<<1024, 256>>>(c, m * n, 4), fill<<<1024, 256>>>(ref, m * n, 4);
      else CK(cudaMemset(c, 0xff, m * n * E));
      peer(), ours();
      CK(cudaDeviceSynchronize());
      std::vector<T> hc(m * n), hr(m * n);
      CK(cudaMemcpy(hc.data(), c, m * n * E, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hr.data(), ref, m * n * E, cudaMemcpyDeviceToHost));
      double err = 0, big = 0;
      for (int64_t i = 0; i < m * n; ++i) {
        const double x = float(hc[i]), y = float(hr[i]);
        err = std::isfinite(x) ? std::max(err, std::fabs(x - y)) : INFINITY;
        big = std::max(big, std::fabs(y));
      }
      for (int i = 0; i < 3; ++i) peer(), ours();  // warm clocks and caches
      std::vector<float> tp, to, tp2;
      for (int r = 0; r < rounds; ++r) {
        tp.push_back(timer.us(peer, flush, flush_bytes));
        to.push_back(timer.us(ours, flush, flush_bytes));
        tp2.push_back(timer.us(peer, flush, flush_bytes));
      }
      std::vector<float> ratio, self;  // per round: the clocks drift less within a round
      for (int r = 0; r < rounds; ++r) ratio.push_back(tp[r] / to[r]), self.push_back(tp[r] / tp2[r]);
      const float mp = median(tp), mo = median(to);
      char shape[64], sched_name[32];
      std::snprintf(sched_name, sizeof sched_name, "%s%s/%d/g%d", names[sched], p.pingpong ? "(pp)" : "", p.splits,
                    p.grid);
      std::snprintf(shape, sizeof shape, "%lld,%lld,%lld", (long long)m, (long long)n, (long long)k);
      std::printf("%-23s %-22s %9.1f %9.1f %9.3f %7.0f %9.3f %9.2e\n", shape,
                  sched_name, mp, mo, median(ratio), 2.0 * m * n * k / mo / 1e6,
                  median(self), err / big);
      std::fflush(stdout);
    }
    CK(cudaFree(a)), CK(cudaFree(w)), CK(cudaFree(c)), CK(cudaFree(ref)), CK(cudaFree(bias)), CK(cudaFree(z)), CK(cudaFree(res));
}


int main(int argc, char** argv) {
  Options o;
  int& rounds = o.rounds;
  int& splits = o.splits;
  bool &with_bias = o.with_bias, &gelu = o.gelu, &preact = o.preact, &residual = o.residual;
  float& beta = o.beta;
  std::string& schedule = o.schedule;
  std::vector<std::array<int64_t, 3>> shapes;
  std::vector<std::string> layouts;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--schedule") && i + 1 < argc) schedule = argv[++i];
    else if (!std::strcmp(argv[i], "--splits") && i + 1 < argc) splits = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gelu")) gelu = true;
    else if (!std::strcmp(argv[i], "--bias")) with_bias = true;
    else if (!std::strcmp(argv[i], "--preact")) gelu = preact = true;
    else if (!std::strcmp(argv[i], "--beta")) beta = 1.0f;
    else if (!std::strcmp(argv[i], "--residual")) residual = true;
    else if (!std::strcmp(argv[i], "--tf32")) o.tf32 = true;
    else {
      long long m, n, k;
      char lay[3] = "NT";
      const int got = std::sscanf(argv[i], "%lld,%lld,%lld,%2[NT]", &m, &n, &k, lay);
      if (got < 3) {
        std::fprintf(stderr, "shape '%s': expected M,N,K[,LAYOUT]\n", argv[i]);
        return 2;
      }
      shapes.push_back({m, n, k});
      layouts.push_back(lay);
    }
  }
  if (shapes.empty()) shapes = {{4096, 4096, 4096}, {8192, 8192, 8192}}, layouts = {"NT", "NT"};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = size_t(512) << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  std::printf("%-23s %-22s %9s %9s %9s %7s %9s %9s\n", "M,N,K", "schedule", "cublas_us", "ours_us",
              "ratio", "TFLOP/s", "peer/peer", "max_err");
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    if (o.tf32) bench_shape<float>(o, shapes[si], layouts[si], prop, h, flush, flush_bytes);
    else bench_shape<__nv_bfloat16>(o, shapes[si], layouts[si], prop, h, flush, flush_bytes);
  }
  return 0;
}
