// The table of op descriptions (tessera/op.hpp), filled by the ops' own registrars while the
// library loads and sorted once, when first read, so the order static initializers ran in does not
// show.
#include <algorithm>
#include <iterator>
#include <set>

#include "runtime/check.hpp"
#include "tessera/op.hpp"

namespace tessera {
namespace {

std::vector<OpDesc>& registered() {
  static std::vector<OpDesc> v;
  return v;
}

// A description that a surface could not use is refused when the table is built, naming the op.
void check(const OpDesc& d) {
  auto refuse = [&](const char* field, const std::string& expected, const std::string& got) {
    detail::throw_arg(ErrorKind::value, "describe", field, expected + " (op '" + d.name + "')", got);
  };
  if (d.name.empty() || d.family.empty()) refuse("name", "a name and a family", "empty");
  if (d.schemas.empty() || d.schemas[0].rfind(d.name + "(", 0) != 0)
    refuse("schema", "a first schema of the op's name", d.schemas.empty() ? "none" : d.schemas[0]);
  for (const OpDesc::Output& o : d.outputs) {
    if (std::find(d.params.begin(), d.params.end(), o.param) == d.params.end())
      refuse("outputs", "an output among the params", o.param);
    if (std::find(d.params.begin(), d.params.end(), o.like) == d.params.end())
      refuse("outputs", "an output like one of the params", o.like);
  }
  if (!d.backward.empty() && (d.backward_args.empty() || d.grads.empty()))
    refuse("differentiable", "the backward's arguments and the gradients it gives", "none");
}

std::vector<OpDesc> build() {
  std::vector<OpDesc> v = registered();
  for (const OpDesc& d : v) check(d);
  std::stable_sort(v.begin(), v.end(), [](const OpDesc& a, const OpDesc& b) {
    const int fa = family_rank(a.family), fb = family_rank(b.family);
    return fa != fb ? fa < fb : a.family != b.family ? a.family < b.family : a.name < b.name;
  });
  std::set<std::string> names;
  for (const OpDesc& d : v)
    if (!names.insert(d.name).second)
      detail::throw_arg(ErrorKind::value, "describe", "name", "a name no other op has", d.name + " (twice)");
  return v;
}

}  // namespace

int family_rank(std::string_view family) {
  static const std::string_view kFamilies[] = {"elementwise", "rowwise", "matrix", "attention", "loss", "set"};
  return static_cast<int>(std::find(std::begin(kFamilies), std::end(kFamilies), family) -
                          std::begin(kFamilies));
}

OpRegistrar::OpRegistrar(describe&& op) { registered().push_back(std::move(op.d)); }

const std::vector<OpDesc>& op_descriptions() {
  static const std::vector<OpDesc> table = build();
  return table;
}

const OpDesc* find_op_description(std::string_view name) {
  for (const OpDesc& d : op_descriptions())
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace tessera
