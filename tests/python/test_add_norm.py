"""tessera.add_layer_norm and add_rms_norm (the residual add fused with the norm: (norm(x + r),
x + r)), from Python.

CPU-side tests (any machine): the functions take torch tensors only; CPU tensors and mixed dtypes
get torch's composition, autograd included; the registered ops on CPU tensors name the argument.

GPU tests (the `torch` fixture): results and gradients against torch's composition (s = x + r,
then the norm) in float64 by relative norm error, with the gradients of either or both outputs,
residual_out bit-equal to torch's x + r, strided and 0-row inputs, the argument errors and the
calls handed to torch, the no-grad shortcut against the registered op and its statistics, the
backward ops, bit-identical weight gradients from run to run, torch.compile.
"""

import math

import pytest

import tessera
from tessera.rowwise import RMS_NORM_DEFAULT_EPS

# Before the import: pytest rewrites the helpers' asserts as a test module's (values on failure).
pytest.register_assert_rewrite("rowwise_helpers")
from rowwise_helpers import (AFFINE, CPU_DEVICE_MSG, DEV, DTYPES, assert_close, dt,  # noqa: E402
                             leaf, norm_params, randn, ref_leaf)


# ---- the residual add fused with the norm: add_layer_norm, add_rms_norm ------------------------

ADD_NORMS = ["add_layer_norm", "add_rms_norm"]


def add_norm_ref(torch, fn, s, w, b, eps):
    """torch's composition of the norm over the last dimension (s: the sum)."""
    F = torch.nn.functional
    if fn == "add_layer_norm":
        return F.layer_norm(s, s.shape[-1:], w, b, eps)
    return F.rms_norm(s, s.shape[-1:], w, eps)


def add_norm(fn, x, r, w, b, eps):
    if fn == "add_layer_norm":
        return tessera.add_layer_norm(x, r, w, b, eps)
    return tessera.add_rms_norm(x, r, w, eps)


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_take_torch_tensors(np, fn):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=rf"tessera\.{fn}: argument 'input': expected a torch tensor, "
                                        r"got ndarray"):
        getattr(tessera, fn)(x, x)
    torch = pytest.importorskip("torch", reason="torch not installed")
    with pytest.raises(TypeError, match=rf"tessera\.{fn}: argument 'residual': expected a torch "
                                        r"tensor, got float"):
        getattr(tessera, fn)(torch.ones(3, 4), 1.0)


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_on_cpu_are_torchs_composition(fn):
    # What the kernels do not take (CPU tensors, mixed dtypes) is torch's composition, autograd
    # included.
    torch = pytest.importorskip("torch", reason="torch not installed")
    x, r = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8)
    out, res = add_norm(fn, x, r, w, b, 1e-5)
    s = x + r
    assert torch.equal(res, s) and torch.equal(out, add_norm_ref(torch, fn, s, w, b, 1e-5))
    out.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, r.grad) and w.grad is not None
    # A float32 residual stream beside bfloat16 activations: torch's promotion.
    out, res = add_norm(fn, x.detach().bfloat16(), r.detach(), None, None, 1e-5)
    assert res.dtype == torch.float32 and out.dtype == torch.float32
    if fn == "add_rms_norm":  # eps=None: torch's default, as F.rms_norm's
        out, res = tessera.add_rms_norm(x.detach(), r.detach())
        assert torch.equal(out, torch.nn.functional.rms_norm(res, (8,)))


def test_add_norm_ops_name_their_arguments(torch_cpu):
    # The registered ops on CPU tensors reach the library's checks, which name the argument.
    torch = torch_cpu
    ops = torch.ops.tessera
    x = torch.ones(4, 8)
    with pytest.raises(ValueError, match=r"tessera\.add_rms_norm: argument 'input': " + CPU_DEVICE_MSG):
        ops.add_rms_norm(x, x, None, 1e-6)
    with pytest.raises(ValueError, match=r"tessera\.add_layer_norm: argument 'input': " + CPU_DEVICE_MSG):
        ops.add_layer_norm(x, x, None, None, 1e-5)
    # The backward's tensor normalized is the forward's residual_out.
    with pytest.raises(ValueError, match=r"tessera\.add_layer_norm_backward: argument 'residual_out': "
                                         + CPU_DEVICE_MSG):
        ops.add_layer_norm_backward(x, None, x, torch.zeros(4), torch.ones(4), None, None, [True, True, True])
    assert ops.add_rms_norm_backward(x, x, x, torch.ones(4), None, [False, True]) == (None, None)


ADD_NORM_SHAPES = [(4, 1), (9,), (7, 33), (64, 1000), (3, 4097), (2, 32768), (1, 65536), (2, 3, 64),
                   (300, 256)]


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ADD_NORM_SHAPES)
@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_and_gradients(torch, fn, shape, dtype, affine):
    d = dt(torch, dtype)
    rms = fn == "add_rms_norm"
    if rms and affine[1]:
        pytest.skip("RMSNorm has no bias")
    normalized = shape[-1:]
    x, r = leaf(1.0 + randn(torch, shape, d)), leaf(randn(torch, shape, d, scale=2.0))
    w, b = norm_params(torch, normalized, d, *affine)
    out, res = add_norm(fn, x, r, w, b, 1e-5)
    assert out.dtype == d and res.dtype == d and out.shape == res.shape == x.shape
    # residual_out holds torch's bits of x + r, and the norm is of those bits.
    assert torch.equal(res, x.detach() + r.detach())
    x64, r64, w64, b64 = ref_leaf(x), ref_leaf(r), ref_leaf(w), ref_leaf(b)
    s64 = x64 + r64
    ref = add_norm_ref(torch, fn, s64, w64, b64, 1e-5)
    assert_close(out, add_norm_ref(torch, fn, res.double(), w64, b64, 1e-5), dtype, "out")
    # The gradients of both outputs: one gradient for input and residual.
    g, h = randn(torch, shape, d), randn(torch, shape, d)
    torch.autograd.backward((out, res), (g, h))
    torch.autograd.backward((ref, s64), (g.double(), h.double()))
    if math.prod(normalized) > 1:
        assert_close(x.grad, x64.grad, dtype, "grad_input")
        assert torch.equal(x.grad, r.grad), "grad of input and of residual differ"
    for p, p64, name in ((w, w64, "grad_weight"), (b, b64, "grad_bias")):
        if p is not None:
            assert p.grad.dtype == d
            assert_close(p.grad, p64.grad, dtype, name)


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_with_one_output_used(torch, fn):
    x, r = leaf(randn(torch, (64, 512), torch.float32)), leaf(randn(torch, (64, 512), torch.float32))
    w = leaf(1.0 + 0.5 * randn(torch, (512,), torch.float32))
    x64, r64, w64 = ref_leaf(x), ref_leaf(r), ref_leaf(w)
    g = randn(torch, (64, 512), torch.float32)
    # Only out's gradient: no grad_residual_out (the backward op gets None).
    out, _ = add_norm(fn, x, r, w, None, 1e-5)
    out.backward(g)
    add_norm_ref(torch, fn, x64 + r64, w64, None, 1e-5).backward(g.double())
    assert_close(x.grad, x64.grad, "float32", "grad_input")
    assert torch.equal(x.grad, r.grad)
    assert_close(w.grad, w64.grad, "float32", "grad_weight")
    # Only residual_out's: it passes to input and residual as it is; the weight gets none.
    x.grad = r.grad = w.grad = None
    _, res = add_norm(fn, x, r, w, None, 1e-5)
    res.backward(g)
    assert torch.equal(x.grad, g) and torch.equal(r.grad, g) and w.grad is None


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_non_contiguous_and_zero_rows(torch, fn):
    base = 1.0 + randn(torch, (64, 96), torch.float32)
    other = randn(torch, (96, 64), torch.float32)
    for x, r in ((base.t(), other), (base[:, ::2], other.t()[:, 1::2]), (base[::2, 1:], base[1::2, :95])):
        x, r = leaf(x), leaf(r)
        w = leaf(1.0 + 0.5 * randn(torch, x.shape[-1:], torch.float32))
        out, res = add_norm(fn, x, r, w, None, 1e-5)
        x64, r64, w64 = ref_leaf(x), ref_leaf(r), ref_leaf(w)
        s64 = x64 + r64
        ref = add_norm_ref(torch, fn, s64, w64, None, 1e-5)
        assert_close(out, ref, "float32", f"out {tuple(x.shape)} {x.stride()} {r.stride()}")
        assert torch.equal(res, x.detach() + r.detach())
        (out.sum() + res.sum()).backward()  # expanded (stride 0) gradients
        (ref.sum() + s64.sum()).backward()
        assert_close(x.grad, x64.grad, "float32", "grad_input")
        assert_close(w.grad, w64.grad, "float32", "grad_weight")
    x = leaf(torch.empty(0, 64, device=DEV))
    w = leaf(torch.ones(64, device=DEV))
    out, res = add_norm(fn, x, x.detach().clone(), w, None, 1e-5)
    assert out.shape == res.shape == (0, 64)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_errors_and_torchs_calls(torch, fn):
    x, r = randn(torch, (16, 32), torch.float32), randn(torch, (16, 32), torch.float32)
    w = torch.ones(32, device=DEV)
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'residual'.*shape \[16, 32\]"):
        add_norm(fn, x, r[:8], None, None, 1e-5)
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'weight'.*shape \[32\]"):
        add_norm(fn, x, r, torch.ones(31, device=DEV), None, 1e-5)
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'input'.*at least 1 dimension"):
        add_norm(fn, x[0, 0], r[0, 0], None, None, 1e-5)
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'eps'"):
        add_norm(fn, x, r, None, None, -1.0)
    # Another dtype for the residual or the weight, float64 inputs: torch's composition. (A mixed
    # weight where torch's own norm takes one on the GPU: a float16 one for a float32 RMSNorm
    # input; torch's CUDA layer_norm refuses a weight of another dtype.)
    cases = [(x.bfloat16(), r, None), (x.double(), r.double(), None)]
    if fn == "add_rms_norm":
        cases.append((x, r, w.half()))
    for xx, rr, ww in cases:
        out, res = add_norm(fn, xx, rr, ww, None, 1e-5)
        s = xx + rr
        assert torch.equal(res, s) and torch.equal(out, add_norm_ref(torch, fn, s, ww, None, 1e-5))
    # The direct op refuses what the function hands to torch, by name.
    with pytest.raises(TypeError, match=rf"tessera\.{fn}: argument 'residual'.*bfloat16"):
        if fn == "add_rms_norm":
            torch.ops.tessera.add_rms_norm(x, r.bfloat16(), None, 1e-6)
        else:
            torch.ops.tessera.add_layer_norm(x, r.bfloat16(), None, None, 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_add_norms_fast_path_op_and_statistics(torch, dtype):
    d = dt(torch, dtype)
    x, r = randn(torch, (300, 1024), d), randn(torch, (300, 1024), d)
    w, b = 1.0 + 0.5 * randn(torch, (1024,), d), randn(torch, (1024,), d)
    # The no-grad shortcut (tessera._torch_fast) and the registered op: the same kernels, the
    # same bits; the op also returns the float32 statistics of residual_out.
    out, res = tessera.add_layer_norm(x, r, w, b, 1e-5)
    o2, r2, mean, rstd = torch.ops.tessera.add_layer_norm(x, r, w, b, 1e-5)
    assert torch.equal(out, o2) and torch.equal(res, r2)
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == (300,)
    s64 = res.double()
    assert_close(mean, s64.mean(-1), "float32", "mean")
    assert_close(rstd, 1.0 / (s64.var(-1, unbiased=False) + 1e-5).sqrt(), "float32", "rstd")
    out, res = tessera.add_rms_norm(x, r, w)
    o2, r2, rstd = torch.ops.tessera.add_rms_norm(x, r, w, RMS_NORM_DEFAULT_EPS)
    assert torch.equal(out, o2) and torch.equal(res, r2)
    assert_close(rstd, 1.0 / ((s64 * s64).mean(-1) + RMS_NORM_DEFAULT_EPS).sqrt(), "float32", "rstd")
    # The backward ops: grad_residual_out added, or absent.
    g, h = randn(torch, x.shape, d), randn(torch, x.shape, d)
    gi, gw = torch.ops.tessera.add_rms_norm_backward(g, h, res, rstd, w, [True, True])
    gi0, gw0 = torch.ops.tessera.add_rms_norm_backward(g, None, res, rstd, w, [True, True])
    gr, gwr = torch.ops.tessera.rms_norm_backward(g, res, [1024], rstd, w, [True, True])
    assert torch.equal(gi0, gr) and torch.equal(gw0, gwr)  # no grad_residual_out: rms_norm's kernels
    assert_close(gw, gwr, dtype, "grad_weight")
    assert_close(gi, gr.double() + h.double(), dtype, "grad_input")
    # No grad_output (only residual_out's gradient came): grad_input is grad_residual_out, no weight's.
    gi1, gw1 = torch.ops.tessera.add_rms_norm_backward(None, h, res, rstd, w, [True, True])
    assert torch.equal(gi1, h) and gw1 is None


@pytest.mark.parametrize("fn", ADD_NORMS)
def test_add_norms_weight_gradients_are_bit_identical_run_to_run(torch, fn):
    d = torch.bfloat16
    x, r = leaf(randn(torch, (8192, 1024), d)), leaf(randn(torch, (8192, 1024), d))
    w, b = norm_params(torch, (1024,), d, True, fn == "add_layer_norm")
    g, h = randn(torch, x.shape, d), randn(torch, x.shape, d)
    runs = []
    for _ in range(2):
        x.grad = r.grad = w.grad = None
        if b is not None:
            b.grad = None
        torch.autograd.backward(add_norm(fn, x, r, w, b, 1e-5), (g, h))
        runs.append([t.grad.clone() for t in (x, w, b) if t is not None])
    for a, c in zip(*runs):
        assert torch.equal(a, c)


def test_add_norms_compile_fullgraph(torch):
    torch._dynamo.reset()

    def f(x, r, w, b):
        h, r = tessera.add_layer_norm(x, r, w, b)
        h, r = tessera.add_rms_norm(h * 2.0, r, w)
        return h * r

    def inputs():
        gen = torch.Generator(device=DEV).manual_seed(0)
        return [torch.randn(*s, device=DEV, generator=gen, requires_grad=True)
                for s in ((32, 64), (32, 64), (64,), (64,))]

    eager_in, compiled_in = inputs(), inputs()
    want = f(*eager_in)
    want.sum().backward()
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(*compiled_in)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled_in, eager_in):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    # In the graph: tessera's ops, forward and backward, not torch's composition.
    from torch._dynamo.testing import CompileCounterWithBackend
    backend = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    torch.compile(f, backend=backend, fullgraph=True)(*inputs()).sum().backward()
    names = {str(n.target) for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"tessera.add_layer_norm.default", "tessera.add_rms_norm.default"} <= names, names
