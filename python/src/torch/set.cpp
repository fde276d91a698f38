// The set family as torch ops: isin. Schema: the description's (src/ops/set/isin.cu).
#include <ATen/ops/empty.h>

#include <string>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

IsinPath path_of(c10::string_view name) {
  for (IsinPath p : {IsinPath::automatic, IsinPath::brute_force, IsinPath::sort, IsinPath::hash,
                     IsinPath::bitmap})
    if (name == isin_path_name(p)) return p;
  TORCH_CHECK_VALUE(false, "tessera.isin: argument 'path': expected 'automatic', 'brute_force', "
                    "'sort', 'hash' or 'bitmap', got '", std::string(name), "'");
}

// Not differentiable (a bool output): no autograd kernel.
at::Tensor isin(const at::Tensor& elements, const at::Tensor& test_elements, bool assume_unique,
                bool invert, c10::string_view path, int64_t brute_force_max_test,
                int64_t brute_force_max_work, int64_t hash_min_test) {
  IsinOptions o;
  o.path = path_of(path);
  o.brute_force_max_test = brute_force_max_test;
  o.brute_force_max_work = brute_force_max_work;
  o.hash_min_test = hash_min_test;
  const TensorView e = view("isin", "elements", elements);
  const TensorView t = view("isin", "test_elements", test_elements);
  at::Tensor out = at::empty(elements.sizes(), elements.options().dtype(at::kBool));
  guarded([&] {
    tessera::isin(e, t, view("isin", "out", out), assume_unique, invert, stream_of(elements), o);
  });
  return out;
}

void kernels(torch::Library& m) { m.impl("isin", &isin); }

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)
