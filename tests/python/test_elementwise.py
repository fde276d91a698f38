"""tessera.add, tessera.gelu, tessera.silu, tessera.silu_mul and tessera.geglu from Python.

CPU-side tests (any machine): argument validation and messages. The library checks, per argument
in order, dimensions, then that it is on a CUDA device, then its dtype, then shapes; so a CPU
array is refused for its device whatever its dtype or shape, and these tests say so.

GPU tests (the `torch` fixture): results against a float64 torch reference by relative norm error
(within the ops' descriptions' tolerances, tessera.bench.ops), broadcasting, strided views, out=, autograd, streams, devices,
and DLPack inputs (cupy, tessera.DeviceArray).
"""


import re

import pytest

import tessera
from tessera._interop import broadcast_shape

CPU_DEVICE_MSG = "expected a CUDA tensor, got a tensor on cpu"


# ---- CPU side ---------------------------------------------------------------------------------

def test_add_cpu_array_names_argument_and_device(np):
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError) as e:
        tessera.add(a, a)
    assert str(e.value) == f"tessera.add: argument 'input': {CPU_DEVICE_MSG}"


def test_gelu_cpu_array_names_argument_and_device(np):
    with pytest.raises(ValueError) as e:
        tessera.gelu(np.ones(5, np.float32))
    assert str(e.value) == f"tessera.gelu: argument 'input': {CPU_DEVICE_MSG}"
    with pytest.raises(ValueError, match=r"tessera\.gelu: argument 'input'.*CUDA"):
        tessera.gelu(np.ones(5, np.float32), approximate="tanh")


def test_gelu_backward_cpu_array(np):
    x = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=r"tessera\.gelu_backward: argument 'input'.*CUDA tensor"):
        tessera.gelu_backward(x, x)


@pytest.mark.parametrize("dtype", ["int32", "float64", "int8", "bool", "complex64"])
def test_cpu_array_of_any_dtype_gets_the_device_error_first(np, dtype):
    # The device check precedes the dtype check (and an unrepresentable dtype, complex64, does
    # not get in its way either).
    x = np.zeros(4, dtype=dtype)
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.gelu(x)
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.add(x, x)


def test_cpu_shape_mismatch_gets_the_device_error_first(np):
    with pytest.raises(ValueError, match=r"argument 'input': " + CPU_DEVICE_MSG):
        tessera.add(np.ones(3, np.float32), np.ones(4, np.float32))


def test_cpu_array_with_scalar_and_out(np):
    a = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"argument 'input': " + CPU_DEVICE_MSG):
        tessera.add(a, 2.5, alpha=3)
    with pytest.raises(ValueError, match=r"argument 'input': " + CPU_DEVICE_MSG):
        tessera.add(a, a, out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match=r"argument 'input': " + CPU_DEVICE_MSG):
        tessera.gelu(a, out=a)


def test_read_only_and_strided_cpu_arrays(np):
    a = np.ones((4, 6), np.float32)
    a.setflags(write=False)
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.gelu(a)
    with pytest.raises(ValueError, match=CPU_DEVICE_MSG):
        tessera.gelu(np.ones((4, 6), np.float32).T[::2])


def test_too_many_dimensions(np):
    with pytest.raises(ValueError, match=r"argument 'input': expected at most 8 dimensions, got 9"):
        tessera.add(np.ones((1,) * 9, np.float32), 1.0)


@pytest.mark.parametrize("fn", ["gelu", "gelu_backward"])
def test_bad_approximate_names_the_argument(np, fn):
    x = np.ones(3, np.float32)
    args = (x,) if fn == "gelu" else (x, x)
    with pytest.raises(ValueError) as e:
        getattr(tessera, fn)(*args, approximate="fast")
    assert str(e.value) == (f"tessera.{fn}: argument 'approximate': expected 'none' or 'tanh', "
                            "got 'fast'")


def test_not_a_tensor_is_a_type_error(np):
    with pytest.raises(TypeError, match=r"tessera\.add: argument 'input': expected a tensor.*got list"):
        tessera.add([1.0, 2.0], 1.0)
    with pytest.raises(TypeError, match=r"tessera\.gelu: argument 'input': expected a tensor.*got str"):
        tessera.gelu("x")
    # A bad `other` is refused when it is converted, before the device checks run.
    with pytest.raises(TypeError, match=r"tessera\.add: argument 'other': expected a tensor.*got str"):
        tessera.add(np.ones(3, np.float32), "1")


def test_a_tuple_is_not_a_tensor():
    # The extension reads tuples as torch view tuples (raw pointers): the API must refuse them.
    fake = (1 << 20, 0, (4,), (1,), 0)
    with pytest.raises(TypeError, match=r"argument 'input'.*got tuple"):
        tessera.add(fake, fake)
    with pytest.raises(TypeError, match=r"argument 'input'.*got tuple"):
        tessera.gelu(fake)
    with pytest.raises(TypeError, match=r"argument 'grad_output'.*got tuple"):
        tessera.gelu_backward(fake, fake)


def test_torch_cpu_tensors_get_torchs_results():
    # torch's contract for the signatures tessera mirrors: what its kernels do not take (a CPU
    # tensor) runs torch's own function, with torch's result or torch's error. No GPU needed.
    torch = pytest.importorskip("torch", reason="torch not installed")
    F = torch.nn.functional
    x = torch.randn(3, 4)
    assert torch.equal(tessera.add(x, x), torch.add(x, x))
    assert torch.equal(tessera.add(x, 2, alpha=3), torch.add(x, 2, alpha=3))
    assert torch.equal(tessera.add(0.5, x), torch.add(0.5, x))
    assert torch.equal(tessera.gelu(x), F.gelu(x))
    assert torch.equal(tessera.silu(x), F.silu(x))
    g = tessera.gelu(x.clone().requires_grad_())
    assert g.requires_grad and torch.equal(g, F.gelu(x))
    with pytest.raises(RuntimeError):
        tessera.add(x, torch.ones(5))  # torch's own error for shapes that do not broadcast
    # out= is tessera's own argument: its calls keep tessera's checks.
    with pytest.raises(ValueError, match=r"tessera\.gelu: argument 'input': " + CPU_DEVICE_MSG):
        tessera.gelu(x, out=torch.empty(3, 4))
    with pytest.raises(ValueError, match=r"tessera\.add: argument 'input': " + CPU_DEVICE_MSG):
        tessera.add(x, x, out=torch.empty(3, 4))


def test_add_takes_what_torch_add_takes():
    # Numbers on either side, two numbers, integer tensors, torch's promotion (CPU: torch's own).
    torch = pytest.importorskip("torch", reason="torch not installed")
    i = torch.arange(6, dtype=torch.int32).view(2, 3)
    f = torch.randn(2, 3)
    cases = [(0.5, f, 1), (2, f, 1), (1, 2, 1), (1.5, 2, 1), (i, i, 1), (i, 3, 2), (i, 0.5, 1),
             (i, f, 1), (f.double(), f, 1), (f, 1j, 1)]
    for a, b, alpha in cases:
        want = torch.add(a, b, alpha=alpha)
        got = tessera.add(a, b, alpha=alpha)
        assert got.dtype == want.dtype and torch.equal(got, want), (a, b, alpha)


def test_device_array_without_gpu_or_with_bad_arguments():
    with pytest.raises(TypeError, match=r"argument 'dtype'.*'float8'"):
        tessera.DeviceArray([4], "float8")
    with pytest.raises(ValueError, match=r"argument 'shape'.*non-negative"):
        tessera.DeviceArray([-1], "float32")
    if not tessera.is_available():
        # One line with the reason there is no GPU, and no path of the machine it was built on.
        with pytest.raises(RuntimeError, match="no usable GPU") as e:
            tessera.DeviceArray([4], "float32")
        assert tessera.no_gpu_reason() in str(e.value) and "\n" not in str(e.value)
        assert not re.search(r"/\S*/src/", str(e.value)), str(e.value)


@pytest.mark.parametrize("a, b, out", [
    ((3, 4), (3, 4), (3, 4)), ((4, 1), (1, 5), (4, 5)), ((2, 3, 4), (4,), (2, 3, 4)),
    ((), (2, 3), (2, 3)), ((5, 1, 3), (4, 1), (5, 4, 3)), ((3,), (4,), None), ((2, 3), (3, 2), None),
    ((0, 3), (1, 3), (0, 3)), ((0,), (1,), (0,)),
])
def test_broadcast_shape_is_torchs(a, b, out):
    assert broadcast_shape(a, b) == out
    assert broadcast_shape(b, a) == out


# ---- GPU: helpers -----------------------------------------------------------------------------

# Bounds on the relative norm error against float64, per dtype: the ops' descriptions, as
# `tessera verify` applies them (one bound per dtype for all the ops here, which
# test_one_tolerance_per_dtype checks).
DESCRIPTIONS = tessera.bench.ops("add,gelu,silu,silu_mul,geglu")
DTYPES = DESCRIPTIONS[0].dtypes
TOL = {d: DESCRIPTIONS[0].tolerance(d) for d in DTYPES}


def test_one_tolerance_per_dtype():
    for op in DESCRIPTIONS:
        assert op.dtypes == DTYPES, op.name
        for d in DTYPES:
            assert op.tolerance(d) == TOL[d], f"{op.name} {d}: assert_close needs the op's own bound"
SIZES = [1, 7, 1000, 4097, 65537, (1 << 20) + 3]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    err = (out - ref).norm().item()
    norm = ref.norm().item()
    return err / norm if norm > 0 else err


def assert_close(out, ref, dtype_name):
    assert out.shape == ref.shape
    assert not out.isnan().any(), "NaN in the output (an element not written?)"
    err = rel_err(out, ref)
    assert err <= TOL[dtype_name], f"relative norm error {err:.3g} > {TOL[dtype_name]}"


def dt(torch, name):
    return getattr(torch, name)


def randn(torch, shape, dtype, **kw):
    return torch.randn(shape, device="cuda", dtype=torch.float32, **kw).to(dtype)


def gelu_ref(torch, x, approximate):
    return torch.nn.functional.gelu(x.double(), approximate=approximate)


# ---- GPU: add ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_add_matches_reference(torch, dtype, n):
    a, b = randn(torch, n, dt(torch, dtype)), randn(torch, n, dt(torch, dtype))
    out = tessera.add(a, b, alpha=0.75)
    assert isinstance(out, torch.Tensor) and out.dtype == a.dtype and out.device == a.device
    assert_close(out, a.double() + 0.75 * b.double(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape_a, shape_b", [
    ((4, 1), (1, 5)), ((33, 65), (65,)), ((3, 5, 7), ()), ((3, 1, 7), (5, 1)), ((1,), (6, 9)),
    ((8, 1024), (1, 1024)), ((2, 3, 4, 5), (3, 1, 5)),
])
def test_add_broadcasting(torch, dtype, shape_a, shape_b):
    a, b = randn(torch, shape_a, dt(torch, dtype)), randn(torch, shape_b, dt(torch, dtype))
    out = tessera.add(a, b, alpha=-1.5)
    assert out.shape == torch.broadcast_shapes(a.shape, b.shape)
    assert_close(out, a.double() - 1.5 * b.double(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_python_scalar_and_scalar_tensors(torch, dtype):
    a = randn(torch, (37, 5), dt(torch, dtype))
    assert_close(tessera.add(a, 2.5), a.double() + 2.5, dtype)
    assert_close(tessera.add(a, 3, alpha=2), a.double() + 6, dtype)
    s = torch.tensor(1.25, device="cuda", dtype=a.dtype)
    assert_close(tessera.add(a, s, alpha=2), a.double() + 2.5, dtype)
    cpu_scalar = torch.tensor(0.5)  # a 0-dim CPU tensor is a number, as in torch
    assert_close(tessera.add(a, cpu_scalar), a.double() + 0.5, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_non_contiguous(torch, dtype):
    base_a = randn(torch, (64, 96), dt(torch, dtype))
    base_b = randn(torch, (96, 64), dt(torch, dtype))
    a, b = base_a.t(), base_b                      # transposed + contiguous
    assert_close(tessera.add(a, b), a.double() + b.double(), dtype)
    a, b = base_a[::2, 1::3], base_b.t()[::2, :32]  # sliced with steps
    assert_close(tessera.add(a, b, alpha=3), a.double() + 3 * b.double(), dtype)
    e = randn(torch, (1, 96), dt(torch, dtype)).expand(64, 96)  # stride 0 input
    assert_close(tessera.add(base_a, e), base_a.double() + e.double(), dtype)
    out = torch.empty(96, 64, device="cuda", dtype=a.dtype).t()  # strided out
    tessera.add(base_a, base_a, out=out)
    assert_close(out, 2 * base_a.double(), dtype)


def test_add_zero_elements(torch):
    a = torch.empty(0, 5, device="cuda")
    out = tessera.add(a, a)
    assert out.shape == (0, 5)
    assert tessera.add(torch.empty(0, device="cuda"), 1.0).shape == (0,)
    assert tessera.add(torch.empty(3, 0, device="cuda"), torch.empty(1, 0, device="cuda")).shape == (3, 0)


def test_add_out(torch):
    a, b = randn(torch, (16, 8), torch.float32), randn(torch, (8,), torch.float32)
    out = torch.full((16, 8), float("nan"), device="cuda")
    r = tessera.add(a, b, alpha=2, out=out)
    assert r is out
    assert_close(out, a.double() + 2 * b.double(), "float32")
    with pytest.raises(ValueError, match=r"tessera\.add: argument 'out'.*shape \[16, 8\]"):
        tessera.add(a, b, out=torch.empty(8, 16, device="cuda"))
    with pytest.raises(TypeError, match=r"argument 'out'.*float32"):
        tessera.add(a, b, out=torch.empty(16, 8, device="cuda", dtype=torch.float16))


def test_add_in_place_and_overlap(torch):
    a, b = randn(torch, 1000, torch.float32), randn(torch, 1000, torch.float32)
    expected = a.double() + b.double()
    r = tessera.add(a, b, out=a)
    assert r is a
    assert_close(a, expected, "float32")
    buf = randn(torch, 1001, torch.float32)
    with pytest.raises(ValueError, match=r"argument 'out'.*overlap"):
        tessera.add(buf[:-1], b, out=buf[1:])
    with pytest.raises(ValueError, match=r"argument 'out'.*overlap"):
        tessera.add(b, buf[:-1], out=buf[1:])


def test_add_dtype_and_device_mismatch(torch):
    a = randn(torch, 10, torch.float32)
    # Mixed dtypes promote as torch.add does (torch's result); devices that differ get torch's
    # own error.
    got = tessera.add(a, a.half())
    assert got.dtype == torch.float32 and torch.equal(got, torch.add(a, a.half()))
    with pytest.raises(RuntimeError, match="device"):
        tessera.add(a, a.cpu())
    with pytest.raises(RuntimeError, match="device"):
        tessera.add(a.cpu(), a)
    # out= is tessera's own argument: its calls keep tessera's checks.
    with pytest.raises(TypeError, match=r"tessera\.add: argument 'other'.*float32.*got float16"):
        tessera.add(a, a.half(), out=torch.empty_like(a))
    with pytest.raises(ValueError, match=r"argument 'other'.*broadcastable"):
        tessera.add(a, randn(torch, 11, torch.float32))


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_dtypes_outside_the_kernels_get_torchs_results(torch, dtype):
    F = torch.nn.functional
    x = torch.arange(8, device="cuda").to(dt(torch, dtype))
    assert torch.equal(tessera.add(x, x), torch.add(x, x))
    assert torch.equal(tessera.add(x, 2.5), torch.add(x, 2.5))  # int + float: float32, as torch
    assert torch.equal(tessera.add(1, x), torch.add(1, x))
    if dtype == "float64":
        assert torch.equal(tessera.gelu(x), F.gelu(x))
    else:
        with pytest.raises(RuntimeError):  # torch's own refusal
            tessera.gelu(x)
    with pytest.raises(TypeError, match=rf"argument 'input'.*got {dtype}"):
        tessera.gelu(x, out=torch.empty_like(x))  # out= is tessera's: its checks


def test_add_numbers_and_promotion_on_the_gpu(torch):
    # Where the kernel takes the call it runs (a number on either side of a float tensor);
    # elsewhere torch's promotion gives torch's dtype and values.
    f = randn(torch, (4, 5), torch.bfloat16)
    i = torch.arange(20, device="cuda", dtype=torch.int64).view(4, 5)
    for a, b in [(0.5, f), (f, 3), (3, f), (i, f), (f, i), (i, 0.5), (f.float(), f), (i, i)]:
        want = torch.add(a, b)
        got = tessera.add(a, b)
        assert got.dtype == want.dtype and got.device == want.device
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    got = tessera.add(0.5, f, alpha=2)
    torch.testing.assert_close(got, torch.add(0.5, f, alpha=2), rtol=0, atol=0)


def test_unrepresentable_dtype_on_the_gpu(torch):
    x = torch.ones(8, device="cuda", dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="ComplexFloat"):  # torch's own refusal
        tessera.gelu(x)
    with pytest.raises(TypeError, match=r"tessera\.gelu: argument 'input'.*complex64"):
        tessera.gelu(x, out=torch.empty_like(x))  # out= is tessera's: its checks


# ---- GPU: gelu --------------------------------------------------------------------------------

@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_gelu_matches_reference(torch, approximate, dtype, n):
    x = 3 * randn(torch, n, dt(torch, dtype))
    out = tessera.gelu(x, approximate=approximate)
    assert out.dtype == x.dtype and out.device == x.device
    assert_close(out, gelu_ref(torch, x, approximate), dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_non_contiguous_zero_and_out(torch, approximate):
    base = randn(torch, (48, 80), torch.bfloat16)
    for x in (base.t(), base[::3, 1::2], base[:, :0]):
        assert_close(tessera.gelu(x, approximate), gelu_ref(torch, x, approximate), "bfloat16")
    out = torch.empty_like(base)
    assert tessera.gelu(base, approximate, out=out) is out
    assert_close(out, gelu_ref(torch, base, approximate), "bfloat16")
    expected = gelu_ref(torch, base, approximate)
    tessera.gelu(base, approximate, out=base)  # in place
    assert_close(base, expected, "bfloat16")
    with pytest.raises(ValueError, match=r"argument 'out'"):
        tessera.gelu(base, out=torch.empty(3, device="cuda", dtype=base.dtype))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_backward_matches_torch_autograd(torch, approximate, dtype):
    x = (3 * randn(torch, (129, 257), dt(torch, dtype))).requires_grad_()
    g = randn(torch, (129, 257), dt(torch, dtype))
    y = tessera.gelu(x, approximate=approximate)
    assert y.grad_fn is not None
    y.backward(g)
    x64 = x.detach().double().requires_grad_()
    torch.nn.functional.gelu(x64, approximate=approximate).backward(g.double())
    assert x.grad.dtype == x.dtype
    assert_close(x.grad, x64.grad, dtype)
    # The kernel directly, and with an expanded (stride 0) gradient as .sum().backward() makes.
    direct = tessera.gelu_backward(g, x.detach(), approximate=approximate)
    assert_close(direct, x64.grad, dtype)
    x.grad = None
    tessera.gelu(x, approximate=approximate).sum().backward()
    x64.grad = None
    torch.nn.functional.gelu(x64, approximate=approximate).sum().backward()
    assert_close(x.grad, x64.grad, dtype)


def test_no_autograd_unless_needed(torch):
    x = randn(torch, 100, torch.float32)
    assert tessera.gelu(x).grad_fn is None
    x.requires_grad_()
    assert tessera.gelu(x).grad_fn is not None
    with torch.no_grad():
        assert tessera.gelu(x).grad_fn is None
        assert tessera.add(x, x).grad_fn is None
    with pytest.raises(RuntimeError, match=r"argument 'out'.*automatic differentiation"):
        tessera.add(x, x, out=torch.empty_like(x))


def test_add_autograd_with_broadcasting(torch):
    a = randn(torch, (4, 1), torch.float32).requires_grad_()
    b = randn(torch, (1, 5), torch.float32).requires_grad_()
    g = randn(torch, (4, 5), torch.float32)
    tessera.add(a, b, alpha=2.5).backward(g)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    torch.add(a64, b64, alpha=2.5).backward(g.double())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert_close(a.grad, a64.grad, "float32")
    assert_close(b.grad, b64.grad, "float32")
    # Only one side requires grad; a Python scalar gets none.
    c = randn(torch, (3, 7), torch.float32).requires_grad_()
    tessera.add(c, randn(torch, (7,), torch.float32), alpha=3).sum().backward()
    assert_close(c.grad, torch.ones(3, 7, device="cuda", dtype=torch.float64), "float32")
    c.grad = None
    tessera.add(c, 2.0).sum().backward()
    assert_close(c.grad, torch.ones(3, 7, device="cuda", dtype=torch.float64), "float32")
    d = randn(torch, (7,), torch.float32).requires_grad_()
    tessera.add(randn(torch, (3, 7), torch.float32), d, alpha=-2).sum().backward()
    assert_close(d.grad, torch.full((7,), -6.0, device="cuda", dtype=torch.float64), "float32")


# ---- GPU: streams and devices -----------------------------------------------------------------

def test_runs_on_the_current_stream(torch):
    n = 1 << 22
    a = torch.zeros(n, device="cuda")
    b = randn(torch, n, torch.float32)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)  # keeps s busy: a launch on another stream would race
        a.fill_(2.0)
        out = tessera.add(a, b)
        y = tessera.gelu(out)
    s.synchronize()
    assert_close(out, 2.0 + b.double(), "float32")
    assert_close(y, gelu_ref(torch, 2.0 + b.double(), "none"), "float32")


def test_output_on_the_input_device(torch):
    for d in range(torch.cuda.device_count()):
        x = torch.randn(1000, device=f"cuda:{d}")
        y = tessera.gelu(x)
        z = tessera.add(x, y)
        assert y.device == x.device and z.device == x.device
        torch.cuda.synchronize(d)
        assert_close(z, x.double() + gelu_ref(torch, x, "none"), "float32")
    if torch.cuda.device_count() > 1:
        x = torch.randn(10, device="cuda:0")
        with pytest.raises(ValueError, match=r"argument 'other'.*cuda:0.*got cuda:1"):
            tessera.add(x, x.to("cuda:1"))


# ---- GPU: DLPack inputs -----------------------------------------------------------------------

def test_device_array_round_trip(torch):
    x = randn(torch, (31, 17), torch.float32)
    arr = tessera.DeviceArray([31, 17], "float32", 0)
    assert arr.shape == (31, 17) and arr.dtype == "float32" and arr.device == 0
    torch.from_dlpack(arr).copy_(x)
    y = tessera.gelu(arr, "tanh")  # a DLPack input gives a DeviceArray back
    assert isinstance(y, tessera.DeviceArray) and y.shape == (31, 17)
    torch.cuda.synchronize()
    assert_close(torch.from_dlpack(y), gelu_ref(torch, x, "tanh"), "float32")
    z = tessera.add(arr, 1.5, alpha=2)
    torch.cuda.synchronize()
    assert_close(torch.from_dlpack(z), x.double() + 3.0, "float32")
    del arr  # the exported tensors keep the memory alive
    torch.cuda.synchronize()
    assert_close(torch.from_dlpack(y), gelu_ref(torch, x, "tanh"), "float32")


def test_cupy_in_cupy_out(torch):
    cupy = pytest.importorskip("cupy", reason="cupy not installed")
    x = cupy.random.standard_normal((100, 33), dtype=cupy.float32)
    b = cupy.random.standard_normal((33,), dtype=cupy.float32)
    y = tessera.gelu(x)
    z = tessera.add(x, b, alpha=0.5)
    assert isinstance(y, cupy.ndarray) and isinstance(z, cupy.ndarray)
    assert y.shape == x.shape and z.shape == x.shape and y.dtype == cupy.float32
    cupy.cuda.get_current_stream().synchronize()
    xt, bt = torch.from_dlpack(x), torch.from_dlpack(b)
    assert_close(torch.from_dlpack(y), gelu_ref(torch, xt, "none"), "float32")
    assert_close(torch.from_dlpack(z), xt.double() + 0.5 * bt.double(), "float32")
    out = cupy.empty_like(x)
    assert tessera.gelu(x, "tanh", out=out) is out
    cupy.cuda.get_current_stream().synchronize()
    assert_close(torch.from_dlpack(out), gelu_ref(torch, xt, "tanh"), "float32")
    with cupy.cuda.Stream(non_blocking=True) as s:  # cupy's current stream is used
        w = tessera.add(x, x)
    s.synchronize()
    assert_close(torch.from_dlpack(w), 2 * xt.double(), "float32")


# ---- silu ---------------------------------------------------------------------------------------

def test_silu_cpu_array_names_argument(np):
    with pytest.raises(ValueError, match=r"tessera\.silu: argument 'input'.*CUDA"):
        tessera.silu(np.ones(5, np.float32))
    x = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=r"tessera\.silu_backward: argument 'input'.*CUDA"):
        tessera.silu_backward(x, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_silu_matches_reference(torch, dtype, n):
    x = 4 * randn(torch, n, dt(torch, dtype))
    out = tessera.silu(x)
    assert out.dtype == x.dtype and out.device == x.device
    assert_close(out, torch.nn.functional.silu(x.double()), dtype)


def test_silu_large_negative_non_contiguous_and_out(torch):
    x = torch.linspace(-150, 10, 4099, device="cuda")  # exp(-x) overflows below -88
    assert_close(tessera.silu(x), torch.nn.functional.silu(x.double()), "float32")
    base = randn(torch, (48, 80), torch.bfloat16)
    for v in (base.t(), base[::3, 1::2], base[:, :0]):
        assert_close(tessera.silu(v), torch.nn.functional.silu(v.double()), "bfloat16")
    expected = torch.nn.functional.silu(base.double())
    assert tessera.silu(base, out=base) is base  # in place, as silu(inplace=True)
    assert_close(base, expected, "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_backward_matches_torch_autograd(torch, dtype):
    x = (4 * randn(torch, (129, 257), dt(torch, dtype))).requires_grad_()
    g = randn(torch, (129, 257), dt(torch, dtype))
    y = tessera.silu(x)
    assert y.grad_fn is not None
    (gx,) = torch.autograd.grad(y, x, g)
    xd = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(torch.nn.functional.silu(xd), xd, g.double())
    assert_close(gx, ref, dtype)
    assert_close(tessera.silu_backward(g, x.detach()), ref, dtype)
    with pytest.raises(RuntimeError, match=r"tessera\.silu: argument 'out'"):
        tessera.silu(x, out=torch.empty_like(x))


# ---- silu_mul and geglu: the gated products, one row each ------------------------------

GATES = {"silu_mul": lambda F, x: F.silu(x), "geglu": lambda F, x: F.gelu(x, approximate="tanh")}


def _gated_ref(torch, name, g, u):
    return GATES[name](torch.nn.functional, g.double()) * u.double()


@pytest.mark.parametrize("name", GATES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_matches_reference_contiguous_and_chunked(torch, name, dtype):
    t = getattr(torch, dtype)
    x = randn(torch, (1001, 2 * 377), t) * 4
    for g, u in [(x[:, :377].contiguous(), x[:, 377:].contiguous()), x.chunk(2, -1)]:
        out = getattr(tessera, name)(g, u)
        assert out.shape == g.shape and out.dtype == t and out.is_contiguous()
        assert_close(out, _gated_ref(torch, name, g, u), dtype)


@pytest.mark.parametrize("name", GATES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_gradients_match_torch(torch, name, dtype):
    t = getattr(torch, dtype)
    x = (randn(torch, (513, 2 * 129), t) * 3).requires_grad_()
    g, u = x.chunk(2, -1)
    y = getattr(tessera, name)(g, u)
    assert y.grad_fn is not None
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    gr, ur = xr.chunk(2, -1)
    (dxr,) = torch.autograd.grad(GATES[name](torch.nn.functional, gr) * ur, xr, dy.double())
    assert_close(dx, dxr, dtype)


@pytest.mark.parametrize("name", GATES)
def test_gated_is_a_torch_op_with_a_fake_kernel(torch, name):
    g = torch.randn(64, 32, device="cuda", requires_grad=True)
    u = torch.randn(64, 32, device="cuda", requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.tessera, name).default, (g, u))
    torch.library.opcheck(getattr(torch.ops.tessera, name + "_backward").default,
                          (torch.randn_like(g), g.detach(), u.detach()))


@pytest.mark.parametrize("name", GATES)
def test_gated_outside_the_kernels_is_torchs(torch, name):
    F = torch.nn.functional
    g, u = torch.randn(7, 5), torch.randn(7, 5)  # CPU
    assert torch.equal(getattr(tessera, name)(g, u), GATES[name](F, g) * u)
    gd = torch.randn(7, 5, device="cuda", dtype=torch.float64)
    assert torch.allclose(getattr(tessera, name)(gd, gd), GATES[name](F, gd) * gd)


@pytest.mark.parametrize("name", GATES)
def test_gated_refuses_mismatched_shapes_by_name(torch, name):
    g = torch.randn(8, 4, device="cuda")
    with pytest.raises(ValueError, match=rf"tessera\.{name}: argument 'up'"):
        getattr(tessera, name)(g, torch.randn(8, 5, device="cuda"))


@pytest.mark.parametrize("name", GATES)
def test_gated_under_compile_keeps_the_op(torch, name):
    g = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    u = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda a, b: getattr(tessera, name)(a, b) + 1, fullgraph=True)
    assert_close(f(g, u), _gated_ref(torch, name, g, u) + 1, "bfloat16")
