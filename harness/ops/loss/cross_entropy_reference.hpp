// CPU reference for cross_entropy, in double precision: the formulas of tessera/ops/loss.hpp term
// by term, with torch's semantics for ignore_index and label smoothing.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::reference {

struct CrossEntropySpec {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double softcap = 0.0;
};

// Each row's loss (0 where ignored, NaN where the target is out of range), its log-sum-exp of the
// capped logits, and the gradient of that row's loss with respect to its logits (rows x classes,
// 0 where ignored); valid: the rows not ignored (the mean's divisor).
struct CrossEntropyRows {
  std::vector<double> loss, lse, grad;
  int64_t valid = 0;
};

// logits: rows x classes, row-major; target: rows class indices.
CrossEntropyRows cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& target, int64_t rows,
                               int64_t classes, const CrossEntropySpec& spec);

}  // namespace tessera::reference
