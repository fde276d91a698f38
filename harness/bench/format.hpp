// Text helpers shared by the report writers: number formatting, escaping for JSON, XML and CSV,
// the derived columns of a row, and writing a file with errors that name the path.
#pragma once

#include <optional>
#include <string>

#include "bench/bench.hpp"

namespace tessera::bench::format {

// printf("%.*f"): "12.35".
std::string fixed(double v, int decimals);
// Round-trippable enough for CSV/JSON: integers (|v| < 2^53) without a fraction, anything else
// with 12 significant digits. Non-finite values give "nan"/"inf"; callers that cannot hold them
// (JSON) check first.
std::string number(double v);

std::string json_string(const std::string& s);  // quoted, with JSON escapes
std::string xml_escape(const std::string& s);   // & < > " '
std::string csv_field(const std::string& s);    // quoted (RFC 4180) only when it must be

// The columns computed from a row and the peaks; empty where they mean nothing (no bytes, no
// FLOPs, no peaks measured, a row never timed).
struct Derived {
  std::optional<double> gbps, pct_copy, tflops, pct_gemm;
};
Derived derive(const Row& row, const Peaks* peaks);

// Replaces `path` with `text`; throws tessera::Error(runtime) naming `what` and the path.
void write_file(const std::string& path, const std::string& text, const char* what);

}  // namespace tessera::bench::format
