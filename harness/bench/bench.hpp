// Benchmark engine: timing, measured ceilings, reports and per-kernel profiling.
// Used by the `tessera` command and, through the Python extension, by the Python benchmarks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace tessera::bench {

// ---- statistics -------------------------------------------------------------------------
struct Stats {
  double median_ms = 0, p20_ms = 0, p80_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
  int reps = 0;
};

// Quantile q in [0, 1] of `sorted` (ascending), linear interpolation between closest ranks
// (numpy's default). Throws tessera::Error on an empty input or q outside [0, 1].
double quantile(const std::vector<double>& sorted, double q);
// Stats of raw samples (any order). Throws tessera::Error on an empty input.
Stats summarize(std::vector<double> samples_ms);

// ---- timing -----------------------------------------------------------------------------
struct TimingOptions {
  double warmup_ms = 25;    // run the op at least this long before timing
  int min_reps = 25;        // never fewer timed reps
  int max_reps = 1000;
  double budget_ms = 100;   // after min_reps, stop once this much op time has been measured
  bool flush_l2 = true;     // read a buffer of twice the L2 before each timed rep
  bool cuda_graph = false;  // time replays of a graph of `graph_batch` calls, per call
  int graph_batch = 20;     // (graph mode does not flush the L2: it gives warm-cache time)
};

// Times `op` (which enqueues its work on the stream it is given) with CUDA events around each
// rep. Throws tessera::Error on bad options or CUDA failure.
Stats time_op(const std::function<void(cudaStream_t)>& op, cudaStream_t stream,
              const TimingOptions& options = {});

// ---- ceilings measured on this GPU ------------------------------------------------------
struct Peaks {
  std::string gpu;           // device name
  int device = 0;
  int sm_count = 0;
  double l2_mb = 0;
  double memory_gb = 0;
  int driver_version = 0;    // cudaDriverGetVersion
  int runtime_version = 0;   // cudaRuntimeGetVersion
  double copy_gbps = 0;      // 1 GiB device-to-device copy, bytes read + written / median time
  double bf16_tflops = 0;    // cuBLAS bf16 GEMM 8192^3 (fp32 accumulate), median
};
Peaks measure_peaks(cudaStream_t stream);

// ---- reports ----------------------------------------------------------------------------
struct Row {
  std::string op, provider, dtype, shape;
  int64_t size = 0;  // x axis of plots
  double bytes = 0, flops = 0;
  Stats stats;
  std::string config;  // the kernel tier and plan that ran (tessera's rows; empty otherwise)
  // The most scratch memory one call held beyond what was in use before it (tessera's pool, MB);
  // unset where not measured (a peer's rows).
  std::optional<double> scratch_mb;
};
double gbps(const Row& r);    // bytes / median
double tflops(const Row& r);  // flops / median

class Report {
 public:
  void add(const Row& row);
  void set_peaks(const Peaks& peaks);
  const std::vector<Row>& rows() const { return rows_; }
  const Peaks& peaks() const { return peaks_; }
  bool has_peaks() const { return has_peaks_; }

  // Aligned text table: op, provider, dtype, shape, median/p20/p80 (us), GB/s, % of copy,
  // TFLOP/s, % of GEMM (percentages only when peaks are set), scratch MB (where measured).
  std::string table() const;
  void write_csv(const std::string& path) const;
  void write_json(const std::string& path) const;
  // One SVG per (op, dtype): throughput against size, one line per provider (GB/s when the op
  // declares no FLOPs, else TFLOP/s), the measured ceiling as a dashed line. Returns the paths.
  std::vector<std::string> write_svgs(const std::string& dir) const;
  std::string svg(const std::string& op, const std::string& dtype) const;

 private:
  std::vector<Row> rows_;
  Peaks peaks_;
  bool has_peaks_ = false;
};

// One-line progress display on a terminal ("[3/12] add float32 [1048576]"), plain lines otherwise.
class Progress {
 public:
  Progress(int total, std::ostream& os);
  void step(const std::string& label);
  void done();

 private:
  int total_, count_ = 0;
  std::ostream& os_;
  bool tty_;
  int fd_ = -1;             // the terminal's file descriptor when tty_
  bool line_open_ = false;  // a '\r' line is on screen and done() must end it
};

// ---- profiling --------------------------------------------------------------------------
struct KernelRecord {
  std::string name;  // demangled
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int registers = 0;
  int static_smem = 0, dynamic_smem = 0;  // bytes
  double duration_us = 0;
};
// Runs fn once under CUPTI activity tracing and returns every kernel it launched, in order.
// Synchronizes the device. Throws tessera::Error when CUPTI is unavailable.
std::vector<KernelRecord> profile_kernels(const std::function<void()>& fn);
// A table like torch.profiler's: name, grid, block, regs, smem, time, % of total.
std::string profile_table(const std::vector<KernelRecord>& kernels);

}  // namespace tessera::bench
