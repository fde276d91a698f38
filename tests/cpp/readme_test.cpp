// README.md's C++ snippet, compiled and run. The code between the `readme:begin` and `readme:end`
// lines below is README.md's ```cpp block, line for line (ReadmeCpp.SnippetIsReadmes compares the
// two files, so they cannot drift apart); its main() is renamed readme_main() here, GoogleTest's
// main being this program's. Edit the README and copy the block here, or the other way round.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "tessera/tessera.hpp"

#define main readme_main
// readme:begin
#include <cuda_runtime.h>
#include <tessera/tessera.hpp>

// y = gelu(x); h = silu(y @ w^T + b); z = rms_norm(h) * g. bfloat16, on the default stream.
int main() {
  using tessera::DType, tessera::TensorView;
  const int64_t M = 256, K = 1024, N = 4096;
  auto zeros = [](int64_t n) {  // n bfloat16 values on the GPU
    void* p = nullptr;
    cudaMalloc(&p, n * 2);
    cudaMemset(p, 0, n * 2);
    return p;
  };
  void *x = zeros(M * K), *y = zeros(M * K), *w = zeros(N * K), *b = zeros(N);
  void *h = zeros(M * N), *g = zeros(N), *z = zeros(M * N);
  cudaStream_t stream = nullptr;

  auto xv = TensorView::contiguous(x, DType::bfloat16, {M, K});
  auto yv = TensorView::contiguous(y, DType::bfloat16, {M, K});
  tessera::gelu(xv, yv, tessera::GeluApproximate::tanh, stream);

  // w is [N, K] row-major (a linear layer's weight); the product reads it as its [K, N] transpose.
  auto wt = TensorView::strided(w, DType::bfloat16, {K, N}, {1, K});
  auto bv = TensorView::contiguous(b, DType::bfloat16, {N});
  auto hv = TensorView::contiguous(h, DType::bfloat16, {M, N});
  tessera::MatmulOptions opt;
  opt.bias = &bv;
  opt.activation = tessera::Activation::silu;
  tessera::matmul(yv, wt, hv, opt, stream);

  auto gv = TensorView::contiguous(g, DType::bfloat16, {N});
  auto zv = TensorView::contiguous(z, DType::bfloat16, {M, N});
  tessera::rms_norm(hv, 1, &gv, 1e-6, /*weight_offset=*/0.0, zv, nullptr, stream);  // over the last dim

  const bool ok = cudaStreamSynchronize(stream) == cudaSuccess;
  for (void* p : {x, y, w, b, h, g, z}) cudaFree(p);
  return ok ? 0 : 1;
}
// readme:end
#undef main

namespace {

// The two files, from the source tree (paths given by CMake), else from the working directory
// (the repository root, where a binary built elsewhere is run).
struct Sources {
  std::string readme, test;
};

bool readable(const std::string& path) { return std::ifstream(path).good(); }

bool find_sources(Sources& s) {
  for (const Sources& c : {Sources{TESSERA_README, TESSERA_README_TEST},
                           Sources{"README.md", "tests/cpp/readme_test.cpp"}}) {
    if (readable(c.readme) && readable(c.test)) {
      s = c;
      return true;
    }
  }
  return false;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

// The lines of every fenced block opened by `open` (e.g. "```cpp"), in order, joined.
std::vector<std::string> fenced(const std::vector<std::string>& lines, const std::string& open) {
  std::vector<std::string> out;
  bool inside = false;
  for (const auto& line : lines) {
    if (!inside) {
      inside = line == open;
    } else if (line == "```") {
      inside = false;
    } else {
      out.push_back(line);
    }
  }
  return out;
}

// The lines strictly between the line `begin` and the line `end`.
std::vector<std::string> between(const std::vector<std::string>& lines, const std::string& begin,
                                 const std::string& end) {
  std::vector<std::string> out;
  bool inside = false;
  for (const auto& line : lines) {
    if (line == begin) {
      inside = true;
    } else if (line == end) {
      break;
    } else if (inside) {
      out.push_back(line);
    }
  }
  return out;
}

TEST(ReadmeCpp, SnippetIsReadmes) {
  Sources s;
  if (!find_sources(s))
    GTEST_SKIP() << "README.md not found (at " << TESSERA_README << " or in the working directory)";
  const auto readme = fenced(read_lines(s.readme), "```cpp");
  const auto here = between(read_lines(s.test), "// readme:begin", "// readme:end");
  ASSERT_FALSE(readme.empty()) << s.readme << " has no ```cpp block";
  ASSERT_FALSE(here.empty()) << s.test << " has no readme:begin/readme:end region";
  for (std::size_t i = 0; i < readme.size() && i < here.size(); ++i)
    ASSERT_EQ(readme[i], here[i]) << "line " << i + 1 << " of README.md's C++ code differs from "
                                  << s.test << "'s copy";
  EXPECT_EQ(readme.size(), here.size()) << "README.md's C++ code and " << s.test
                                        << "'s copy differ in length";
}

TEST(ReadmeCpp, SnippetRuns) {
  TESSERA_REQUIRE_GPU();
  EXPECT_EQ(readme_main(), 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
