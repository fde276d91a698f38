// CPU reference for cross_entropy, in double precision: torch's F.cross_entropy term by term
// (ignore_index, class weights, label smoothing, class indices or probabilities), with tessera's
// z-loss and soft-cap (tessera/ops/loss.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::reference {

struct CrossEntropySpec {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double softcap = 0.0;
  std::vector<double> weight;  // class weights [classes]; empty: all 1
};

// Each row's loss (0 where ignored, NaN where the target is out of range), its log-sum-exp of the
// capped logits, and the gradient of that row's loss with respect to its logits (rows x classes,
// 0 where ignored); valid: the rows not ignored; divisor: what the mean divides by (valid, or with
// class weights the sum of those rows' target weights (rows out of range adding none), or for
// probabilities the rows).
struct CrossEntropyRows {
  std::vector<double> loss, lse, grad;
  int64_t valid = 0;
  double divisor = 0.0;
};

// logits: rows x classes, row-major; target: rows class indices.
CrossEntropyRows cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& target, int64_t rows,
                               int64_t classes, const CrossEntropySpec& spec);

// The same against class probabilities: probs rows x classes, row-major (ignore_index unused).
CrossEntropyRows cross_entropy_probs(const std::vector<double>& logits, const std::vector<double>& probs, int64_t rows,
                                     int64_t classes, const CrossEntropySpec& spec);

}  // namespace tessera::reference
