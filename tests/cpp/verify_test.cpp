// Every registered op's verify cases against its CPU reference, one test per op, generated from
// the op table: an op needs no GPU test of its own to be checked (its family's test file holds
// what the cases cannot express: argument errors, determinism, special layouts).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu.hpp"
#include "ops/registry.hpp"
#include "testing.hpp"

namespace {

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& op : tessera::ops::all_ops()) names.push_back(op.name);
  return names;
}

class VerifyGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(VerifyGpu, MatchesReference) {
  TESSERA_REQUIRE_GPU();
  tessera::testing::run_verify(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Op, VerifyGpu, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
