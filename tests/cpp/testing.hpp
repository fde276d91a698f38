// Helpers every family's tests share: fake device tensors for argument checks (never
// dereferenced), the expected-error check, and the run of every verify case of an op.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "ops/registry.hpp"
#include "tessera/error.hpp"
#include "tessera/tensor.hpp"

namespace tessera::testing {

// A pointer the argument checks see as valid device memory; nothing reads it.
inline void* fake(uintptr_t p) { return reinterpret_cast<void*>(p); }

inline TensorView cuda_tensor(uintptr_t p, DType dt, std::initializer_list<int64_t> shape, int device = 0) {
  return TensorView::contiguous(fake(p), dt, shape, Device{DeviceType::cuda, device});
}

// Runs fn, expects a tessera::Error of `kind` whose message contains every fragment.
template <class F>
void expect_error(F fn, ErrorKind kind, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected tessera::Error";
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "missing '" << f << "' in: " << e.what();
  }
}

// Every verify case of `op_name` against its reference (cases over 2^31 elements only with
// TESSERA_TEST_LARGE set). Needs a GPU: call after TESSERA_REQUIRE_GPU().
inline void run_verify(const std::string& op_name) {
  const auto* op = ops::find_op(op_name);
  ASSERT_NE(op, nullptr) << op_name;
  const bool large = std::getenv("TESSERA_TEST_LARGE") != nullptr;
  int ran = 0;
  for (const auto& c : op->verify_cases()) {
    if (c.large && !large) continue;
    const auto r = c.run();
    ++ran;
    EXPECT_TRUE(r.passed) << op_name << " " << r.name << ": rel_err=" << r.rel_err << " max_abs=" << r.max_abs
                          << " unwritten=" << r.unwritten << " " << r.detail;
  }
  EXPECT_GT(ran, 0);
}

}  // namespace tessera::testing
