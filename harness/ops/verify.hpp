// Shared machinery for checking an operator against its CPU reference: test tensors in several
// layouts filled with fresh random data, host copies, and the comparison that every family's
// verify cases end with. Used by `tessera verify` and by the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/registry.hpp"
#include "runtime/memory.hpp"
#include "tessera/tensor.hpp"

namespace tessera::ops {

enum class Layout {
  contiguous,
  strided,     // every other element of the last dimension (stride 2)
  transposed,  // last two dimensions stored swapped (needs ndim >= 2)
  offset,      // contiguous but starting one element past a 16-byte boundary
};
const char* layout_name(Layout layout);

// A device tensor: its storage and a view into it.
struct TestTensor {
  runtime::DeviceBuffer storage;
  TensorView view;
  int64_t storage_elems = 0;
};

TestTensor make_tensor(DType dtype, const std::vector<int64_t>& shape, Layout layout);
// The seed every random input of a verify run derives from (`tessera verify --seed`): each run of
// one seed draws the same inputs, another seed other inputs.
void set_verify_seed(uint64_t seed);
// A seed for a case's own host-side draws (targets, class weights), from the run's seed and the
// case's `salt`.
uint64_t case_seed(uint64_t salt);

// Fills the whole storage with values uniform in [lo, hi) (seeded from a process-wide counter
// started at the run's seed, so each call draws fresh data).
void fill_random(TestTensor& t, double lo, double hi, cudaStream_t stream);
// Sets the storage to the poison pattern (NaN in every float dtype).
void fill_poison(TestTensor& t, cudaStream_t stream);

// A host copy of a test tensor with the same strides.
struct HostCopy {
  std::vector<unsigned char> bytes;
  TensorView view;  // device = cpu
};
HostCopy to_host(const TestTensor& t);
// Writes a host copy (edited, or made by to_host of another tensor of its shape) back over `t`.
void to_device(TestTensor& t, const HostCopy& h);

// Compares `out` (on the device) with `ref` (row-major, double) and fills a VerifyResult:
// poison count on the GPU, then norms on the host. NaN or Inf where the reference is finite fails.
// The bound is the registered op's tolerance for out's dtype under `model` (the sums and
// intermediates behind this output), so `op` must be a registered name.
VerifyResult compare(const std::string& op, const std::string& name, const TestTensor& out,
                     const std::vector<double>& ref, cudaStream_t stream, const ErrorModel& model = {});

// What a case of several outputs reports: `worst` becomes `r` where `r` failed or erred more,
// unless `worst` has already failed.
void keep_worst(VerifyResult& worst, const VerifyResult& r);

// A contiguous device tensor of `shape` holding `values` (row-major): float dtypes rounded as
// stored, int32 / int64 exactly (class indices, lengths).
TestTensor upload(DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& values);

// v rounded to dtype the way the kernels round: to float first, then to the storage type.
double round_to(DType dt, double v);

// For operators whose every output element is determined exactly (a copy; a dropout, whose kept
// elements are x * scale in float rounded once to the storage type): fails `r` unless every
// element equals its reference rounded to the output dtype, and counts the elements whose zero /
// non-zero state (the keep decision, for a dropout) differs. The relative-norm check of compare()
// cannot see one flipped element among a million; this one can.
void check_exact(VerifyResult& r, const TestTensor& out, const std::vector<double>& ref);

// A bench case's description filled from the op's bench shape; the caller allocates its tensors
// from shape.shapes and sets run and state.
BenchCase bench_case(const std::string& op, DType dtype, int64_t size, const BenchShape& shape);

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace tessera::ops
