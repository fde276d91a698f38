// profile_kernels: every kernel a call launches, with its launch shape, resources and GPU time,
// from CUPTI's activity API (the same source nsys and torch.profiler read). profile_table prints
// them the way torch.profiler does.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "bench/format.hpp"
#include "bench/toolkit_lib.hpp"
#include "runtime/check.hpp"

namespace tessera::bench {
namespace {

// The kernel record of the CUPTI this file is compiled against. CUPTI writes the record layout of
// its own version, so the header must match the library linked (both come from one toolkit).
// Newer records extend older ones; the fields read here sit at the same place in all of them.
#if CUPTI_API_VERSION >= 130000
using CuptiKernelRecord = CUpti_ActivityKernel10;  // CUDA 13.x
#else
using CuptiKernelRecord = CUpti_ActivityKernel9;   // CUDA 12.x
#endif

// CUPTI through the library opened at first use (toolkit_lib.hpp).
#define TESSERA_CUPTI(fn) TESSERA_TOOLKIT_FN(cupti_library(), fn)

[[noreturn]] void throw_cupti(CUptiResult r, const char* what) {
  const char* text = nullptr;
  if (TESSERA_CUPTI(cuptiGetResultString)(r, &text) != CUPTI_SUCCESS || !text) text = "unknown CUPTI error";
  throw Error(ErrorKind::runtime, std::string("tessera.bench.profile_kernels: CUPTI error ") + text +
                                      " from " + what);
}

#define TESSERA_CUPTI_CHECK(expr)                                  \
  do {                                                             \
    CUptiResult tessera_r_ = (expr);                               \
    if (tessera_r_ != CUPTI_SUCCESS) throw_cupti(tessera_r_, #expr); \
  } while (0)

// Activity buffers: CUPTI asks for more when one fills, so the size only sets how often.
constexpr std::size_t kBufferBytes = std::size_t{8} << 20;
constexpr std::size_t kBufferAlign = 8;  // CUPTI requires 8-byte aligned buffers

struct Timed {
  uint64_t start = 0;
  KernelRecord record;
  std::string raw_name;
};

// What the completion callback (on CUPTI's thread or in cuptiActivityFlushAll) hands back.
// Never destroyed: CUPTI may deliver a buffer while the process exits.
struct Collector {
  std::mutex mu;
  std::vector<Timed> kernels;
  std::size_t dropped = 0;
  std::string error;  // the first failure inside a callback, which cannot throw
};
Collector& collector() {
  static Collector* c = new Collector;
  return *c;
}

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // A null buffer makes CUPTI drop records, which the completion side counts and reports.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI on_buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                  size_t /*size*/, size_t valid_size) {
  if (!buffer) return;
  Collector& c = collector();
  std::lock_guard<std::mutex> lock(c.mu);
  try {
    CUpti_Activity* record = nullptr;
    const auto next_record = TESSERA_CUPTI(cuptiActivityGetNextRecord);
    for (;;) {
      const CUptiResult r = next_record(buffer, valid_size, &record);
      if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of the buffer
      if (r != CUPTI_SUCCESS) {
        const char* text = nullptr;
        TESSERA_CUPTI(cuptiGetResultString)(r, &text);
        if (c.error.empty()) c.error = std::string("reading a record: ") + (text ? text : "?");
        break;
      }
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
        continue;
      const auto* k = reinterpret_cast<const CuptiKernelRecord*>(record);
      Timed t;
      t.start = k->start;
      t.raw_name = k->name ? k->name : "";  // CUPTI owns the string: copy it now
      KernelRecord& out = t.record;
      out.grid[0] = static_cast<unsigned>(k->gridX);
      out.grid[1] = static_cast<unsigned>(k->gridY);
      out.grid[2] = static_cast<unsigned>(k->gridZ);
      out.block[0] = static_cast<unsigned>(k->blockX);
      out.block[1] = static_cast<unsigned>(k->blockY);
      out.block[2] = static_cast<unsigned>(k->blockZ);
      out.registers = k->registersPerThread;
      out.static_smem = k->staticSharedMemory;
      out.dynamic_smem = k->dynamicSharedMemory;
      out.duration_us = k->end > k->start ? static_cast<double>(k->end - k->start) * 1e-3 : 0.0;
      c.kernels.push_back(std::move(t));
    }
    size_t dropped = 0;
    if (TESSERA_CUPTI(cuptiActivityGetNumDroppedRecords)(context, stream_id, &dropped) == CUPTI_SUCCESS)
      c.dropped += dropped;
  } catch (const std::exception& e) {  // bad_alloc: must not cross into CUPTI
    if (c.error.empty()) c.error = e.what();
  }
  std::free(buffer);
}

std::string demangle(const std::string& name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !d) return name;  // extern "C" kernels and unknown manglings stay as they are
  std::string out = d;
  std::free(d);
  return out;
}

// Disables tracing on the way out of profile_kernels, whichever way it leaves, so the next call
// (and anything else in the process) starts from a clean state.
class TracingSession {
 public:
  TracingSession() {
    TESSERA_CUPTI_CHECK(TESSERA_CUPTI(cuptiActivityRegisterCallbacks)(on_buffer_requested, on_buffer_completed));
    TESSERA_CUPTI_CHECK(TESSERA_CUPTI(cuptiActivityEnable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    active_ = true;
  }
  // Normal end: every record delivered, errors reported.
  void finish() {
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    TESSERA_CUPTI_CHECK(TESSERA_CUPTI(cuptiActivityFlushAll)(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    active_ = false;
    TESSERA_CUPTI_CHECK(TESSERA_CUPTI(cuptiActivityDisable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  }
  ~TracingSession() {
    if (!active_) return;
    // fn threw: drain and disable without throwing over the exception in flight.
    cudaDeviceSynchronize();
    cudaGetLastError();
    TESSERA_CUPTI(cuptiActivityFlushAll)(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    TESSERA_CUPTI(cuptiActivityDisable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  }
  TracingSession(const TracingSession&) = delete;
  TracingSession& operator=(const TracingSession&) = delete;

 private:
  bool active_ = false;
};

}  // namespace

std::vector<KernelRecord> profile_kernels(const std::function<void()>& fn) {
  if (!fn)
    detail::throw_arg(ErrorKind::value, "bench.profile_kernels", "fn", "a callable",
                      "an empty function");
  // The activity API is process-wide: one profiling session at a time.
  static std::mutex session_mu;
  std::lock_guard<std::mutex> session_lock(session_mu);

  // Kernels still running from before must not be attributed to fn.
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  Collector& c = collector();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.kernels.clear();
    c.dropped = 0;
    c.error.clear();
  }
  {
    TracingSession session;
    fn();
    session.finish();
  }

  std::vector<Timed> kernels;
  std::size_t dropped = 0;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    kernels.swap(c.kernels);
    dropped = c.dropped;
    error.swap(c.error);
  }
  if (!error.empty())
    throw Error(ErrorKind::runtime, "tessera.bench.profile_kernels: CUPTI error " + error);
  if (dropped)
    throw Error(ErrorKind::runtime, "tessera.bench.profile_kernels: CUPTI dropped " +
                                        std::to_string(dropped) +
                                        " activity records; the kernel list would be incomplete");

  // Buffers complete per context and stream, not in launch order; the start time restores it.
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const Timed& a, const Timed& b) { return a.start < b.start; });
  std::vector<KernelRecord> out;
  out.reserve(kernels.size());
  for (Timed& t : kernels) {
    t.record.name = demangle(t.raw_name);
    out.push_back(std::move(t.record));
  }
  return out;
}

namespace {

// Demangled template kernels run to hundreds of characters. Keep the part that identifies the
// kernel: drop a leading "void ", then the parameter list, then cut to the width with "...".
std::string short_name(std::string name, std::size_t width) {
  if (name.size() <= width) return name;
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  if (name.size() > width && !name.empty() && name.back() == ')') {
    // The '(' that opens the trailing parameter list, skipping nested parentheses.
    int depth = 0;
    for (std::size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      else if (name[i] == '(' && --depth == 0) {
        if (i > 0) name.erase(i);
        break;
      }
    }
  }
  if (name.size() > width) name = name.substr(0, width - 3) + "...";
  return name;
}

std::string dim3_str(const unsigned d[3]) {
  std::string s = "(";
  s.append(std::to_string(d[0])).append(", ").append(std::to_string(d[1])).append(", ");
  return s.append(std::to_string(d[2])).append(")");
}

}  // namespace

std::string profile_table(const std::vector<KernelRecord>& kernels) {
  constexpr std::size_t kNameWidth = 60;
  constexpr std::size_t kCols = 7;
  const char* header[kCols] = {"name", "grid", "block", "regs", "smem", "time_us", "%total"};

  double total_us = 0;
  for (const KernelRecord& k : kernels) total_us += k.duration_us;
  auto pct = [&](double us) { return format::fixed(total_us > 0 ? 100.0 * us / total_us : 0.0, 1); };

  std::vector<std::vector<std::string>> rows;
  for (const KernelRecord& k : kernels)
    rows.push_back({short_name(k.name, kNameWidth), dim3_str(k.grid), dim3_str(k.block),
                    std::to_string(k.registers), std::to_string(k.static_smem + k.dynamic_smem),
                    format::fixed(k.duration_us, 2), pct(k.duration_us)});
  const std::vector<std::string> total = {
      "total (" + std::to_string(kernels.size()) + (kernels.size() == 1 ? " kernel)" : " kernels)"),
      "", "", "", "", format::fixed(total_us, 2), pct(total_us)};

  std::size_t width[kCols];
  for (std::size_t c = 0; c < kCols; ++c) {
    width[c] = std::string(header[c]).size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
    width[c] = std::max(width[c], total[c].size());
  }
  std::size_t rule = 2 * (kCols - 1);
  for (std::size_t w : width) rule += w;

  std::ostringstream out;
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t c = 0; c < kCols; ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (c) line += "  ";
      line += c == 0 ? cells[c] + pad : pad + cells[c];  // the name left, numbers right
    }
    out << line << '\n';
  };
  emit(std::vector<std::string>(header, header + kCols));
  out << std::string(rule, '-') << '\n';
  for (const auto& r : rows) emit(r);
  out << std::string(rule, '-') << '\n';
  emit(total);
  return out.str();
}

}  // namespace tessera::bench
