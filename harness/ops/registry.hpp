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
  std::function<double(DType)> tolerance;  // the bound on rel_err verify uses for outputs of a dtype
};

// The bound on ||out - ref|| / ||ref|| that DESIGN.md (Testing) sets for results stored in a
// dtype; the tolerance of most ops.
double default_tolerance(DType dtype);

// Adds the ops that `make` returns to the table. Constructed at namespace scope in an op's
// <op>_cases.cpp, so it runs while the harness library loads. `make` runs once, when the table is
// first read. The table's order does not depend on the order static initializers run in: family
// first (the order of DESIGN.md's family table: elementwise, rowwise, matrix, attention, set;
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
