// Numeric constants the kernels share, each written once.
#pragma once

namespace tessera::tile {

// log2(e) and ln(2): exp(x) = exp2(x * log2(e)) on the MUFU, and a log2 back to a natural log.
inline constexpr double kLog2eDouble = 1.4426950408889634;
inline constexpr float kLog2e = float(kLog2eDouble);
inline constexpr float kLn2 = 0.6931471805599453f;

}  // namespace tessera::tile
