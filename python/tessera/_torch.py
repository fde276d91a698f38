"""tessera's operators as torch ops: ``torch.ops.tessera.*``.

The compiled library next to this module (libtessera_torch.so, built with the wheel where the
building Python had torch: ``pip install --no-build-isolation .``) defines every op from its
description's schema and registers its CUDA kernel and, for the differentiable ones, its autograd
kernel, all in C++; for the ops whose description allocates outputs by a rule (tessera/op.hpp) also
the Meta kernel that FakeTensor and torch.compile trace with. This module loads it and registers
the fake kernels (shapes, dtypes and strides only) of the others, written here.

The public functions (tessera.softmax, ...) call these ops for torch tensors. Without the library
(a wheel built in an isolated environment, without torch) ``ops`` is None: calls that need
autograd are refused with a message that says how to install with them.

Imported by tessera._interop once torch is present (importing it imports torch); it fills in
tessera._state.
"""

from __future__ import annotations

import os

import torch

from . import _C, _state

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtessera_torch.so")

if os.path.exists(_PATH):
    torch.ops.load_library(_PATH)
    ops = torch.ops.tessera
    try:  # the plain tensors' shortcut to the same kernels and ops (python/src/torch/fast.cpp)
        from . import _torch_fast as fast
    except ImportError:
        fast = None
else:
    ops = None
    fast = None


def _like(t):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _register_fakes():
    fake = torch.library.register_fake

    @fake("tessera::matmul")
    def _matmul(input, other, *, bias=None, residual=None, activation="none", alpha=1.0,
                out_dtype=None, allow_tf32=None):
        m, n = input.shape[-2], other.shape[-1]
        batch = max(input.shape[0] if input.dim() == 3 else 1,
                    other.shape[0] if other.dim() == 3 else 1)
        if activation in ("swiglu", "geglu"):
            n //= 2  # gate and up pairs: half the product's columns
        shape = (m, n) if input.dim() == 2 and other.dim() == 2 else (batch, m, n)
        return input.new_empty(shape, dtype=out_dtype or input.dtype)

    @fake("tessera::matmul.preactivation")
    def _matmul_preactivation(input, other, **kwargs):
        out = _matmul(input, other, **kwargs)
        product = out.shape[:-1] + (other.shape[-1],)
        return out, out.new_empty(product)

    # mlp: input [..., K], w_in [N, K], w_out [D, N'] -> [..., D]; the pre-activation [..., N].
    @fake("tessera::mlp")
    def _mlp(input, w_in, w_out, *, activation="swiglu", allow_tf32=None):
        return input.new_empty(input.shape[:-1] + (w_out.shape[0],))

    @fake("tessera::mlp.preactivation")
    def _mlp_preactivation(input, w_in, w_out, **kwargs):
        return _mlp(input, w_in, w_out, **kwargs), input.new_empty(input.shape[:-1] + (w_in.shape[0],))

    @fake("tessera::attention")
    def _attention(q, k, v, *, causal=False, scale=None, window_left=-1, window_right=-1, softcap=0.0,
                   deterministic=False, alibi_slopes=None):
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
        return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)

    @fake("tessera::attention.varlen")
    def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
        out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)

    @fake("tessera::attention.kvcache")
    def _attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, **kwargs):
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))
        return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)

    @fake("tessera::attention_backward.varlen")
    def _attention_varlen_backward(grad_out, q, k, v, out, lse, *args, **kwargs):
        return _like(q), _like(k), _like(v)

    @fake("tessera::attention_backward")
    def _attention_backward(grad_out, q, k, v, out, lse, **kwargs):
        return _like(q), _like(k), _like(v)

    @fake("tessera::scaled_mm")
    def _scaled_mm(input, other, scale_a, scale_b, *, bias=None, out_dtype=None, residual=None, activation="none"):
        n = other.shape[1] // 2 if activation in ("swiglu", "geglu") else other.shape[1]
        return input.new_empty((input.shape[0], n), dtype=out_dtype or torch.bfloat16)

    # float8_quantize: q [M, K] float8_e4m3fn and scale (float8's scale shapes: [M, 1] 'row', 0-d
    # 'tensor', [M, K / 128] 'block', [M / 128, K / 128] 'block2d'); .columns adds x's columns
    # transposed, q_t [K, M], and scale_t; .transposed gives those alone. float8_quantize_gated
    # (and .columns) quantize act(gate) * up as float8_quantize (and .columns) quantize input.
    @fake("tessera::float8_quantize")
    def _float8_quantize(input, *, granularity="row"):
        from .float8 import _scale_shape
        m, k = input.shape
        return (input.new_empty((m, k), dtype=torch.float8_e4m3fn),
                input.new_empty(_scale_shape((m, k), granularity), dtype=torch.float32))

    @fake("tessera::float8_quantize.columns")
    def _float8_quantize_columns(input, *, granularity="row"):
        from .float8 import _scale_shape
        m, k = input.shape
        return (*_float8_quantize(input, granularity=granularity),
                input.new_empty((k, m), dtype=torch.float8_e4m3fn),
                input.new_empty(_scale_shape((m, k), granularity, columns=True), dtype=torch.float32))

    @fake("tessera::float8_quantize.transposed")
    def _float8_quantize_transposed(input, *, granularity="row"):
        return _float8_quantize_columns(input, granularity=granularity)[2:]

    def _gated_product(gate, up):
        if up.shape != gate.shape or up.dtype != gate.dtype:
            raise ValueError(f"tessera.float8_quantize_gated: argument 'up': expected gate's shape "
                             f"{list(gate.shape)} and dtype {gate.dtype}, got {list(up.shape)} and {up.dtype}")
        return gate

    @fake("tessera::float8_quantize_gated")
    def _float8_quantize_gated(gate, up, *, activation="silu", granularity="row"):
        return _float8_quantize(_gated_product(gate, up), granularity=granularity)

    @fake("tessera::float8_quantize_gated.columns")
    def _float8_quantize_gated_columns(gate, up, *, activation="silu", granularity="row"):
        return _float8_quantize_columns(_gated_product(gate, up), granularity=granularity)

    # grouped_mm: [M, N] where one operand is 3-d, [G, M, N] where both are (or both 2-d: G = offs's
    # length).
    @fake("tessera::grouped_mm")
    def _grouped_mm(input, other, offs=None, *, out_dtype=None):
        m, n = input.shape[-2], other.shape[-1]
        if input.dim() != other.dim():
            shape = (m, n)
        else:
            shape = (input.shape[0] if input.dim() == 3 else offs.shape[0], m, n)
        return input.new_empty(shape, dtype=out_dtype or input.dtype)

    # moe_permute: [T k, H] pairs from [T, H] tokens; moe_unpermute: [T, H] from pairs (rows [T, k]).
    @fake("tessera::moe_permute")
    def _moe_permute(input, rows, weight=None):
        return input.new_empty((rows.shape[0] * rows.shape[1], input.shape[-1]))

    @fake("tessera::moe_unpermute")
    def _moe_unpermute(input, rows, weight=None):
        return input.new_empty((rows.shape[0], input.shape[-1]))


def _register_lowerings() -> None:
    """Gives every tessera op inductor's fallback lowering (a call of the op's kernel) before a
    graph is lowered, with the layout constraint inductor would pick for it.

    Inductor otherwise registers the fallback at the op's first use in a graph, and first formats
    that call's arguments into a log message, whether or not logging is on. An argument made by a
    chain of extern kernels (GEMMs and tessera's ops, layer after layer) prints the whole chain
    once for every path through it, which grows exponentially with the model's depth: a tessera
    op first used after the last layer could keep the compile busy for many minutes."""
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag
        for qualified in torch._C._dispatch_get_all_op_names():
            if not qualified.startswith("tessera::"):
                continue
            name, _, overload = qualified[len("tessera::"):].partition(".")
            op = getattr(getattr(ops, name), overload or "default")
            # ops with a decomposition (CompositeImplicitAutograd ones) never reach a lowering
            if op not in lowering.lowerings and op not in lowering.decompositions:
                constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
                lowering.make_fallback(op, layout_constraint=constraint, warn=False)
    except Exception as e:  # a torch whose inductor differs: compiled graphs still work, only slower to compile
        import warnings
        warnings.warn(f"tessera: could not register its ops' lowerings with torch inductor ({e!r}); "
                      "torch.compile still works, but may compile deep models slowly", stacklevel=2)


if ops is not None:
    _register_fakes()
    from . import _sharding
    from ._imports import after_import
    _sharding.install(torch)  # DTensor's rules, once torch.distributed.tensor is imported
    after_import("torch._inductor.lowering", _register_lowerings)



def _fast_index():
    """fast.call's op indices by name, or None where they do not match the library's list of the
    generic ops (the same libtessera gives both lists: a mismatch is a broken install)."""
    from ._surface import generic_descriptions
    index = {d["name"]: fast.index(d["name"]) for d in generic_descriptions()}
    return index if list(index.values()) == list(range(len(index))) else None


# What the public functions read per call (tessera._surface counts the generic ops in the same order).
_index = _fast_index() if fast is not None else {}
if _index is None:
    fast, _index = None, {}
_state.publish(torch, ops, fast, _index)
