// What the loss family's launchers share: a mean's divisor and the sum of per-row losses (defined
// in cross_entropy.cu), both on the device so that no call synchronizes; and the row kernels'
// tiers' ways of reading a row and launch plan (cross_entropy, jsd).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/device.hpp"

namespace tessera::loss {

// A row kernel's three ways of reading a row: 16-byte vectors of whole rows, 16-byte vectors
// between a scalar head and tail (rows at any alignment), or element by element.
enum class Access { scalar, vectors, split };

struct RowsPlan {
  int threads = 0, vw = 1;
  unsigned grid = 0;
  std::string describe() const {
    return std::to_string(grid) + " persistent CTAs of " + std::to_string(threads) + " threads, " +
           std::to_string(vw) + " elements a load";
  }
};

// A CTA per row of `classes` at a time, `vw` elements a load and `loads` loads in flight a thread:
// `most` threads for long rows, one CTA per SM; a row that fewer threads cover in one step takes
// that many (128 at least), most / threads CTAs per SM, so that an SM keeps as many rows in
// flight rather than one mostly idle CTA.
inline RowsPlan rows_plan(int64_t rows, int64_t classes, int vw, int loads, int most, int sms) {
  RowsPlan p;
  p.vw = vw;
  p.threads = 128;
  while (p.threads < most && int64_t(p.threads) * loads * vw < classes) p.threads *= 2;
  p.grid = runtime::grid_cap(std::min<int64_t>(rows, int64_t(sms) * (most / p.threads)));
  return p;
}

// *divisor = a mean's divisor, as torch's: for target [rows] (class indices, int64 or int32) the
// rows that are not `ignore`, or with class weights (weight: float32 [classes], nullable) the sum
// of those rows' target weights; for probabilities (target null) the rows.
void mean_divisor(const void* target, bool target64, int64_t rows, int64_t ignore, const float* weight,
                  int64_t classes, float* divisor, cudaStream_t stream);

// *loss = the sum of row_loss [rows] in a fixed order (the same bits every run), divided by
// *divisor where divisor is set (a mean; over no rows 0 / 0 = NaN, as torch).
void sum_rows(const float* row_loss, int64_t rows, const float* divisor, float* loss, cudaStream_t stream);

// *loss = the mean of row_loss [rows]: its sum as sum_rows's over mean_divisor's divisor, both in
// one launch (where nothing needed the divisor before the rows' losses).
void mean_rows(const float* row_loss, int64_t rows, const void* target, bool target64, int64_t ignore,
               const float* weight, int64_t classes, float* loss, cudaStream_t stream);

}  // namespace tessera::loss
