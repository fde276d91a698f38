#include "ops/rowwise/cases.hpp"

namespace tessera::ops {

void register_rowwise(std::vector<OpInfo>& ops) {
  rowwise::add_softmax_ops(ops);
  rowwise::add_norm_ops(ops);
}

}  // namespace tessera::ops
