// Conversions between storage types and the float32 that all arithmetic runs in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace tessera::tile {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
// float8 (scaled_mm's inputs), exactly, through half's bit layout: a few integer ops on every
// GPU, where the library's conversion is a long emulation before sm_89.
// e5m2 is the top byte of a half.
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x.__x << 8)));
}
// e4m3fn is a half with 3 fewer exponent bits (bias 7, not 15) and no infinities: shifted into a
// half it reads 2^-8 of its value, subnormals included; 0x7f and 0xff are NaN.
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) {
  const unsigned b = x.__x;
  const unsigned h = (b & 0x7f) == 0x7f ? 0x7fff : (b & 0x80) << 8 | (b & 0x7f) << 7;
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h))) * 256.0f;
}

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace tessera::tile
