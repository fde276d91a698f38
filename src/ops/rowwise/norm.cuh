// LayerNorm and RMSNorm: what the kernel files and the host launcher share.
//
//   norm.cu            host: argument checks, layouts, dtype dispatch, the public functions
//   norm_forward.cuh   forward kernels and their tiers
//   norm_backward.cuh  backward: register-resident and long-row tiers, the dw/db column sums
//   norm_staged.cu     backward on sm_90: rows staged in shared memory by bulk copies
//
// Each direction picks its kernel with runtime::run_first over an ordered list of tiers
// (runtime/tier.hpp), in norm_forward.cuh and norm_backward.cuh. Those export one host entry
// point each (forward, backward), explicitly instantiated per dtype in a file of its own
// (norm_forward_<dtype>.cu, norm_backward_<dtype>.cu): a template is compiled where it is
// instantiated, so each dtype's kernels are compiled in their own file only.
//
// add_layer_norm and add_rms_norm take the same kernels with a residual (kAdd): the forward also
// reads the residual and writes x + residual (residual_out), the row it then normalizes; the
// backward, on residual_out, adds the gradient of residual_out to dx as it writes it. One more
// row-sized read in each direction, and in the forward one more write.
//
// What bounds every kernel here: the forward must read x and write out, the backward read x and
// dy and write dx; weight, bias, mean/rstd and dw/db are N or rows elements next to rows x N. So
// each row-sized tensor crosses DRAM exactly once, and everything else (the weight, the partial
// column sums) stays small beside it. To keep DRAM busy, each SM needs its share of the
// bandwidth times the loaded memory latency in loads outstanding: tens of KB. A kernel that holds
// its row in registers has one row's loads outstanding per row group, so the tiers are about how
// many bytes of row are resident per SM within 64K registers. The kernels are capped at 64
// registers per thread (__launch_bounds__(1024, 1)); the forward's prefetching VPT-4 tier takes
// 80 and the staged backward, whose rows wait in shared memory, up to 128 in 512-thread CTAs.
// Registers besides the row's are kept down so: 16-bit rows stay packed two elements per
// register (tile::Frag); column offsets are 32-bit and, where the group size is a template
// constant, immediates; rows sit at a uniform stride (one multiply per row, no 64-bit division);
// and the compiler is kept from holding float copies of the row, or early weight loads, across a
// reduction (tile::refresh, tile::zero_after). ptxas reports small spills in two places, kept
// because the spilling form is the faster one: float32 rms_norm forward at VPT 8 in groups of 32,
// and the backward's ring of two rows at VPT 2 (sm_90).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "tile/row.cuh"

namespace tessera::norm {

using tile::Frag;
using tile::GroupReduce;
using tile::MergeMoments;
using tile::Moments;
using tile::Pair;
using tile::RowLanes;
using tile::pack_each;
using tile::refresh;
using tile::row_offsets;
using tile::splat;
using tile::zero_after;

constexpr int kMaxThreads = 1024;
constexpr int kBarrierGroups = 15;  // named barriers 1..15 per CTA (0 is __syncthreads)

// ---- kernel arguments -------------------------------------------------------------------------
template <class T>
struct FwdParams {
  const T* x;
  T* out;
  const T* w;   // nullptr: no weight
  const T* b;   // nullptr: no bias
  float* mean;  // nullptr: not wanted (and always for RMSNorm)
  float* rstd;  // nullptr: not wanted
  int64_t stride[4];  // row strides (elements) of x, out, mean, rstd
  int64_t rows, n;
  float inv_n;        // 1 / n
  float eps;
  float w_offset;     // added to each weight in float32 (Gemma's 1 + w); 0 without a weight
  uint32_t zero;      // 0 (see tile::refresh)
  int gs;  // threads per row group (a multiple of 32 dividing blockDim.x)
};

template <class T>
struct BwdParams {
  const T* dy;
  const T* x;
  const T* w;          // nullptr: no weight (w = 1)
  float w_offset;      // added to each weight in float32; 0 without a weight
  const float* mean;   // nullptr for RMSNorm
  const float* rstd;
  T* dx;               // nullptr: grad_in not wanted
  float* part_w;       // [gridDim.x][ld] column sums of dy * xhat, or nullptr
  float* part_b;       // [gridDim.x][ld] column sums of dy, or nullptr
  float* row_means;    // long rows: [rows][2] mean(w dy), mean(w dy xhat)
  int64_t stride[5];  // row strides (elements) of x, dy, dx, mean, rstd
  int64_t rows, n, ld;
  float inv_n;        // 1 / n
  uint32_t zero;      // 0 (see tile::refresh)
  int gs;
  int stages;         // norm_backward_staged_kernel: ring slots per row group
};

// The kernels with a residual (kAdd) take these; the plain ones keep the structs above as they
// are (a larger parameter struct alone changes what ptxas makes of the plain kernels).
template <class T>
struct AddFwdParams : FwdParams<T> {
  const T* res;           // nullptr: no residual (the plain kernels); else the row is x + res
  T* res_out;             // where x + res is written
  int64_t res_stride[2];  // row strides (elements) of res, res_out
};
template <class T>
struct AddBwdParams : BwdParams<T> {
  const T* dres;  // nullptr: none (the plain kernels); else added to dx: the gradient of residual_out
  int64_t dres_stride;
};
// The float8 norms' kernels (rms_norm_float8) take these: the output's maxima taken as it is
// written (float32 magnitude bits, merged by atomicMax into zeroed words), for float8_quantize's
// second pass: rows' words amax[0, rows) then columns' amax[rows, rows + n) (rows_max), or one
// word amax[0] for the whole output. kAdd as the plain kernels: res null or not.
template <class T>
struct MaxFwdParams : AddFwdParams<T> {
  uint32_t* amax;
  bool rows_max;
};
template <class T, bool kAdd, bool kMax = false>
using FwdP = std::conditional_t<kMax, MaxFwdParams<T>, std::conditional_t<kAdd, AddFwdParams<T>, FwdParams<T>>>;
template <class T, bool kAdd>
using BwdP = std::conditional_t<kAdd, AddBwdParams<T>, BwdParams<T>>;

// Where row `row` of dres starts (the plain kernels have none).
template <class T>
__device__ __forceinline__ const T* dres_row(const BwdParams<T>&, int64_t) { return nullptr; }
template <class T>
__device__ __forceinline__ const T* dres_row(const AddBwdParams<T>& p, int64_t row) {
  return p.dres + row * p.dres_stride;
}

// ---- device helpers ---------------------------------------------------------------------------
template <class T, int V>
__device__ __forceinline__ tile::Vec<T, V> fill_vec(T v) {
  tile::Vec<T, V> r;
#pragma unroll
  for (int e = 0; e < V; ++e) r[e] = v;
  return r;
}

// 16 bytes of 1.0 and of 0.0 in each storage type: what a missing weight or bias reads.
__device__ __align__(16) const uint32_t kOnesF32[4] = {0x3f800000u, 0x3f800000u, 0x3f800000u, 0x3f800000u};
__device__ __align__(16) const uint32_t kOnesBf16[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
__device__ __align__(16) const uint32_t kOnesF16[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
__device__ __align__(16) const uint32_t kZeros[4] = {0u, 0u, 0u, 0u};

template <class T>
__device__ __forceinline__ const T* ones() {
  if constexpr (std::is_same_v<T, float>) return reinterpret_cast<const T*>(kOnesF32);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return reinterpret_cast<const T*>(kOnesBf16);
  else return reinterpret_cast<const T*>(kOnesF16);
}
template <class T>
__device__ __forceinline__ const T* zeros() { return reinterpret_cast<const T*>(kZeros); }

// Running column sums of one row group in shared memory: a plane of VPT * V * gs floats, laid
// out [k][e / Q][thread][Q] with Q = 4 floats per access (1 for V = 1), so a thread's accesses
// are 16-byte vectors and a warp's are contiguous: no bank conflicts, two shared-memory
// instructions per four elements. (In registers they would cost 8-16 registers per plane per
// thread, which the row and its prefetched successor need.)
template <int VPT, int V>
struct ColumnSums {
  static constexpr int Q = V >= 4 ? 4 : 1;
  float* p;  // plane + thread * Q
  int gs;
  __device__ __forceinline__ ColumnSums(float* plane, int gs_, int t) : p(plane + t * Q), gs(gs_) {}
  __device__ __forceinline__ float* at(int k, int j) const { return p + (k * (V / Q) + j) * gs * Q; }
  __device__ __forceinline__ void zero() const {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int j = 0; j < V / Q; ++j) tile::store<Q>(at(k, j), tile::Vec<float, Q>{});
  }
  // sums[k][j * Q, + Q) += v
  __device__ __forceinline__ void add(int k, int j, const float (&v)[Q]) const {
    tile::Vec<float, Q> s = tile::load<Q>(at(k, j));
#pragma unroll
    for (int i = 0; i < Q; ++i) s[i] += v[i];
    tile::store<Q>(at(k, j), s);
  }
};

// Adds the row groups' planes in group order and writes the CTA's partial row. Slot i of a
// plane holds Q columns: (k, j) = divmod(i / gs, V / Q), thread t = i % gs.
template <int VPT, int V>
__device__ __forceinline__ void write_partial(float* dst, const float* planes, int plane_stride, int subs,
                                              int gs, int n) {
  constexpr int Q = ColumnSums<VPT, V>::Q;
  const int slots = VPT * (V / Q) * gs;
  for (int i = threadIdx.x; i < slots; i += blockDim.x) {
    const int kj = i / gs, t = i - kj * gs;
    const int k = kj / (V / Q), j = kj - k * (V / Q);
    const int c = (k * gs + t) * V + j * Q;
    if (c >= n) continue;
    tile::Vec<float, Q> s = tile::load<Q>(planes + i * Q);
    for (int g = 1; g < subs; ++g) {
      const tile::Vec<float, Q> o = tile::load<Q>(planes + g * plane_stride + i * Q);
#pragma unroll
      for (int q = 0; q < Q; ++q) s[q] += o[q];
    }
    tile::store<Q>(dst + c, s);
  }
}

// ---- host: tiers ------------------------------------------------------------------------------
// What a tier's choice depends on besides the arguments: the device the call runs on (current).
struct Ctx {
  int device;
  int major;               // compute capability
  int sms;                 // multiprocessors
  std::size_t smem_optin;  // most shared memory one CTA may have
  static Ctx of(int device) {
    const cudaDeviceProp& props = runtime::device_props(device);
    return {device, props.major, props.multiProcessorCount, props.sharedMemPerBlockOptin};
  }
};

// Vectors of V elements in a row of n.
template <int V>
inline int64_t vectors(int64_t n) { return runtime::ceil_div(n, V); }
inline int round_up32(int64_t v) { return static_cast<int>(runtime::ceil_div(v, 32) * 32); }

// f(std::integral_constant<int, G>{}) for G = `size` among the compile-time sizes given (the
// last for any other): a group size chosen at run time, as the template constant it is built as.
template <int kFirst, int... kRest, class F>
auto with_size(int size, F&& f) {
  if constexpr (sizeof...(kRest) == 0) return f(std::integral_constant<int, kFirst>{});
  else return size == kFirst ? f(std::integral_constant<int, kFirst>{}) : with_size<kRest...>(size, f);
}

// The backward's arguments: the kernels' parameters (the partial-row pointers and the group
// shape are set at launch), where dw and db go, and the scratch memory the launch allocates (owned
// by the caller, so that it is freed after everything that uses it is enqueued).
template <class T>
struct BwdArgs {
  AddBwdParams<T> p;  // p.dres null: the plain kernels, on the BwdParams part
  T* dw;  // nullptr: not wanted
  T* db;  // nullptr: not wanted (always for RMSNorm)
  int device;
  runtime::Scratch* parts;  // partial rows of column sums
  runtime::Scratch* means;  // long rows: the row means dx needs
};

// A one-kernel backward tier's launch: a grid of CTAs of `threads`, one partial row each. P: the
// kernel's parameters (BwdP).
template <class P>
struct BwdPlan {
  void (*kernel)(P) = nullptr;
  int gs = 0, threads = 0, stages = 0, elems = 0;  // elems: row elements per thread
  std::size_t smem = 0;
  int64_t grid = 0;
  std::string describe() const {
    return std::to_string(grid) + " CTAs x " + std::to_string(threads) + " threads in groups of " +
           std::to_string(gs) + ", " + std::to_string(elems) + " elements per thread, " +
           std::to_string(smem) + " B of shared memory" +
           (stages ? ", " + std::to_string(stages) + " ring slots per group" : std::string());
  }
};

// norm_backward.cuh: `plan`'s kernel, with the partial rows of column sums it writes and their sum
// into dw/db after it.
template <class P, class T>
void launch_backward(const BwdArgs<T>& a, const BwdPlan<P>& plan, cudaStream_t stream);

// norm_staged.cu: the staged backward at E elements per thread (16 or 32), on sm_90 with 16-byte
// vectors (V = 16 / sizeof(T)); instantiated there for those V. At E = 32 it takes bf16 and fp16
// RMSNorm rows only (for the others it never can_implement). kAdd: dx also adds p.dres.
template <class T, int V, bool kRms, bool kAdd, int E>
struct Staged {
  static constexpr const char* kName = E == 32 ? "staged-32" : "staged";
  static constexpr const char* kWhen =
      E == 32 ? "sm_90, bf16 or fp16 RMSNorm rows of 4097..16384 elements, x and dy fitting 3 times in 200 KB"
              : "sm_90, rows of <= 8192 elements whose x and dy fit 3 times in 200 KB of shared memory";
  static bool in_range(int64_t nv);  // rows of nv vectors are this tier's, shared memory aside
  static bool can_implement(const BwdArgs<T>& a, const Ctx& ctx);
  static BwdPlan<BwdP<T, kAdd>> plan(const BwdArgs<T>& a, const Ctx& ctx);
  static void launch(const BwdArgs<T>& a, const BwdPlan<BwdP<T, kAdd>>& plan, cudaStream_t stream) {
    launch_backward(a, plan, stream);
  }
};

// ---- host: entry points (instantiated for float, __half, __nv_bfloat16) ------------------------
// `vec`: the 16-byte vector path (N % V == 0 and every row 16-byte aligned); else V = 1. The
// kernels with a residual (p.res, a.p.dres) are instantiations of their own (kAdd), so that the
// plain norms' kernels stay as they are.
template <class T>
void forward(const char* op, const AddFwdParams<T>& p, bool rms, bool vec, const Ctx& ctx, cudaStream_t stream);
template <class T>
void backward(const char* op, const BwdArgs<T>& a, bool rms, bool vec, const Ctx& ctx, cudaStream_t stream);
// RMSNorm with the output's maxima (MaxFwdParams), on 16-byte vectors: false, launching nothing,
// where its one tier does not take the rows (other dtypes, rows longer than 1024 vectors), and
// the caller takes them apart.
template <class T>
bool forward_float8(const char* op, const MaxFwdParams<T>& p, const Ctx& ctx, cudaStream_t stream);

}  // namespace tessera::norm
