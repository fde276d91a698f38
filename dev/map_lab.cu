// The elementwise map's memory pipeline on its own, built in seconds apart from the library:
// silu_mul's forward (2 tensors in, 1 out) and its recomputing backward (3 in, 3 out) in bf16 at
// the Llama step's size, as the library's map kernel runs them and as variants (streaming cache
// hints, other unrolls and block sizes, a grid-stride loop), each in TB/s beside a device copy.
//   here:   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o dev/map_lab dev/map_lab.cu
//   device: dev/map_lab [elements]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "tile/activation.cuh"
#include "tile/map.cuh"

using bf16 = __nv_bfloat16;
using namespace tessera;

struct Fwd {
  __device__ float operator()(float g, float u) const { return tile::Silu<true>{}(g) * u; }
};
struct Bwd {
  __device__ tile::Floats<3> operator()(float dy, float g, float u) const {
    const float a = tile::Silu<true>{}(g);
    return {{tile::SiluBackward<true>{}(dy * u, g), dy * a, a * u}};
  }
};

template <bool S>
__device__ __forceinline__ uint4 ld(const uint4* p) { return S ? __ldcs(p) : *p; }
template <bool S>
__device__ __forceinline__ void st(uint4* p, uint4 v) { if (S) __stcs(p, v); else *p = v; }

__device__ __forceinline__ void unpack(uint4 v, float (&f)[8]) {
  const bf16* h = reinterpret_cast<const bf16*>(&v);
  for (int i = 0; i < 8; ++i) f[i] = __bfloat162float(h[i]);
}
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
  uint4 v;
  bf16* h = reinterpret_cast<bf16*>(&v);
  for (int i = 0; i < 8; ++i) h[i] = __float2bfloat16(f[i]);
  return v;
}

// Vectors of 8 (n a multiple of 8); U vectors per thread per step; grid-stride when GS.
template <int U, bool S, bool GS, int NIN, int NOUT, class F>
__global__ void lab_kernel(int64_t nv, const uint4* const* in, uint4* const* out, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x * U;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x * U; base < nv; base += step) {
    uint4 x[U][NIN];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * blockDim.x + threadIdx.x;
#pragma unroll
      for (int k = 0; k < NIN; ++k) x[u][k] = i < nv ? ld<S>(in[k] + i) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * blockDim.x + threadIdx.x;
      float a[NIN][8], r[NOUT][8];
#pragma unroll
      for (int k = 0; k < NIN; ++k) unpack(x[u][k], a[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (NIN == 2) {
          r[0][e] = f(a[0][e], a[1][e]);
        } else {
          const tile::Floats<3> y = f(a[0][e], a[1][e], a[2][e]);
          for (int k = 0; k < NOUT; ++k) r[k][e] = y.v[k];
        }
      }
      if (i < nv)
#pragma unroll
        for (int k = 0; k < NOUT; ++k) st<S>(out[k] + i, pack(r[k]));
    }
    if (!GS) break;
  }
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

template <class L>
float time_ms(L launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) launch();
  float best = 1e9;
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  CK(cudaGetLastError());
  return best;
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atoll(argv[1]) : int64_t(8192) * 5632, nv = n / 8;
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  bf16* buf[6];
  for (auto& p : buf) {
    CK(cudaMalloc(&p, n * sizeof(bf16)));
    CK(cudaMemset(p, 0x3c, n * sizeof(bf16)));
  }
  const uint4* in_h[3] = {(const uint4*)buf[0], (const uint4*)buf[1], (const uint4*)buf[2]};
  uint4* out_h[3] = {(uint4*)buf[3], (uint4*)buf[4], (uint4*)buf[5]};
  const uint4** in_d;
  uint4** out_d;
  CK(cudaMalloc(&in_d, sizeof in_h));
  CK(cudaMalloc(&out_d, sizeof out_h));
  CK(cudaMemcpy(in_d, in_h, sizeof in_h, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(out_d, out_h, sizeof out_h, cudaMemcpyHostToDevice));
  const double b = double(n) * sizeof(bf16);
  auto report = [&](const char* name, double bytes, float ms) {
    printf("%-44s %8.1f us %6.0f GB/s\n", name, ms * 1e3, bytes / ms / 1e6);
  };
  report("copy (cudaMemcpyAsync, 1 in 1 out)", 2 * b, time_ms([&] { cudaMemcpyAsync(buf[3], buf[0], b, cudaMemcpyDeviceToDevice); }));
  tile::Inputs<bf16, 2> i2{{buf[0], buf[1]}};
  tile::Inputs<bf16, 3> i3{{buf[0], buf[1], buf[2]}};
  tile::Outputs<bf16, 1> o1{{buf[3]}};
  tile::Outputs<bf16, 3> o3{{buf[3], buf[4], buf[5]}};
  report("fwd: library map_contiguous<8,4>", 3 * b, time_ms([&] { tile::launch_map_contiguous_v<8, 4, 2>(n, o1, i2, Fwd{}, 0); }));
  report("bwd: library map_contiguous<8,4>", 6 * b, time_ms([&] { tile::launch_map_contiguous_v<8, 4, 3>(n, o3, i3, Bwd{}, 0); }));
#define RUN(NAME, U, S, GS, T, NIN, NOUT, F, BYTES)                                                  \
  report(NAME, BYTES, time_ms([&] {                                                                  \
    const int64_t blocks = (nv + int64_t(T) * U - 1) / (int64_t(T) * U);                             \
    const int grid = GS ? int(blocks < int64_t(sms) * (2048 / T) ? blocks : int64_t(sms) * (2048 / T)) : int(blocks); \
    lab_kernel<U, S, GS, NIN, NOUT><<<grid, T>>>(nv, in_d, out_d, F{});                              \
  }))
  RUN("fwd: lab U4 T256", 4, false, false, 256, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U4 T256 streaming", 4, true, false, 256, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U2 T256", 2, false, false, 256, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U8 T256", 8, false, false, 256, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U4 T128", 4, false, false, 128, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U4 T512", 4, false, false, 512, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U4 T256 grid-stride", 4, false, true, 256, 2, 1, Fwd, 3 * b);
  RUN("fwd: lab U4 T256 grid-stride streaming", 4, true, true, 256, 2, 1, Fwd, 3 * b);
  RUN("bwd: lab U4 T256", 4, false, false, 256, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U4 T256 streaming", 4, true, false, 256, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U2 T256", 2, false, false, 256, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U2 T256 streaming", 2, true, false, 256, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U4 T128", 4, false, false, 128, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U4 T256 grid-stride", 4, false, true, 256, 3, 3, Bwd, 6 * b);
  RUN("bwd: lab U4 T256 grid-stride streaming", 4, true, true, 256, 3, 3, Bwd, 6 * b);
  return 0;
}
