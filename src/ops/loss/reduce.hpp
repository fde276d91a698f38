// What the loss family's launchers share: a mean's count and the sum of per-row losses (defined in
// cross_entropy.cu), both on the device so that no call synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::loss {

// *valid = the rows of target [rows] (int64 or int32) that are not `ignore`.
void count_valid(const void* target, bool target64, int64_t rows, int64_t ignore, int* valid,
                 cudaStream_t stream);

// *loss = the sum of row_loss [rows] in a fixed order (the same bits every run), divided by *valid
// where valid is set (a mean; over no rows 0 / 0 = NaN, as torch).
void sum_rows(const float* row_loss, int64_t rows, const int* valid, float* loss, cudaStream_t stream);

}  // namespace tessera::loss
