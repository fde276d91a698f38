// Warpgroup matrix multiply (sm_90a's wgmma): a warpgroup of 4 consecutive warps multiplies a
// 64 x 16 tile of A by a 16 x N tile of B (both in shared memory, named by descriptors) into
// 64 x N float32 accumulators held in its registers, asynchronously. 16 is the depth of a 16-bit
// step: 32 bytes of K, which is 8 for tf32 (float operands) and 32 for fp8.
//
// Use: fence() before the first wgmma that reads registers or shared memory written since; then
// the multiplies; commit() closes a group; wait<n>() returns once at most n groups are pending,
// after which their accumulators may be read and the shared memory they read reused.
// Issue multiplies on paths every thread of the warpgroup visibly takes (loop bodies, not under
// an `if` on a run-time flag): ptxas otherwise serializes each wgmma with a wait of its own, and
// says so only in an info line ("Potential Performance Loss: wgmma.mma_async instructions are
// serialized"), not as a warning.
//
// Accumulator layout (thread t of the warpgroup, warp w = t / 32, lane l = t % 32): d[j] holds
// row 16 w + l / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (l % 4) + j % 2.
//
// Shared-memory operands are tiles with the 128-byte swizzle, as the copy engine writes them with
// TmaSwizzle::b128 and a box 64 16-bit elements wide, in one of two orders:
//   K-major   row r (of M, or of N) holds 128 bytes of K (64 16-bit values); rows follow each
//             other.
//   MN-major  row k holds 64 consecutive M (or N) values in 128 bytes; a tile wider than 64 is
//             several such 64-wide column blocks one after the other, each `block_bytes` long.
// Each 8-row group of 1024 bytes is swizzled as a unit; tiles start 1024-byte aligned.
// sm_90a only: elsewhere these trap.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace tessera::tile::wgmma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_WGMMA 1
#endif

// The descriptor of a K-major, 128-byte-swizzled tile starting at `smem` (shared memory).
// Stepping 16 elements along K inside the 128-byte rows adds 32 bytes to the start address, i.e.
// 2 to the descriptor.
__device__ __forceinline__ uint64_t kmajor_sw128(const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);  // start address
  d |= uint64_t{1} << 16;                                      // leading offset: unused here
  d |= uint64_t{1024 >> 4} << 32;                              // 8-row groups, 1024 bytes apart
  d |= uint64_t{1} << 62;                                      // 128-byte swizzle
  return d;
}

// The descriptor of an MN-major, 128-byte-swizzled tile at `smem` whose 64-wide column blocks
// are `block_bytes` apart. Stepping 16 elements along K is 16 rows: 2048 bytes, 128 descriptor
// units; multiply with TransA/TransB = 1.
__device__ __forceinline__ uint64_t mnmajor_sw128(const void* smem, uint32_t block_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);  // start address
  d |= static_cast<uint64_t>(block_bytes >> 4) << 16;          // next 64-wide block along M/N
  d |= uint64_t{1024 >> 4} << 32;                              // next 8 rows along K
  d |= uint64_t{1} << 62;                                      // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void fence() {
#ifdef TESSERA_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void commit() {
#ifdef TESSERA_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int Pending>
__device__ __forceinline__ void wait() {
#ifdef TESSERA_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#else
  __trap();
#endif
}

// Warpgroup register reallocation (setmaxnreg): a producer warpgroup gives registers back so that
// its consumers may claim more. Takes effect only in kernels with a register cap at entry
// (__launch_bounds__(threads, 1)) whose warpgroups each take one branch of an if/else.
template <int Regs>
__device__ __forceinline__ void release_registers() {
#ifdef TESSERA_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}
template <int Regs>
__device__ __forceinline__ void claim_registers() {
#ifdef TESSERA_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}

// Keeps the compiler from moving accumulator reads or writes across a fence or wait: the
// registers are written by the asynchronous unit, which the compiler does not see.
template <int Size>
__device__ __forceinline__ void fence_operands(float (&d)[Size]) {
#pragma unroll
  for (int i = 0; i < Size; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int Size>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[Size]) {
#pragma unroll
  for (int i = 0; i < Size; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// d (+)= A B for one 64 x N x 16 step; `accumulate` false overwrites d. TransA/TransB: 0 for
// K-major operands, 1 for MN-major ones.
template <class T, int N, int TransA = 0, int TransB = 0>
struct Mma;

#define TESSERA_WG_D8(i)                                                                         \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define TESSERA_WG_D32(i) \
  TESSERA_WG_D8(i), TESSERA_WG_D8(i + 8), TESSERA_WG_D8(i + 16), TESSERA_WG_D8(i + 24)
#define TESSERA_WG_D_N64(i) TESSERA_WG_D32(i)
#define TESSERA_WG_D_N128(i) TESSERA_WG_D32(i), TESSERA_WG_D32(i + 32)
#define TESSERA_WG_D_N256(i) TESSERA_WG_D_N128(i), TESSERA_WG_D_N128(i + 64)
#define TESSERA_WG_REGS_N64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TESSERA_WG_REGS_N128 TESSERA_WG_REGS_N64 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TESSERA_WG_REGS_N256 TESSERA_WG_REGS_N128 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#ifdef TESSERA_WGMMA
// A, B, scale-d, trans-a, trans-b follow the N / 2 accumulators as operands IA .. IA + 4.
#define TESSERA_WG_MMA(TYPE, PTX, N, IA, IB, IS, ITA, ITB)                                     \
  template <int TransA, int TransB>                                                            \
  struct Mma<TYPE, N, TransA, TransB> {                                                        \
    __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b,      \
                                               bool accumulate) {                              \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                           \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX               \
                   " {" TESSERA_WG_REGS_N##N "}, %" #IA ", %" #IB ", p, 1, 1, %" #ITA ", %" #ITB \
                   ";\n}\n"                                                                    \
                   : TESSERA_WG_D_N##N(0)                                                        \
                   : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TransA),           \
                     "n"(TransB));                                                             \
    }                                                                                          \
  };
#else
#define TESSERA_WG_MMA(TYPE, PTX, N, IA, IB, IS, ITA, ITB)                                \
  template <int TransA, int TransB>                                                       \
  struct Mma<TYPE, N, TransA, TransB> {                                                   \
    __device__ __forceinline__ static void run(float (&)[N / 2], uint64_t, uint64_t, bool) { \
      __trap();                                                                           \
    }                                                                                     \
  };
#endif

#ifdef TESSERA_WGMMA
// tf32 (float operands, 8-deep steps) and fp8 (32-deep steps): K-major operands only, so no
// transpose operands; each step is still 32 bytes of K.
#define TESSERA_WG_MMA_KMAJOR(TYPE, PTX, K, N, IA, IB, IS)                                    \
  template <>                                                                                \
  struct Mma<TYPE, N, 0, 0> {                                                                \
    __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t a, uint64_t b,    \
                                               bool accumulate) {                            \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                         \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." PTX "." PTX          \
                   " {" TESSERA_WG_REGS_N##N "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"            \
                   : TESSERA_WG_D_N##N(0)                                                      \
                   : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));                     \
    }                                                                                        \
  };
#else
#define TESSERA_WG_MMA_KMAJOR(TYPE, PTX, K, N, IA, IB, IS)                                  \
  template <>                                                                              \
  struct Mma<TYPE, N, 0, 0> {                                                              \
    __device__ __forceinline__ static void run(float (&)[N / 2], uint64_t, uint64_t, bool) { \
      __trap();                                                                            \
    }                                                                                      \
  };
#endif

TESSERA_WG_MMA(__nv_bfloat16, "bf16", 64, 32, 33, 34, 35, 36)
TESSERA_WG_MMA(__nv_bfloat16, "bf16", 128, 64, 65, 66, 67, 68)
TESSERA_WG_MMA(__nv_bfloat16, "bf16", 256, 128, 129, 130, 131, 132)
TESSERA_WG_MMA(__half, "f16", 64, 32, 33, 34, 35, 36)
TESSERA_WG_MMA(__half, "f16", 128, 64, 65, 66, 67, 68)
TESSERA_WG_MMA(__half, "f16", 256, 128, 129, 130, 131, 132)

TESSERA_WG_MMA_KMAJOR(float, "tf32", 8, 128, 64, 65, 66)
TESSERA_WG_MMA_KMAJOR(float, "tf32", 8, 256, 128, 129, 130)
TESSERA_WG_MMA_KMAJOR(__nv_fp8_e4m3, "e4m3", 32, 128, 64, 65, 66)
TESSERA_WG_MMA_KMAJOR(__nv_fp8_e4m3, "e4m3", 32, 256, 128, 129, 130)
TESSERA_WG_MMA_KMAJOR(__nv_fp8_e5m2, "e5m2", 32, 128, 64, 65, 66)
TESSERA_WG_MMA_KMAJOR(__nv_fp8_e5m2, "e5m2", 32, 256, 128, 129, 130)


// d (+)= A B with A from registers (16-bit types): per warp w, the rows 16 w .. 16 w + 15 of a
// 64 x 16 step, thread l holding in a[0..3] the pairs (row g, cols 2 t, 2 t + 1), (row g + 8, the
// same cols), (row g, cols 2 t + 8, 2 t + 9), (row g + 8, those), g = l / 4, t = l % 4, the lower
// column in the low half. That is the accumulator layout of a 64 x 16 slice of d, so a product
// such as attention's P re-enters a multiply by packing d[8 k .. 8 k + 7] pairwise, in order.
// B from shared memory as in Mma; the registers stay read until the group completes.
template <class T, int N, int TransB = 0>
struct MmaRS;

#ifdef TESSERA_WGMMA
#define TESSERA_WG_MMA_RS(TYPE, PTX, N, IA0, IA1, IA2, IA3, IB, IS, ITB)                       \
  template <int TransB>                                                                        \
  struct MmaRS<TYPE, N, TransB> {                                                              \
    __device__ __forceinline__ static void run(float (&d)[N / 2], const uint32_t (&a)[4],      \
                                               uint64_t b, bool accumulate) {                  \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                           \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX               \
                   " {" TESSERA_WG_REGS_N##N "}, {%" #IA0 ", %" #IA1 ", %" #IA2 ", %" #IA3 "}, %" #IB \
                   ", p, 1, 1, %" #ITB ";\n}\n"                                                \
                   : TESSERA_WG_D_N##N(0)                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),                       \
                     "r"(static_cast<int>(accumulate)), "n"(TransB));                          \
    }                                                                                          \
  };
#else
#define TESSERA_WG_MMA_RS(TYPE, PTX, N, IA0, IA1, IA2, IA3, IB, IS, ITB)                     \
  template <int TransB>                                                                      \
  struct MmaRS<TYPE, N, TransB> {                                                            \
    __device__ __forceinline__ static void run(float (&)[N / 2], const uint32_t (&)[4],      \
                                               uint64_t, bool) {                             \
      __trap();                                                                              \
    }                                                                                        \
  };
#endif

TESSERA_WG_MMA_RS(__nv_bfloat16, "bf16", 64, 32, 33, 34, 35, 36, 37, 38)
TESSERA_WG_MMA_RS(__nv_bfloat16, "bf16", 128, 64, 65, 66, 67, 68, 69, 70)
TESSERA_WG_MMA_RS(__nv_bfloat16, "bf16", 256, 128, 129, 130, 131, 132, 133, 134)
TESSERA_WG_MMA_RS(__half, "f16", 64, 32, 33, 34, 35, 36, 37, 38)
TESSERA_WG_MMA_RS(__half, "f16", 128, 64, 65, 66, 67, 68, 69, 70)
TESSERA_WG_MMA_RS(__half, "f16", 256, 128, 129, 130, 131, 132, 133, 134)

#undef TESSERA_WG_MMA
#undef TESSERA_WG_MMA_RS
#undef TESSERA_WG_MMA_KMAJOR

}  // namespace tessera::tile::wgmma
