#include "ops/registry.hpp"

namespace tessera::ops {

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> v;
    register_elementwise(v);
    register_rowwise(v);
    register_set(v);
    return v;
  }();
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const auto& op : all_ops())
    if (op.name == name) return &op;
  return nullptr;
}

std::vector<const OpInfo*> select_ops(const std::string& name) {
  std::vector<const OpInfo*> r;
  for (const auto& op : all_ops())
    if (op.name == name || op.name.rfind(name + "_", 0) == 0) r.push_back(&op);
  return r;
}

}  // namespace tessera::ops
