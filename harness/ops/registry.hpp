// The table of operators that `tessera verify/bench/profile`, the tests and the Python benchmarks
// walk: one description per operator, registered by the operator's own <op>_cases.cpp (a
// Registrar at namespace scope), so that adding an operator edits no list anywhere else.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::ops {

// One check of one operator against its CPU reference.
struct VerifyResult {
  std::string op;
  std::string name;       // "float16 [1023, 77] strided"
  bool passed = false;
  double rel_err = 0;     // ||out - ref|| / ||ref||
  double max_abs = 0;     // max |out - ref|
  double tolerance = 0;   // bound on rel_err for this dtype
  int64_t unwritten = 0;  // output elements still holding the poison pattern
  std::string detail;     // why it failed, when it did
};

struct VerifyCase {
  std::string name;
  bool large = false;  // > 2^31 elements: skipped unless asked for (tessera verify --large)
  std::function<VerifyResult()> run;
};

// A ready-to-time call: inputs allocated and filled with random data, output allocated.
struct BenchCase {
  std::string op;
  std::string dtype;
  std::string shape;        // "[268435456]"
  int64_t size = 0;         // the size asked for (OpInfo::size_meaning; the x axis of plots)
  double bytes = 0;         // the fewest bytes the operator must move through HBM
  double flops = 0;         // the floating-point operations it must do (0 for memory-bound ops)
  std::function<void(cudaStream_t)> run;
  std::shared_ptr<void> state;  // owns the buffers `run` uses
};

// What one bench case of (dtype, size) is, computed without allocating anything: make_bench builds
// its tensors from these shapes, and the Python benchmarks read the same description.
struct BenchShape {
  std::vector<std::vector<int64_t>> shapes;  // the input tensors' shapes, main tensor first (the
                                             // order of the operator's signature)
  std::string shape;                         // the label reports use, e.g. "[4096, 1024]"
  double bytes = 0;                          // the fewest bytes the op must move through HBM
  double flops = 0;                          // floating-point operations (0 for memory-bound ops)
};

// What verify's bound on one output's relative error ||out - ref|| / ||ref|| is derived from
// (DESIGN.md, Testing: the error model):
//   bound = c * (max(u(out), floor) + rounded + accumulate * sqrt(k))
// u(out) is the unit roundoff of the output's dtype (its final rounding, 2^-24 for float32, 2^-11
// float16, 2^-8 bfloat16); `rounded` that of the narrowest dtype an intermediate is stored in on
// the way (a chunk of logits, a hidden activation, tf32 operands; 0 where none); a float32 sum of
// k terms adds accumulate * sqrt(k), its rounding errors growing as a random walk. c covers the
// rest: a few ulp of the hardware's approximate functions, the cancellation of a backward pass.
// Where outputs fall below the dtype's normal range (a float16 softmax over a million classes),
// rounding loses more than u(out); compare() measures that floor on the reference itself,
// ||fl(ref) - ref|| / ||ref|| in out's dtype, and the bound takes it in place of u(out) where larger.
struct ErrorModel {
  int64_t k = 1;                // terms in the longest sum behind one output element
  double rounded = 0;           // unit roundoff of the narrowest intermediate; 0: none
  double accumulate = 0x1p-24;  // unit roundoff of the sums (float32's)
  double c = 4;                 // DESIGN.md (Testing) names the cases that raise it, and why
  double floor = 0;             // the reference's own rounding error in out's dtype (compare() sets it)
};

// 2^-(mantissa bits + 1): 2^-53, 2^-24, 2^-11, 2^-8 (2^-4 and 2^-3 for float8 e4m3 / e5m2); 0 for
// integer dtypes, which are exact.
double unit_roundoff(DType dtype);
// tf32's operands keep 10 mantissa bits, as float16's.
inline constexpr double kTf32Roundoff = 0x1p-11;

struct OpInfo {
  std::string name;         // "add", "gelu", "gelu_backward"
  std::string family;       // "elementwise"
  std::string summary;
  std::vector<DType> dtypes;            // supported
  std::vector<int64_t> bench_sizes;     // default sizes for `tessera bench`
  std::function<std::vector<VerifyCase>()> verify_cases;
  // Builds a bench case for dtype and size on the current device, from bench_shape(dtype, size).
  std::function<BenchCase(DType, int64_t)> make_bench;
  // The same case on the peer library, timed beside it by `tessera bench` (cuBLAS for matmul);
  // empty where there is none in process.
  std::function<BenchCase(DType, int64_t)> make_baseline;
  // What `size` means for this op: "elements", or "row length N (rows = min(4096, 2^26 / N))".
  std::string size_meaning;
  std::function<BenchShape(DType, int64_t)> bench_shape;  // the source make_bench reads
  // The bound on rel_err verify uses for an output of a dtype under a case's error model.
  std::function<double(DType, const ErrorModel&)> tolerance;
};

// The error model's bound for an output stored in `dtype` (above); the tolerance of every op whose
// results are not exact.
double default_tolerance(DType dtype, const ErrorModel& model = {});

// Adds the ops that `make` returns to the table. Constructed at namespace scope in an op's
// <op>_cases.cpp, so it runs while the harness library loads. `make` runs once, when the table is
// first read. The table's order does not depend on the order static initializers run in: family
// first (the order of DESIGN.md's family table: elementwise, rowwise, matrix, attention, loss, moe, set;
// others after, by name), then `order` (lower first), then the order `make` returns them in.
struct Registrar {
  Registrar(int order, std::function<std::vector<OpInfo>()> make);
};

const std::vector<OpInfo>& all_ops();
const OpInfo* find_op(const std::string& name);  // nullptr when unknown
// The ops a user means by `name`: the op itself and its variants, i.e. every op named `name` or
// starting with `name` + "_" ("gelu" selects gelu, gelu_tanh, gelu_backward, gelu_tanh_backward),
// of the named op's family where there is one ("add" is not add_rms_norm). Empty when nothing
// matches.
std::vector<const OpInfo*> select_ops(const std::string& name);

}  // namespace tessera::ops
