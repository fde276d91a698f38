"""tessera.softmax, log_softmax, layer_norm, rms_norm and their backward functions, from Python
(add_layer_norm and add_rms_norm: test_add_norm.py; the helpers both use: rowwise_helpers.py).

CPU-side tests (any machine): checks of the Python-only arguments (dim, normalized_shape,
output_mask, dtype=) and the library's device errors for CPU arrays, which all raise before
anything touches a GPU; torch's rms_norm default eps (a CPU torch is enough to see it).

GPU tests (the `torch` fixture): results and gradients against float64 torch references by
relative norm error (within the ops' descriptions' tolerances, tessera.bench.ops), every softmax
dim, strided and 0-row inputs, -inf/NaN rows, two normalized dims, weight/bias combinations, the
saved statistics, the backward functions against torch's own, bit-identical weight gradients from
run to run, DLPack.
"""

import math

import pytest

import tessera
from tessera.rowwise import RMS_NORM_DEFAULT_EPS

# Before the import: pytest rewrites the helpers' asserts as a test module's (values on failure).
pytest.register_assert_rewrite("rowwise_helpers")
from rowwise_helpers import (AFFINE, CPU_DEVICE_MSG, DESCRIPTIONS, DEV, DTYPES, ROW_K, TOL,  # noqa: E402
                             assert_close, dt, leaf, norm_params, randn, ref_leaf, rel_err)


# ---- CPU side ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_cpu_array_names_argument_and_device(np, fn):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError) as e:
        getattr(tessera, fn)(x, -1)
    assert str(e.value) == f"tessera.{fn}: argument 'input': {CPU_DEVICE_MSG}"
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'input': {CPU_DEVICE_MSG}"):
        getattr(tessera, fn)(x, 5)  # the device before the range of dim


@pytest.mark.parametrize("fn", ["softmax_backward", "log_softmax_backward"])
def test_softmax_backward_cpu_arrays(np, fn):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=rf"tessera\.{fn}: argument 'grad_output': {CPU_DEVICE_MSG}"):
        getattr(tessera, fn)(x, x, 1)


def test_norms_cpu_array_names_argument_and_device(np):
    x = np.ones((3, 4, 5), np.float32)
    for fn, args in (("layer_norm", ((4, 5),)), ("rms_norm", (5,))):
        with pytest.raises(ValueError) as e:
            getattr(tessera, fn)(x, *args)
        assert str(e.value) == f"tessera.{fn}: argument 'input': {CPU_DEVICE_MSG}"


@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape, normalized, got", [
    ((3, 4), 5, "[5]"), ((3, 4), (3,), "[3]"), ((3, 4), (4, 3), "[4, 3]"),
    ((3, 4), (2, 3, 4), "[2, 3, 4]"), ((3, 4), (), "[]"),
])
def test_wrong_normalized_shape_is_named(np, fn, shape, normalized, got):
    # Checked before the library sees anything: a CPU array gets this message, not the device's.
    with pytest.raises(ValueError) as e:
        getattr(tessera, fn)(np.ones(shape, np.float32), normalized)
    assert str(e.value) == (f"tessera.{fn}: argument 'normalized_shape': expected the trailing "
                            f"dimensions of the input's shape [3, 4] (1 to 2 of them), got {got}")


def test_normalized_shape_of_a_0d_input(np):
    with pytest.raises(ValueError, match=r"argument 'normalized_shape'.*a 0-d input has none"):
        tessera.layer_norm(np.float32(1.0), 1)


@pytest.mark.parametrize("bad", [1.5, "4", None, [4.0], True])
def test_normalized_shape_type(np, bad):
    with pytest.raises(TypeError, match=r"tessera\.layer_norm: argument 'normalized_shape'"):
        tessera.layer_norm(np.ones((3, 4), np.float32), bad)


@pytest.mark.parametrize("bad", [1.0, "1", None, True])
def test_dim_must_be_an_integer(np, bad):
    with pytest.raises(TypeError, match=r"tessera\.softmax: argument 'dim': expected an integer"):
        tessera.softmax(np.ones((3, 4), np.float32), bad)


def test_dim_beyond_int32(np):
    with pytest.raises(ValueError, match=r"tessera\.log_softmax: argument 'dim'.*got 4294967296"):
        tessera.log_softmax(np.ones((3, 4), np.float32), 1 << 32)


def test_integer_likes_are_accepted_for_dim_and_shape(np):
    # numpy integers index like ints; the call then reaches the library's device check.
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.softmax(x, np.int64(-1))
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.layer_norm(x, (np.int32(4),))
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.rms_norm(x, [3, 4])


def test_dtype_needs_a_torch_tensor(np):
    with pytest.raises(TypeError, match=r"tessera\.softmax: argument 'dtype'"):
        tessera.softmax(np.ones(3, np.float32), 0, dtype="float32")


def test_torch_only_functions_refuse_other_arrays(np):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"tessera\.layer_norm_forward: argument 'input'.*ndarray"):
        tessera.layer_norm_forward(x, 4)
    with pytest.raises(TypeError, match=r"tessera\.rms_norm_backward: argument 'input'"):
        tessera.rms_norm_backward(x, x, 4, x)


def test_a_tuple_is_not_a_tensor():
    fake = (1 << 20, 0, (4,), (1,), 0)
    with pytest.raises(TypeError, match=r"tessera\.softmax: argument 'input'.*got tuple"):
        tessera.softmax(fake, 0)
    with pytest.raises(TypeError, match=r"argument 'normalized_shape'|argument 'input'"):
        tessera.layer_norm(fake, 4)


def test_torch_cpu_tensors_get_torchs_results():
    # torch's contract for the mirrored signatures: a CPU tensor runs torch's own function.
    torch = pytest.importorskip("torch", reason="torch not installed")
    F = torch.nn.functional
    x = torch.randn(3, 4)
    assert torch.equal(tessera.softmax(x, -1), torch.softmax(x, -1))
    assert torch.equal(tessera.log_softmax(x, 0, dtype=torch.float64),
                       torch.log_softmax(x, 0, dtype=torch.float64))
    w = torch.ones(4, requires_grad=True)
    y = tessera.layer_norm(x, 4, w)
    assert y.requires_grad and torch.equal(y, F.layer_norm(x, (4,), w))
    assert torch.equal(tessera.rms_norm(x, (3, 4)), F.rms_norm(x, (3, 4)))
    wb = torch.randn(4, dtype=torch.bfloat16)
    assert torch.equal(tessera.rms_norm(x.bfloat16(), 4, wb, 1e-6, weight_offset=1.0),
                       (F.rms_norm(x.bfloat16().float(), (4,), None, 1e-6) * (1 + wb.float())).bfloat16())
    with pytest.raises(ValueError, match=r"argument 'weight_offset'"):
        tessera.rms_norm(x, 4, None, weight_offset=1.0)
    # The functions that are tessera's own (no torch signature) keep tessera's errors.
    with pytest.raises(ValueError, match=r"tessera\.softmax: argument 'input': " + CPU_DEVICE_MSG):
        tessera.softmax(x, -1, out=torch.empty(3, 4))
    with pytest.raises(ValueError, match=r"tessera\.rms_norm: argument 'input': " + CPU_DEVICE_MSG):
        tessera.rms_norm_forward(x, (3, 4))
    with pytest.raises(ValueError, match=r"tessera\.layer_norm_backward: argument 'input': "
                                         + CPU_DEVICE_MSG):
        tessera.layer_norm_backward(x, x, 4, torch.zeros(3), torch.ones(3))
    with pytest.raises(RuntimeError, match=r"normalized_shape"):  # torch's own error
        tessera.layer_norm(x, (3,))
    with pytest.raises(ValueError, match=r"tessera\.layer_norm_backward: argument 'output_mask'"):
        tessera.layer_norm_backward(x, x, 4, torch.zeros(3), torch.ones(3), None, None, (True, False))
    # Everything masked off: nothing to compute, no library call.
    assert tessera.rms_norm_backward(x, x, 4, torch.ones(3), None, (False, True)) == (None, None)


def test_rms_norm_default_eps_is_torchs():
    # torch documents finfo(input.dtype).eps, but resolves eps=None with its accumulation type's
    # epsilon: float32's, also for bfloat16 inputs. tessera follows the behaviour.
    torch = pytest.importorskip("torch", reason="torch not installed")
    assert RMS_NORM_DEFAULT_EPS == torch.finfo(torch.float32).eps
    x = torch.full((2, 8), 1e-3).to(torch.bfloat16)  # mean(x^2) ~ 1e-6: eps is load-bearing
    default = torch.nn.functional.rms_norm(x, (8,))
    assert torch.equal(default, torch.nn.functional.rms_norm(x, (8,), eps=RMS_NORM_DEFAULT_EPS))
    assert not torch.equal(default, torch.nn.functional.rms_norm(
        x, (8,), eps=torch.finfo(torch.bfloat16).eps))


def test_one_tolerance_per_dtype():
    for op in DESCRIPTIONS:
        assert op.dtypes == DTYPES, op.name
        for d in DTYPES:
            assert op.tolerance(d, k=ROW_K) == TOL[d], f"{op.name} {d}: assert_close needs the op's own bound"


# ---- GPU: softmax and log_softmax ---------------------------------------------------------------

SOFTMAX_SHAPES = [(1, 1), (3, 1), (7, 33), (64, 1000), (5, 4097), (2, 32768), (1, 262144),
                  (3000, 17)]


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_softmax_matches_reference(torch, fn, dtype, shape):
    x = randn(torch, shape, dt(torch, dtype), scale=4.0)
    out = getattr(tessera, fn)(x, -1)
    assert isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.device == x.device
    assert_close(out, getattr(torch, fn)(x.double(), -1), dtype)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("dim", range(-4, 4))
def test_softmax_every_dim(torch, fn, dtype, dim):
    x = randn(torch, (3, 5, 70, 9), dt(torch, dtype), scale=3.0)
    assert_close(getattr(tessera, fn)(x, dim), getattr(torch, fn)(x.double(), dim), dtype)
    x = leaf(x)
    w = randn(torch, x.shape, x.dtype)
    (getattr(tessera, fn)(x, dim) * w).sum().backward()
    x64 = ref_leaf(x)
    (getattr(torch, fn)(x64, dim) * w.double()).sum().backward()
    assert_close(x.grad, x64.grad, dtype, "grad")


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_non_contiguous(torch, fn):
    base = randn(torch, (96, 130), torch.float32, scale=3.0)
    row = randn(torch, (1, 130), torch.float32)
    for x, dim in ((base.t(), -1), (base.t(), 0), (base[:, ::2], -1), (base[::3, 1:-1], 1),
                   (base[1::2].t()[::5], 0), (row.expand(6, 130), -1)):
        assert_close(getattr(tessera, fn)(x, dim), getattr(torch, fn)(x.double(), dim), "float32")
    out = torch.empty(130, 96, device=DEV).t()  # a strided out
    assert getattr(tessera, fn)(base, 1, out=out) is out
    assert_close(out, getattr(torch, fn)(base.double(), 1), "float32")


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_zero_rows_0d_and_out(torch, fn):
    f, ref = getattr(tessera, fn), getattr(torch, fn)
    assert f(torch.empty(0, 17, device=DEV), -1).shape == (0, 17)
    assert f(torch.empty(4, 0, device=DEV), -1).shape == (4, 0)
    assert f(torch.empty(4, 0, device=DEV), 0).shape == (4, 0)
    s = torch.tensor(2.5, device=DEV)
    for dim in (0, -1):
        assert_close(f(s, dim), ref(s.double(), dim), "float32")
    x = leaf(torch.empty(0, 9, device=DEV))
    f(x, -1).sum().backward()
    assert x.grad.shape == (0, 9)
    x = randn(torch, (33, 65), torch.float32)
    expected = ref(x.double(), 0)
    out = torch.full_like(x, math.nan)
    assert f(x, 0, out=out) is out
    assert_close(out, expected, "float32")
    assert f(x, 0, out=x) is x  # in place
    assert_close(x, expected, "float32")


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_inf_and_nan_rows(torch, fn, dtype):
    x = randn(torch, (8, 300), dt(torch, dtype), scale=2.0)
    x[1] = -math.inf                # all -inf: NaN row
    x[2, 5] = math.nan              # NaN anywhere: NaN row
    x[3, :100] = -math.inf          # partly -inf: zeros (softmax), -inf (log_softmax) there
    x[4, 299] = -math.inf
    x[5, 7] = 1e30 if dtype != "float16" else 6e4  # one dominant element
    x[6, ::2] = -math.inf
    out = getattr(tessera, fn)(x, -1)
    ref = getattr(torch, fn)(x.double(), -1)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(out.double(), ref, equal_nan=True, **tol)
    assert out[1].isnan().all() and out[2].isnan().all() and not out[3:].isnan().any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_dtype_argument(torch, dtype):
    x = leaf(randn(torch, (37, 300), dt(torch, dtype), scale=3.0))
    for fn in ("softmax", "log_softmax"):
        out = getattr(tessera, fn)(x, -1, dtype=torch.float32)
        assert out.dtype == torch.float32
        assert_close(out, getattr(torch, fn)(x.double(), -1), "float32")
        (out * out.detach()).sum().backward()  # the gradient goes through the cast
        assert x.grad.dtype == x.dtype
        x64 = ref_leaf(x)
        o64 = getattr(torch, fn)(x64, -1)
        (o64 * o64.detach()).sum().backward()
        assert_close(x.grad, x64.grad, dtype, f"{fn} grad")
        x.grad = None


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (64, 1000), (3, 4097), (2, 32768)])
def test_softmax_gradients_match_torch(torch, fn, dtype, shape):
    x = leaf(randn(torch, shape, dt(torch, dtype), scale=3.0))
    g = randn(torch, shape, x.dtype)
    y = getattr(tessera, fn)(x, -1)
    assert y.grad_fn is not None
    y.backward(g)
    x64 = ref_leaf(x)
    getattr(torch, fn)(x64, -1).backward(g.double())
    assert x.grad.dtype == x.dtype
    assert_close(x.grad, x64.grad, dtype, "grad")
    # The backward functions directly, against torch's own.
    y = y.detach()
    direct = getattr(tessera, f"{fn}_backward")(g, y, -1)
    aten = getattr(torch.ops.aten, f"_{fn}_backward_data")(g.double(), y.double(), -1,
                                                           torch.float64)
    assert_close(direct, aten, dtype, "backward function")


def test_softmax_backward_strided_and_expanded_gradients(torch):
    x = leaf(randn(torch, (200, 300), torch.float32, scale=2.0).t())  # a strided leaf
    tessera.log_softmax(x, -1).sum().backward()  # grad_out expanded: stride 0 everywhere
    x64 = ref_leaf(x)
    torch.log_softmax(x64, -1).sum().backward()
    assert_close(x.grad, x64.grad, "float32", "grad")
    y = torch.softmax(randn(torch, (64, 96), torch.float32), 0)
    g = randn(torch, (96, 64), torch.float32).t()
    out = torch.empty(96, 64, device=DEV).t()
    assert tessera.softmax_backward(g, y, 0, out=out) is out
    ref = torch.ops.aten._softmax_backward_data(g.double(), y.double(), 0, torch.float64)
    assert_close(out, ref, "float32")


def test_softmax_errors_on_the_gpu(torch):
    x = randn(torch, (4, 5), torch.float32)
    with pytest.raises(ValueError, match=r"tessera\.softmax: argument 'dim': expected a dimension "
                                         r"in \[-2, 1\] for a 2-d tensor, got 2"):
        tessera.softmax(x, 2)
    with pytest.raises(ValueError, match=r"tessera\.log_softmax: argument 'dim'"):
        tessera.log_softmax(leaf(x), -3)
    assert torch.equal(tessera.softmax(x.double(), -1), torch.softmax(x.double(), -1))  # torch's
    with pytest.raises(ValueError, match=r"tessera\.softmax: argument 'out'.*shape"):
        tessera.softmax(x, -1, out=torch.empty(5, 4, device=DEV))
    with pytest.raises(TypeError, match=r"tessera\.softmax: argument 'out'.*float16"):
        tessera.softmax(x, -1, out=torch.empty(4, 5, device=DEV, dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"argument 'out'.*automatic differentiation"):
        tessera.softmax(leaf(x), -1, out=torch.empty_like(x))
    with pytest.raises(ValueError, match=r"tessera\.softmax_backward: argument 'output'.*shape"):
        tessera.softmax_backward(x, x[:, :4], 1)


def test_no_autograd_unless_needed(torch):
    x = randn(torch, (4, 8), torch.float32)
    w = torch.ones(8, device=DEV)
    assert tessera.softmax(x).grad_fn is None
    assert tessera.layer_norm(x, 8, w).grad_fn is None
    assert tessera.rms_norm(x, 8, leaf(w)).grad_fn is not None  # the weight asks for it
    assert tessera.layer_norm(x, 8, None, leaf(w)).grad_fn is not None  # so does the bias
    with torch.no_grad():
        assert tessera.log_softmax(leaf(x)).grad_fn is None
        assert tessera.layer_norm(leaf(x), 8).grad_fn is None


# ---- GPU: LayerNorm and RMSNorm ---------------------------------------------------------------

# (shape, number of normalized trailing dimensions)
NORM_SHAPES = [((4, 1), 1), ((9,), 1), ((7, 33), 1), ((64, 1000), 1), ((3, 4097), 1),
               ((2, 32768), 1), ((1, 65536), 1), ((2, 3, 64), 2), ((5, 6, 7), 2), ((2, 3, 4, 5), 3)]


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, k", NORM_SHAPES)
def test_layer_norm_and_gradients(torch, shape, k, dtype, affine):
    d = dt(torch, dtype)
    normalized = shape[len(shape) - k:]
    x = leaf(1.0 + 2.0 * randn(torch, shape, d))  # an offset mean: cancellation shows up
    w, b = norm_params(torch, normalized, d, *affine)
    g = randn(torch, shape, d)
    out = tessera.layer_norm(x, normalized, w, b, 1e-5)
    assert out.dtype == d and out.shape == x.shape
    x64, w64, b64 = ref_leaf(x), ref_leaf(w), ref_leaf(b)
    ref = torch.nn.functional.layer_norm(x64, normalized, w64, b64, 1e-5)
    assert_close(out, ref, dtype, "out")
    out.backward(g)
    ref.backward(g.double())
    if math.prod(normalized) > 1:
        assert_close(x.grad, x64.grad, dtype, "grad_input")
    else:
        # A 1-element row normalizes to 0 whatever x is, so the input gradient is exactly 0; in
        # float32 it is a difference of equal terms times rstd = 1/sqrt(eps) ~ 316, so rounding
        # leaves ~1e-5. A relative error against 0 is meaningless: bound the absolute value.
        assert x.grad.abs().max().item() <= 1e-3, f"grad_input: {x.grad.abs().max().item()}"
    for p, p64, name in ((w, w64, "grad_weight"), (b, b64, "grad_bias")):
        if p is not None:
            assert p.grad.dtype == d
            assert_close(p.grad, p64.grad, dtype, name)


@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, k", NORM_SHAPES)
def test_rms_norm_and_gradients(torch, shape, k, dtype, with_weight):
    d = dt(torch, dtype)
    normalized = shape[len(shape) - k:]
    x = leaf(randn(torch, shape, d))
    w, _ = norm_params(torch, normalized, d, with_weight, False)
    g = randn(torch, shape, d)
    out = tessera.rms_norm(x, normalized, w, 1e-6)
    x64, w64 = ref_leaf(x), ref_leaf(w)
    ref = torch.nn.functional.rms_norm(x64, normalized, w64, 1e-6)
    assert_close(out, ref, dtype, "out")
    out.backward(g)
    ref.backward(g.double())
    if math.prod(normalized) > 1:
        # (A 1-element row's input gradient, eps / (x^2 + eps)^1.5, is a difference of nearly
        # equal terms given a float32 rstd, in any implementation: not compared.)
        assert_close(x.grad, x64.grad, dtype, "grad_input")
    if w is not None:
        assert_close(w.grad, w64.grad, dtype, "grad_weight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 1024), (19, 999), (2, 70000), (301, 4096), (3, 5, 256)])
def test_rms_norm_weight_offset(torch, shape, dtype):
    # Gemma's x * rstd * (1 + w): the offset added in float32, through autograd and the fast path.
    d = dt(torch, dtype)
    n = shape[-1]
    x = leaf(randn(torch, shape, d))
    w = leaf(0.1 * randn(torch, (n,), d))
    g = randn(torch, shape, d)
    out = tessera.rms_norm(x, (n,), w, 1e-6, weight_offset=1.0)
    x64, w64 = ref_leaf(x), ref_leaf(w)
    ref = torch.nn.functional.rms_norm(x64, (n,), None, 1e-6) * (1.0 + w64)
    assert_close(out, ref, dtype, "out")
    out.backward(g)
    ref.backward(g.double())
    assert_close(x.grad, x64.grad, dtype, "grad_input")
    assert_close(w.grad, w64.grad, dtype, "grad_weight")
    with torch.no_grad():  # the fast path, and the functions that take the statistics
        assert torch.equal(tessera.rms_norm(x, (n,), w, 1e-6, weight_offset=1.0), out.detach())
        _, rstd = tessera.rms_norm_forward(x, n, w, 1e-6, weight_offset=1.0)
        gi, gw = tessera.rms_norm_backward(g, x, n, rstd, w, weight_offset=1.0)
    assert torch.equal(gi, x.grad) and torch.equal(gw, w.grad)


def test_rms_norm_weight_offset_errors(torch):
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(ValueError, match=r"tessera\.rms_norm: argument 'weight_offset'.*0 when 'weight' is not given"):
        tessera.rms_norm(x, 8, None, weight_offset=1.0)
    with pytest.raises(ValueError, match=r"argument 'weight_offset'.*finite"):
        tessera.rms_norm(x, 8, torch.ones(8, device="cuda"), weight_offset=float("inf"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_default_eps_on_the_gpu(torch, dtype):
    # Small inputs, where eps decides the result: the default must be the one torch uses.
    x = randn(torch, (16, 256), dt(torch, dtype), scale=1e-3)
    out = tessera.rms_norm(x, 256)
    assert_close(out, torch.nn.functional.rms_norm(x.double(), (256,), eps=2.0 ** -23), dtype)
    assert_close(out, torch.nn.functional.rms_norm(x, (256,)), dtype, "vs torch's default")
    bf16_eps = torch.nn.functional.rms_norm(x.double(), (256,), eps=torch.finfo(torch.bfloat16).eps)
    assert rel_err(out, bf16_eps) > 0.5  # the check above can tell the two apart


@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm"])
def test_norms_non_contiguous(torch, fn):
    base = 1.0 + randn(torch, (64, 96), torch.float32)
    cube = randn(torch, (8, 6, 10), torch.float32)
    cases = [(base.t(), (64,)), (base[:, ::2], (48,)), (base[::2, 1:], (95,)),
             (cube.permute(2, 0, 1), (8, 6)), (cube[:, ::2, 1::3], (3, 3))]
    F = torch.nn.functional
    for x, normalized in cases:
        x = leaf(x)
        w = leaf(1.0 + 0.5 * randn(torch, normalized, torch.float32))
        y = getattr(tessera, fn)(x, normalized, w, eps=1e-5)
        x64, w64 = ref_leaf(x), ref_leaf(w)
        ref = getattr(F, fn)(x64, normalized, w64, eps=1e-5)
        assert_close(y, ref, "float32", f"out {tuple(x.shape)} {x.stride()}")
        y.sum().backward()  # an expanded (stride 0) grad_output
        ref.sum().backward()
        assert_close(x.grad, x64.grad, "float32", "grad_input")
        assert_close(w.grad, w64.grad, "float32", "grad_weight")


def test_norms_zero_rows(torch):
    x = leaf(torch.empty(0, 64, device=DEV))
    w, b = leaf(torch.ones(64, device=DEV)), leaf(torch.zeros(64, device=DEV))
    y = tessera.layer_norm(x, 64, w, b)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64)
    assert torch.equal(b.grad, torch.zeros_like(b)) and torch.equal(w.grad, torch.zeros_like(w))
    w.grad = None
    tessera.rms_norm(x, (64,), w).sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    out, mean, rstd = tessera.layer_norm_forward(x.detach(), 64)
    assert out.shape == (0, 64) and mean.shape == (0,) and rstd.shape == (0,)
    # Sums over no rows are written as zeros, not left as whatever the memory held: freed NaN
    # blocks of the same size are what torch's caching allocator hands out next.
    poison = [torch.full((64,), math.nan, device=DEV) for _ in range(2)]
    del poison
    _, gw, gb = tessera.layer_norm_backward(torch.empty(0, 64, device=DEV), x.detach(), 64, mean,
                                            rstd, w.detach(), w.detach())
    assert torch.equal(gw, torch.zeros_like(gw)) and torch.equal(gb, torch.zeros_like(gb))
    x3 = torch.empty(2, 0, 5, device=DEV)
    assert tessera.rms_norm(x3, (0, 5)).shape == (2, 0, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_forward_statistics(torch, dtype):
    x = 3.0 + randn(torch, (4, 3, 64), dt(torch, dtype), scale=2.0)
    for k in (1, 2, 3):
        normalized = x.shape[3 - k:]
        out, mean, rstd = tessera.layer_norm_forward(x, normalized, eps=1e-5)
        lead = x.shape[:3 - k]
        assert mean.shape == lead and rstd.shape == lead  # the leading shape; 0-d for k = 3
        assert mean.dtype == torch.float32 and rstd.dtype == torch.float32
        dims = tuple(range(3 - k, 3))
        x64 = x.double()
        assert_close(mean, x64.mean(dims), "float32", "mean")
        assert_close(rstd, 1.0 / (x64.var(dims, unbiased=False) + 1e-5).sqrt(), "float32", "rstd")
        assert_close(out, torch.nn.functional.layer_norm(x64, normalized, eps=1e-5), dtype)
        out, rstd = tessera.rms_norm_forward(x, normalized, eps=1e-5)
        assert rstd.shape == lead and rstd.dtype == torch.float32
        assert_close(rstd, 1.0 / ((x64 * x64).mean(dims) + 1e-5).sqrt(), "float32", "rms rstd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, True), (False, True, False),
                                  (False, False, True), (False, False, False)])
def test_layer_norm_backward_function_matches_torch(torch, dtype, mask):
    d = dt(torch, dtype)
    x = randn(torch, (6, 5, 96), d)
    w = 1.0 + 0.5 * randn(torch, (5, 96), d)
    b = randn(torch, (5, 96), d)
    g = randn(torch, x.shape, d)
    # torch's statistics (shape leading + (1, 1)) and ours (the leading shape) are both taken.
    _, mean_t, rstd_t = torch.native_layer_norm(x.float(), (5, 96), None, None, 1e-5)
    _, mean, rstd = tessera.layer_norm_forward(x, (5, 96), w, b, 1e-5)
    assert mean_t.shape == (6, 1, 1) and mean.shape == (6,)
    ref = torch.ops.aten.native_layer_norm_backward(g.double(), x.double(), (5, 96),
                                                    mean.double().view(6, 1, 1),
                                                    rstd.double().view(6, 1, 1), w.double(),
                                                    b.double(), [True, True, True])
    for m, r in ((mean, rstd), (mean_t, rstd_t)):
        got = tessera.layer_norm_backward(g, x, (5, 96), m, r, w, b, mask)
        for want, out, expected, name in zip(mask, got, ref, ("grad_input", "grad_weight",
                                                              "grad_bias")):
            if want:
                assert_close(out, expected, dtype, name)
            else:
                assert out is None, name
    # No weight: no grad_weight, and no bias no grad_bias, whatever the mask says.
    gi, gw, gb = tessera.layer_norm_backward(g, x, (5, 96), mean, rstd)
    assert gw is None and gi is not None and gb is None
    gi, gw, gb = tessera.layer_norm_backward(g, x, (5, 96), mean, rstd, None, b)
    assert gw is None and gi is not None and gb is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward_function(torch, dtype):
    d = dt(torch, dtype)
    x = randn(torch, (6, 5, 96), d)
    w = 1.0 + 0.5 * randn(torch, (96,), d)
    g = randn(torch, x.shape, d)
    _, rstd = tessera.rms_norm_forward(x, 96, w, 1e-6)
    x64, w64 = ref_leaf(x), ref_leaf(w)
    torch.nn.functional.rms_norm(x64, (96,), w64, 1e-6).backward(g.double())
    gi, gw = tessera.rms_norm_backward(g, x, 96, rstd, w)
    assert_close(gi, x64.grad, dtype, "grad_input")
    assert_close(gw, w64.grad, dtype, "grad_weight")
    gi, gw = tessera.rms_norm_backward(g, x, 96, rstd.view(6, 5, 1), w, (False, True))
    assert gi is None
    assert_close(gw, w64.grad, dtype, "grad_weight")
    assert tessera.rms_norm_backward(g, x, 96, rstd, None, (True, True))[1] is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_gradients_are_bit_identical_run_to_run(torch, dtype):
    d = dt(torch, dtype)
    x = leaf(randn(torch, (8192, 1024), d))
    w, b = norm_params(torch, (1024,), d, True, True)
    g = randn(torch, x.shape, d)
    runs = []
    for _ in range(2):
        x.grad = w.grad = b.grad = None
        tessera.layer_norm(x, 1024, w, b).backward(g)
        runs.append((x.grad.clone(), w.grad.clone(), b.grad.clone()))
    for a, c, name in zip(*runs, ("grad_input", "grad_weight", "grad_bias")):
        assert torch.equal(a, c), name
    runs = []
    for _ in range(2):
        w.grad = None
        tessera.rms_norm(x, 1024, w).backward(g)
        runs.append(w.grad.clone())
    assert torch.equal(*runs)


def test_norms_out_and_errors(torch):
    x = randn(torch, (16, 32), torch.float32)
    w = torch.ones(32, device=DEV)
    out = torch.full_like(x, math.nan)
    assert tessera.layer_norm(x, 32, w, out=out) is out
    assert_close(out, torch.nn.functional.layer_norm(x.double(), (32,), w.double()), "float32")
    assert tessera.rms_norm(x, 32, out=out) is out
    assert_close(out, torch.nn.functional.rms_norm(x.double(), (32,), eps=2.0 ** -23), "float32")
    with pytest.raises(ValueError, match=r"argument 'normalized_shape'.*\[16, 32\].*got \[16\]"):
        tessera.layer_norm(x, 16)
    with pytest.raises(ValueError, match=r"tessera\.layer_norm: argument 'weight'.*shape"):
        tessera.layer_norm(x, 32, torch.ones(31, device=DEV))
    # Parameters of another dtype or device, float64 inputs: torch's own functions.
    F = torch.nn.functional
    assert torch.equal(tessera.rms_norm(x, 32, w.half()), F.rms_norm(x, (32,), w.half()))
    with pytest.raises(ValueError, match=r"tessera\.layer_norm: argument 'bias': "
                                         + CPU_DEVICE_MSG):
        tessera.layer_norm(x, 32, w, torch.zeros(32))  # torch refuses it too; tessera names it
    assert torch.equal(tessera.layer_norm(x.double(), 32), F.layer_norm(x.double(), (32,)))
    with pytest.raises(TypeError, match=r"tessera\.rms_norm: argument 'weight'.*float16"):
        tessera.rms_norm(x, 32, w.half(), out=torch.empty_like(x))  # out= is tessera's
    with pytest.raises(ValueError, match=r"tessera\.layer_norm: argument 'eps'"):
        tessera.layer_norm(x, 32, eps=-1.0)
    with pytest.raises(RuntimeError, match=r"argument 'out'.*automatic differentiation"):
        tessera.rms_norm(leaf(x), 32, out=out)
    _, mean, rstd = tessera.layer_norm_forward(x, 32)
    with pytest.raises(ValueError, match=r"tessera\.layer_norm_backward: argument 'mean'"):
        tessera.layer_norm_backward(x, x, 32, mean[:8], rstd)
    with pytest.raises(TypeError, match=r"tessera\.layer_norm_backward: argument 'rstd'"):
        tessera.layer_norm_backward(x, x, 32, mean, rstd.double())


# ---- GPU: DLPack inputs -----------------------------------------------------------------------

def test_device_array_inputs(torch):
    x = randn(torch, (31, 17), torch.float32)
    arr = tessera.DeviceArray([31, 17], "float32", 0)
    torch.from_dlpack(arr).copy_(x)
    torch.cuda.synchronize()
    y = tessera.softmax(arr, -1)
    assert isinstance(y, tessera.DeviceArray) and y.shape == (31, 17)
    z = tessera.log_softmax(arr, 0)
    gi = tessera.softmax_backward(arr, y, -1)
    ln = tessera.layer_norm(arr, (17,))
    rn = tessera.rms_norm(arr, 17)
    torch.cuda.synchronize()
    assert_close(torch.from_dlpack(y), torch.softmax(x.double(), -1), "float32")
    assert_close(torch.from_dlpack(z), torch.log_softmax(x.double(), 0), "float32")
    yt = torch.from_dlpack(y)
    assert_close(torch.from_dlpack(gi),
                 torch.ops.aten._softmax_backward_data(x.double(), yt.double(), -1, torch.float64),
                 "float32")
    assert_close(torch.from_dlpack(ln), torch.nn.functional.layer_norm(x.double(), (17,)),
                 "float32")
    assert_close(torch.from_dlpack(rn),
                 torch.nn.functional.rms_norm(x.double(), (17,), eps=2.0 ** -23), "float32")


def test_cupy_in_cupy_out(torch):
    cupy = pytest.importorskip("cupy", reason="cupy not installed")
    x = cupy.random.standard_normal((100, 33), dtype=cupy.float32)
    y = tessera.softmax(x, -1)
    n = tessera.layer_norm(x, 33)
    assert isinstance(y, cupy.ndarray) and isinstance(n, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    xt = torch.from_dlpack(x)
    assert_close(torch.from_dlpack(y), torch.softmax(xt.double(), -1), "float32")
    assert_close(torch.from_dlpack(n), torch.nn.functional.layer_norm(xt.double(), (33,)),
                 "float32")
