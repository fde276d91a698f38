// What the loss family's launchers share: a mean's divisor and the sum of per-row losses (defined
// in cross_entropy.cu), both on the device so that no call synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::loss {

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
