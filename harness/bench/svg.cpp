// SVG plots of a report: one standalone file per (op, dtype), throughput against size on a log2
// axis, one line per provider and the measured ceiling as a dashed line. Hand-written SVG keeps
// the benchmark engine free of plotting dependencies; any browser shows the result.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "bench/bench.hpp"
#include "bench/format.hpp"
#include "runtime/check.hpp"

namespace tessera::bench {
namespace {

using format::fixed;
using format::xml_escape;

// Canvas and plot area, in SVG user units. The right margin holds the legend.
constexpr double kWidth = 820, kHeight = 480;
constexpr double kLeft = 80, kRight = 620, kTop = 50, kBottom = 410;

// Distinct, colour-blind-friendlier hues (the usual categorical palette); cycled past ten.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// Axis values: SVG coordinates with at most two decimals keep files small and diffs readable.
std::string coord(double v) { return fixed(v, 2); }

// A tick step of 1, 2 or 5 times a power of ten giving about `target` intervals up to `top`.
double nice_step(double top, int target) {
  const double raw = top / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

std::string tick_label(double v) {
  std::ostringstream s;
  s << v;  // 6 significant digits: 500, 1000, 0.3 (not 0.30000000000000004)
  return s.str();
}

// A name usable as a file name on every platform: letters, digits and ._+- kept, the rest '_'.
std::string file_stem(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == '+';
    if (!ok) c = '_';
  }
  return out;
}

}  // namespace

std::string Report::svg(const std::string& op, const std::string& dtype) const {
  std::vector<const Row*> rows;
  bool any_flops = false;
  for (const Row& r : rows_) {
    if (r.op == op && r.dtype == dtype) rows.push_back(&r);
    // The metric is chosen per op, not per (op, dtype): every plot of one op shows the same unit.
    if (r.op == op && r.flops > 0) any_flops = true;
  }
  if (rows.empty())
    detail::throw_arg(ErrorKind::value, "bench.svg", "op, dtype", "an (op, dtype) pair in the report",
                      "'" + op + "' (" + dtype + ")");

  const char* unit = any_flops ? "TFLOP/s" : "GB/s";
  auto value_of = [&](const Row& r) { return any_flops ? tflops(r) : gbps(r); };
  double ceiling = 0;
  std::string ceiling_label;
  if (has_peaks_) {
    ceiling = any_flops ? peaks_.bf16_tflops : peaks_.copy_gbps;
    ceiling_label = any_flops ? "cuBLAS bf16 GEMM " + fixed(ceiling, 0) + " TFLOP/s"
                              : "device copy " + fixed(ceiling, 0) + " GB/s";
  }

  // Providers in order of first appearance, each with its points sorted by size. A size of 0 or
  // less has no place on a log axis and is left out of the plot (it stays in table/CSV/JSON).
  std::vector<std::string> providers;
  struct Point {
    double x, y;  // log2(size), throughput
    int64_t size;
  };
  std::map<std::string, std::vector<Point>> points;
  for (const Row* r : rows) {
    if (!points.count(r->provider)) providers.push_back(r->provider);
    auto& pts = points[r->provider];
    if (r->size > 0) pts.push_back({std::log2(static_cast<double>(r->size)), value_of(*r), r->size});
  }
  double x_lo = INFINITY, x_hi = -INFINITY, y_max = ceiling;
  for (auto& [name, pts] : points) {
    std::stable_sort(pts.begin(), pts.end(),
                     [](const Point& a, const Point& b) { return a.x < b.x; });
    for (const Point& p : pts) {
      x_lo = std::min(x_lo, p.x);
      x_hi = std::max(x_hi, p.x);
      if (std::isfinite(p.y)) y_max = std::max(y_max, p.y);
    }
  }
  if (!(x_lo <= x_hi)) x_lo = x_hi = 0;  // nothing plottable: draw empty axes
  x_lo = std::floor(x_lo);
  x_hi = std::ceil(x_hi);
  if (x_hi - x_lo < 1) {  // one size: centre it between neighbouring powers of two
    x_lo -= 1;
    x_hi += 1;
  }
  if (!(y_max > 0)) y_max = 1;
  const double y_step = nice_step(y_max * 1.05, 5);
  const int y_ticks = static_cast<int>(std::ceil(y_max * 1.05 / y_step));
  const double y_top = y_ticks * y_step;

  auto px = [&](double x) { return kLeft + (x - x_lo) / (x_hi - x_lo) * (kRight - kLeft); };
  auto py = [&](double y) { return kBottom - y / y_top * (kBottom - kTop); };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" fill=\"white\"/>\n";
  s << "<text x=\"" << coord((kLeft + kRight) / 2) << "\" y=\"28\" text-anchor=\"middle\" "
    << "font-size=\"16\" font-weight=\"bold\">" << xml_escape(op + " (" + dtype + ")") << "</text>\n";

  // Grid and ticks. Light solid grid lines; only the ceiling is dashed.
  s << "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (int i = 1; i <= y_ticks; ++i)
    s << "<line x1=\"" << kLeft << "\" y1=\"" << coord(py(i * y_step)) << "\" x2=\"" << kRight << "\" y2=\""
      << coord(py(i * y_step)) << "\"/>\n";
  // Power-of-two ticks, thinned to at most ten so the labels never overlap.
  int x_tick_step = 1;
  while ((x_hi - x_lo) / x_tick_step > 10) x_tick_step *= 2;
  std::vector<int> x_ticks;
  for (int k = static_cast<int>(x_lo); k <= static_cast<int>(x_hi); ++k)
    if (k % x_tick_step == 0) x_ticks.push_back(k);
  for (int k : x_ticks)
    s << "<line x1=\"" << coord(px(k)) << "\" y1=\"" << kTop << "\" x2=\"" << coord(px(k))
      << "\" y2=\"" << kBottom << "\"/>\n";
  s << "</g>\n";
  s << "<g stroke=\"black\" stroke-width=\"1\">\n"
    << "<line x1=\"" << kLeft << "\" y1=\"" << kBottom << "\" x2=\"" << kRight << "\" y2=\""
    << kBottom << "\"/>\n"
    << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\"" << kBottom
    << "\"/>\n</g>\n";
  for (int k : x_ticks)
    s << "<text x=\"" << coord(px(k)) << "\" y=\"" << kBottom + 18
      << "\" text-anchor=\"middle\">2^" << k << "</text>\n";
  for (int i = 0; i <= y_ticks; ++i)
    s << "<text x=\"" << kLeft - 8 << "\" y=\"" << coord(py(i * y_step) + 4)
      << "\" text-anchor=\"end\">" << tick_label(i * y_step) << "</text>\n";
  s << "<text x=\"" << coord((kLeft + kRight) / 2) << "\" y=\"" << kBottom + 42
    << "\" text-anchor=\"middle\">size (elements, log2 scale)</text>\n";
  s << "<text x=\"20\" y=\"" << coord((kTop + kBottom) / 2)
    << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " << coord((kTop + kBottom) / 2)
    << ")\">" << unit << "</text>\n";

  if (ceiling > 0) {
    s << "<line x1=\"" << kLeft << "\" y1=\"" << coord(py(ceiling)) << "\" x2=\"" << kRight
      << "\" y2=\"" << coord(py(ceiling))
      << "\" stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
    s << "<text x=\"" << kRight - 4 << "\" y=\"" << coord(py(ceiling) - 6)
      << "\" text-anchor=\"end\" fill=\"#555555\">" << xml_escape(ceiling_label) << "</text>\n";
  }

  for (std::size_t i = 0; i < providers.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    const auto& pts = points[providers[i]];
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (std::size_t j = 0; j < pts.size(); ++j)
      s << (j ? " " : "") << coord(px(pts[j].x)) << ',' << coord(py(pts[j].y));
    s << "\"/>\n";
    // Each marker carries its exact values as a tooltip.
    for (const Point& p : pts)
      s << "<circle cx=\"" << coord(px(p.x)) << "\" cy=\"" << coord(py(p.y)) << "\" r=\"3\" fill=\""
        << color << "\"><title>" << xml_escape(providers[i]) << ", size " << p.size << ": "
        << fixed(p.y, 2) << ' ' << unit << "</title></circle>\n";
  }

  // Legend: a short line and marker per provider, right of the plot.
  const double lx = kRight + 20;
  for (std::size_t i = 0; i < providers.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    const double ly = kTop + 10 + 20.0 * static_cast<double>(i);
    s << "<line x1=\"" << lx << "\" y1=\"" << coord(ly) << "\" x2=\"" << lx + 24 << "\" y2=\""
      << coord(ly) << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>"
      << "<circle cx=\"" << lx + 12 << "\" cy=\"" << coord(ly) << "\" r=\"3\" fill=\"" << color
      << "\"/>"
      << "<text x=\"" << lx + 30 << "\" y=\"" << coord(ly + 4) << "\">" << xml_escape(providers[i])
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::vector<std::string> Report::write_svgs(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    throw Error(ErrorKind::runtime, "tessera.bench.write_svgs: cannot create directory '" + dir +
                                        "'" + (ec ? ": " + ec.message() : std::string()));

  std::vector<std::pair<std::string, std::string>> pairs;  // (op, dtype), first-seen order
  for (const Row& r : rows_)
    if (std::find(pairs.begin(), pairs.end(), std::make_pair(r.op, r.dtype)) == pairs.end())
      pairs.emplace_back(r.op, r.dtype);

  std::vector<std::string> paths;
  std::set<std::string> used;
  for (const auto& [op, dtype] : pairs) {
    // Two pairs that differ only in characters a file name cannot hold get distinct files.
    std::string stem = file_stem(op + "_" + dtype);
    for (int n = 2; used.count(stem); ++n) stem = file_stem(op + "_" + dtype) + "_" + std::to_string(n);
    used.insert(stem);
    const std::string path = (fs::path(dir) / (stem + ".svg")).string();
    format::write_file(path, svg(op, dtype), "write_svgs");
    paths.push_back(path);
  }
  return paths;
}

}  // namespace tessera::bench
