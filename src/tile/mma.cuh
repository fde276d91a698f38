// Warp-level matrix multiply (sm_80's mma.sync) and the shared-memory fragment loads that feed it
// (ldmatrix). A warp multiplies a 16 x 16 tile of A by a 16 x 8 tile of B into 16 x 8 float32
// accumulators; each operand is held across the warp's 32 lanes in a fixed layout (lane l, group
// g = l / 4, thread t = l % 4):
//   A  a[0] = (row g, cols 2t, 2t + 1), a[1] = (row g + 8, the same), a[2] = (row g, cols 2t + 8,
//      2t + 9), a[3] = (row g + 8, the same); the lower column in the low half of each register
//   B  b[0] = (rows 2t, 2t + 1, col g), b[1] = (rows 2t + 8, 2t + 9, col g)
//   D  d[0], d[1] = (row g, cols 2t, 2t + 1), d[2], d[3] = (row g + 8, the same)
// Since the product sums over K, the 16 K positions may be assigned to lanes in any other order,
// as long as A and B use the same one (the skinny GEMM loads K in 16-byte runs that way).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace tessera::tile {

// d += a b on an m16n8k16 tile, 16-bit operands (T: __half or __nv_bfloat16), float32 d.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory, lane l giving the address of row
// l % 8 of matrix l / 8; register j of lane l holds row l / 4, columns 2 (l % 4) and the next of
// matrix j (Trans: of its transpose).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

// The inverse of ldmatrix_x4 (no transpose): lane l gives the address of row l % 8 of matrix l / 8,
// and register j of lane l is written to row l / 4, columns 2 (l % 4) and the next of matrix j.
// sm_90 and later: elsewhere it traps.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
#else
  __trap();
#endif
}

}  // namespace tessera::tile
