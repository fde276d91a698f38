"""Float8 training for torch models: torchao's ``convert_to_float8_training`` with tessera's
recipes, and the quantization they are made of.

    import tessera.float8 as f8
    f8.convert_to_float8_training(model, recipe="rowwise")   # nn.Linear -> f8.Float8Linear, in place
    q, scale = f8.quantize(x, "row")                         # x ~ q * scale, q float8_e4m3fn

Recipes (the scales of each GEMM's operands, along that GEMM's K; e4m3 everywhere):

- ``tensorwise``: one scale per operand;
- ``rowwise``: one per row of the left operand and per column of the right one;
- ``blockwise`` (DeepSeek-V3's): activations and gradients one per 1 x 128 block along K (a last
  partial block its own), weights one per 128 x 128 block.

Each Float8Linear GEMM (forward, dgrad, wgrad) quantizes its operands along its own K: the forward
x and the weight along in_features, dgrad the output gradient and the weight along out_features,
wgrad the output gradient and x along the tokens. A group is quantized as torchao quantizes: its
multiplier m = 448 / max(amax, 1e-12), computed in float64 and rounded to float32, the elements
x * m rounded to float32 and then to e4m3 (nearest, saturated at +-448); its scale, the
dequantization factor (``x ~ q * scale``), is 1 / m in float32 (tensorwise, the bytes and scales
of torchao's cast). A group holding inf or NaN takes a NaN scale, so its products are NaN where
they would be inf or NaN in bfloat16 too; nothing is clamped silently.

On a Hopper GPU (sm_90, the float8 tensor cores tessera's kernels run on) every recipe runs each
GEMM on ``tessera.scaled_mm``: the quantized operands multiplied as float8, the scales (one per
tensor, or per row of each operand) applied to the float32 sums in the kernel's epilogue, or
(blockwise) each 128-deep block of K's sums scaled and added in float32 (wgrad's right operand,
x, by 1 x 128 blocks of its columns). wgrad's K (the tokens) is padded with zeros to a multiple
of 16, the rows the copy engine takes; zeros change neither the scales nor the sums. The
operands are quantized by tessera's float8_quantize kernel (the same bits as ``quantize``'s torch
code), each tensor once: x and the weight in the forward, by rows and (where the backward needs
them) by columns, transposed, from one read (an x that several layers take in turn, as
attention's q, k and v projections do, once for all of them); the output gradient in the
backward, by rows for dgrad and by columns for wgrad in one call. The block granularities take
one pass (a 128 x 128 tile holds every block it touches); the per-row and per-tensor ones two
over the columns' copy. The backward keeps those float8 copies rather than x and the weight.
Elsewhere (the CPU, other GPUs) the GEMMs are emulated: quantize,
dequantize, then torch's GEMM in float32.
That is the recipes' exact numerics (products of dequantized operands, accumulated in float32),
the reference tessera's fp8 kernels are verified against, and no faster than bfloat16; the
kernels differ from it by their accumulation (the tensor cores' float8 sums keep about 14 bits)
and by rounding the output once. Float8Linear is a subclass of torch.nn.Linear with the same
parameters, so state_dicts load either way.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Optional

__all__ = ["RECIPES", "GRANULARITIES", "E4M3_MAX", "AMAX_FLOOR", "quantize", "dequantize", "rms_norm", "add_rms_norm",
           "convert_to_float8_training",
           "drop_cached_weights", "gated_linear", "linear_cross_entropy", "Float8Linear"]

RECIPES = ("tensorwise", "rowwise", "blockwise")
GRANULARITIES = ("tensor", "row", "block", "block2d")
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-12  # torchao's: an amax below it counts as it
BLOCK = 128

# each GEMM's operands' granularity by recipe: (activation or gradient, weight)
_OPERANDS = {"tensorwise": ("tensor", "tensor"), "rowwise": ("row", "row"), "blockwise": ("block", "block2d")}


def _groups(torch, x, granularity: str):
    """x [M, K] (K last) as [groups..., members] for the amax: the reduction's view."""
    m, k = x.shape
    if granularity == "tensor":
        return x.reshape(1, -1)
    if granularity == "row":
        return x
    if granularity == "block":  # a last block of fewer than 128 padded with zeros
        pad = -k % BLOCK
        x = torch.nn.functional.pad(x, (0, pad)) if pad else x
        return x.reshape(m, (k + pad) // BLOCK, BLOCK)
    return x.reshape(m // BLOCK, BLOCK, k // BLOCK, BLOCK).transpose(1, 2).reshape(m // BLOCK, k // BLOCK, -1)


def _scale_shape(shape, granularity: str, columns: bool = False):
    """The scale's shape for x of ``shape`` [M, K], or (``columns``) that of x's columns quantized
    along M (float8_quantize's scale_t): one per column ('row'), per 128 x 1 block of a column
    ('block'); 'tensor' and 'block2d' the same either way."""
    m, k = shape
    if columns:
        return {"tensor": (), "row": (1, k), "block": (-(-m // BLOCK), k), "block2d": (m // BLOCK, k // BLOCK)}[granularity]
    return {"tensor": (), "row": (m, 1), "block": (m, -(-k // BLOCK)), "block2d": (m // BLOCK, k // BLOCK)}[granularity]


def _expand(scale, shape, granularity: str):
    """The scale broadcast over the [M, K] elements it applies to."""
    k = shape[1]
    if granularity in ("tensor", "row"):
        return scale
    if granularity == "block":
        return scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    return scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)


def _check(x, granularity: str, op: str = "quantize"):
    if granularity not in GRANULARITIES:
        raise ValueError(f"tessera.float8.{op}: argument 'granularity': expected one of {GRANULARITIES}, "
                         f"got {granularity!r}")
    if x.dim() != 2:
        raise ValueError(f"tessera.float8.{op}: argument 'x': expected a 2-d tensor [M, K] (K the GEMM's depth), "
                         f"got {x.dim()}-d")
    if not x.is_floating_point():
        raise TypeError(f"tessera.float8.{op}: argument 'x': expected a floating-point tensor, got {x.dtype}")
    m, k = x.shape
    if granularity == "block2d" and (m % BLOCK or k % BLOCK):
        raise ValueError(f"tessera.float8.{op}: argument 'x': [{m}, {k}] is not a whole number of {BLOCK} x "
                         f"{BLOCK} blocks")


def quantize(x, granularity: str = "row"):
    """(q, scale): x [M, K] in float8_e4m3fn and the float32 dequantization factors, one per
    group: 'tensor' (a 0-d scale), 'row' ([M, 1]), 'block' (1 x 128 along K: [M, K / 128]) or
    'block2d' (128 x 128: [M / 128, K / 128]); x ~ q * scale (see the module's documentation).
    A last 1 x 128 block of fewer than 128 (K not a multiple of 128: the tokens, as wgrad's K) is
    its own group; 128 x 128 blocks must tile x whole. On CUDA, every granularity runs on
    tessera's float8_quantize kernel (one read of x), the same bits as the torch code here."""
    _check(x, granularity)
    if _kernel_takes(x, granularity):
        return _kernel_quantize(x, granularity)
    return _torch_quantize(x, granularity)


def _torch_quantize(x, granularity: str):
    """quantize in torch's operations: the reference the kernel is verified against, and the
    CPU's path."""
    import torch
    xf = x.detach().float()
    g = _groups(torch, xf, granularity)
    amax = g.abs().amax(-1)
    finite = torch.isfinite(g).all(-1)
    # torchao's amax_to_scale: 448 / amax in float64 (torch divides a number by a tensor as the
    # number times the tensor's reciprocal), rounded to float32; the scale its reciprocal.
    mult = (E4M3_MAX / amax.double().clamp(min=AMAX_FLOOR)).float()
    nan = torch.full_like(mult, float("nan"))  # torch's NaN on every device, not 1 / NaN's
    mult = torch.where(finite, mult, nan)
    scale = torch.where(finite, torch.ones_like(mult) / mult, nan).reshape(_scale_shape(x.shape, granularity))
    y = xf * _expand(mult.reshape(scale.shape), x.shape, granularity)
    q = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _kernel_takes(x, granularity: str, columns: bool = False) -> bool:
    """Whether tessera's float8_quantize kernel takes ``x``: CUDA, a 16- or 32-bit float, an
    element to take the amax of (and with the transposed copy, M and K multiples of 16, the GEMMs'
    K step)."""
    if granularity not in GRANULARITIES or not getattr(x, "is_cuda", False) or x.numel() == 0:
        return False
    import torch
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return not columns or (x.shape[0] % 16 == 0 and x.shape[1] % 16 == 0)


def _kernel_quantize(x, granularity: str, columns: bool = False, rows: bool = True):
    """tessera's float8_quantize on a CUDA tensor x [M, K]: (q, scale), and with ``columns`` also
    (q_t, scale_t): x's columns quantized along M, transposed, q_t [K, M] and scale_t
    (_scale_shape's with columns: 'row' [1, K], one per column of x, the shape of scaled_mm's
    scale_b for q_t.t() as its right operand, scale_t.t() scale_a's [K, 1] for q_t as its left one;
    'block' [M / 128, K], per-column block scales likewise; 'tensor' and 'block2d' the values of
    scale). One read of x for both layouts. ``rows`` False (with ``columns``): (q_t, scale_t)
    alone, the rows' products skipped (float8_quantize.transposed)."""
    from . import _C, _state
    from ._interop import torch_if_tensor, torch_stream, torch_view
    torch = torch_if_tensor(x, init=True)  # loads the torch ops on a first call
    x = x.detach()
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        x = x.contiguous()
    if not rows and not columns:
        raise ValueError("tessera.float8: argument 'columns': expected True where 'rows' is False")
    if _state.fast is not None and not _state.dynamo_compiling():  # the kernel at once
        out = _state.fast.float8_quantize(x, granularity, columns, rows)
        if out is not None:
            return out
    if _state.ops is not None:
        op = _state.ops.float8_quantize
        op = op.default if not columns else op.columns if rows else op.transposed
        return tuple(op(x, granularity=granularity))
    if not rows:  # the extension's entry writes both layouts
        return _kernel_quantize(x, granularity, True)[2:]
    m, k = x.shape
    out = [torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device),
           torch.empty(_scale_shape((m, k), granularity), dtype=torch.float32, device=x.device)]
    if columns:
        out += [torch.empty((k, m), dtype=torch.float8_e4m3fn, device=x.device),
                torch.empty(_scale_shape((m, k), granularity, True), dtype=torch.float32, device=x.device)]
    xv = torch_view(x)
    _C.float8_quantize(xv, *(torch_view(t) for t in out[:2]),
                       *((torch_view(t) for t in out[2:]) if columns else (None, None)),
                       granularity, torch_stream(xv))
    return tuple(out)


def dequantize(q, scale, granularity: str):
    """q * scale in float32, the scale broadcast over its group."""
    _check(q, granularity, "dequantize")
    return q.float() * _expand(scale, q.shape, granularity)


def _fake(x, granularity: str):
    """x through the recipe's rounding: quantized along its last dimension, dequantized."""
    return dequantize(*quantize(x, granularity), granularity)


def _on_kernels(x, recipe: str) -> bool:
    """Whether a GEMM of ``recipe`` on ``x``'s device runs on tessera.scaled_mm: every recipe's
    scales on the sm90 tier's float8 tensor cores (other GPUs would take its SIMT fallback, slower
    than the emulation's torch GEMM)."""
    if recipe not in RECIPES or not x.is_cuda:
        return False
    import torch
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):  # the quantizing kernel's inputs
        return False
    return _major(x.device.index) == 9


@functools.lru_cache(maxsize=None)
def _major(index: int) -> int:
    """The compute capability's major version of CUDA device ``index`` (asked once: each
    Float8Linear call consults it)."""
    import torch
    return torch.cuda.get_device_capability(index)[0]


def _cast(t, dtype):
    """t in dtype, t itself where it is one already: an autograd.Function's output that is
    ``.to()`` of its own dtype (an alias) gets a zero gradient under torch.compile."""
    return t if t.dtype == dtype else t.to(dtype)


def _scaled(qa, sa, qb_t, sb, out_dtype):
    """qa [M, K] @ qb_t [K, N] (column-major) on tessera.scaled_mm, sa [M, 1] and sb [1, N] (or
    one element each), in out_dtype (float32 kept where scaled_mm has no such output)."""
    import torch
    from . import _state, matrix
    kept = out_dtype if out_dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    # Operands made here are valid: the kernel at once, without the dispatcher or the public
    # function's Python checks (not while dynamo traces).
    fast = _state.fast
    out = fast.scaled_mm(qa, qb_t, sa, sb, kept) if fast is not None and not _state.dynamo_compiling() else None
    if out is None:
        out = matrix.scaled_mm(qa, qb_t, sa, sb, out_dtype=kept)
    return _cast(out, out_dtype)


def _pad_rows(t, multiple: int = 16):
    """t [M, K] with zero rows to a multiple of ``multiple`` (no copy where it is one already):
    zeros change neither a column's amax nor a product's sums."""
    import torch
    pad = -t.shape[0] % multiple
    return torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t


def _quantize_blocks(t, granularity: str, columns: bool):
    """_quantize_both's block granularities in torch's operations (where the kernel does not take
    t): 'block' rows (scale [M, K / 128]) and columns (q_t [K, M'], scale_t [M' / 128, K]:
    scaled_mm's per-column scale_b for q_t.t() as its right operand, scale_t.t() its scale_a as
    the left one); 'block2d' (scale [M / 128, K / 128]) and its transpose, the same blocks
    (scale_t = scale, scale_b for q_t.t())."""
    q, scale = _torch_quantize(t, granularity)
    if not columns:
        return q, scale, None, None
    if granularity == "block2d":
        return q, scale, q.t().contiguous(), scale
    q_t, scale_t = _torch_quantize(_pad_rows(t).t(), "block")
    return q, scale, q_t, scale_t.t()


def _as_right(scale, granularity: str):
    """A scale of the rows of q [N, K] as scaled_mm's scale_b for q.t() [K, N]."""
    if not scale.dim():
        return scale
    return scale.t() if granularity == "block2d" else scale.reshape(1, -1)


def _quantize_both(t, granularity: str, columns: bool, rows: bool = True):
    """One kernel call for a tensor quantized along its rows for one GEMM and (``columns``) along
    its columns for another: (q, scale, q_t, scale_t) of t's rows padded to 16 where columns are
    asked for, q and scale cut back to t's rows; q_t and scale_t None without columns, q and
    scale None without ``rows`` (the columns alone). The block granularities where the kernel
    does not take t (K not a multiple of 16 with columns) in torch's operations."""
    takes = _kernel_takes(t, granularity) and (not columns or t.shape[1] % 16 == 0)
    if granularity in ("block", "block2d") and not takes:
        q, scale, q_t, scale_t = _quantize_blocks(t, granularity, columns)
        return (q, scale, q_t, scale_t) if rows else (None, None, q_t, scale_t)
    if not columns:
        return (*_kernel_quantize(t, granularity), None, None)
    if not rows:
        return (None, None, *_kernel_quantize(_pad_rows(t), granularity, True, rows=False))
    m = t.shape[0]
    q, scale, q_t, scale_t = _kernel_quantize(_pad_rows(t), granularity, columns=True)
    if granularity in ("row", "block"):
        scale = scale[:m]
    return q[:m], scale, q_t, scale_t


def _quantize_gated(gate, up, kind: str, granularity: str, columns: bool):
    """_quantize_both of act(gate) * up (kind "silu": silu_mul's product, "gelu_tanh": geglu's),
    quantized in the pass that computes it (tessera's float8_quantize_gated, the same bytes) where
    that is the faster way: where quantizing the product takes two passes anyway (per row with
    the columns, per tensor), the product's first pass is the gated op's own (its maxima taken on
    the way), one read of the product and one launch fewer. Rows alone (one pass over the product)
    and the block granularities (one pass, two inputs in registers) are faster as the gated op's
    output quantized, as is what the kernel does not take at once (gate and up of other layouts,
    M not a multiple of 16 with columns)."""
    from . import _state
    g, u = gate.detach(), up.detach()
    two_pass = granularity == "tensor" or (granularity == "row" and columns)
    if (two_pass and g.stride() == u.stride() and _kernel_takes(g, granularity, columns) and
            (g.stride(-1) == 1 or g.shape[-1] == 1)):
        out = None
        if _state.fast is not None and not _state.dynamo_compiling():  # the kernel at once
            out = _state.fast.float8_quantize_gated(g, u, kind, granularity, columns)
        # The registered op where dynamo traces (or no fast entry is built). A subclass (a DTensor)
        # composes: the op's rules would gather gate and up where the product alone does.
        if out is None and _state.ops is not None and type(g) is _state.Tensor:
            op = _state.ops.float8_quantize_gated
            out = (op.columns if columns else op.default)(g, u, activation=kind, granularity=granularity)
        if out is not None:
            return tuple(out) if columns else (*out, None, None)
    from .elementwise import gated
    return _quantize_both(gated(kind, g, u), granularity, columns)


# The last activation quantized on the kernels, for the next Float8Matmul of the same tensor (the
# q, k and v projections take one x, gate and up another): (weakref to the tensor the activation
# is a view of, the activation's identity, granularity, columns, (q, scale, q_t, scale_t)).
_last_x = None


def _identity(t):
    """(anchor, key): while the anchor (the tensor t views, else t) lives, its storage does, so an
    equal key (pointer, shape, strides, dtype, device, version counter) means the same elements,
    unchanged: any in-place write through any view bumps the shared version. None where t has no
    version or storage to read (inference tensors, fakes)."""
    try:
        anchor = t._base if t._base is not None else t
        return anchor, (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t._version)
    except RuntimeError:
        return None


def _quantize_reusing(t, granularity: str, columns: bool, quantize=None):
    """quantize(t, granularity, columns) (default _quantize_both): (q, scale, q_t, scale_t), or the
    last call's result where that was of the same elements, unchanged since, with the granularity
    and at least the layouts asked (a result with columns also serves one without). One entry: the
    activations that repeat do so back to back. The entry holds the last activation's float8
    copies until the next call. Not under torch.compile (its graph has no Python state to consult)
    nor while a CUDA graph is captured (a result from outside the capture would be read at each
    replay as it is then)."""
    global _last_x
    import torch
    quantize = quantize or _quantize_both
    ident = None
    if not torch.compiler.is_compiling() and not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
        ident = _identity(t)
    if ident is None:
        return quantize(t, granularity, columns)
    anchor, key = ident
    last, _last_x = _last_x, None  # dropped unless it serves this call
    if last is not None:
        ref, last_key, last_granularity, last_columns, result = last
        if ref() is anchor and last_key == key and last_granularity == granularity and (last_columns or not columns):
            _last_x = last
            return result if columns else (*result[:2], None, None)
    result = quantize(t, granularity, columns)
    _last_x = (weakref.ref(anchor), key, granularity, columns, result)
    return result


def _leave_for_next(y2d, granularity: str, columns: bool, result) -> None:
    """Leaves ``result`` (q, scale, q_t, scale_t: y2d quantized) for the next _quantize_reusing of
    y2d's elements, as if that call had made it."""
    global _last_x
    ident = _identity(y2d)
    if ident is not None:
        _last_x = (weakref.ref(ident[0]), ident[1], granularity, columns, result)


def _check_norm_granularity(op: str, granularity: str) -> None:
    if granularity not in ("row", "tensor"):
        raise ValueError(f"tessera.float8.{op}: argument 'granularity': expected 'row' or 'tensor', "
                         f"got {granularity!r}")


def rms_norm(x, weight, eps: float, granularity: str = "row", weight_offset: float = 0.0):
    """``tessera.rms_norm(x, (x.shape[-1],), weight, eps, weight_offset=weight_offset)`` for the
    Float8Linears that take its output next (a decoder layer's q, k and v projections, or its gate
    and up): the norm's kernel also quantizes the output by ``granularity`` ('row' or 'tensor', the
    rowwise and tensorwise recipes' activations) with the copy of its columns that wgrad needs where
    grad is enabled (tessera's rms_norm_float8: the output's maxima taken as it is written, so the
    quantization reads the output once, not twice), and the float8 copies wait for the next
    Float8Linear of that output, which takes them instead of quantizing it again. The same values
    and gradients as tessera.rms_norm, which runs instead where the fused kernel does not: off CUDA
    or sm_90 (where the float8 GEMMs are emulated), under torch.compile or a CUDA graph capture
    (where _quantize_reusing hands nothing over), under autocast, x and weight not both bf16 or fp16
    of one dtype, either not contiguous, or rows or their length not multiples of 16."""
    from .rowwise import rms_norm as plain
    _check_norm_granularity("rms_norm", granularity)
    from ._float8_producers import fuses, norm_function
    if not fuses(x, weight):
        return plain(x, (x.shape[-1],), weight, eps, weight_offset=weight_offset)
    import torch
    return norm_function().apply(x, None, weight, float(eps), float(weight_offset), granularity,
                                 torch.is_grad_enabled())


def add_rms_norm(input, residual, weight, eps: float, granularity: str = "row"):
    """``tessera.add_rms_norm(input, residual, weight, eps)`` (``(output, residual_out)``) whose
    output is quantized for the Float8Linears after it as :func:`rms_norm`'s is, in the same kernels
    (the residual added, the sum written and normalized, the output's maxima taken as it is
    written), under the same conditions (residual of input's shape, dtype and layout), else
    tessera.add_rms_norm."""
    from .rowwise import add_rms_norm as plain
    _check_norm_granularity("add_rms_norm", granularity)
    from ._float8_producers import fuses, norm_function
    if not fuses(input, weight, residual):
        return plain(input, residual, weight, eps)
    import torch
    return norm_function().apply(input, residual, weight, float(eps), 0.0, granularity, torch.is_grad_enabled())


def _weight_layouts(weight, granularity: str, columns: bool, cache: bool):
    """The weight's float8 copies for one GEMM: by rows (q, scale; the forward) or by columns
    (q_t, scale_t; dgrad), as (q, scale, q_t, scale_t) with the other pair None. With ``cache``
    (the layer's cache_weights) both layouts come from one call and are kept (in _weights) until
    the next step of any torch.optim optimizer, or until the weight's identity key moves (an
    in-place write bumps its version), so that micro-batches accumulating gradients cast each
    weight once per optimizer step; the two copies (2 bytes a parameter) are held meanwhile. Not
    under torch.compile nor while a CUDA graph is captured (_quantize_reusing's reasons)."""
    global _weights
    import torch
    ident = None
    if cache and not torch.compiler.is_compiling() and not (weight.is_cuda and torch.cuda.is_current_stream_capturing()):
        ident = _identity(weight)
    if ident is None:
        return _quantize_both(weight, granularity, columns, rows=not columns)
    if _weights is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _weights = WeakIdKeyDictionary()
        # Every optimizer step drops the copies, whatever the version counters say: FSDP2 refills
        # an unsharded weight in place with its version preserved, so only the step tells.
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(lambda *args: drop_cached_weights())
    anchor, key = ident
    held = _weights.get(anchor)
    if held is None or held[0] != (key, granularity):
        _weights.pop(anchor, None)  # the stale copies go before the new ones are made
        held = ((key, granularity), _quantize_both(weight, granularity, True))
        _weights[anchor] = held
    q, scale, q_t, scale_t = held[1]
    return (None, None, q_t, scale_t) if columns else (q, scale, None, None)


# The cached weights' float8 copies, by the weight (its storage's tensor): ((identity key,
# granularity), (q, scale, q_t, scale_t)); an entry goes with its weight.
_weights = None


def drop_cached_weights(module=None) -> None:
    """Frees the float8 copies that Float8Linears with ``cache_weights`` hold for ``module``'s
    weights (every module's without one). A copy is also replaced, not added to, once its weight
    changes, and goes when its weight is freed."""
    if _weights is None:
        return
    if module is None:
        _weights.clear()
        return
    for p in module.parameters():
        _weights.pop(p, None)


def _forward_gemm(qx, sx, weight, wgt: str, cache: bool, dtype):
    """The forward's GEMM on the kernels: qx @ weight^T, the weight by rows."""
    qw, sw, _, _ = _weight_layouts(weight, wgt, False, cache)
    return _scaled(qx, sx, qw.t(), _as_right(sw, wgt), dtype)


def _backward_gemms(grad, qx_t, sx_t, weight, recipe: str, cache: bool, want_dx: bool, want_dw: bool, dtypes):
    """dgrad and wgrad on the kernels from the output gradient and the forward's float8 copy of
    x's columns (qx_t, sx_t): (dx, dw), each None where not wanted. grad quantized by rows for
    dgrad (K = out_features) and by columns for wgrad (K = tokens) in one kernel call, or its
    copies taken where the pass that wrote it made them (_float8_producers.gated_grads)."""
    act, wgt = _OPERANDS[recipe]
    dx = dw = None
    from ._float8_producers import take_grad_copies
    held = take_grad_copies(grad, act, want_dw)
    qg, sg, qg_t, sg_t = held if held is not None else _quantize_both(grad.contiguous(), act, want_dw)
    if want_dx:  # grad [T, O] @ weight [O, I]: the weight's columns as qw_t [I, O]
        _, _, qw_t, sw_t = _weight_layouts(weight, wgt, True, cache)
        dx = _scaled(qg, sg, qw_t.t(), sw_t, dtypes[0])
    if want_dw:  # grad^T [O, T'] @ x [T', I]: both by columns, T' padded to 16
        dw = _scaled(qg_t, sg_t.t() if sg_t.dim() else sg_t, qx_t.t(), sx_t, dtypes[1])
    return dx, dw


_function = None


def _matmul_function():
    """The float8 linear as an autograd Function (made at first use: torch is imported lazily).
    Each GEMM's operands quantized along its own K, the products on tessera.scaled_mm where
    _on_kernels says so, else emulated in float32."""
    global _function
    if _function is not None:
        return _function
    import torch

    class Float8Matmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, recipe, recorded=True, cache=False):
            act, wgt = _OPERANDS[recipe]
            ctx.recipe, ctx.cache = recipe, cache
            ctx.kernels = _on_kernels(x, recipe)
            if not ctx.kernels:
                ctx.save_for_backward(x, weight)
                return _cast(_fake(x, act) @ _fake(weight, wgt).t(), x.dtype)
            # x quantized once, in both layouts where the backward needs its columns too (wgrad:
            # K = tokens, padded to 16 with zero rows); the backward keeps that float8 copy, not
            # x. The weight by rows alone: dgrad's copy of its columns (K = out_features) is made
            # in the backward from the weight itself, which the model holds anyway, so that no
            # layer holds a float8 copy of its weight from its forward to its backward.
            # (`recorded`: autograd keeps the call, which needs_input_grad does not say under no_grad)
            want_dw = recorded and ctx.needs_input_grad[1]
            qx, sx, qx_t, sx_t = _quantize_reusing(x, act, want_dw)  # q/k/v (gate/up): x once
            ctx.save_for_backward(qx_t, sx_t, weight)
            ctx.dtypes = (x.dtype, weight.dtype)
            return _forward_gemm(qx, sx, weight, wgt, cache, x.dtype)

        @staticmethod
        def backward(ctx, grad):
            act, wgt = _OPERANDS[ctx.recipe]
            dx = dw = None
            want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            if ctx.kernels:
                qx_t, sx_t, weight = ctx.saved_tensors
                dx, dw = _backward_gemms(grad, qx_t, sx_t, weight, ctx.recipe, ctx.cache, want_dx, want_dw, ctx.dtypes)
                return dx, dw, None, None, None
            x, weight = ctx.saved_tensors
            if want_dx:  # K = out_features: grad's rows, the weight's columns
                dx = _cast(_fake(grad, act) @ _fake(weight.t().contiguous(), wgt).t(), x.dtype)
            if want_dw:  # K = tokens: grad's and x's columns
                dw = _cast(_fake(grad.t().contiguous(), act) @ _fake(x.t().contiguous(), act).t(), weight.dtype)
            return dx, dw, None, None, None

    _function = Float8Matmul
    return _function


def gated_linear(kind: str, gate, up, linear):
    """``linear(act(gate) * up)`` for a Float8Linear ``linear`` (kind "silu": SwiGLU's product,
    "gelu_tanh": GeGLU's), the product quantized in the pass that computes it rather than written
    in bfloat16 and read back (tessera's float8_quantize_gated) where the layer's GEMMs run on the
    kernels; elsewhere (the emulation, another Linear, a layer with hooks, autocast) the module
    called on the gated op's output. gate and up: one shape [..., in_features] and dtype."""
    import torch
    from ._float8_producers import gated_function
    from .elementwise import gated
    if kind not in ("silu", "gelu_tanh"):
        raise ValueError(f"tessera.float8.gated_linear: argument 'kind': expected 'silu' or 'gelu_tanh', got {kind!r}")
    if (not isinstance(linear, __getattr__("Float8Linear")) or linear._forward_hooks or linear._forward_pre_hooks
            or gate.shape != up.shape or gate.dtype != up.dtype
            or not _on_kernels(gate, linear.recipe) or gate.dtype != linear.weight.dtype
            or torch.is_autocast_enabled(gate.device.type)):
        return linear(gated(kind, gate, up))
    shape = gate.shape
    recorded = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad or linear.weight.requires_grad)
    out = gated_function().apply(gate.reshape(-1, shape[-1]), up.reshape(-1, shape[-1]), linear.weight, kind,
                                  linear.recipe, recorded, linear.cache_weights)
    if linear.bias is not None:
        out = out + linear.bias
    return out.reshape(*shape[:-1], out.shape[-1])


def linear_cross_entropy(hidden, weight, target, *, recipe: str = "rowwise", ignore_index: int = -100,
                         reduction: str = "mean", cache_weights: bool = False, compact_rows: bool = False):
    """tessera.linear_cross_entropy's loss (no bias, soft-cap, smoothing or z-loss) of hidden [N, H]
    @ weight [V, H]^T against class indices ``target`` [N], with its GEMMs in float8 by ``recipe``
    (each operand along its own K: the hidden size, the vocabulary, then the tokens; blockwise's
    d_weight in the weight's dtype): a language model's output head in float8, which
    tessera.transformers' fused loss takes where lm_head is a Float8Linear. The logits are never
    all held: chunks of the rows, each chunk's gradient computed in the forward, an ignored row's
    loss and gradient zeros, nothing read on the host. ``compact_rows=True`` gathers the rows not
    ignored first (one host synchronization a call, for their count): fewer GEMM rows where many
    targets are ignored (masked prompts). torch.compile breaks its graph at the call (the kernels
    are called as they are), so fullgraph=True refuses it. 'mean' divides by the count of the rows
    not ignored. V and H multiples of 16 (128 for blockwise). ``cache_weights`` as
    convert_to_float8_training's."""
    from ._float8_head import head_loss
    return head_loss(hidden, weight, target, recipe, ignore_index, reduction, cache_weights, compact_rows)


def _linear_class():
    import torch

    class Float8Linear(torch.nn.Linear):
        """torch.nn.Linear whose three GEMMs run in float8 by ``recipe`` (see tessera.float8):
        the same parameters and state_dict as the Linear it was made from."""

        recipe = "rowwise"
        cache_weights = False

        @classmethod
        def from_float(cls, linear, recipe: str = "rowwise", cache_weights: bool = False):
            """The Linear itself, its class swapped: parameters, hooks and device untouched."""
            _check_recipe(recipe)
            _check_shape(linear, recipe)
            linear.__class__ = cls
            linear.recipe = recipe
            linear.cache_weights = bool(cache_weights)
            return linear

        def forward(self, x):
            shape = x.shape
            recorded = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
            out = _matmul_function().apply(x.reshape(-1, shape[-1]), self.weight, self.recipe, recorded,
                                           self.cache_weights)
            if self.bias is not None:
                out = out + self.bias
            return out.reshape(*shape[:-1], out.shape[-1])

        def extra_repr(self):
            cached = ", cache_weights=True" if self.cache_weights else ""
            return f"{super().extra_repr()}, recipe={self.recipe}{cached}"

    Float8Linear.__module__ = __name__
    return Float8Linear


_built: dict = {}


def __getattr__(name: str):
    """Float8Linear, made at first use (tessera never imports torch itself)."""
    if name != "Float8Linear":
        raise AttributeError(f"module 'tessera.float8' has no attribute {name!r}")
    if name not in _built:
        _built[name] = _linear_class()
    return _built[name]


def _check_recipe(recipe: str):
    if recipe not in RECIPES:
        raise ValueError(f"tessera.float8: argument 'recipe': expected one of {RECIPES}, got {recipe!r}")


def _misfit(linear, recipe: str):
    """The first of a Linear's dimensions that the recipe's GEMMs cannot take as K or as a block's
    side (multiples of 16, the fp8 tensor cores' K step; of 128 for blockwise): (name, need), or None."""
    need = BLOCK if recipe == "blockwise" else 16
    for name in ("in_features", "out_features"):
        if getattr(linear, name) % need:
            return name, need
    return None


def _check_shape(linear, recipe: str):
    bad = _misfit(linear, recipe)
    if bad:
        name, need = bad
        raise ValueError(f"tessera.float8: a Linear's '{name}' = {getattr(linear, name)} is not a multiple of "
                         f"{need} ({recipe}); leave it out with module_filter_fn")


def convert_to_float8_training(module, *, recipe: str = "rowwise",
                               module_filter_fn: Optional[Callable[[Any, str], bool]] = None,
                               cache_weights: bool = False):
    """torchao's convert_to_float8_training: every torch.nn.Linear of ``module`` (itself included)
    that ``module_filter_fn(linear, fully_qualified_name)`` keeps becomes a Float8Linear of
    ``recipe``, in place (parameter names and state_dict unchanged). Without a filter, the
    Linears whose dimensions the recipe takes (multiples of 16; of 128 for blockwise). Returns
    ``module``.

    ``cache_weights=True``: each weight is cast once per optimizer step rather than twice per
    micro-batch (by rows for the forward, by columns for dgrad): both float8 copies come from one
    call at the weight's first use and are reused until the next step of any torch.optim
    optimizer (or an in-place write to the weight), at 2 bytes a parameter held meanwhile. For
    gradient accumulation; with one micro-batch a step it only adds memory. A weight changed
    otherwise (through ``.data``, by an update outside torch.optim) needs drop_cached_weights()
    before its next use. Each layer's ``cache_weights`` attribute switches it later."""
    import torch
    _check_recipe(recipe)
    cls = __getattr__("Float8Linear")
    chosen = [m for fqn, m in module.named_modules() if type(m) is torch.nn.Linear and
              (module_filter_fn(m, fqn) if module_filter_fn is not None else not _misfit(m, recipe))]
    for m in chosen:  # all checked before any is converted
        _check_shape(m, recipe)
    for m in chosen:
        cls.from_float(m, recipe, cache_weights)
    return module
