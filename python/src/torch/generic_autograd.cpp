// The autograd kernel of every op whose description has a backward formula (generic.hpp's plans):
// where autograd records the call, it runs the op below autograd inside one
// torch::autograd::Function for every op. Its forward saves what the description's backward
// formula names (arguments, the forward's result); its backward calls the backward op through the
// dispatcher, so the backward is itself a tessera op that torch.compile and the profiler see.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "generic.hpp"

namespace tessera::torch_ops::generic {
namespace {

int64_t all_given(const Plan& p) { return (int64_t{1} << p.grad_args.size()) - 1; }

// The shape and dtype of output `i`, saved where its missing gradient is taken as zeros.
std::string zeros_key(int i) { return "zeros" + std::to_string(i); }

// apply's arguments: the plan, the op, which of the plan's grad_args were given (bit i: grad_args[i];
// a None optional tensor is not passed), the tensors given (autograd sees these), the stack (read
// here, where the call takes its arguments off it).
struct Function : torch::autograd::Function<Function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Plan* p,
                                                const c10::OperatorHandle* op, int64_t given, at::TensorList,
                                                torch::jit::Stack* stack) {
    using B = Plan::BackwardArg;
    auto in = torch::jit::last(*stack, p->num_args);
    std::vector<at::Tensor> saved(static_cast<size_t>(p->num_saved));
    // The values list only where the backward takes values (a list is a heap allocation).
    std::optional<c10::impl::GenericList> values;
    if (p->num_values) values.emplace(c10::AnyType::get());
    for (const B& b : p->backward_args) {
      if (b.kind == B::tensor && in[b.arg].isTensor()) saved[b.slot] = in[b.arg].toTensor();
      else if (b.kind == B::value) values->push_back(in[b.arg]);
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op->callBoxed(stack);
    }
    torch::autograd::variable_list outs;
    outs.reserve(static_cast<size_t>(p->num_outputs));
    for (size_t i = stack->size() - static_cast<size_t>(p->num_outputs); i < stack->size(); ++i)
      outs.push_back(std::move((*stack)[i]).toTensor());
    torch::jit::drop(*stack, p->num_outputs);
    for (const B& b : p->backward_args)
      if (b.kind == B::result) saved[b.slot] = outs[static_cast<size_t>(b.arg)];
    ctx->save_for_backward(std::move(saved));
    ctx->saved_data["plan"] = reinterpret_cast<int64_t>(p);
    if (values) ctx->saved_data["values"] = std::move(*values);
    if (given != all_given(*p)) ctx->saved_data["given"] = given;
    if (!p->materialize) {
      ctx->set_materialize_grads(false);  // no zeros for the statistics' gradients
      torch::autograd::variable_list fixed;
      for (size_t i = 0; i < outs.size(); ++i)
        if (!p->differentiable[i] && outs[i].defined()) fixed.push_back(outs[i]);
      ctx->mark_non_differentiable(fixed);
      for (int i : p->zeros) {  // symbolic sizes: torch.compile traces this with dynamic shapes
        const at::Tensor& o = outs[static_cast<size_t>(i)];
        ctx->saved_data[zeros_key(i)] = o.sym_sizes();
        ctx->saved_data[zeros_key(i) + "dtype"] = static_cast<int64_t>(o.scalar_type());
      }
    }
    return outs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    using B = Plan::BackwardArg;
    const Plan& p = *reinterpret_cast<const Plan*>(ctx->saved_data["plan"].toInt());
    const auto g = ctx->saved_data.find("given");
    const int64_t given = g == ctx->saved_data.end() ? all_given(p) : g->second.toInt();
    // One gradient per argument of apply: the plan, the op, given, each tensor given, the stack.
    torch::autograd::variable_list result(static_cast<size_t>(__builtin_popcountll(given)) + 4);
    const at::Tensor* came = nullptr;  // a gradient that came: the device of any zeros
    for (const B& b : p.backward_args)
      if (b.kind == B::grad && grads[static_cast<size_t>(b.arg)].defined()) came = &grads[static_cast<size_t>(b.arg)];
    if (!came) return result;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::optional<c10::impl::GenericList> values;
    if (p.num_values) values.emplace(ctx->saved_data["values"].toList());
    torch::jit::Stack stack;
    stack.reserve(p.backward_args.size());
    for (const B& b : p.backward_args) {
      switch (b.kind) {
        case B::grad: {
          const at::Tensor& g = grads[static_cast<size_t>(b.arg)];
          if (g.defined()) {
            stack.emplace_back(g.contiguous());
          } else if (b.optional) {
            stack.emplace_back();
          } else {
            const auto dtype = static_cast<at::ScalarType>(ctx->saved_data[zeros_key(b.arg) + "dtype"].toInt());
            stack.emplace_back(at::zeros_symint(ctx->saved_data[zeros_key(b.arg)].toSymIntVector(),
                                                came->options().dtype(dtype)));
          }
          break;
        }
        case B::value: stack.push_back(values->get(static_cast<size_t>(b.slot))); break;
        case B::mask: {  // the backward outputs autograd wants: any of the arguments each one is for
          c10::List<bool> want;
          for (int j = 0; j < p.num_backward_outputs; ++j) want.push_back(false);
          for (size_t i = 0, c = 0; i < p.grad_args.size(); ++i)
            if ((given >> i & 1) && ctx->needs_input_grad(c++)) want.set(static_cast<size_t>(p.grad_args[i].out), true);
          stack.emplace_back(std::move(want));
          break;
        }
        default: {  // an optional tensor that was None was saved undefined: None again
          const at::Tensor& t = saved[static_cast<size_t>(b.slot)];
          if (t.defined()) stack.emplace_back(t);
          else stack.emplace_back();
          break;
        }
      }
    }
    if (at::GradMode::is_enabled()) {  // create_graph: torch's autograd fallback sees the call
      p.backward_op().callBoxed(&stack);
    } else {  // nothing to record: past the autograd keys at once
      at::AutoDispatchBelowADInplaceOrView guard;
      p.backward_op().callBoxed(&stack);
    }
    // The backward's returns, one stack entry each; each is the gradient of the arguments it is for.
    for (size_t i = 0, c = 0; i < p.grad_args.size(); ++i) {
      if (!(given >> i & 1)) continue;
      const size_t j = static_cast<size_t>(p.grad_args[i].out);
      if (j < stack.size() && stack[j].isTensor()) result[3 + c] = stack[j].toTensor();
      ++c;
    }
    return result;
  }
};

// One op's autograd kernel: below autograd at once where autograd will not record the call.
struct AutogradKernel : c10::OperatorKernel {
  const Plan* plan;
  explicit AutogradKernel(const Plan* p) : plan(p) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) const {
    auto in = torch::jit::last(*stack, plan->num_args);
    c10::SmallVector<at::Tensor, 4> inputs;
    int64_t given = 0;
    bool records = false;
    for (size_t i = 0; i < plan->grad_args.size(); ++i) {
      const c10::IValue& a = in[plan->grad_args[i].arg];
      if (!a.isTensor() || !a.toTensor().defined()) continue;  // a None optional tensor: no gradient, not passed
      given |= int64_t{1} << i;
      inputs.push_back(a.toTensor());
      records = records || inputs.back().requires_grad();
    }
    if (!records || !at::GradMode::is_enabled()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.callBoxed(stack);
      return;
    }
    torch::autograd::variable_list outs =
        Function::apply(plan, &op, given, at::TensorList(inputs.data(), inputs.size()), stack);
    for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  }
};

}  // namespace
}  // namespace tessera::torch_ops::generic

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops::generic;
  for (const Plan& p : plans())
    if (!p.desc->backward.empty())
      m.impl(p.desc->name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(&p)));
}
