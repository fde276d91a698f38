// CPU-side tests of the benchmark engine: statistics, option validation, report writers,
// progress lines and the profile table. GPU-side tests are in bench_gpu_test.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/bench.hpp"
#include "report_parsers.hpp"
#include "tessera/error.hpp"

namespace tb = tessera::bench;
namespace fs = std::filesystem;

namespace {

using tessera::testing::Json;
using tessera::testing::JsonParser;
using tessera::testing::parse_csv;

// Runs f and returns the tessera::Error it throws; fails the test if it throws nothing.
template <class F>
tessera::Error error_of(F&& f) {
  try {
    f();
  } catch (const tessera::Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a tessera::Error";
  return tessera::Error(tessera::ErrorKind::runtime, "none thrown");
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("tessera_bench_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

tb::Stats stats_ms(double median, double p20, double p80) {
  tb::Stats s;
  s.median_ms = median;
  s.p20_ms = p20;
  s.p80_ms = p80;
  s.min_ms = p20 * 0.9;
  s.max_ms = p80 * 1.1;
  s.mean_ms = median;
  s.reps = 25;
  return s;
}

tb::Row row(std::string op, std::string provider, std::string dtype, int64_t size, double bytes,
            double flops, double median_ms) {
  tb::Row r;
  r.op = std::move(op);
  r.provider = std::move(provider);
  r.dtype = std::move(dtype);
  r.shape = "[" + std::to_string(size) + "]";
  r.size = size;
  r.bytes = bytes;
  r.flops = flops;
  r.stats = stats_ms(median_ms, median_ms * 0.9, median_ms * 1.2);
  return r;
}

tb::Peaks peaks() {
  tb::Peaks p;
  p.gpu = "Test \"GPU\"";
  p.sm_count = 132;
  p.l2_mb = 50;
  p.memory_gb = 80;
  p.driver_version = 13000;
  p.runtime_version = 13000;
  p.copy_gbps = 4000;
  p.bf16_tflops = 800;
  return p;
}

// Two providers of a memory-bound op over two sizes, and one GEMM row.
tb::Report sample_report() {
  tb::Report rep;
  // 3 * 4 bytes per element: a + b -> out in float32.
  rep.add(row("add", "tessera", "float32", 1 << 20, 12.0 * (1 << 20), 0, 0.00524288));  // 2400 GB/s
  rep.add(row("add", "torch", "float32", 1 << 20, 12.0 * (1 << 20), 0, 0.0104858));
  rep.add(row("add", "tessera", "float32", 1 << 22, 12.0 * (1 << 22), 0, 0.02097152));
  rep.add(row("add", "torch", "float32", 1 << 22, 12.0 * (1 << 22), 0, 0.0419430));
  // 2 * 4096^3 flops in 0.5 ms = 274.9 TFLOP/s.
  const double f = 2.0 * 4096.0 * 4096.0 * 4096.0;
  tb::Row g = row("gemm", "tessera", "bfloat16", int64_t{1} << 24, 3.0 * 2 * 4096 * 4096, f, 0.5);
  g.shape = "[4096, 4096, 4096]";
  g.scratch_mb = 12.5;
  rep.add(g);
  return rep;
}

}  // namespace

// ---- statistics ---------------------------------------------------------------------------

TEST(BenchStats, QuantileInterpolatesLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4};
  // numpy.quantile([1, 2, 3, 4], q) with the default linear method.
  EXPECT_DOUBLE_EQ(tb::quantile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(tb::quantile(v, 0.2), 1.6);
  EXPECT_DOUBLE_EQ(tb::quantile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(tb::quantile(v, 0.8), 3.4);
  EXPECT_DOUBLE_EQ(tb::quantile(v, 1.0), 4.0);
  const std::vector<double> w = {0, 10, 20, 30, 40};
  EXPECT_DOUBLE_EQ(tb::quantile(w, 0.25), 10.0);  // falls exactly on a rank
  EXPECT_DOUBLE_EQ(tb::quantile(w, 0.1), 4.0);
  EXPECT_DOUBLE_EQ(tb::quantile(w, 0.5), 20.0);
}

TEST(BenchStats, QuantileOfOneElementIsThatElement) {
  for (double q : {0.0, 0.2, 0.5, 1.0}) EXPECT_DOUBLE_EQ(tb::quantile({7.5}, q), 7.5);
}

TEST(BenchStats, QuantileRejectsBadInput) {
  auto e = error_of([] { tb::quantile({}, 0.5); });
  EXPECT_EQ(e.kind(), tessera::ErrorKind::value);
  EXPECT_NE(std::string(e.what()).find("quantile"), std::string::npos) << e.what();

  for (double q : {-0.01, 1.01, std::numeric_limits<double>::quiet_NaN()}) {
    auto eq = error_of([q] { tb::quantile({1, 2}, q); });
    EXPECT_EQ(eq.kind(), tessera::ErrorKind::value);
    EXPECT_NE(std::string(eq.what()).find("'q'"), std::string::npos) << eq.what();
  }
  auto eu = error_of([] { tb::quantile({3, 1, 2}, 0.5); });
  EXPECT_NE(std::string(eu.what()).find("ascending"), std::string::npos) << eu.what();
}

TEST(BenchStats, SummarizeSortsACopy) {
  const tb::Stats s = tb::summarize({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(s.median_ms, 3.0);
  EXPECT_DOUBLE_EQ(s.p20_ms, 1.8);
  EXPECT_DOUBLE_EQ(s.p80_ms, 4.2);
  EXPECT_DOUBLE_EQ(s.min_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.max_ms, 5.0);
  EXPECT_DOUBLE_EQ(s.mean_ms, 3.0);
  EXPECT_EQ(s.reps, 5);
}

TEST(BenchStats, SummarizeRejectsEmptyAndNonFinite) {
  EXPECT_EQ(error_of([] { tb::summarize({}); }).kind(), tessera::ErrorKind::value);
  EXPECT_EQ(error_of([] { tb::summarize({1.0, std::nan("")}); }).kind(), tessera::ErrorKind::value);
}

TEST(BenchStats, Throughput) {
  tb::Row r;
  r.bytes = 2e9;
  r.flops = 1e12;
  r.stats.median_ms = 2.0;
  EXPECT_DOUBLE_EQ(tb::gbps(r), 1000.0);   // 2 GB in 2 ms
  EXPECT_DOUBLE_EQ(tb::tflops(r), 500.0);  // 1 TFLOP in 2 ms
  r.stats.median_ms = 0;  // never timed: no throughput, not infinity
  EXPECT_EQ(tb::gbps(r), 0.0);
  EXPECT_EQ(tb::tflops(r), 0.0);
}

// ---- timing options (validated before the GPU is touched) ---------------------------------

TEST(BenchTiming, RejectsBadOptionsBeforeRunning) {
  bool ran = false;
  auto op = [&](cudaStream_t) { ran = true; };
  struct Case {
    const char* arg;
    tb::TimingOptions o;
  };
  std::vector<Case> cases;
  {
    tb::TimingOptions o;
    o.min_reps = 0;
    cases.push_back({"min_reps", o});
  }
  {
    tb::TimingOptions o;
    o.min_reps = 10;
    o.max_reps = 9;
    cases.push_back({"max_reps", o});
  }
  {
    tb::TimingOptions o;
    o.graph_batch = 0;
    cases.push_back({"graph_batch", o});
  }
  {
    tb::TimingOptions o;
    o.warmup_ms = -1;
    cases.push_back({"warmup_ms", o});
  }
  {
    tb::TimingOptions o;
    o.budget_ms = std::nan("");
    cases.push_back({"budget_ms", o});
  }
  for (const Case& c : cases) {
    auto e = error_of([&] { tb::time_op(op, nullptr, c.o); });
    EXPECT_EQ(e.kind(), tessera::ErrorKind::value);
    EXPECT_NE(std::string(e.what()).find(c.arg), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("time_op"), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of([] { tb::time_op({}, nullptr); }).kind(), tessera::ErrorKind::value);
  EXPECT_FALSE(ran);
}

// ---- reports ------------------------------------------------------------------------------

TEST(BenchReport, TableHasColumnsAndDashesWhereMeaningless) {
  const tb::Report rep = sample_report();
  const std::string t = rep.table();
  std::vector<std::string> lines;
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 2 + rep.rows().size());  // header, rule, rows
  for (const char* col : {"op", "provider", "dtype", "shape", "median_us", "p20_us", "p80_us",
                          "GB/s", "%copy", "TFLOP/s", "%gemm", "scratch_MB"})
    EXPECT_NE(lines[0].find(col), std::string::npos) << col;
  // Numbers are right-aligned in the last column, so every line is as wide as the header.
  for (const auto& l : lines) EXPECT_EQ(l.size(), lines[0].size()) << l;

  // Row 1: add/tessera, 12 MiB in 5.24288 us = 2400 GB/s; no FLOPs and no peaks: dashes.
  std::istringstream r1(lines[2]);
  std::vector<std::string> cells;
  for (std::string c; r1 >> c;) cells.push_back(c);
  ASSERT_EQ(cells.size(), 12u) << lines[2];
  EXPECT_EQ(cells[0], "add");
  EXPECT_EQ(cells[1], "tessera");
  EXPECT_EQ(cells[3], "[1048576]");
  EXPECT_EQ(cells[4], "5.24");  // median in us
  EXPECT_EQ(cells[7], "2400.0");
  EXPECT_EQ(cells[8], "-");
  EXPECT_EQ(cells[9], "-");
  EXPECT_EQ(cells[10], "-");
  EXPECT_EQ(cells[11], "-");  // scratch not measured
  // The GEMM row has TFLOP/s, and its scratch last.
  EXPECT_NE(lines.back().find("274.88"), std::string::npos) << lines.back();
  EXPECT_EQ(lines.back().substr(lines.back().size() - 4), "12.5") << lines.back();
}

TEST(BenchReport, TableShowsPercentOfPeaks) {
  tb::Report rep = sample_report();
  rep.set_peaks(peaks());
  std::istringstream in(rep.table());
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::istringstream r1(lines[2]);
  std::vector<std::string> cells;
  for (std::string c; r1 >> c;) cells.push_back(c);
  ASSERT_EQ(cells.size(), 12u);
  EXPECT_EQ(cells[8], "60.0");  // 2400 of 4000 GB/s
  EXPECT_EQ(cells[10], "-");    // still no FLOPs
  // GEMM: 274.88 of 800 TFLOP/s = 34.4 %.
  EXPECT_NE(lines.back().find("34.4"), std::string::npos) << lines.back();
}

TEST(BenchReport, CsvRoundTrips) {
  TempDir dir;
  tb::Report rep = sample_report();
  tb::Row odd = row("we,ird \"op\"", "tessera", "float16", 100, 600, 0, 0.001);
  odd.shape = "[10, 10]";
  rep.add(odd);
  const fs::path path = dir.path() / "out.csv";
  rep.write_csv(path.string());

  const auto rows = parse_csv(slurp(path));
  ASSERT_EQ(rows.size(), 1 + rep.rows().size());
  const auto& h = rows[0];
  const std::vector<std::string> expected_header = {
      "op",     "provider", "dtype",  "shape",  "size",    "bytes",  "flops", "median_ms", "p20_ms",
      "p80_ms", "min_ms",   "max_ms", "mean_ms", "reps",   "gbps",   "tflops", "pct_copy", "pct_gemm",
      "scratch_mb"};
  ASSERT_EQ(h, expected_header);
  std::map<std::string, std::size_t> col;
  for (std::size_t i = 0; i < h.size(); ++i) col[h[i]] = i;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), h.size()) << "line " << i;
    const tb::Row& r = rep.rows()[i - 1];
    EXPECT_EQ(rows[i][col["op"]], r.op);
    EXPECT_EQ(rows[i][col["shape"]], r.shape);
    EXPECT_EQ(std::stoll(rows[i][col["size"]]), r.size);
    EXPECT_DOUBLE_EQ(std::stod(rows[i][col["bytes"]]), r.bytes);
    EXPECT_NEAR(std::stod(rows[i][col["median_ms"]]), r.stats.median_ms, 1e-12);
    EXPECT_NEAR(std::stod(rows[i][col["p80_ms"]]), r.stats.p80_ms, 1e-12);
    EXPECT_EQ(std::stoi(rows[i][col["reps"]]), r.stats.reps);
    EXPECT_NEAR(std::stod(rows[i][col["gbps"]]), tb::gbps(r), 1e-6 * tb::gbps(r));
    EXPECT_EQ(rows[i][col["pct_copy"]], "");  // no peaks set
    if (r.flops > 0)
      EXPECT_NEAR(std::stod(rows[i][col["tflops"]]), tb::tflops(r), 1e-6 * tb::tflops(r));
    else
      EXPECT_EQ(rows[i][col["tflops"]], "");
  }
}

TEST(BenchReport, CsvHasPercentagesWithPeaks) {
  TempDir dir;
  tb::Report rep = sample_report();
  rep.set_peaks(peaks());
  rep.write_csv((dir.path() / "p.csv").string());
  const auto rows = parse_csv(slurp(dir.path() / "p.csv"));
  ASSERT_EQ(rows.size(), 1 + rep.rows().size());
  EXPECT_NEAR(std::stod(rows[1][16]), 60.0, 1e-6);  // pct_copy
  EXPECT_EQ(rows[1][17], "");                      // pct_gemm: no FLOPs
  EXPECT_NEAR(std::stod(rows.back()[17]), 100.0 * 274.877906944 / 800, 1e-6);
  EXPECT_EQ(rows[1][18], "");  // scratch not measured
  EXPECT_DOUBLE_EQ(std::stod(rows.back()[18]), 12.5);
}

TEST(BenchReport, JsonParsesAndEscapes) {
  TempDir dir;
  tb::Report rep = sample_report();
  tb::Row odd = row("quote\"back\\slash\ttab", "p<1>", "float32", 64, 512, 0, 0.001);
  rep.add(odd);
  const fs::path path = dir.path() / "out.json";
  rep.write_json(path.string());
  const std::string text = slurp(path);
  EXPECT_NE(text.find(R"("quote\"back\\slash\ttab")"), std::string::npos) << text;

  const Json doc = JsonParser(text).parse();
  ASSERT_EQ(doc.kind, Json::object);
  EXPECT_EQ(doc["peaks"].kind, Json::null);
  const Json& rows = doc["rows"];
  ASSERT_EQ(rows.kind, Json::array);
  ASSERT_EQ(rows.items.size(), rep.rows().size());
  for (const char* key : {"op", "provider", "dtype", "shape", "size", "bytes", "flops", "median_ms",
                          "p20_ms", "p80_ms", "min_ms", "max_ms", "mean_ms", "reps", "gbps",
                          "tflops", "pct_copy", "pct_gemm", "scratch_mb"})
    EXPECT_TRUE(rows.items[0].has(key)) << key;
  EXPECT_EQ(rows.items.back()["op"].str, odd.op);  // escapes decode to the original
  EXPECT_EQ(rows.items.back()["provider"].str, "p<1>");
  EXPECT_NEAR(rows.items[0]["gbps"].num, 2400.0, 1e-6);
  EXPECT_EQ(rows.items[0]["tflops"].kind, Json::null);
  EXPECT_EQ(rows.items[0]["reps"].num, 25);
}

TEST(BenchReport, JsonHasPeaksWhenSet) {
  TempDir dir;
  tb::Report rep;
  rep.set_peaks(peaks());
  rep.write_json((dir.path() / "p.json").string());
  const Json doc = JsonParser(slurp(dir.path() / "p.json")).parse();
  const Json& p = doc["peaks"];
  ASSERT_EQ(p.kind, Json::object);
  EXPECT_EQ(p["gpu"].str, "Test \"GPU\"");
  EXPECT_EQ(p["sm_count"].num, 132);
  EXPECT_EQ(p["copy_gbps"].num, 4000);
  EXPECT_EQ(p["bf16_tflops"].num, 800);
  EXPECT_TRUE(p.has("driver_version"));
  EXPECT_TRUE(p.has("runtime_version"));
  EXPECT_EQ(doc["rows"].items.size(), 0u);
}

TEST(BenchReport, SvgPlotsEachProviderOnALog2Axis) {
  const tb::Report rep = sample_report();
  const std::string s = rep.svg("add", "float32");
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(s, "<polyline"), 2u);  // tessera and torch
  EXPECT_NE(s.find(">2^20<"), std::string::npos);
  EXPECT_NE(s.find(">2^22<"), std::string::npos);
  EXPECT_NE(s.find(">add (float32)<"), std::string::npos);
  EXPECT_NE(s.find(">GB/s<"), std::string::npos);
  EXPECT_EQ(s.find("TFLOP/s"), std::string::npos);
  EXPECT_NE(s.find(">tessera<"), std::string::npos);  // legend
  EXPECT_NE(s.find(">torch<"), std::string::npos);
  EXPECT_EQ(s.find("stroke-dasharray"), std::string::npos);  // no peaks, no ceiling
  EXPECT_EQ(count(s, "<text"), count(s, "</text>"));
  EXPECT_EQ(count(s, "<circle"), 4u + 2u);  // a marker per point, one per legend entry

  const std::string g = rep.svg("gemm", "bfloat16");
  EXPECT_NE(g.find(">TFLOP/s<"), std::string::npos);
  EXPECT_EQ(count(g, "<polyline"), 1u);
}

TEST(BenchReport, SvgDrawsCeilingOnlyWithPeaks) {
  tb::Report rep = sample_report();
  rep.set_peaks(peaks());
  const std::string s = rep.svg("add", "float32");
  EXPECT_EQ(count(s, "stroke-dasharray"), 1u);
  EXPECT_NE(s.find("4000 GB/s"), std::string::npos);
  const std::string g = rep.svg("gemm", "bfloat16");
  EXPECT_EQ(count(g, "stroke-dasharray"), 1u);
  EXPECT_NE(g.find("800 TFLOP/s"), std::string::npos);
}

TEST(BenchReport, SvgEscapesText) {
  tb::Report rep;
  rep.add(row("a<b", "x&y", "float32", 1024, 100, 0, 0.001));
  const std::string s = rep.svg("a<b", "float32");
  EXPECT_NE(s.find("a&lt;b (float32)"), std::string::npos);
  EXPECT_NE(s.find(">x&amp;y<"), std::string::npos);
  EXPECT_EQ(s.find("a<b"), std::string::npos);
  EXPECT_EQ(s.find("x&y"), std::string::npos);
  EXPECT_EQ(error_of([&] { rep.svg("nope", "float32"); }).kind(), tessera::ErrorKind::value);
}

TEST(BenchReport, WriteSvgsCreatesTheDirectoryAndOneFilePerOpDtype) {
  TempDir dir;
  const fs::path out = dir.path() / "nested" / "plots";
  const auto paths = sample_report().write_svgs(out.string());
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(fs::path(paths[0]).filename(), "add_float32.svg");
  EXPECT_EQ(fs::path(paths[1]).filename(), "gemm_bfloat16.svg");
  for (const auto& p : paths) EXPECT_EQ(slurp(p).rfind("<svg", 0), 0u) << p;
}

TEST(BenchReport, UnwritablePathThrowsNamingIt) {
  TempDir dir;
  const tb::Report rep = sample_report();
  const std::string missing = (dir.path() / "no_such_dir" / "x.csv").string();
  auto e = error_of([&] { rep.write_csv(missing); });
  EXPECT_EQ(e.kind(), tessera::ErrorKind::runtime);
  EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  EXPECT_EQ(error_of([&] { rep.write_json(missing); }).kind(), tessera::ErrorKind::runtime);
  // A directory cannot be made under a regular file, even by root.
  const fs::path file = dir.path() / "file";
  std::ofstream(file) << "x";
  auto es = error_of([&] { rep.write_svgs((file / "plots").string()); });
  EXPECT_EQ(es.kind(), tessera::ErrorKind::runtime);
  EXPECT_NE(std::string(es.what()).find((file / "plots").string()), std::string::npos) << es.what();
}

// ---- progress -----------------------------------------------------------------------------

TEST(BenchProgress, PlainLinesWhenNotATerminal) {
  std::ostringstream os;
  tb::Progress p(3, os);
  p.step("add float32 [1048576]");
  p.step("add float16 [1048576]");
  p.done();
  EXPECT_EQ(os.str(), "[1/3] add float32 [1048576]\n[2/3] add float16 [1048576]\n");
  EXPECT_EQ(os.str().find('\r'), std::string::npos);
}

// ---- profile table ------------------------------------------------------------------------

TEST(BenchProfile, TableHasRowsPercentagesAndTotal) {
  tb::KernelRecord a;
  a.name = "void tessera::(anonymous namespace)::add_vec_kernel<float, 4>(float const*, float const*, "
           "float*, long, float)";
  a.grid[0] = 528;
  a.block[0] = 256;
  a.registers = 32;
  a.static_smem = 1024;
  a.dynamic_smem = 2048;
  a.duration_us = 30;
  tb::KernelRecord b;
  b.name = "copy_kernel";
  b.grid[0] = 4;
  b.grid[1] = 2;
  b.block[0] = 128;
  b.duration_us = 10;
  const std::string t = tb::profile_table({a, b});

  for (const char* col : {"name", "grid", "block", "regs", "smem", "time_us", "%total"})
    EXPECT_NE(t.find(col), std::string::npos) << col;
  EXPECT_NE(t.find("(528, 1, 1)"), std::string::npos) << t;
  EXPECT_NE(t.find("(4, 2, 1)"), std::string::npos) << t;
  EXPECT_NE(t.find("3072"), std::string::npos) << t;  // static + dynamic
  EXPECT_NE(t.find("75.0"), std::string::npos) << t;
  EXPECT_NE(t.find("25.0"), std::string::npos) << t;
  EXPECT_NE(t.find("total (2 kernels)"), std::string::npos) << t;
  EXPECT_NE(t.find("40.00"), std::string::npos) << t;
  EXPECT_NE(t.find("100.0"), std::string::npos) << t;
  // The long name is cut to the template, without its parameter list or "void ".
  EXPECT_NE(t.find("tessera::(anonymous namespace)::add_vec_kernel<float, 4>"), std::string::npos) << t;
  EXPECT_EQ(t.find("float const*"), std::string::npos) << t;
  // The name column is at most 60 wide: the first column gap starts by then.
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);)
    if (l[0] != '-') EXPECT_LE(l.find("  "), 60u) << l;
}

TEST(BenchProfile, VeryLongNamesAreTruncated) {
  tb::KernelRecord k;
  k.name = std::string(200, 'x');
  const std::string t = tb::profile_table({k});
  EXPECT_NE(t.find(std::string(57, 'x') + "..."), std::string::npos);
  EXPECT_EQ(t.find(std::string(58, 'x')), std::string::npos);
}
