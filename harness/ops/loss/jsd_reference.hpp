// CPU reference for jsd, in double precision: the generalized Jensen-Shannon divergence of a
// student's logits from a teacher's, and its gradient with respect to the student's logits
// (tessera/ops/loss.hpp), term by term from the formula.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::reference {

struct JsdSpec {
  double beta = 0.5;
  double temperature = 1.0;
  int64_t ignore_index = -100;
};

// Each row's loss and the gradient of that row's loss with respect to its student logits (rows x
// classes, row-major); 0 for rows whose target is ignore_index.
struct JsdRows {
  std::vector<double> loss, grad;
};

// student, teacher: rows x classes, row-major; target: rows labels, or empty (no row ignored).
JsdRows jsd(const std::vector<double>& student, const std::vector<double>& teacher, const std::vector<int64_t>& target,
            int64_t rows, int64_t classes, const JsdSpec& spec);

}  // namespace tessera::reference
