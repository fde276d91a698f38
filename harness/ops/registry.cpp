#include "ops/registry.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include "runtime/check.hpp"
#include "tessera/op.hpp"

namespace tessera::ops {
namespace {

struct Entry {
  int order;
  std::function<std::vector<OpInfo>()> make;
};

// Constructed on first use: a Registrar in another file may run before this file's statics.
std::vector<Entry>& entries() {
  static std::vector<Entry> e;
  return e;
}

// A description missing a part would fail later, far from its cause (an empty std::function
// throws bad_function_call in the middle of a bench run): refuse it when the table is built.
void check_complete(const OpInfo& op) {
  auto missing = [&](const char* field) {
    detail::throw_arg(ErrorKind::value, "register", field, "set for op '" + op.name + "'", "empty");
  };
  if (op.name.empty()) missing("name");
  if (op.family.empty()) missing("family");
  if (op.dtypes.empty()) missing("dtypes");
  if (op.bench_sizes.empty()) missing("bench_sizes");
  if (op.size_meaning.empty()) missing("size_meaning");
  if (!op.verify_cases) missing("verify_cases");
  if (!op.make_bench) missing("make_bench");
  if (!op.bench_shape) missing("bench_shape");
  if (!op.tolerance) missing("tolerance");
}

// An op the library describes (tessera/op.hpp) takes its family, summary and dtypes from its
// description, which the harness does not repeat: it names the op and adds the cases, the bench
// and the tolerance. The harness's own ops (variants such as gelu_tanh, isin_sort) give their own.
void from_description(OpInfo& op) {
  const OpDesc* d = find_op_description(op.name);
  if (!d) {
    if (op.summary.empty())
      detail::throw_arg(ErrorKind::value, "register", "summary", "set for op '" + op.name + "'", "empty");
    return;
  }
  if (!op.summary.empty())
    detail::throw_arg(ErrorKind::value, "register", "summary",
                      "none for op '" + op.name + "' (its description's is used)", op.summary);
  op.family = d->family;
  op.summary = d->summary;
  op.dtypes = d->dtypes;
}

std::vector<OpInfo> build_table() {
  // Sort key: family, order, then (two files of one family with the same order) the file's first
  // op name, never which file registered first; within a file, the order `make` returned.
  struct Keyed {
    int rank;
    std::string family;
    int order;
    std::string file_key;
    std::size_t index;
    OpInfo op;
    auto key() const { return std::tie(rank, family, order, file_key, index); }
  };
  std::vector<Keyed> keyed;
  for (const Entry& e : entries()) {
    std::vector<OpInfo> ops = e.make();
    const std::string file_key = ops.empty() ? std::string() : ops[0].name;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      from_description(ops[i]);
      check_complete(ops[i]);
      keyed.push_back({family_rank(ops[i].family), ops[i].family, e.order, file_key, i, std::move(ops[i])});
    }
  }
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) { return a.key() < b.key(); });
  std::vector<OpInfo> table;
  std::set<std::string> names;
  for (Keyed& k : keyed) {
    if (!names.insert(k.op.name).second)
      detail::throw_arg(ErrorKind::value, "register", "name", "a name no other op has", k.op.name + " (twice)");
    table.push_back(std::move(k.op));
  }
  return table;
}

}  // namespace

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::float64: return 0x1p-53;
    case DType::float32: return 0x1p-24;
    case DType::float16: return 0x1p-11;
    case DType::bfloat16: return 0x1p-8;
    case DType::float8_e4m3fn: return 0x1p-4;
    case DType::float8_e5m2: return 0x1p-3;
    default: return 0.0;
  }
}

double default_tolerance(DType dtype, const ErrorModel& m) {
  return m.c * (std::max(unit_roundoff(dtype), m.floor) + m.rounded +
                m.accumulate * std::sqrt(double(std::max<int64_t>(m.k, 1))));
}

Registrar::Registrar(int order, std::function<std::vector<OpInfo>()> make) {
  entries().push_back({order, std::move(make)});
}

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = build_table();
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const auto& op : all_ops())
    if (op.name == name) return &op;
  return nullptr;
}

std::vector<const OpInfo*> select_ops(const std::string& name) {
  const OpInfo* named = find_op(name);
  std::vector<const OpInfo*> r;
  for (const auto& op : all_ops())
    if (op.name == name || (op.name.rfind(name + "_", 0) == 0 && (!named || op.family == named->family)))
      r.push_back(&op);
  return r;
}

}  // namespace tessera::ops
