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

// Whether the first schema has an argument of that name ("Tensor? bias=None" names bias).
bool in_schema(const OpDesc& d, const std::string& name) {
  const std::string& s = d.schemas[0];
  for (size_t at = s.find(" " + name); at != std::string::npos; at = s.find(" " + name, at + 1)) {
    const char next = at + 1 + name.size() < s.size() ? s[at + 1 + name.size()] : '\0';
    if (next == ',' || next == '=' || next == ')') return true;
  }
  return false;
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
    if (std::find(d.params.begin(), d.params.end(), o.like) == d.params.end() && !in_schema(d, o.like))
      refuse("outputs", "an output like one of the params or of the schema's arguments", o.like);
    using S = OpDesc::Output::Shape;
    const bool takes_other = o.shape == S::broadcast || o.shape == S::reduced || (o.shape == S::leading && o.drop == 0);
    if (takes_other == o.other.empty())
      refuse("outputs", "a second argument exactly where the shape rule takes one", o.param);
  }
  if (!d.backward.empty() && (d.backward_args.empty() || d.grads.empty()))
    refuse("differentiable", "the backward's arguments and the gradients it gives", "none");
  for (const OpDesc& o : d.overloads) {
    if (o.name.rfind(d.name + ".", 0) != 0 || o.schemas.size() != 1)
      refuse("overload", "an op named " + d.name + ".<overload> with one schema", o.name);
    check(o);
  }
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
  static const std::string_view kFamilies[] = {"elementwise", "rowwise", "matrix", "attention", "loss", "moe", "set"};
  return static_cast<int>(std::find(std::begin(kFamilies), std::end(kFamilies), family) -
                          std::begin(kFamilies));
}

OpRegistrar::OpRegistrar(describe&& op) { registered().push_back(std::move(op.d)); }

const std::vector<OpDesc>& op_descriptions() {
  static const std::vector<OpDesc> table = build();
  return table;
}

namespace {
std::string dims_list(const int64_t* d, size_t n) {
  std::string r = "[";
  for (size_t i = 0; i < n; ++i) r += (i ? ", " : "") + std::to_string(d[i]);
  return r + "]";
}
}  // namespace

std::vector<int64_t> output_shape(const OpDesc& op, const OpDesc::Output& o, const std::vector<int64_t>& like,
                                  const std::vector<int64_t>& other, std::string_view reduction) {
  using S = OpDesc::Output::Shape;
  if (o.shape == S::like) return like;
  if (o.shape == S::scalar) return {};
  if (o.shape == S::reduced) {  // the rows where nothing is reduced; a 1-d like (refused later) has none
    if (reduction != "none" || like.empty()) return {};
    return std::vector<int64_t>(like.begin(), like.end() - 1);
  }
  if (o.shape == S::leading) {
    // A fixed count drops what there is: the library names an input with too few dimensions.
    const size_t drop = o.other.empty() ? std::min(static_cast<size_t>(o.drop), like.size()) : other.size();
    if (drop > like.size())
      detail::throw_arg(ErrorKind::value, op.name.c_str(), (o.other.empty() ? o.like : o.other).c_str(),
                        "at most the " + std::to_string(like.size()) + " dimensions of '" + o.like + "'",
                        std::to_string(drop) + " dimensions");
    return std::vector<int64_t>(like.begin(), like.end() - static_cast<std::ptrdiff_t>(drop));
  }
  // Broadcast: dimensions aligned from the last; each pair equal, or one of them 1. The error is
  // the library's own (runtime/validate.cpp).
  const size_t n = std::max(like.size(), other.size());
  std::vector<int64_t> r(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = i < like.size() ? like[like.size() - 1 - i] : 1;
    const int64_t b = i < other.size() ? other[other.size() - 1 - i] : 1;
    if (a != b && a != 1 && b != 1)
      detail::throw_arg(ErrorKind::value, op.name.c_str(), o.other.c_str(),
                        "a shape broadcastable with " + o.like + "'s " + dims_list(like.data(), like.size()),
                        dims_list(other.data(), other.size()));
    r[n - 1 - i] = a == 1 ? b : a;
  }
  return r;
}

void check_trailing(const OpDesc& op, const OpDesc::Trailing& t, const int64_t* shape, int ndim, const int64_t* dims,
                    size_t n) {
  const size_t nd = static_cast<size_t>(ndim);
  bool ok = n > 0 && n <= nd;
  for (size_t i = 0; ok && i < n; ++i) ok = shape[nd - n + i] == dims[i];
  if (ok) return;
  detail::throw_arg(ErrorKind::value, op.name.c_str(), t.arg.c_str(),
                    "the trailing dimensions of the " + t.of + "'s shape " + dims_list(shape, nd) + " (" +
                        (nd ? "1 to " + std::to_string(nd) + " of them" : std::string("a 0-d " + t.of + " has none")) +
                        ")",
                    dims_list(dims, n));
}

const OpDesc* find_op_description(std::string_view name) {
  for (const OpDesc& d : op_descriptions()) {
    if (d.name == name) return &d;
    for (const OpDesc& o : d.overloads)
      if (o.name == name) return &o;
  }
  return nullptr;
}

}  // namespace tessera
