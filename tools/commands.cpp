// The verbs of `tessera`: thin loops over the op registry and the benchmark engine.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench/bench.hpp"
#include "bench/fill.hpp"
#include "bench/toolkit_lib.hpp"
#include "cli.hpp"
#include "ops/registry.hpp"
#include "ops/selection.hpp"
#include "ops/verify.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/tuner.hpp"
#include "tessera/error.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/matrix.hpp"
#include "tessera/version.hpp"

namespace tessera::cli {
namespace {

template <typename... T>
std::string strf(const char* format, T... values) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, values...);
  return buf;
}

// "13.0" from cudaDriverGetVersion's 13000.
std::string cuda_version(int v) { return strf("%d.%d", v / 1000, v % 1000 / 10); }

// Decimal units, as the GB/s figures are.
std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  for (; bytes >= 1000 && u < 4; ++u) bytes /= 1000;
  return strf(u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
}

// A stream of our own: CUDA graphs cannot capture the legacy default stream.
class Stream {
 public:
  Stream() { TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

bench::Peaks measure_peaks(std::ostream& err) {
  err << "measuring peaks (1 GiB device copy, cuBLAS bf16 GEMM 8192^3)...\n";
  Stream stream;
  return bench::measure_peaks(stream.get());
}

int info(const Args& a, std::ostream& out, std::ostream& err) {
  const cudaDeviceProp& p = runtime::device_props(a.device);
  int driver = 0, runtime_version = 0;
  TESSERA_CUDA_CHECK(cudaDriverGetVersion(&driver));
  TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&runtime_version));
  out << strf("GPU %d of %d: %s\n", a.device, runtime::device_count(), p.name)
      << strf("  compute capability  %d.%d\n", p.major, p.minor)
      << strf("  SMs                 %d\n", p.multiProcessorCount)
      << strf("  memory              %.1f GiB\n", p.totalGlobalMem / double(1 << 30))
      << strf("  L2 cache            %.1f MiB\n", p.l2CacheSize / double(1 << 20))
      << strf("  driver              %s\n", cuda_version(driver).c_str())
      << strf("  runtime             %s\n", cuda_version(runtime_version).c_str());
  if (a.peaks) {
    out.flush();
    bench::Peaks peaks = measure_peaks(err);
    out << "measured peaks:\n"
        << strf("  copy                %.0f GB/s\n", peaks.copy_gbps)
        << strf("  bf16 GEMM (cuBLAS)  %.1f TFLOP/s\n", peaks.bf16_tflops);
  }
  return 0;
}

// What a case covers for the default selection (ops/selection.hpp): its dtype with each traced
// op and tier, or the dtype alone where nothing was traced.
std::vector<std::string> coverage(const std::string& name, const std::vector<runtime::TierChoice>& tiers) {
  std::string dtype = ops::case_dtype(name);
  if (dtype.empty()) dtype = "(no dtype)";
  std::vector<std::string> covers;
  for (const auto& t : tiers) covers.push_back(dtype + ":" + t.op + ":" + t.tier);
  if (covers.empty()) covers.push_back(dtype);
  std::sort(covers.begin(), covers.end());
  covers.erase(std::unique(covers.begin(), covers.end()), covers.end());
  return covers;
}

// After a full run: the pairs the compiled-in selection misses, and the fresh selection where asked.
void check_selection(const Args& a, const std::vector<ops::CaseCoverage>& ran, std::ostream& out) {
  const std::vector<std::string> missed = ops::uncovered_by_default(ran);
  const std::vector<std::size_t> chosen = ops::cover(ran);
  out << "default selection: " << chosen.size() << " of " << ran.size()
      << " cases cover every dtype and tier this run reached of its ops";
  if (missed.empty()) out << "; the compiled-in selection covers them all\n";
  else out << "; the compiled-in selection misses " << missed.size() << ":\n";
  for (const std::string& m : missed) out << "  " << m << "\n";
  if (!missed.empty() && a.selection_out.empty())
    out << "  (write a fresh selection: tessera verify --full --write-selection harness/ops/verify_default.txt)\n";
  if (a.selection_out.empty()) return;
  std::ofstream f(a.selection_out);
  f << "# The default `tessera verify` run (harness/ops/selection.hpp): op<TAB>case name, one case a line.\n"
    << "# Written by `tessera verify --full --write-selection harness/ops/verify_default.txt` on a GPU.\n";
  for (std::size_t i : chosen) f << ran[i].op << "\t" << ran[i].name << "\n";
  if (!f) throw Error(ErrorKind::runtime, "verify: could not write --write-selection " + a.selection_out);
  out << "wrote " << a.selection_out << "\n";
}

int verify(const Args& a, std::ostream& out) {
  const std::vector<const ops::OpInfo*> selected = resolve_ops(a.ops);
  size_t op_width = 0;
  for (const auto* op : selected) op_width = std::max(op_width, op->name.size());
  // Whether the run takes a case: --large for the largest; those the default selection leaves
  // out with --full, or where ops are named (all of theirs).
  const bool full = a.full || !a.selection_out.empty() || !a.ops.empty();
  const auto takes = [&](const ops::OpInfo& op, const ops::VerifyCase& c) {
    return (!c.large || a.large) && (full || ops::selected_by_default(op.name, c.name));
  };

  if (a.list) {
    size_t n = 0;
    for (const ops::OpInfo* op : selected)
      for (const ops::VerifyCase& c : op->verify_cases())
        if (takes(*op, c)) out << op->name << "  " << c.name << "\n", ++n;
    out << n << " case(s)" << std::endl;
    return 0;
  }
  ops::set_verify_seed(uint64_t(a.seed));
  int passed = 0, failed = 0, skipped = 0, left = 0;
  double worst = 0;  // the largest rel_err / tol of a passing case: the run's margin
  std::string worst_case;
  std::vector<ops::CaseCoverage> ran;
  for (const ops::OpInfo* op : selected) {
    for (const ops::VerifyCase& c : op->verify_cases()) {
      if (!takes(*op, c)) {
        ++(c.large && !a.large ? skipped : left);
        continue;
      }
      ops::VerifyResult r;
      const auto t0 = std::chrono::steady_clock::now();
      runtime::set_tier_trace(true);
      try {
        r = c.run();
      } catch (const Error& e) {  // one broken case must not hide the others
        r.passed = false;
        r.detail = e.what();
      }
      const std::vector<runtime::TierChoice> tiers = runtime::take_tier_trace();
      runtime::set_tier_trace(false);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r.name.empty()) r.name = c.name;
      ++(r.passed ? passed : failed);
      ran.push_back({op->name, c.name, coverage(c.name, tiers), seconds});
      const double ratio = r.tolerance > 0 ? r.rel_err / r.tolerance : (r.rel_err > 0 ? INFINITY : 0.0);
      if (r.passed && ratio > worst) {
        worst = ratio;
        worst_case = op->name + " " + r.name;
      }
      out << strf("%s  %-*s  %-36s  rel_err %.2e  max_abs %.2e  tol %.2e  (%.3f of tol)  unwritten %lld  %.2f s",
                  r.passed ? "PASS" : "FAIL", int(op_width), op->name.c_str(), r.name.c_str(),
                  r.rel_err, r.max_abs, r.tolerance, ratio, static_cast<long long>(r.unwritten), seconds);
      if (!r.passed && !r.detail.empty()) out << "  (" << r.detail << ")";
      out << std::endl;  // flushed: a long run shows its progress
    }
  }
  if (skipped) out << skipped << " large case(s) skipped (run with --large)\n";
  if (left)
    out << left << " case(s) left out: the default run takes the fewest cases that cover every op, dtype "
        << "and kernel tier (run with --full for all)\n";
  if (!worst_case.empty()) out << strf("closest to its bound: %s (%.3f of tol)\n", worst_case.c_str(), worst);
  if (full) check_selection(a, ran, out);
  out << passed << " passed, " << failed << " failed (seed " << a.seed << ")\n";
  return failed ? 1 : 0;
}

// The tiers and plans one run of `c` took ("sm90_wgmma: cooperative, 128 x 256 tiles, ..."),
// from an untimed run under the tier trace; empty for ops without tiers.
std::string traced_config(ops::BenchCase& c, cudaStream_t stream) {
  runtime::set_tier_trace(true);
  std::vector<runtime::TierChoice> tiers;
  try {
    c.run(stream);
    tiers = runtime::take_tier_trace();
  } catch (...) {
    runtime::set_tier_trace(false);
    throw;
  }
  runtime::set_tier_trace(false);
  std::string config;
  for (const auto& t : tiers) {
    const std::size_t plan = t.why.rfind(": ");
    config += (config.empty() ? "" : "; ") + t.tier + " (" +
              (plan == std::string::npos ? t.why : t.why.substr(plan + 2)) + ")";
  }
  return config;
}

int bench_ops(const Args& a, const std::vector<BenchItem>& plan, std::ostream& out,
              std::ostream& err) {
  bench::Report report;
  if (a.peaks) report.set_peaks(measure_peaks(err));

  bench::TimingOptions options;
  options.cuda_graph = a.graph;
  options.flush_l2 = a.flush_l2;
  if (a.reps) options.min_reps = options.max_reps = a.reps;

  Stream stream;
  bench::Progress progress(static_cast<int>(plan.size()), err);
  for (const BenchItem& item : plan) {
    progress.step(item.op->name + " " + dtype_name(item.dtype) + " " + format_size(item.size));
    // Scoped so the case's buffers are freed before the next (maybe larger) one is allocated.
    const auto time = [&](ops::BenchCase c, const char* provider) {
      bench::Row row;
      if (std::string(provider) == "tessera") {
        // The traced call also measures the scratch one call holds beyond what was in use.
        int device = 0;
        TESSERA_CUDA_CHECK(cudaGetDevice(&device));
        runtime::reset_scratch_peak(device);
        const std::size_t before = runtime::scratch_peak_bytes(device);
        row.config = traced_config(c, stream.get());
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
        row.scratch_mb = double(runtime::scratch_peak_bytes(device) - before) / double(1 << 20);
      }
      row.stats = bench::time_op(c.run, stream.get(), options);
      row.op = c.op;
      row.provider = provider;
      row.dtype = c.dtype;
      row.shape = c.shape;
      row.size = c.size;
      row.bytes = c.bytes;
      row.flops = c.flops;
      report.add(row);
    };
    time(item.op->make_bench(item.dtype, item.size), "tessera");
    if (item.op->make_baseline && bench::cublas_library().available())
      time(item.op->make_baseline(item.dtype, item.size), "cuBLAS");
  }
  progress.done();
  out << report.table();

  if (!a.out_dir.empty()) {
    namespace fs = std::filesystem;
    fs::create_directories(a.out_dir);
    std::vector<std::string> paths = {(fs::path(a.out_dir) / "bench.csv").string(),
                                      (fs::path(a.out_dir) / "bench.json").string()};
    report.write_csv(paths[0]);
    report.write_json(paths[1]);
    for (auto& svg : report.write_svgs(a.out_dir)) paths.push_back(svg);
    for (const auto& path : paths) out << "wrote " << path << "\n";
  }
  return 0;
}

int profile(const BenchItem& item, std::ostream& out) {
  Stream stream;
  ops::BenchCase c = item.op->make_bench(item.dtype, item.size);
  // Two untraced runs first, so one-time costs (module loading, autotuning) stay out of the trace.
  c.run(stream.get());
  c.run(stream.get());
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  runtime::set_tier_trace(true);
  std::vector<runtime::TierChoice> tiers;
  std::vector<bench::KernelRecord> kernels;
  try {
    kernels = bench::profile_kernels([&] { c.run(stream.get()); });
    tiers = runtime::take_tier_trace();
    runtime::set_tier_trace(false);
  } catch (...) {
    runtime::set_tier_trace(false);
    throw;
  }
  out << c.op << "  " << c.dtype << "  " << c.shape << "  " << human_bytes(c.bytes) << " moved";
  if (c.flops > 0) out << strf("  %.3g GFLOP", c.flops / 1e9);
  out << "\n";
  // The kernel tier each call chose and why (ops whose kernels come in tiers).
  for (const auto& t : tiers) out << "tier  " << t.op << ": " << t.tier << " (" << t.why << ")\n";
  out << bench::profile_table(kernels);
  return 0;
}

// One line per record: op, key, config, time and the machine that measured it. `here` (this
// GPU and software) marks its records with '*'; without it none is marked.
void print_records(const std::vector<runtime::TuneRecord>& records,
                   const runtime::TuneIdentity* here, std::ostream& out) {
  for (const auto& r : records)
    out << (here && r.id == *here ? "* " : "  ") << r.op << "  " << r.key << "  "
        << r.entry.config << strf("  %.1f us", r.entry.time_us) << "  (" << r.id.gpu_name << ", "
        << r.id.sm_count << " SMs, driver " << cuda_version(r.id.driver_version) << ", runtime "
        << cuda_version(r.id.runtime_version) << ", tessera " << r.id.tessera_version << ")\n";
  out << records.size() << " record(s); "
      << (here ? "* marks those of this GPU and software\n"
               : "each is used only on the GPU and software it names\n");
}

// `tune --show`: the cache file as it is. It only reads the file, so it touches no GPU; this
// machine's identity comes from the GPU, so no record is marked as its own.
int tune_show(std::ostream& out) {
  const std::string path = runtime::default_cache_path();
  if (path.empty()) {
    out << "tune cache: none (TESSERA_CACHE_DIR, XDG_CACHE_HOME and HOME are unset)\n";
    return 0;
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) {
    out << "tune cache: " << path << " (absent: nothing tuned yet)\n";
    return 0;
  }
  // A placeholder identity, which no record has: this cache object only lists.
  const runtime::TuneCache file(path, {"none", 0, 0, 0, kVersion});
  out << "tune cache: " << path << "\n";
  print_records(file.list(), nullptr, out);
  return file.warnings().empty() ? 0 : 1;  // an unreadable file: the warning is on stderr
}

// The cache after tuning, as this process holds it: '*' on the records of this GPU.
void tune_list(int device, std::ostream& out) {
  runtime::TuneCache& cache = runtime::tune_cache(device);
  out << "tune cache: " << (cache.path().empty() ? "(in memory: no cache directory)" : cache.path())
      << "\n";
  print_records(cache.list(), &cache.identity(), out);
}

// A matmul operand of `rows` x `cols` as the layout letter says: 'n' row-major, 't' the
// transpose of a row-major [cols, rows] matrix.
TensorView operand(void* data, DType dt, int64_t rows, int64_t cols, char layout, int device) {
  TensorView v;
  v.data = data, v.dtype = dt, v.ndim = 2, v.device = {DeviceType::cuda, device};
  v.shape[0] = rows, v.shape[1] = cols;
  v.strides[0] = layout == 'n' ? cols : 1;
  v.strides[1] = layout == 'n' ? 1 : rows;
  return v;
}

// Each shape, dtype and layout: a matmul call with tuning on, which measures the candidates
// where the cache lacks the shape's bucket and stores the winner.
int tune(const Args& a, std::ostream& out, std::ostream& err) {
  const std::vector<DType> dtypes = a.dtypes.empty() ? std::vector<DType>{DType::bfloat16} : a.dtypes;
  const std::vector<std::string> layouts = a.layouts.empty() ? std::vector<std::string>{"nt"} : a.layouts;
  Stream stream;
  const bool was_on = runtime::autotune_enabled();
  runtime::set_autotune(true);
  runtime::set_tune_listener([&](const std::string& key, int done, int of) {
    err << "\r  tuning " << key << "  " << done << "/" << of << (done == of ? "\n" : "") << std::flush;
  });
  int failed = 0;
  for (const GemmShape& s : a.shapes)
    for (DType dt : dtypes)
      for (const std::string& l : layouts) {
        const std::string what = strf("matmul %lldx%lldx%lld %s %s", (long long)s.m,
                                      (long long)s.n, (long long)s.k, dtype_name(dt), l.c_str());
        try {
          // float8 goes through scaled_mm (unit scales, bfloat16 out); float32 is tuned as TF32,
          // the only float32 path with configs.
          const bool fp8 = dt == DType::float8_e4m3fn || dt == DType::float8_e5m2;
          const DType out_dt = fp8 ? DType::bfloat16 : dt;
          const std::size_t e = dtype_size(dt);
          runtime::DeviceBuffer ab(std::size_t(s.m * s.k) * e), bb(std::size_t(s.k * s.n) * e),
              cb(std::size_t(s.m * s.n) * dtype_size(out_dt)), sb(sizeof(float));
          bench::fill_uniform(ab.data(), dt, s.m * s.k, -1, 1, 1, stream.get());
          bench::fill_uniform(bb.data(), dt, s.k * s.n, -1, 1, 2, stream.get());
          bench::fill_uniform(sb.data(), DType::float32, 1, 1, 1, 3, stream.get());
          const TensorView av = operand(ab.data(), dt, s.m, s.k, l[0], a.device);
          const TensorView bv = operand(bb.data(), dt, s.k, s.n, l[1], a.device);
          const TensorView cv = operand(cb.data(), out_dt, s.m, s.n, 'n', a.device);
          const TensorView scale = TensorView::contiguous(sb.data(), DType::float32, {1},
                                                          {DeviceType::cuda, a.device});
          MatmulOptions o;
          o.allow_tf32 = dt == DType::float32;
          if (fp8) scaled_mm(av, bv, scale, scale, cv, nullptr, stream.get());
          else matmul(av, bv, cv, o, stream.get());
          TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
          out << "done  " << what << "\n";
        } catch (const Error& e) {
          ++failed;
          out << "FAIL  " << what << ": " << e.what() << "\n";
        }
      }
  // attention: a call per shape and dtype, contiguous tensors; its decode tier (seq_q <= 16)
  // tunes its split over the keys, the other tiers have no configs yet.
  for (const AttentionShape& s : a.attention_shapes)
    for (DType dt : dtypes) {
      const std::string what = strf("attention %lldx%lldx%lldx%lldx%lldx%lld %s", (long long)s.batch,
                                    (long long)s.seq_q, (long long)s.seq_k, (long long)s.heads_q,
                                    (long long)s.heads_kv, (long long)s.head_dim, dtype_name(dt));
      try {
        const std::size_t e = dtype_size(dt);
        const int64_t nq = s.batch * s.seq_q * s.heads_q * s.head_dim, nk = s.batch * s.seq_k * s.heads_kv * s.head_dim;
        runtime::DeviceBuffer qb(std::size_t(nq) * e), kb(std::size_t(nk) * e), vb(std::size_t(nk) * e),
            ob(std::size_t(nq) * e);
        bench::fill_uniform(qb.data(), dt, nq, -1, 1, 1, stream.get());
        bench::fill_uniform(kb.data(), dt, nk, -1, 1, 2, stream.get());
        bench::fill_uniform(vb.data(), dt, nk, -1, 1, 3, stream.get());
        const Device dev{DeviceType::cuda, a.device};
        const TensorView q = TensorView::contiguous(qb.data(), dt, {s.batch, s.seq_q, s.heads_q, s.head_dim}, dev);
        const TensorView k = TensorView::contiguous(kb.data(), dt, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, dev);
        const TensorView v = TensorView::contiguous(vb.data(), dt, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, dev);
        const TensorView o = TensorView::contiguous(ob.data(), dt, {s.batch, s.seq_q, s.heads_q, s.head_dim}, dev);
        attention(q, k, v, o, nullptr, {}, stream.get());
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
        out << "done  " << what << (s.seq_q > 16 ? " (no configs: the decode tier takes seq_q <= 16)" : "") << "\n";
      } catch (const Error& e) {
        ++failed;
        out << "FAIL  " << what << ": " << e.what() << "\n";
      }
    }
  runtime::set_tune_listener({});
  runtime::set_autotune(was_on);
  tune_list(a.device, out);
  return failed ? 1 : 0;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Args a;
  std::vector<BenchItem> plan;
  try {
    a = parse_args(args);
    if (a.help || a.version) {
      out << (a.version ? version_line() + "\n" : usage(a.verb));
      return 0;
    }
    // Planned before any GPU is touched: a bad op/dtype pair is a usage error on any machine.
    if (a.verb == Verb::bench || a.verb == Verb::profile) plan = bench_plan(a);
  } catch (const UsageError& e) {
    err << "tessera: " << e.what() << "\n";
    return 2;
  }

  try {
    if (a.verb == Verb::tune && a.show) return tune_show(out);  // reads a file: no GPU needed
    if (a.verb == Verb::verify && a.list) return verify(a, out);  // names only: no GPU needed
    int count = runtime::device_count();
    if (count == 0) {
      err << "tessera: " << verb_name(a.verb) << " needs a GPU: " << runtime::no_gpu_reason()
          << "\n";
      return 1;
    }
    if (a.device >= count) {
      err << "tessera: --device " << a.device << ": out of range, this machine has " << count
          << " GPU(s) (0.." << count - 1 << ")\n";
      return 2;
    }
    runtime::DeviceGuard guard(a.device);
    switch (a.verb) {
      case Verb::info: return info(a, out, err);
      case Verb::verify: return verify(a, out);
      case Verb::bench: return bench_ops(a, plan, out, err);
      case Verb::profile: return profile(plan.front(), out);
      case Verb::tune: return tune(a, out, err);
      case Verb::help: break;  // handled above: help always sets a.help
    }
    return 0;
  } catch (const std::exception& e) {  // tessera::Error, CUDA failures, file system errors
    out.flush();
    err << "tessera: " << e.what() << "\n";
    return 1;
  }
}

int run_cli(int argc, char** argv) { return run_cli(std::vector<std::string>(argv, argv + argc)); }

}  // namespace tessera::cli
