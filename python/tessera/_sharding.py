"""DTensor sharding rules for tessera's torch ops (torch.distributed.tensor's register_sharding),
so that torch.ops.tessera.* on DTensors run tessera's kernels on each rank's local shard.

Each rule lists the placements (per mesh dimension) under which the op on local shards gives the
global result; DTensor picks the one that needs the least communication and redistributes the
inputs to it. An op that cannot run sharded lists Replicate only, and DTensor gathers: seeded
dropout, whose mask depends on each element's global index. Ops without a rule here (matmul,
the losses, isin, copy) keep DTensor's default, an error naming the op.

torch.distributed.tensor takes a third of a second to import, so the rules are registered when a
program imports it (install()), not when tessera is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_MODULE = "torch.distributed.tensor"
_done = False


def install(torch) -> None:
    """Registers the rules now if torch.distributed.tensor is loaded, else once it is."""
    if _MODULE in sys.modules:
        register(torch)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(torch))


class _Finder(importlib.abc.MetaPathFinder):
    """Runs register() right after torch.distributed.tensor has been imported."""

    def __init__(self, torch):
        self.torch = torch

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # the lookup below, and later imports, without this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, torch = spec.loader, self.torch

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                register(torch)

            def __getattr__(self, attr):  # get_source, resource readers, ...: the real loader's
                return getattr(loader, attr)

        spec.loader = Loader()
        return spec


def register(torch) -> bool:
    """Registers every rule (once); False where this torch has no register_sharding."""
    global _done
    if _done:
        return True
    try:
        from torch.distributed.tensor import Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:
        return False
    _done = True
    ops = torch.ops.tessera
    R = Replicate()

    def is_tensor(a):
        return hasattr(a, "ndim")

    def each(args, placement):
        """`placement` for every tensor argument, None for the others."""
        return [placement if is_tensor(a) else None for a in args]

    # Elementwise ops over tensors of one shape: any dimension, or replicated.
    def same_shape(op):
        outs = len(op._schema.returns)

        @register_sharding(op)
        def rule(*args, **kwargs):
            ndim = next(a for a in args if is_tensor(a)).ndim
            return [([R] * outs, each(args, R))] + [([Shard(d)] * outs, each(args, Shard(d))) for d in range(ndim)]

    for name in ("gelu", "gelu_backward", "silu", "silu_backward", "silu_mul", "silu_mul_backward"):
        same_shape(getattr(ops, name).default)

    # Seeded dropout: element i's mask bit comes from the Philox stream at (seed, offset + i), the
    # global index; a shard would draw another mask.
    def replicated(op):
        @register_sharding(op)
        def rule(*args, **kwargs):
            return [([R], each(args, R))]

    for name in ("dropout", "dropout_backward"):
        replicated(getattr(ops, name).default)

    # softmax(input, dim), softmax_backward(grad_output, output, dim): any dimension but dim.
    def rows(op, tensors):
        @register_sharding(op)
        def rule(*args, **kwargs):
            ndim = args[0].ndim
            dim = args[tensors] % max(ndim, 1)
            return [([R], [R] * tensors + [None])] + \
                [([Shard(d)], [Shard(d)] * tensors + [None]) for d in range(ndim) if d != dim]

    for name, tensors in (("softmax", 1), ("log_softmax", 1), ("softmax_backward", 2), ("log_softmax_backward", 2)):
        rows(getattr(ops, name).default, tensors)

    # The norms: rows are independent, so the leading (not normalized) dimensions shard, the
    # statistics alike. The parameters are replicated; their gradients are column sums over the
    # rows, so each rank holds a partial sum (Partial).
    def lead(x, normalized_shape):
        return range(x.ndim - len(normalized_shape))

    def param(t):
        return R if t is not None else None

    @register_sharding(ops.layer_norm.default)
    def layer_norm_rule(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        tail = [param(weight), param(bias), None]
        return [([R] * 3, [R, None] + tail)] + \
            [([Shard(d)] * 3, [Shard(d), None] + tail) for d in lead(input, normalized_shape)]

    @register_sharding(ops.rms_norm.default)
    def rms_norm_rule(input, normalized_shape, weight, eps):
        tail = [param(weight), None]
        return [([R] * 2, [R, None] + tail)] + \
            [([Shard(d)] * 2, [Shard(d), None] + tail) for d in lead(input, normalized_shape)]

    @register_sharding(ops.layer_norm_backward.default)
    def layer_norm_backward_rule(grad_output, input, normalized_shape, mean, rstd, weight, output_mask):
        def ins(p):
            return [p, p, None, p, p, param(weight), None]
        return [([R] * 3, ins(R))] + \
            [([Shard(d), Partial(), Partial()], ins(Shard(d))) for d in lead(input, normalized_shape)]

    @register_sharding(ops.rms_norm_backward.default)
    def rms_norm_backward_rule(grad_output, input, normalized_shape, rstd, weight, output_mask):
        def ins(p):
            return [p, p, None, p, param(weight), None]
        return [([R] * 2, ins(R))] + [([Shard(d), Partial()], ins(Shard(d))) for d in lead(input, normalized_shape)]

    # The residual add fused with the norm: the same, over the last dimension; input and residual
    # (and residual_out, grad_residual_out) sharded alike.
    def rows_of(x):
        return range(x.ndim - 1)

    @register_sharding(ops.add_layer_norm.default)
    def add_layer_norm_rule(input, residual, weight=None, bias=None, eps=1e-5):
        tail = [param(weight), param(bias), None]
        return [([R] * 4, [R, R] + tail)] + [([Shard(d)] * 4, [Shard(d)] * 2 + tail) for d in rows_of(input)]

    @register_sharding(ops.add_rms_norm.default)
    def add_rms_norm_rule(input, residual, weight, eps):
        tail = [param(weight), None]
        return [([R] * 3, [R, R] + tail)] + [([Shard(d)] * 3, [Shard(d)] * 2 + tail) for d in rows_of(input)]

    @register_sharding(ops.add_layer_norm_backward.default)
    def add_layer_norm_backward_rule(grad_output, grad_residual_out, residual_out, mean, rstd, weight, output_mask):
        def ins(p):
            return [p, p if grad_residual_out is not None else None, p, p, p, param(weight), None]
        return [([R] * 3, ins(R))] + \
            [([Shard(d), Partial(), Partial()], ins(Shard(d))) for d in rows_of(residual_out)]

    @register_sharding(ops.add_rms_norm_backward.default)
    def add_rms_norm_backward_rule(grad_output, grad_residual_out, residual_out, rstd, weight, output_mask):
        def ins(p):
            return [p, p if grad_residual_out is not None else None, p, p, param(weight), None]
        return [([R] * 2, ins(R))] + [([Shard(d), Partial()], ins(Shard(d))) for d in rows_of(residual_out)]

    # RoPE: q and k by batch or by heads (k's heads divided as q's), the angles replicated.
    def rotary_rule(q, k, cos, sin, *args, **kwargs):
        layout = kwargs.get("layout", args[0] if args else "bshd")
        rest = [None] * len(args)
        return [([R] * 2, [R] * 4 + rest)] + \
            [([Shard(d)] * 2, [Shard(d)] * 2 + [R, R] + rest) for d in (0, 2 if layout == "bshd" else 1)]

    register_sharding(ops.rotary_embedding.default)(rotary_rule)
    register_sharding(ops.rotary_embedding_backward.default)(rotary_rule)

    # Attention in FlashAttention's layout, (batch, seq, heads, dim): by batch or by heads (GQA's
    # groups stay whole where both head counts divide by the mesh); lse is (batch, heads, seq).
    # With ALiBi's slopes (a keyword argument, which these placements do not cover: a shard would
    # index them by its local batch and heads) replicated only.
    @register_sharding(ops.attention.default)
    def attention_rule(q, k, v, *args, **kwargs):
        rest = [None] * len(args)
        if kwargs.get("alibi_slopes") is not None:
            return [([R] * 2, [R] * 3 + rest)]
        return [([R] * 2, [R] * 3 + rest), ([Shard(0)] * 2, [Shard(0)] * 3 + rest),
                ([Shard(2), Shard(1)], [Shard(2)] * 3 + rest)]

    @register_sharding(ops.attention_backward.default)
    def attention_backward_rule(grad_out, q, k, v, out, lse, *args, **kwargs):
        rest = [None] * len(args)
        if kwargs.get("alibi_slopes") is not None:
            return [([R] * 3, [R] * 6 + rest)]
        return [([R] * 3, [R] * 6 + rest), ([Shard(0)] * 3, [Shard(0)] * 6 + rest),
                ([Shard(2)] * 3, [Shard(2)] * 5 + [Shard(1)] + rest)]

    return True
