// One CUDA kernel and one autograd kernel for every op whose description has a kernel
// (tessera/op.hpp), registered from the descriptions: no op is named here.
//
// The CUDA kernel reads the schema's arguments off the dispatcher's stack, allocates each output
// by its description's rule, and runs the library function on torch's current stream; the Meta
// kernel (what FakeTensor and torch.compile trace with) allocates the same outputs and stops.
// The autograd kernel is generic_autograd.cpp's.
// tessera._torch_fast (fast.cpp) calls the kernel's function (run) for calls autograd will not
// record, and the op itself through the dispatcher (dispatch) for those it records.
#include "generic.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/library.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "binding.hpp"

namespace tessera::torch_ops::generic {
namespace {

using From = Plan::From;

From kind_of(const c10::Argument& a, const OpDesc& d) {
  const c10::TypePtr& t = a.type();
  if (t->kind() == c10::TypeKind::TensorType) return From::tensor;
  if (auto o = t->cast<c10::OptionalType>(); o && o->getElementType()->kind() == c10::TypeKind::TensorType)
    return From::optional_tensor;
  // ScalarType? is int? to the dispatcher; its real type says what it is.
  if (auto o = a.real_type()->cast<c10::OptionalType>(); o && o->getElementType()->kind() == c10::TypeKind::ScalarTypeType)
    return From::dtype;
  if (auto l = t->cast<c10::ListType>()) {
    if (l->getElementType()->kind() == c10::TypeKind::IntType) return From::ints;
    if (l->getElementType()->kind() == c10::TypeKind::BoolType) return From::bools;
  }
  switch (t->kind()) {
    case c10::TypeKind::FloatType: return From::real;
    case c10::TypeKind::IntType: return From::integer;
    case c10::TypeKind::BoolType: return From::boolean;
    case c10::TypeKind::StringType: return From::string;
    default:
      TORCH_CHECK(false, "tessera: op '", d.name, "': argument '", a.name(), "' of type ", t->str(),
                  " has no generic kernel; register its kernel by hand");
  }
}

// Where each of the backward's arguments comes from (OpDesc::backward_args), and which forward
// outputs have a gradient formula.
void fill_backward(Plan& p, const OpDesc& d, const std::function<int(const std::string&)>& arg_index) {
  const OpDesc* back = find_op_description(d.backward);
  TORCH_CHECK(back, "tessera: op '", d.name, "': its backward '", d.backward, "' has no description");
  const c10::FunctionSchema schema = torch::jit::parseSchema(back->schemas[0]);
  TORCH_CHECK(schema.arguments().size() == d.backward_args.size(), "tessera: op '", d.name, "': ",
              d.backward_args.size(), " backward arguments for the ", schema.arguments().size(), " of '",
              d.backward, "'");
  p.num_backward_outputs = static_cast<int>(schema.returns().size());
  p.differentiable.assign(static_cast<size_t>(p.num_outputs), false);
  auto numbered = [](const std::string& a, const char* prefix) {  // "grad3" -> 3, "grad" -> 0; else -1
    const size_t n = std::strlen(prefix);
    if (a.compare(0, n, prefix) != 0) return -1;
    if (a.size() == n) return 0;
    for (size_t i = n; i < a.size(); ++i)
      if (!std::isdigit(static_cast<unsigned char>(a[i]))) return -1;
    return std::stoi(a.substr(n));
  };
  using B = Plan::BackwardArg;
  for (size_t i = 0; i < d.backward_args.size(); ++i) {
    const std::string& a = d.backward_args[i];
    const bool optional = schema.arguments()[i].type()->cast<c10::OptionalType>() != nullptr;
    if (const int g = numbered(a, "grad"); g >= 0) {
      TORCH_CHECK(g < p.num_outputs, "tessera: op '", d.name, "': '", a, "' names no output");
      p.backward_args.push_back({B::grad, g, -1, optional});
      p.differentiable[static_cast<size_t>(g)] = true;
    } else if (const int r = numbered(a, "result"); r >= 0) {
      TORCH_CHECK(r < p.num_outputs, "tessera: op '", d.name, "': '", a, "' names no output");
      p.backward_args.push_back({B::result, r, p.num_saved++});
    } else if (a == "mask") {
      p.backward_args.push_back({B::mask, -1, -1});
    } else if (const int k = arg_index(a); p.args[k] == From::tensor || p.args[k] == From::optional_tensor) {
      p.backward_args.push_back({B::tensor, k, p.num_saved++});
    } else {
      p.backward_args.push_back({B::value, k, p.num_values++});
    }
  }
  p.materialize = std::all_of(p.differentiable.begin(), p.differentiable.end(), [](bool b) { return b; });
  const auto n_diff = std::count(p.differentiable.begin(), p.differentiable.end(), true);
  if (!p.materialize && n_diff > 1)
    for (const B& b : p.backward_args)
      if (b.kind == B::grad && !b.optional) p.zeros.push_back(b.arg);
  // "input residual": one backward output, the gradient of each forward argument it names.
  for (size_t j = 0; j < d.grads.size(); ++j) {
    std::istringstream names(d.grads[j]);
    for (std::string name; names >> name;) p.grad_args.push_back({arg_index(name), static_cast<int>(j)});
  }
  TORCH_CHECK(p.grad_args.size() < 63, "tessera: op '", d.name, "': too many gradients");
  TORCH_CHECK(static_cast<int>(d.grads.size()) <= p.num_backward_outputs, "tessera: op '", d.name, "': ",
              d.grads.size(), " gradients from the ", p.num_backward_outputs, " outputs of '", d.backward, "'");
}

void fill_plan(Plan& p, const OpDesc& d) {
  p.desc = &d;
  p.qualified = "tessera::" + d.name;  // "tessera::add.Scalar" for an overload
  const c10::FunctionSchema schema = torch::jit::parseSchema(d.schemas[0]);
  const auto& args = schema.arguments();
  p.num_args = static_cast<int>(args.size());
  TORCH_CHECK(p.num_args <= kMaxArgs && d.params.size() <= static_cast<size_t>(kMaxArgs),
              "tessera: op '", d.name, "': too many arguments for the generic kernel");
  auto arg_index = [&](const std::string& name) {
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name() == name) return static_cast<int>(i);
    TORCH_CHECK(false, "tessera: op '", d.name, "': '", name, "' is not an argument of its schema");
  };
  for (const c10::Argument& a : args) p.args.push_back(kind_of(a, d));
  p.float32.assign(args.size(), false);
  for (const std::string& name : d.float32_args) p.float32[static_cast<size_t>(arg_index(name))] = true;
  p.own_dtype.assign(args.size(), false);
  for (const std::string& name : d.own_dtype_args) p.own_dtype[static_cast<size_t>(arg_index(name))] = true;
  for (int s = 0; s < std::min(64, static_cast<int>(at::ScalarType::NumOptions)); ++s) {
    DType t;
    if (dtype_of(static_cast<at::ScalarType>(s), t) && std::find(d.dtypes.begin(), d.dtypes.end(), t) != d.dtypes.end())
      p.dtypes |= uint64_t{1} << s;
  }
  for (const OpDesc::Trailing& t : d.trailing) {
    p.trailing.push_back({arg_index(t.arg), arg_index(t.of), &t});
    TORCH_CHECK(p.args[p.trailing.back().arg] == From::ints && p.args[p.trailing.back().of] == From::tensor,
                "tessera: op '", d.name, "': '", t.arg, "' is not an int[] naming dimensions of tensor '", t.of, "'");
  }
  for (const std::string& name : d.params) {
    Plan::Param q{From::output, -1, -1};
    const auto out = std::find_if(d.outputs.begin(), d.outputs.end(),
                                  [&](const OpDesc::Output& o) { return o.param == name; });
    if (out != d.outputs.end()) {
      q.arg = arg_index(out->like);
      q.out = static_cast<int>(out - d.outputs.begin());
      if (!out->other.empty()) q.other = arg_index(out->other);
      if (!out->mask.empty()) q.mask = arg_index(out->mask);
      if (!out->dtype_from.empty()) q.dtype = arg_index(out->dtype_from);
      if (!out->needs.empty()) q.needs = arg_index(out->needs);
      TORCH_CHECK(q.needs < 0 || p.args[q.needs] == From::optional_tensor, "tessera: op '", d.name, "': output '",
                  out->param, "' needs '", out->needs, "', which is not a Tensor? argument");
      TORCH_CHECK(q.dtype < 0 || p.args[q.dtype] == From::dtype, "tessera: op '", d.name, "': output '", out->param,
                  "' takes its dtype from '", out->dtype_from, "', which is not a ScalarType? argument");
      TORCH_CHECK(p.args[q.arg] == From::tensor || p.args[q.arg] == From::optional_tensor, "tessera: op '",
                  d.name, "': output '", out->param, "' is like '", out->like, "', which is not a tensor argument");
      const bool reduced = out->shape == OpDesc::Output::Shape::reduced;
      TORCH_CHECK(q.other < 0 || (reduced ? p.args[q.other] == From::string
                                          : p.args[q.other] == From::tensor || p.args[q.other] == From::ints),
                  "tessera: op '", d.name, "': output '", out->param, "' is shaped by '", out->other,
                  "', which is not a ", reduced ? "str" : "tensor or int[]", " argument");
      TORCH_CHECK(q.mask < 0 || p.args[q.mask] == (out->mask_index < 0 ? From::boolean : From::bools),
                  "tessera: op '", d.name, "': output '", out->param, "' is masked by '", out->mask,
                  "', which is not a ", out->mask_index < 0 ? "bool" : "bool[]", " argument");
    } else {
      q.arg = arg_index(name);
      q.from = p.args[q.arg];
    }
    p.params.push_back(q);
  }
  p.num_outputs = static_cast<int>(d.outputs.size());
  for (const OpDesc::Output& o : d.outputs) p.internal.push_back(o.internal);
  TORCH_CHECK(schema.returns().size() == d.outputs.size(), "tessera: op '", d.name,
              "': its schema returns ", schema.returns().size(), " values, its description ",
              d.outputs.size(), " outputs");
  if (!d.backward.empty()) fill_backward(p, d, arg_index);
}

// The int[] arguments that name trailing dimensions, checked against their tensor's shape.
// On symbolic sizes (torch.compile with dynamic shapes) only the trailing dimensions named are
// compared, so the leading ones stay symbolic.
void check_trailing(const Plan& p, const Value* args) {
  for (const Plan::Trailing& t : p.trailing) {
    const at::Tensor& of = *args[t.of].tensor;
    const c10::SymIntArrayRef s = of.sym_sizes();
    const size_t nd = s.size(), n = static_cast<size_t>(args[t.arg].num);
    bool ok = n > 0 && n <= nd;
    for (size_t i = 0; ok && i < n; ++i) ok = s[nd - n + i] == args[t.arg].ints[i];
    if (ok) continue;
    std::vector<int64_t> shape;
    for (const c10::SymInt& v : s) shape.push_back(v.guard_int(__FILE__, __LINE__));
    guarded([&] {
      tessera::check_trailing(*p.desc, *t.rule, shape.data(), static_cast<int>(nd), args[t.arg].ints, n);
    });
  }
}

// Whether output `q` exists: not where its rule says None (an absent `like` or `needs`, a false
// mask entry).
bool present(const Plan& p, const Plan::Param& q, const Value* args) {
  const OpDesc::Output& o = p.desc->outputs[static_cast<size_t>(q.out)];
  if (!args[q.arg].tensor || (q.needs >= 0 && !args[q.needs].tensor)) return false;
  return q.mask < 0 || (o.mask_index < 0 ? args[q.mask].boolean
                                         : o.mask_index < args[q.mask].num && (args[q.mask].bools >> o.mask_index & 1u));
}

// Output `q`'s dtype and device: its rule's dtype (or its ScalarType? argument's) on like's device.
at::TensorOptions options(const Plan& p, const Plan::Param& q, const Value* args) {
  using O = OpDesc::Output;
  const O& o = p.desc->outputs[static_cast<size_t>(q.out)];
  const at::Tensor& like = *args[q.arg].tensor;
  if (q.dtype >= 0 && args[q.dtype].integer >= 0)
    return like.options().dtype(static_cast<at::ScalarType>(args[q.dtype].integer));
  return o.dtype == O::Dtype::like      ? like.options()
         : o.dtype == O::Dtype::float32 ? like.options().dtype(at::kFloat)
                                        : like.options().dtype(at::kBool);
}

// A contiguous tensor: on CUDA straight from torch's CUDA allocator (the kernels run on CUDA
// tensors alone; at::empty would pass the dispatcher again).
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& opt) {
  return opt.device().is_cuda() ? at::Tensor(at::detail::empty_cuda(sizes, opt)) : at::empty(sizes, opt);
}

// Output `q` by its rule: contiguous, on like's device; undefined where it is not present.
at::Tensor allocate(const Plan& p, const Plan::Param& q, const Value* args) {
  using O = OpDesc::Output;
  const O& o = p.desc->outputs[static_cast<size_t>(q.out)];
  if (!present(p, q, args)) return {};
  const at::Tensor& like = *args[q.arg].tensor;
  const at::TensorOptions opt = options(p, q, args);
  if (o.shape == O::Shape::like) return empty_output(like.sizes(), opt);
  std::vector<int64_t> other;
  std::string_view text;
  if (q.other >= 0 && p.args[q.other] == From::string) text = args[q.other].string;
  else if (q.other >= 0 && args[q.other].tensor) other = args[q.other].tensor->sizes().vec();
  else if (q.other >= 0) other.assign(args[q.other].ints, args[q.other].ints + args[q.other].num);
  std::vector<int64_t> shape;
  guarded([&] { shape = output_shape(*p.desc, o, like.sizes().vec(), other, text); });
  return empty_output(shape, opt);
}

// The Meta kernel's output `q`: the run's rule on symbolic sizes, which stay symbolic (a leading
// dimension is never specialized to the traced value).
at::Tensor allocate_symbolic(const Plan& p, const Plan::Param& q, const Value* args) {
  using O = OpDesc::Output;
  const OpDesc& d = *p.desc;
  const O& o = d.outputs[static_cast<size_t>(q.out)];
  if (!present(p, q, args)) return {};
  const at::Tensor& like = *args[q.arg].tensor;
  const at::TensorOptions opt = options(p, q, args);
  const c10::SymIntArrayRef s = like.sym_sizes();
  switch (o.shape) {
    case O::Shape::like: return at::empty_symint(s, opt);
    case O::Shape::scalar: return at::empty({}, opt);
    case O::Shape::reduced:
      return args[q.other].string == "none" && !s.empty() ? at::empty_symint(s.slice(0, s.size() - 1), opt)
                                                           : at::empty({}, opt);
    case O::Shape::leading: {
      size_t drop = q.other < 0                 ? std::min(static_cast<size_t>(o.drop), s.size())
                    : p.args[q.other] == From::ints ? static_cast<size_t>(args[q.other].num)
                                                  : static_cast<size_t>(args[q.other].tensor->dim());
      if (drop > s.size())  // the library's message, from the rule on the dimension counts alone
        guarded([&] { output_shape(d, o, std::vector<int64_t>(s.size(), 1), std::vector<int64_t>(drop, 1)); });
      return at::empty_symint(s.slice(0, s.size() - drop), opt);
    }
    case O::Shape::broadcast: return at::empty_symint(at::infer_size_symint(s, args[q.other].tensor->sym_sizes()), opt);
  }
  return {};
}

// The schema's arguments off the stack, as run() reads them.
void read_args(const Plan& p, c10::ArrayRef<c10::IValue> in, Value* v) {
  for (int i = 0; i < p.num_args; ++i) {
    const c10::IValue& x = in[i];
    switch (p.args[i]) {
      case From::tensor: v[i].tensor = &x.toTensor(); break;
      case From::optional_tensor:  // an undefined tensor (torch's saved None weight) is None too
        v[i].tensor = x.isTensor() && x.toTensor().defined() ? &x.toTensor() : nullptr;
        break;
      case From::real: v[i].real = x.toDouble(); break;
      case From::integer: v[i].integer = x.toInt(); break;
      case From::boolean: v[i].boolean = x.toBool(); break;
      case From::string: v[i].string = x.toStringView(); break;
      case From::ints: {
        const c10::List<int64_t> l = x.toIntList();
        TORCH_CHECK_VALUE(l.size() <= static_cast<size_t>(kMaxDims), "tessera.", p.desc->name, ": argument ",
                          i + 1, ": expected at most ", kMaxDims, " sizes, got ", l.size());
        v[i].num = static_cast<int>(l.size());
        for (size_t k = 0; k < l.size(); ++k) v[i].ints[k] = l.get(k);
        break;
      }
      case From::dtype: v[i].integer = x.isNone() ? -1 : static_cast<int64_t>(x.toScalarType()); break;
      case From::bools: {
        const c10::List<bool> l = x.toBoolList();
        TORCH_CHECK_VALUE(l.size() <= 32, "tessera.", p.desc->name, ": argument ", i + 1,
                          ": expected at most 32 booleans, got ", l.size());
        v[i].num = static_cast<int>(l.size());
        v[i].bools = 0;
        for (size_t k = 0; k < l.size(); ++k) v[i].bools |= static_cast<uint32_t>(l.get(k)) << k;
        break;
      }
      case From::output: break;
    }
  }
}

// One op's CUDA kernel (and CPU one, for the library's own message: a CUDA tensor expected).
struct Kernel : c10::OperatorKernel {
  const Plan* plan;
  explicit Kernel(const Plan* p) : plan(p) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) const {
    Value v[kMaxArgs];
    read_args(*plan, torch::jit::last(*stack, plan->num_args), v);
    Outputs outs = run(*plan, v);
    torch::jit::drop(*stack, plan->num_args);
    for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  }
};

// One op's Meta kernel: its outputs by their rule on the meta device, the library not called.
// FakeTensor (torch.compile's tracing) runs it on meta copies of the fake inputs.
struct MetaKernel : c10::OperatorKernel {
  const Plan* plan;
  explicit MetaKernel(const Plan* p) : plan(p) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) const {
    Value v[kMaxArgs];
    read_args(*plan, torch::jit::last(*stack, plan->num_args), v);
    check_trailing(*plan, v);
    Outputs outs(static_cast<size_t>(plan->num_outputs));
    for (const Plan::Param& q : plan->params)
      if (q.from == From::output) outs[q.out] = allocate_symbolic(*plan, q, v);
    torch::jit::drop(*stack, plan->num_args);
    for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  }
};

void register_kernels(torch::Library& m) {
  for (const Plan& p : plans())
    m.impl(p.desc->name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(&p)));
}

}  // namespace

// "tessera::add.Scalar" as the dispatcher's (name, overload name).
static std::pair<std::string, std::string> split_overload(const std::string& qualified) {
  const size_t dot = qualified.find('.');
  if (dot == std::string::npos) return {qualified, ""};
  return {qualified.substr(0, dot), qualified.substr(dot + 1)};
}

const c10::OperatorHandle& Plan::op() const {
  std::call_once(found, [&] {
    const auto [name, overload] = split_overload(qualified);
    handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  });
  return *handle;
}

const c10::OperatorHandle& Plan::backward_op() const {
  std::call_once(backward_found, [&] {
    const auto [name, overload] = split_overload("tessera::" + desc->backward);
    backward_handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  });
  return *backward_handle;
}

const std::deque<Plan>& plans() {
  static const std::deque<Plan> v = [] {
    std::deque<Plan> r;
    for (const OpDesc& d : op_descriptions()) {
      if (d.call) fill_plan(r.emplace_back(), d);
      for (const OpDesc& o : d.overloads)
        if (o.call) fill_plan(r.emplace_back(), o);
    }
    return r;
  }();
  return v;
}

int index(const std::string& name) {
  static const std::unordered_map<std::string, int> names = [] {
    std::unordered_map<std::string, int> m;
    for (size_t i = 0; i < plans().size(); ++i) m.emplace(plans()[i].desc->name, static_cast<int>(i));
    return m;
  }();
  const auto it = names.find(name);
  return it == names.end() ? -1 : it->second;
}

Outputs run(const Plan& p, const Value* args, bool internal) {
  const OpDesc& d = *p.desc;
  const char* op = d.name.c_str();
  c10::SmallVector<Arg, 12> a(p.params.size());  // a norm backward's 11 without a heap allocation
  const at::Tensor* first = nullptr;
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Plan::Param& q = p.params[i];
    if (q.from == From::output) continue;
    const Value& v = args[q.arg];
    switch (q.from) {
      case From::tensor:
      case From::optional_tensor:
        if (v.tensor) {
          a[i].kind = Arg::Kind::tensor;
          a[i].tensor = view(op, d.params[i].c_str(), *v.tensor);
          if (!first) first = v.tensor;
        }
        break;
      case From::real: a[i].kind = Arg::Kind::real; a[i].real = v.real; break;
      case From::integer: a[i].kind = Arg::Kind::integer; a[i].integer = v.integer; break;
      case From::boolean: a[i].kind = Arg::Kind::boolean; a[i].boolean = v.boolean; break;
      case From::string: a[i].kind = Arg::Kind::string; a[i].string = v.string; break;
      case From::ints: a[i].kind = Arg::Kind::integer; a[i].integer = v.num; break;  // a Trailing rule's count
      case From::bools:
      case From::dtype:
      case From::output: break;
    }
  }
  check_trailing(p, args);
  // Outputs after every input is viewed: an input the library refuses allocates nothing.
  Outputs outs(static_cast<size_t>(p.num_outputs));
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Plan::Param& q = p.params[i];
    if (q.from != From::output || (!internal && p.internal[static_cast<size_t>(q.out)])) continue;
    outs[q.out] = allocate(p, q, args);
    if (!outs[q.out].defined()) continue;
    a[i].kind = Arg::Kind::tensor;
    a[i].tensor = view(op, d.params[i].c_str(), outs[q.out]);
  }
  // Every output None (masked off, or like absent tensors): nothing to compute.
  if (p.num_outputs > 0 && std::none_of(outs.begin(), outs.end(), [](const at::Tensor& t) { return t.defined(); }))
    return outs;
  guarded([&] { d.call(op, a.data(), first ? stream_of(*first) : nullptr); });
  return outs;
}

Outputs dispatch(const Plan& p, const Value* args) {
  torch::jit::Stack stack;
  stack.reserve(static_cast<size_t>(std::max(p.num_args, p.num_outputs)));
  for (int i = 0; i < p.num_args; ++i) {
    const Value& v = args[i];
    switch (p.args[i]) {
      case From::tensor: stack.emplace_back(*v.tensor); break;
      case From::optional_tensor:
        if (v.tensor) stack.emplace_back(*v.tensor);
        else stack.emplace_back();
        break;
      case From::real: stack.emplace_back(v.real); break;
      case From::integer: stack.emplace_back(v.integer); break;
      case From::boolean: stack.emplace_back(v.boolean); break;
      case From::string: stack.emplace_back(std::string(v.string)); break;
      case From::ints: stack.emplace_back(std::vector<int64_t>(v.ints, v.ints + v.num)); break;
      case From::dtype:
        if (v.integer < 0) stack.emplace_back();
        else stack.emplace_back(static_cast<at::ScalarType>(v.integer));
        break;
      case From::bools: {
        c10::List<bool> l;
        for (int k = 0; k < v.num; ++k) l.push_back((v.bools >> k & 1u) != 0);
        stack.emplace_back(std::move(l));
        break;
      }
      case From::output: break;
    }
  }
  p.op().callBoxed(&stack);
  Outputs outs;
  for (c10::IValue& o : stack) outs.push_back(std::move(o).toTensor());
  return outs;
}

}  // namespace tessera::torch_ops::generic

TESSERA_TORCH_KERNELS(tessera::torch_ops::generic::register_kernels)
TORCH_LIBRARY_IMPL(tessera, Meta, m) {
  using namespace tessera::torch_ops::generic;
  for (const Plan& p : plans())
    m.impl(p.desc->name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MetaKernel>(&p)));
}
