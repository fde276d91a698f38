// The default `tessera verify` run (ops/selection.hpp): the compiled-in list names only cases that
// exist, and the greedy cover keeps every (dtype, tier) pair of each op with the fewest cases,
// cheapest first among equals. No GPU needed.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/registry.hpp"
#include "ops/selection.hpp"

namespace {

using tessera::ops::CaseCoverage;
using tessera::ops::case_dtype;
using tessera::ops::cover;

TEST(VerifySelection, NamesOnlyExistingCases) {
  for (const auto& [op, name] : tessera::ops::default_selection()) {
    const tessera::ops::OpInfo* info = tessera::ops::find_op(op);
    ASSERT_NE(info, nullptr) << "verify_default.txt names an op that does not exist: " << op;
    bool found = false;
    for (const auto& c : info->verify_cases()) found = found || c.name == name;
    EXPECT_TRUE(found) << "verify_default.txt names a case that " << op << " no longer has: " << name
                       << " (tessera verify --full --write-selection harness/ops/verify_default.txt)";
    EXPECT_TRUE(tessera::ops::selected_by_default(op, name));
  }
}

TEST(VerifySelection, OpsTheListDoesNotNameRunEveryCase) {
  std::set<std::string> named;
  for (const auto& p : tessera::ops::default_selection()) named.insert(p.first);
  for (const auto& op : tessera::ops::all_ops())
    if (!named.count(op.name))
      for (const auto& c : op.verify_cases()) EXPECT_TRUE(tessera::ops::selected_by_default(op.name, c.name));
}

TEST(VerifySelection, CaseDtypeIsTheFirstDtypeWord) {
  EXPECT_EQ(case_dtype("bfloat16 [128, 64] contiguous @ [64, 256] transposed -> float32"), "bfloat16");
  EXPECT_EQ(case_dtype("rows 4096 float16"), "float16");
  EXPECT_EQ(case_dtype("float8_e4m3fn [16, 512] -> bfloat16"), "float8_e4m3fn");
  EXPECT_EQ(case_dtype("no dtype here"), "");
}

TEST(VerifySelection, GreedyCoverKeepsEveryPairWithTheFewestCheapestCases) {
  const std::vector<CaseCoverage> ran = {
      {"a", "one tier", {"float32:a:x"}, 0.1},
      {"a", "two tiers", {"float32:a:x", "float32:a:y"}, 2.0},
      {"a", "two tiers, cheaper", {"float32:a:x", "float32:a:y"}, 1.0},
      {"a", "bf16", {"bfloat16:a:x"}, 0.5},
      {"b", "alone", {"float32"}, 3.0},
  };
  const std::vector<std::size_t> want = {2, 3, 4};
  EXPECT_EQ(cover(ran), want);
  // The cover misses nothing the run reached.
  std::set<std::string> all, got;
  for (const auto& c : ran) all.insert(c.covers.begin(), c.covers.end());
  for (std::size_t i : cover(ran)) got.insert(ran[i].covers.begin(), ran[i].covers.end());
  EXPECT_EQ(got, all);
}

}  // namespace
