// Report: the rows of one benchmark run and the peaks they are compared with, written as a
// terminal table, CSV and JSON (SVG plots are in svg.cpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "bench/bench.hpp"
#include "bench/format.hpp"

namespace tessera::bench {

using format::Derived;

void Report::add(const Row& row) { rows_.push_back(row); }

void Report::set_peaks(const Peaks& peaks) {
  peaks_ = peaks;
  has_peaks_ = true;
}

namespace {

std::string opt_fixed(const std::optional<double>& v, int decimals) {
  return v ? format::fixed(*v, decimals) : "-";
}

// Empty cell (CSV) or null (JSON) where the derived column means nothing for the row.
std::string opt_number(const std::optional<double>& v, const char* none) {
  return v ? format::number(*v) : none;
}

// JSON has no NaN or infinity: such a value (never one from time_op) becomes null.
std::string json_number(double v) { return std::isfinite(v) ? format::number(v) : "null"; }

}  // namespace

std::string Report::table() const {
  constexpr std::size_t kCols = 12;
  // Text columns align left, numbers right, as a reader scans them.
  const std::array<const char*, kCols> header = {"op",     "provider", "dtype", "shape",
                                                 "median_us", "p20_us", "p80_us", "GB/s",
                                                 "%copy",  "TFLOP/s",  "%gemm", "scratch_MB"};
  constexpr std::size_t kTextCols = 4;

  std::vector<std::array<std::string, kCols>> cells;
  cells.reserve(rows_.size());
  const Peaks* peaks = has_peaks_ ? &peaks_ : nullptr;
  for (const Row& r : rows_) {
    const Derived d = format::derive(r, peaks);
    cells.push_back({r.op, r.provider, r.dtype, r.shape, format::fixed(r.stats.median_ms * 1e3, 2),
                     format::fixed(r.stats.p20_ms * 1e3, 2), format::fixed(r.stats.p80_ms * 1e3, 2),
                     opt_fixed(d.gbps, 1), opt_fixed(d.pct_copy, 1), opt_fixed(d.tflops, 2),
                     opt_fixed(d.pct_gemm, 1), opt_fixed(r.scratch_mb, 1)});
  }

  std::array<std::size_t, kCols> width{};
  for (std::size_t c = 0; c < kCols; ++c) {
    width[c] = std::string(header[c]).size();
    for (const auto& row : cells) width[c] = std::max(width[c], row[c].size());
  }

  std::ostringstream out;
  auto emit = [&](auto cell_at) {
    std::string line;
    for (std::size_t c = 0; c < kCols; ++c) {
      const std::string cell = cell_at(c);
      const std::string pad(width[c] - cell.size(), ' ');
      if (c) line += "  ";
      line += c < kTextCols ? cell + pad : pad + cell;
    }
    // Padding after the last text column would only be trailing spaces.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  emit([&](std::size_t c) { return std::string(header[c]); });
  std::size_t rule = 2 * (kCols - 1);
  for (std::size_t w : width) rule += w;
  out << std::string(rule, '-') << '\n';
  for (const auto& row : cells) emit([&](std::size_t c) { return row[c]; });
  // What ran, below the table: a column would be wider than the rest of it.
  for (const Row& r : rows_)
    if (!r.config.empty())
      out << "  ran: " << r.op << " " << r.dtype << " " << r.shape << ": " << r.config << '\n';
  return out.str();
}

void Report::write_csv(const std::string& path) const {
  std::ostringstream out;
  out << "op,provider,dtype,shape,size,bytes,flops,median_ms,p20_ms,p80_ms,min_ms,max_ms,mean_ms,"
         "reps,gbps,tflops,pct_copy,pct_gemm,scratch_mb\n";
  const Peaks* peaks = has_peaks_ ? &peaks_ : nullptr;
  for (const Row& r : rows_) {
    const Derived d = format::derive(r, peaks);
    const Stats& s = r.stats;
    out << format::csv_field(r.op) << ',' << format::csv_field(r.provider) << ','
        << format::csv_field(r.dtype) << ',' << format::csv_field(r.shape) << ',' << r.size << ','
        << format::number(r.bytes) << ',' << format::number(r.flops) << ','
        << format::number(s.median_ms) << ',' << format::number(s.p20_ms) << ','
        << format::number(s.p80_ms) << ',' << format::number(s.min_ms) << ','
        << format::number(s.max_ms) << ',' << format::number(s.mean_ms) << ',' << s.reps << ','
        << opt_number(d.gbps, "") << ',' << opt_number(d.tflops, "") << ','
        << opt_number(d.pct_copy, "") << ',' << opt_number(d.pct_gemm, "") << ','
        << opt_number(r.scratch_mb, "") << '\n';
  }
  format::write_file(path, out.str(), "write_csv");
}

void Report::write_json(const std::string& path) const {
  using format::json_string;
  const auto num = json_number;
  std::ostringstream out;
  out << "{\n  \"peaks\": ";
  if (has_peaks_) {
    const Peaks& p = peaks_;
    out << "{\"gpu\": " << json_string(p.gpu) << ", \"device\": " << p.device
        << ", \"sm_count\": " << p.sm_count << ", \"l2_mb\": " << num(p.l2_mb)
        << ", \"memory_gb\": " << num(p.memory_gb) << ", \"driver_version\": " << p.driver_version
        << ", \"runtime_version\": " << p.runtime_version << ", \"copy_gbps\": " << num(p.copy_gbps)
        << ", \"bf16_tflops\": " << num(p.bf16_tflops) << "}";
  } else {
    out << "null";
  }
  out << ",\n  \"rows\": [";
  const Peaks* peaks = has_peaks_ ? &peaks_ : nullptr;
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    const Stats& s = r.stats;
    const Derived d = format::derive(r, peaks);
    out << (i ? ",\n    " : "\n    ") << "{\"op\": " << json_string(r.op)
        << ", \"provider\": " << json_string(r.provider) << ", \"dtype\": " << json_string(r.dtype)
        << ", \"shape\": " << json_string(r.shape) << ", \"size\": " << r.size
        << ", \"bytes\": " << num(r.bytes) << ", \"flops\": " << num(r.flops)
        << ", \"median_ms\": " << num(s.median_ms) << ", \"p20_ms\": " << num(s.p20_ms)
        << ", \"p80_ms\": " << num(s.p80_ms) << ", \"min_ms\": " << num(s.min_ms)
        << ", \"max_ms\": " << num(s.max_ms) << ", \"mean_ms\": " << num(s.mean_ms)
        << ", \"reps\": " << s.reps << ", \"gbps\": " << opt_number(d.gbps, "null")
        << ", \"tflops\": " << opt_number(d.tflops, "null")
        << ", \"pct_copy\": " << opt_number(d.pct_copy, "null")
        << ", \"pct_gemm\": " << opt_number(d.pct_gemm, "null")
        << ", \"scratch_mb\": " << opt_number(r.scratch_mb, "null");
    if (!r.config.empty()) out << ", \"config\": " << json_string(r.config);
    out << "}";
  }
  out << (rows_.empty() ? "]\n}\n" : "\n  ]\n}\n");
  format::write_file(path, out.str(), "write_json");
}

}  // namespace tessera::bench
