"""Matrix operators: matmul (GEMM with a fused epilogue), linear and the two-layer MLP, on torch
tensors.

    y = tessera.matmul(a, b, bias=b0, activation="gelu")   # gelu(a @ b + b0), one kernel
    y = tessera.linear(x, w, bias)                         # F.linear: x @ w.T + bias
    y = tessera.mlp(x, w13, w2)                            # w2(silu(w1 x) * w3 x), h not saved

``matmul(input, other, *, bias=None, activation=None, residual=None, alpha=1.0, beta=0.0,
out=None, out_dtype=None)`` computes

    out = activation(alpha * (input @ other) + bias) + residual + beta * out

with the whole epilogue applied as the product is stored. ``activation`` is None, 'relu', 'gelu',
'gelu_tanh', 'silu', 'swiglu' or 'geglu'. 'swiglu' and 'geglu' are gated: the product's columns
hold gate and up interleaved in blocks of 64 (columns 128 j .. 128 j + 63 the gate of features
64 j .. 64 j + 63, the next 64 their up; for F = N / 2 not a multiple of 64 the last block is
F % 64 wide; ``swiglu_weight(w_gate, w_up)`` builds such a weight for ``linear``), and the output is
``silu(gate) * up`` ('swiglu') or ``gelu_tanh(gate) * up`` ('geglu', Gemma's), N / 2 columns (N
even; no residual or beta; on Hopper in the GEMM's epilogue where N is a multiple of 128). So ``linear(x, swiglu_weight(w1,
w3), activation="swiglu")`` is ``F.silu(x @ w1.T) * (x @ w3.T)`` from one GEMM. Under autograd the forward also stores the product (N columns: what the backward
reads), so the memory it saves is that of the separate gate and up tensors' kernel launches, not
of the product. ``input`` is [..., M, K] and ``other`` [K, N] or [..., K, N] (batch
dimensions broadcast as in torch.matmul); ``bias`` has N elements, ``residual`` the output's shape
(or one that broadcasts to it), both in the output's dtype; ``beta`` reads ``out`` (so it needs
``out=``). float16 and bfloat16 inputs run on the tensor cores where K is contiguous in both
operands (a row-major ``input`` and ``other`` = ``w.T`` of a row-major ``w``: the layout of a
linear layer), accumulating in float32; ``out_dtype=torch.float32`` keeps the float32 result.
float32 inputs follow torch's setting: exact float32 arithmetic under
``torch.set_float32_matmul_precision("highest")`` (the default), TF32 tensor cores where "high" or
"medium" (or ``torch.backends.cuda.matmul.allow_tf32 = True``) allows it, read at each call.

``scaled_mm(a, b, scale_a, scale_b, *, bias=None, out_dtype=None, residual=None, activation=None)``
is ``torch._scaled_mm`` with
per-tensor or row-wise scales: float8 ``a`` [M, K] (row-major) and ``b`` [K, N] (column-major, e.g.
``w.t()`` of a row-major [N, K] ``w``), float32 scales of one element each, or row-wise ones
(``scale_a`` [M, 1], one per row of ``a``, and ``scale_b`` [1, N], one per column of ``b``,
contiguous; one of each kind is refused, as torch refuses it): ``out[i, j] = scale_a[i] *
scale_b[j] * (a @ b)[i, j] + bias[j]``, the scales applied to the float32 sums in the GEMM's
epilogue. Output bfloat16 unless ``out_dtype`` says float16 or float32 (float8 outputs are not
offered). The products accumulate in the tensor
cores' float32 accumulator without periodic promotion, as ``use_fast_accum=True`` does.
Block-wise scales (DeepSeek-V3's recipe; e4m3): ``scale_a`` [M, ceil(K / 128)], one per 1 x 128
block of a row of ``a``, and ``scale_b`` [ceil(K / 128), ceil(N / 128)], one per 128 x 128 block of
``b`` (or [ceil(K / 128), N], one per 1 x 128 block of a column of ``b``: the weight gradient's
layout, both operands activations), any strides: each 128-deep block of K is multiplied on its own, its float32 sums scaled by
its blocks' scales and added to the others' in float32 (the promotion out of the tensor core
that bounds the error at large K). A last partial block of K or N has its own scale. After the
scales, matmul's epilogue: ``activation`` of the scaled product plus bias (swiglu and geglu pair
its columns, N / 2 out), then ``residual``, in the same kernel (the gated ones: the product,
then the gated op).
No autograd.

Autograd: torch.ops.tessera.matmul's own (C++; a call that needs it without the torch ops is
refused). Its backward runs tessera matmuls (dA = alpha dZ B^T, dB = alpha A^T dZ, dbias = sum of
dZ), with dZ the gradient through the activation (tessera's gelu/silu backward kernels), which
reads the pre-activation product: the forward keeps the whole epilogue fused, its kernel storing
the product before the activation as a second output (torch.ops.tessera.matmul.preactivation).

``mlp(input, w_in, w_out, *, activation="swiglu")`` is ``linear(linear(input, w_in,
activation=activation), w_out)``: a feed-forward block without biases (Llama's, with ``w_in =
swiglu_weight(w1, w3)`` and ``w_out = w2``). ``input`` is [..., K], ``w_in`` [N, K], ``w_out``
[D, N] ([D, N / 2] for 'swiglu' and 'geglu'), all of one dtype (float32, float16, bfloat16; CUDA tensors only);
``activation`` as matmul's (None too). Under autograd it saves what the backward needs but not the
hidden activation h = activation(x w_in^T): the first GEMM's kernel stores the product
z = x w_in^T beside h (torch.ops.tessera.mlp.preactivation), and the forward saves x, the weights
and z, and frees h when it returns; the backward recomputes h from z (for the gated ones in the same pass that gives dz), as
torch.compile's partitioner does for two linears. Per layer that saves h's [tokens, N / 2] (or
[tokens, N]) elements against the two-linear composition, which keeps z for the first linear's
activation and h for the second's weight gradient. Without autograd it is the two GEMMs, h in a
workspace between them.

Torch tensors only for now (DLPack arrays: through the C++ API). DTensors (tensor parallelism) take
the registered op, which runs on the shards by its sharding rules (tessera/_sharding.py: rows or
batch of ``input``, columns of ``other``, or K of both as a partial sum); a replicated ``bias`` or
``residual`` is split first to go with the shards (DTensor does not redistribute the op's keyword
arguments). mlp shards the rows of ``input`` (weights replicated), or runs Megatron's MLP:
``w_in``'s rows and ``w_out``'s columns sharded (for 'swiglu' in whole 128-row gate/up blocks),
``input`` replicated, the output a partial sum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from . import _C, _interop, _state
from ._interop import as_arg, torch_if_tensor, torch_stream, torch_view

if TYPE_CHECKING:
    import torch

__all__ = ["matmul", "linear", "mlp", "scaled_mm", "grouped_mm", "swiglu_weight"]

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
GATED = ("swiglu", "geglu")  # half the product's columns out
SWIGLU_BLOCK = 64  # gate and up interleave in blocks of this many columns (features)


def _activation(activation, op: str = "matmul") -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"tessera.{op}: argument 'activation': expected None, 'relu', 'gelu', "
                         f"'gelu_tanh', 'silu', 'swiglu' or 'geglu', got {activation!r}")
    return activation or "none"


def _torch_only(x, arg: str, op: str = "matmul"):
    torch = torch_if_tensor(x, init=True)  # loads the torch ops on a first call
    if torch is None:
        raise TypeError(f"tessera.{op}: argument '{arg}': expected a torch tensor (DLPack arrays "
                        f"go through the C++ API for now), got {type(x).__name__}")
    return torch


def _as_3d(torch, t, batch_shape, rows, cols):
    """t broadcast to batch_shape + (rows, cols) as a 2-d tensor (no batch) or a 3-d one."""
    if not batch_shape:
        return t
    if t.dim() == 2:  # shared by every batch
        return t
    t = t.expand(*batch_shape, rows, cols)
    if len(batch_shape) == 1:
        return t
    try:
        return t.view(-1, rows, cols)
    except RuntimeError:  # batch dimensions that do not flatten in place
        return t.reshape(-1, rows, cols)


def _forward(torch, a, b, bias, activation, residual, alpha, beta, out, out_dtype):
    """The product with its epilogue, without autograd; returns the output tensor."""
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"tessera.matmul: arguments 'input' and 'other': expected at least 2 "
                         f"dimensions, got {a.dim()} and {b.dim()}")
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch_shape = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    out_shape = batch_shape + (m, n // 2 if activation in GATED else n)
    dtype = out_dtype if out_dtype is not None else a.dtype
    allocate = out is None
    if out is None:
        if beta != 0:
            raise ValueError("tessera.matmul: argument 'beta': a nonzero beta reads 'out', "
                             "which was not given")
        if _state.ops is None:
            out = torch.empty(out_shape, dtype=dtype, device=a.device)
    elif tuple(out.shape) != out_shape:
        raise ValueError(f"tessera.matmul: argument 'out': expected shape {list(out_shape)}, got "
                         f"{list(out.shape)}")
    a3 = _as_3d(torch, a, batch_shape, m, k)
    b3 = _as_3d(torch, b, batch_shape, b.shape[-2], n)
    if a3.dim() == 2 and b3.dim() == 3:
        a3 = a3.unsqueeze(0)  # the library takes a 3-d output only with a 3-d operand batch
    r3 = None
    if residual is not None:
        _torch_only(residual, "residual")
        if tuple(residual.shape) != out_shape:
            try:
                residual = residual.expand(out_shape)
            except RuntimeError:
                raise ValueError(f"tessera.matmul: argument 'residual': expected a shape that "
                                 f"broadcasts to {list(out_shape)}, got "
                                 f"{list(residual.shape)}") from None
        r3 = _as_3d(torch, residual, batch_shape, m, n)
    if allocate and _state.ops is not None:  # the registered op allocates the output; it reads
        # torch's float32 matmul precision itself (at run time, also in a compiled graph)
        result = _state.ops.matmul.default(
            a3, b3, bias=bias, residual=r3, activation=_activation(activation), alpha=float(alpha),
            out_dtype=out_dtype)
        return result if len(batch_shape) <= 1 else result.view(out_shape)
    # TF32 for float32 inputs where torch's matmul precision allows it, read at each call.
    tf32 = a.dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"
    o3 = out if len(batch_shape) <= 1 else out.view(-1, m, out_shape[-1])
    av = torch_view(a3)
    _C.matmul(av, as_arg(torch, b3, "matmul", "other"), as_arg(torch, o3, "matmul", "out"),
              as_arg(torch, bias, "matmul", "bias"), as_arg(torch, r3, "matmul", "residual"),
              _activation(activation), float(alpha), float(beta), tf32, torch_stream(av))
    return out


def matmul(input: torch.Tensor, other: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None,
           alpha: float = 1.0, beta: float = 0.0, out: Optional[torch.Tensor] = None,
           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``activation(alpha * (input @ other) + bias) + residual + beta * out`` in one kernel; see
    the module's documentation."""
    fast = _state.fast
    if fast is not None and activation is None and residual is None and alpha == 1 and beta == 0 \
            and out is None and out_dtype is None and not _state.dynamo_compiling():
        r = fast.matmul(input, other) if bias is None else fast.matmul(input, other, bias)
        if r is not None:
            return r
    if type(input) is not _state.Tensor and (bias is not None or residual is not None) \
            and hasattr(input, "placements") and hasattr(other, "placements"):  # DTensors
        bias, residual = _epilogue_as_placed(input, other, bias, residual, activation)
    ops = _state.ops
    if ops is not None and out is None and residual is None and beta == 0 \
            and isinstance(input, _state.Tensor) and isinstance(other, _state.Tensor) \
            and input.dim() == 2 and other.dim() == 2 and input.is_cuda \
            and input.dtype in _state.FLOATS and other.dtype is input.dtype \
            and type(alpha) in (int, float) and math.isfinite(alpha):
        return ops.matmul.default(input, other, bias=bias, activation=_activation(activation),
                                  alpha=alpha, out_dtype=out_dtype)
    if bias is None and activation is None and residual is None and alpha == 1 and beta == 0 \
            and out is None and out_dtype is None and _torch_takes_over(input, other):
        return _state.torch_module.matmul(input, other)
    torch = _torch_only(input, "input")
    _torch_only(other, "other")
    _activation(activation)
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)):
        raise TypeError(f"tessera.matmul: argument 'alpha': expected a finite number, got {alpha!r}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (input, other, bias, residual)):
        if out is not None or beta != 0:
            raise RuntimeError("tessera.matmul: out= and beta are not differentiable; call it "
                               "under torch.no_grad() or without them")
        _interop.needs_ops("matmul")  # the registered op's autograd (C++)
        return _forward(torch, input, other, bias, activation, residual, alpha, 0.0, None,
                        out_dtype)
    return _forward(torch, input, other, bias, activation, residual, alpha, beta, out, out_dtype)


_LINEAR = ("sum", "avg")  # the partial sums a product (and its epilogue without activation) keeps


def _epilogue_as_placed(a, b, bias, residual, activation):
    """For DTensor operands: bias and residual placed as the sharding rule of
    torch.ops.tessera.matmul (tessera/_sharding.py) takes them beside a and b as they are. The op
    takes them by keyword, which DTensor does not redistribute, so a replicated one is split here
    (no communication: a local slice, or a division for a partial sum), as DTensor splits
    aten.addmm's bias: along the output's columns where other's are sharded (for 'swiglu' where a
    shard holds whole gate/up blocks), along its rows or batch where input's are (residual
    only), into a partial sum where the product is one (K sharded in both, or an operand a
    partial sum, the other replicated; without an activation). Other placements stay."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    nd = 3 if a.dim() == 3 or b.dim() == 3 else 2
    n = b.shape[-1]
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
    shape = ((batch,) if nd == 3 else ()) + (a.shape[-2], n // 2 if activation in GATED else n)
    columns = activation not in GATED or n % (2 * SWIGLU_BLOCK * b.device_mesh.size()) == 0
    targets = []  # per mesh dimension: a Partial, the output's sharded dimension, or None
    for pa, pb in zip(a.placements, b.placements):
        target = None
        if activation is None and pa == Shard(a.dim() - 1) and pb == Shard(b.dim() - 2):
            target = Partial()
        elif activation is None and pa.is_partial() and pa.reduce_op in _LINEAR and pb.is_replicate():
            target = Partial(pa.reduce_op)
        elif activation is None and pa.is_replicate() and pb.is_partial() and pb.reduce_op in _LINEAR:
            target = Partial(pb.reduce_op)
        elif pa.is_replicate() and pb == Shard(b.dim() - 1) and columns:
            target = nd - 1
        elif pa == Shard(a.dim() - 2) and pb.is_replicate():
            target = nd - 2
        else:
            a_batch = a.dim() == 3 and a.shape[0] == batch > 1 and pa == Shard(0)
            b_batch = b.dim() == 3 and b.shape[0] == batch > 1 and pb == Shard(0)
            if (a_batch or b_batch) and (a_batch or pa.is_replicate()) and (b_batch or pb.is_replicate()):
                target = 0
        targets.append(target)

    def place(t, is_bias):
        if not hasattr(t, "placements") or t.device_mesh != a.device_mesh:
            return t
        new = []
        for p, target in zip(t.placements, targets):
            if not p.is_replicate() or target is None:
                new.append(p)
            elif isinstance(target, Partial):
                new.append(target)
            elif is_bias:
                new.append(Shard(t.dim() - 1) if target == nd - 1 else Replicate())
            else:  # residual: its own dimension along the output's, unless broadcast there
                k = target - (nd - t.dim())
                new.append(Shard(k) if k >= 0 and t.shape[k] == shape[target] else Replicate())
        if new == list(t.placements):
            return t
        if any(p.is_partial() for p in new):  # DTensor.redistribute keeps Replicate -> Partial for
            # its own use (as for aten.addmm's bias): its autograd function, which it calls.
            from torch.distributed.tensor._redistribute import Redistribute
            return Redistribute.apply(t, t.device_mesh, tuple(new))
        return t.redistribute(t.device_mesh, new)

    return (None if bias is None else place(bias, True)), (None if residual is None else place(residual, False))


def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           activation: Optional[str] = None) -> torch.Tensor:
    """``torch.nn.functional.linear``: ``input @ weight.T + bias`` (weight [N, K]), with an
    optional fused activation."""
    fast = _state.fast
    if fast is not None and activation is None and not _state.dynamo_compiling():
        r = fast.linear(input, weight) if bias is None else fast.linear(input, weight, bias)
        if r is not None:
            return r
    if activation is None and _torch_takes_over(input, weight, bias):
        return _state.torch_module.nn.functional.linear(input, weight, bias)
    _torch_only(weight, "weight")
    return matmul(input, weight.transpose(-1, -2), bias=bias, activation=activation)


def mlp(input: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, *,
        activation: Optional[str] = "swiglu") -> torch.Tensor:
    """``linear(linear(input, w_in, activation=activation), w_out)`` (no biases), whose autograd
    saves the pre-activation product and recomputes the hidden activation in the backward; see the
    module's documentation."""
    name = _activation(activation, "mlp")
    fast = _state.fast
    if fast is not None and not _state.dynamo_compiling():
        r = fast.mlp(input, w_in, w_out, name)
        if r is not None:
            return r
    for arg, t in (("input", input), ("w_in", w_in), ("w_out", w_out)):
        _torch_only(t, arg, "mlp")
    return _interop.needs_ops("mlp", "needs").mlp.default(input, w_in, w_out, activation=name)


def swiglu_weight(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """The [2 F, K] weight whose product with ``linear(x, w, activation="swiglu")`` is
    ``silu(x @ w_gate.T) * (x @ w_up.T)`` (and with activation 'geglu', GeGLU's): the rows of
    ``w_gate`` and ``w_up`` (each [F, K]) interleaved in blocks of 64, the last block F % 64 rows of
    each where F is not a multiple of 64. A new tensor (differentiable: gradients flow back to
    both); for a model's parameter, build it once and keep it as the parameter."""
    torch = _torch_only(w_gate, "w_gate")
    _torch_only(w_up, "w_up")
    if w_gate.dim() != 2 or w_gate.shape != w_up.shape:
        raise ValueError(f"tessera.swiglu_weight: arguments 'w_gate' and 'w_up': expected two [F, K] "
                         f"tensors of one shape, got {list(w_gate.shape)} and {list(w_up.shape)}")
    f, k = w_gate.shape
    whole = f - f % SWIGLU_BLOCK
    blocks = (whole // SWIGLU_BLOCK, SWIGLU_BLOCK, k)
    head = torch.stack((w_gate[:whole].reshape(blocks), w_up[:whole].reshape(blocks)), 1).reshape(2 * whole, k)
    return torch.cat((head, w_gate[whole:], w_up[whole:])) if whole < f else head


def _torch_takes_over(input, other, bias=None) -> bool:
    """torch's contract for matmul and linear called with torch's arguments alone: torch's own
    function for tensors tessera's kernels do not take (CPU, float64, integer or mixed dtypes) and
    for shapes outside them (1-d, or more than 3 dimensions)."""
    global _kernel_dtypes
    torch = torch_if_tensor(input)
    if torch is None:
        return False
    if _kernel_dtypes is None:
        _kernel_dtypes = frozenset(getattr(torch, n) for n in (
            "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
    if _interop.outside_kernels(input, other, bias, dtypes=_kernel_dtypes):
        return True
    return isinstance(other, torch.Tensor) and (input.dim() not in (2, 3)
                                                or other.dim() not in (2, 3))


_kernel_dtypes = None  # matmul's dtypes as torch dtypes, once torch is seen


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Optional[torch.Tensor] = None, *,
               bias: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None, validate: bool = False) -> torch.Tensor:
    """``torch._grouped_mm``: a product per group in one call (a Mixture-of-Experts layer's tokens
    grouped by expert), float32 accumulation, differentiable; ``offs`` (int32, the groups'
    cumulative ends) stays on the GPU.

    - ``mat_a [M, K] @ mat_b [G, K, N]``, offs over M: ``[M, N]``, rows of group g times ``mat_b[g]``;
    - ``mat_a [G, M, K] @ mat_b [K, N]``, offs over N: ``[M, N]``;
    - ``mat_a [M, K] @ mat_b [K, N]``, offs over K: ``[G, M, N]`` (the weights' gradient form);
    - ``mat_a [G, M, K] @ mat_b [G, K, N]``, no offs: ``[G, M, N]``.

    Group g spans ``[offs[g-1], offs[g])``; rows (columns) past the last offset are zero, as is an
    empty group's product. Offsets that decrease or pass the extent are clamped, never read out of
    bounds, and not checked on the host (that would wait for the GPU) unless ``validate=True``: then
    offsets that decrease, or whose last is not the grouped extent, are a ValueError naming
    ``offs`` (one synchronization). float32, float16 and
    bfloat16; ``out_dtype`` the inputs' or float32. Every gradient is a grouped product too.
    Tensors tessera's kernels do not take (CPU, float64) go to ``torch._grouped_mm``."""
    torch = _torch_only(mat_a, "mat_a", "grouped_mm")
    _torch_only(mat_b, "mat_b", "grouped_mm")
    if mat_a.is_cuda and mat_b.dtype != mat_a.dtype:
        raise TypeError(f"tessera.grouped_mm: argument 'mat_b': expected mat_a's dtype {mat_a.dtype}, "
                        f"got {mat_b.dtype}")
    if validate and offs is not None:
        _validate_offs(torch, mat_a, mat_b, offs)
    if _interop.outside_kernels(mat_a, mat_b) and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(mat_a, mat_b, offs, bias=bias, out_dtype=out_dtype)  # torch's, or its error
    if bias is not None:
        raise ValueError("tessera.grouped_mm: argument 'bias': not supported (as torch._grouped_mm); "
                         "expected None")
    return _interop.needs_ops("grouped_mm", "needs").grouped_mm.default(mat_a, mat_b, offs, out_dtype=out_dtype)


def _validate_offs(torch, a, b, offs) -> None:
    """grouped_mm's offsets non-decreasing and ending at the grouped extent (rows, columns or K)."""
    extent = a.shape[-1] if a.dim() == 2 and b.dim() == 2 else a.shape[0] if a.dim() == 2 else b.shape[-1]
    o = offs.long()
    bad = (o[1:] < o[:-1]).any() | (o[:1] < 0).any() | (o[-1:] != extent).any() if o.numel() else False
    if bool(bad):
        raise ValueError(f"tessera.grouped_mm: argument 'offs': expected non-decreasing cumulative ends ending at "
                         f"{extent}, got {offs.tolist()}")


def _scales_kind(torch, input, other, scale_a, scale_b) -> str:
    """scaled_mm's kind of scales: 'tensor', 'row' or 'block'; raises as the library's check does,
    on any device (input and other 2-d)."""
    for arg, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            raise TypeError(f"tessera.scaled_mm: argument '{arg}': expected dtype in {{float32}}, "
                            f"got {str(s.dtype).replace('torch.', '')}")
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"
    m, n, k = input.shape[0], other.shape[1], input.shape[1]
    kb, nb = -(-k // 128), -(-n // 128)
    fits_a, fits_b = tuple(scale_a.shape) == (m, 1), tuple(scale_b.shape) == (1, n)
    rows_a, cols_b = fits_a and scale_a.is_contiguous(), fits_b and scale_b.is_contiguous()
    if rows_a and cols_b:
        return "row"
    blocks_a = tuple(scale_a.shape) == (m, kb)
    if blocks_a and tuple(scale_b.shape) in ((kb, nb), (kb, n)):
        if input.dtype != torch.float8_e4m3fn:
            raise TypeError(f"tessera.scaled_mm: argument 'input': expected float8_e4m3fn with block-wise "
                            f"scales, got {str(input.dtype).replace('torch.', '')}")
        return "block"

    def got(s, fits):
        shape = "[" + ", ".join(str(d) for d in s.shape) + "]"
        return shape + (" (not contiguous)" if fits and not s.is_contiguous() else "")
    arg = "scale_b" if rows_a or scale_a.numel() == 1 or blocks_a else "scale_a"
    raise ValueError(f"tessera.scaled_mm: argument '{arg}': expected both of one element (per-tensor); "
                     f"'scale_a' [{m}, 1] and 'scale_b' [1, {n}], contiguous (row-wise); or 'scale_a' [{m}, {kb}] "
                     f"and 'scale_b' [{kb}, {nb}] or [{kb}, {n}] (block-wise: 1 x 128 blocks, and 128 x 128 or 1 x 128); "
                     f"not two kinds, "
                     f"got 'scale_a' {got(scale_a, fits_a)} and 'scale_b' {got(scale_b, fits_b)}")


def scaled_mm(input: torch.Tensor, other: torch.Tensor, scale_a: torch.Tensor,
              scale_b: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
              out_dtype: Optional[torch.dtype] = None,
              scale_result: Optional[torch.Tensor] = None,
              use_fast_accum: bool = True, beta: float = 0.0,
              out: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
              activation: Optional[str] = None) -> torch.Tensor:
    """``torch._scaled_mm`` with per-tensor, row-wise or block-wise scales: ``scale_a * scale_b *
    (input @ other) + bias`` for float8 inputs, scale_a one element or [M, 1], scale_b one element
    or [1, N]; or (e4m3) scale_a [M, ceil(K / 128)] and scale_b [ceil(K / 128), ceil(N / 128)], one
    per 1 x 128 block of input's rows and per 128 x 128 block of other; see the module's
    documentation. Then :func:`matmul`'s epilogue: ``activation`` (None, 'relu', 'gelu', 'gelu_tanh',
    'silu'; 'swiglu' and 'geglu' pair the product's columns as matmul's do, N / 2 of them out)
    and ``residual`` ([M, N], out's dtype) added after it. ``out`` [M, N] (bfloat16, float16 or
    float32) takes the result, plus ``beta`` times its old values where beta is not 0
    (per-tensor and row-wise scales: a product accumulated over calls, as a gradient over chunks
    of K); neither is differentiable."""
    torch = _torch_only(input, "input", "scaled_mm")
    for arg, t in (("other", other), ("scale_a", scale_a), ("scale_b", scale_b)):
        _torch_only(t, arg, "scaled_mm")
    if scale_result is not None:
        raise ValueError("tessera.scaled_mm: argument 'scale_result': float8 outputs are not "
                         "offered, so there is no result scale; expected None")
    if input.dim() != 2 or other.dim() != 2:
        raise ValueError(f"tessera.scaled_mm: arguments 'input' and 'other': expected 2-d "
                         f"tensors, got {input.dim()}-d and {other.dim()}-d")
    _scales_kind(torch, input, other, scale_a, scale_b)
    activation = _activation(activation, "scaled_mm")
    n = other.shape[1] // 2 if activation in ("swiglu", "geglu") else other.shape[1]
    if out is None:
        if beta != 0:
            raise ValueError("tessera.scaled_mm: argument 'beta': a nonzero beta reads 'out', which was not "
                             "given")
        if _state.ops is not None:
            return _state.ops.scaled_mm.default(input, other, scale_a, scale_b, bias=bias,
                                                  out_dtype=out_dtype, residual=residual, activation=activation)
        dtype = out_dtype if out_dtype is not None else torch.bfloat16
        out = torch.empty((input.shape[0], n), dtype=dtype, device=input.device)
    else:
        _torch_only(out, "out", "scaled_mm")
        if tuple(out.shape) != (input.shape[0], n):
            raise ValueError(f"tessera.scaled_mm: argument 'out': expected shape "
                             f"{[input.shape[0], n]}, got {list(out.shape)}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"tessera.scaled_mm: argument 'out': expected out_dtype {out_dtype}, got "
                             f"{out.dtype}")
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (input, other, scale_a, scale_b, bias, residual)):
            raise RuntimeError("tessera.scaled_mm: out= and beta are not differentiable; call it under "
                               "torch.no_grad() or without them")
    av = torch_view(input)
    _C.scaled_mm(av, as_arg(torch, other, "scaled_mm", "other"),
                 as_arg(torch, scale_a, "scaled_mm", "scale_a"),
                 as_arg(torch, scale_b, "scaled_mm", "scale_b"), torch_view(out),
                 as_arg(torch, bias, "scaled_mm", "bias"), float(beta),
                 as_arg(torch, residual, "scaled_mm", "residual"), activation, torch_stream(av))
    return out
