#include "ops/elementwise/dropout_reference.hpp"

#include <algorithm>

#include "bench/host.hpp"

namespace tessera::reference {

std::array<uint32_t, 4> philox4x32_10(const std::array<uint32_t, 4>& counter,
                                      const std::array<uint32_t, 2>& key) {
  // Each round: (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)),
  // then the key advances by the Weyl increments.
  constexpr uint64_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  std::array<uint32_t, 4> c = counter;
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = M0 * c[0], p1 = M1 * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += W0;
    k1 += W1;
  }
  return c;
}

namespace {
// The four words that elements 4g .. 4g + 3 of a call at `offset` draw.
std::array<uint32_t, 4> dropout_words(uint64_t seed, uint64_t offset, int64_t g) {
  const uint64_t counter = offset + static_cast<uint64_t>(g);
  return philox4x32_10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

bool keep_word(uint32_t word, double p) {
  const float u = static_cast<float>(word >> 8) * 0x1p-24f;  // exact: a 24-bit integer times 2^-24
  return u >= static_cast<float>(p);
}

// x * scale where kept, one Philox call per group of 4 elements.
std::vector<double> dropout_map(const TensorView& x, double p, uint64_t seed, uint64_t offset) {
  const int64_t n = x.numel();
  const double scale = dropout_scale(p);
  std::vector<double> out(static_cast<std::size_t>(n));
  host::parallel_for((n + 3) / 4, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const auto words = dropout_words(seed, offset, g);
      for (int64_t i = 4 * g; i < std::min(n, 4 * g + 4); ++i)
        out[i] = keep_word(words[i % 4], p) ? host::load_double(x, i) * scale : 0.0;
    }
  });
  return out;
}
}  // namespace

bool dropout_keep(uint64_t seed, uint64_t offset, int64_t i, double p) {
  return keep_word(dropout_words(seed, offset, i / 4)[i % 4], p);
}

float dropout_scale(double p) {
  return static_cast<float>(p) < 1.0f ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
}

std::vector<double> dropout(const TensorView& x, double p, uint64_t seed, uint64_t offset) {
  return dropout_map(x, p, seed, offset);
}

std::vector<double> dropout_backward(const TensorView& grad_out, double p, uint64_t seed,
                                     uint64_t offset) {
  return dropout_map(grad_out, p, seed, offset);
}

}  // namespace tessera::reference
