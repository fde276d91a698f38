// time_op: the method of triton.testing.do_bench and NVIDIA's nvbench. Warm up, flush the L2
// before each timed rep so the op reads its inputs from HBM, put CUDA events around the op alone,
// and summarize the per-rep times.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "bench/flush.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/memory.hpp"
#include "runtime/nvtx.hpp"

namespace tessera::bench {
namespace {

constexpr const char* kOp = "bench.time_op";

// Timed reps are enqueued in chunks, with one synchronization per chunk: the GPU stays busy from
// one rep to the next, and the budget check still sees every time measured so far.
constexpr long long kMaxChunk = 100;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// start/end event pairs, created on first use and reused by every chunk.
class EventPairs {
 public:
  EventPairs() = default;
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  ~EventPairs() {
    for (cudaEvent_t e : start_) cudaEventDestroy(e);
    for (cudaEvent_t e : end_) cudaEventDestroy(e);
  }

  void ensure(std::size_t n) {
    start_.reserve(n);
    end_.reserve(n);
    while (end_.size() < n) {
      cudaEvent_t s = nullptr, e = nullptr;
      TESSERA_CUDA_CHECK(cudaEventCreate(&s));
      start_.push_back(s);
      TESSERA_CUDA_CHECK(cudaEventCreate(&e));
      end_.push_back(e);
    }
  }
  cudaEvent_t start(std::size_t i) const { return start_[i]; }
  cudaEvent_t end(std::size_t i) const { return end_[i]; }
  double elapsed_ms(std::size_t i) const {
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_[i], end_[i]));
    return ms;
  }

 private:
  std::vector<cudaEvent_t> start_, end_;
};

// batch calls of op captured on a private stream, instantiated for replay on any stream.
class CapturedGraph {
 public:
  CapturedGraph(const std::function<void(cudaStream_t)>& op, int batch) {
    // The legacy default stream cannot be captured and the caller's stream may be it, so capture
    // on a stream of our own. ThreadLocal mode: only this thread's unsafe calls (cudaMalloc, a
    // synchronize) invalidate the capture, not those of unrelated threads in the process.
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
    try {
      for (int i = 0; i < batch; ++i) op(capture_stream_);
    } catch (...) {
      // End the capture so the stream is usable (and destroyable) again; the partial graph is
      // of no use.
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(capture_stream_, &partial);
      if (partial) cudaGraphDestroy(partial);
      cudaGetLastError();
      throw;
    }
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(capture_stream_, &graph_));
    std::size_t nodes = 0;
    TESSERA_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes));
    // An op that ignores its stream (launches on stream 0, say) runs eagerly during capture and
    // leaves an empty graph: timing its replays would report nothing.
    if (nodes == 0)
      detail::throw_arg(ErrorKind::value, kOp, "op",
                        "work enqueued on the stream it is given (cuda_graph mode captures it)",
                        "nothing captured");
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (capture_stream_) cudaStreamDestroy(capture_stream_);
  }

  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaStream_t capture_stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

void validate(const std::function<void(cudaStream_t)>& op, const TimingOptions& o) {
  using detail::throw_arg;
  if (!op) throw_arg(ErrorKind::value, kOp, "op", "a callable", "an empty function");
  if (!(o.warmup_ms >= 0) || !std::isfinite(o.warmup_ms))
    throw_arg(ErrorKind::value, kOp, "options.warmup_ms", "a finite value >= 0",
              std::to_string(o.warmup_ms));
  if (o.min_reps < 1)
    throw_arg(ErrorKind::value, kOp, "options.min_reps", "at least 1", std::to_string(o.min_reps));
  if (o.max_reps < o.min_reps)
    throw_arg(ErrorKind::value, kOp, "options.max_reps",
              "at least options.min_reps (" + std::to_string(o.min_reps) + ")",
              std::to_string(o.max_reps));
  if (!(o.budget_ms >= 0) || !std::isfinite(o.budget_ms))
    throw_arg(ErrorKind::value, kOp, "options.budget_ms", "a finite value >= 0",
              std::to_string(o.budget_ms));
  if (o.graph_batch < 1)
    throw_arg(ErrorKind::value, kOp, "options.graph_batch", "at least 1",
              std::to_string(o.graph_batch));
}

}  // namespace

Stats time_op(const std::function<void(cudaStream_t)>& op, cudaStream_t stream,
              const TimingOptions& options) {
  // Options first, before touching the GPU: a bad call fails the same way with or without one.
  validate(op, options);
  runtime::NvtxRange range("tessera.bench.time_op");

  // One call outside any clock: lazy module loading, cuBLAS handles and workspaces, a Python
  // op's first-call work. Its launch errors surface here, named as the op's.
  op(stream);
  TESSERA_LAUNCH_CHECK();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));

  // In graph mode a "launch" is one replay of graph_batch calls and each sample is divided by
  // graph_batch. No L2 flush there: the calls of one replay run back to back, so all but the
  // first would find their data in L2 anyway. Graph mode is meant for launch-bound sizes, whose
  // data fits in L2; it measures warm-cache time per call.
  std::unique_ptr<CapturedGraph> graph;
  if (options.cuda_graph) graph = std::make_unique<CapturedGraph>(op, options.graph_batch);
  const double per_launch_calls = graph ? options.graph_batch : 1;
  auto launch = [&] {
    if (graph) {
      TESSERA_CUDA_CHECK(cudaGraphLaunch(graph->exec(), stream));
    } else {
      op(stream);
      TESSERA_LAUNCH_CHECK();
    }
  };

  // Twice the L2, read before each rep, evicts whatever the previous rep left there (flush.cu).
  // Allocated per call, not cached: a Python process keeps no 100+ MB buffer it did not ask for,
  // and cudaMalloc's cost is small next to the warm-up.
  L2Flush flush;
  if (options.flush_l2 && !graph) {
    int device = 0;
    TESSERA_CUDA_CHECK(cudaGetDevice(&device));
    flush = L2Flush(device);
  }

  // Warm-up: doubling batches with one synchronization each keep the GPU busy (clocks ramp up as
  // they will under the timed loop) while bounding how far past warmup_ms the queue can reach:
  // a batch grows only while it takes under a millisecond.
  {
    const auto t0 = Clock::now();
    long long batch = 1;
    while (ms_since(t0) < options.warmup_ms) {
      const auto tb = Clock::now();
      for (long long i = 0; i < batch; ++i) launch();
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (ms_since(tb) < 1.0 && batch < (1 << 20)) batch *= 2;
    }
  }

  EventPairs events;
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(std::min(options.max_reps, 1 << 16)));
  double measured_ms = 0;  // op time (whole replays in graph mode) measured so far
  while (static_cast<int>(samples.size()) < options.max_reps) {
    const long long done = static_cast<long long>(samples.size());
    long long want;
    if (done < options.min_reps) {
      want = options.min_reps - done;
    } else {
      if (measured_ms >= options.budget_ms) break;
      // As many reps as the remaining budget holds at the mean rep time so far (capped in
      // floating point first: a near-zero mean would overflow the conversion).
      const double per_rep = measured_ms / static_cast<double>(done);
      const double fit = per_rep > 0 ? std::ceil((options.budget_ms - measured_ms) / per_rep)
                                     : static_cast<double>(kMaxChunk);
      want = static_cast<long long>(std::min(fit, static_cast<double>(kMaxChunk)));
    }
    want = std::clamp<long long>(want, 1, std::min<long long>(kMaxChunk, options.max_reps - done));

    events.ensure(static_cast<std::size_t>(want));
    for (long long i = 0; i < want; ++i) {
      flush.run(stream);
      TESSERA_CUDA_CHECK(cudaEventRecord(events.start(i), stream));
      launch();
      TESSERA_CUDA_CHECK(cudaEventRecord(events.end(i), stream));
    }
    TESSERA_CUDA_CHECK(cudaEventSynchronize(events.end(want - 1)));
    for (long long i = 0; i < want; ++i) {
      const double ms = events.elapsed_ms(i);
      measured_ms += ms;
      samples.push_back(ms / per_launch_calls);
    }
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return summarize(std::move(samples));
}

}  // namespace tessera::bench
