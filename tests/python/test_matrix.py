"""tessera.matmul and tessera.linear from Python.

CPU-side tests (any machine): what is refused before anything reaches the GPU. GPU tests (the
`torch` fixture): results against a float64 torch reference by relative norm error (the op's
tolerance per output dtype), every layout and batch form, each piece of the epilogue, out=,
and autograd against torch's own.
"""

import pytest

import tessera

CPU_DEVICE_MSG = "expected a CUDA tensor, got a tensor on cpu"


# ---- CPU side ---------------------------------------------------------------------------------

def test_matmul_takes_torch_tensors_only(np):
    a = np.ones((4, 4), np.float32)
    with pytest.raises(TypeError, match=r"tessera\.matmul: argument 'input': expected a torch "
                                        r"tensor.*got ndarray"):
        tessera.matmul(a, a)


def test_matmul_cpu_tensors():
    # torch's contract: with torch's arguments alone, a CPU tensor runs torch's own function;
    # tessera's own arguments keep tessera's checks.
    torch = pytest.importorskip("torch")
    a = torch.randn(4, 4)
    assert torch.equal(tessera.matmul(a, a), torch.matmul(a, a))
    assert torch.equal(tessera.linear(a, a), torch.nn.functional.linear(a, a))
    with pytest.raises(ValueError) as e:
        tessera.matmul(a, a, activation="relu")
    assert str(e.value) == f"tessera.matmul: argument 'input': {CPU_DEVICE_MSG}"


def test_matmul_bad_activation_is_refused_first():
    torch = pytest.importorskip("torch")
    a = torch.ones(4, 4)
    with pytest.raises(ValueError, match=r"argument 'activation': expected None, 'relu', 'gelu', "
                                         r"'gelu_tanh', 'silu', 'swiglu' or 'geglu', got 'tanh'"):
        tessera.matmul(a, a, activation="tanh")


# ---- GPU ---------------------------------------------------------------------------------------

TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def rel_err(torch, got, ref):
    ref = ref.double()
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def act_ref(torch, z, activation):
    F = torch.nn.functional
    return {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](z)


def operands(torch, dtype, m, k, n, b_layout="wt", a_layout="row"):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    if a_layout == "col":
        a = torch.randn(k, m, device="cuda", dtype=dtype).t()
    if b_layout == "wt":  # other = W^T of a row-major W: K contiguous (a linear layer)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    else:  # row-major other: N contiguous
        b = torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mkn", [(128, 64, 256), (300, 200, 520), (1, 4096, 1), (1000, 1000, 777)])
@pytest.mark.parametrize("b_layout,a_layout", [("wt", "row"), ("row", "row"), ("wt", "col")])
def test_matmul_matches_reference(torch, dtype, mkn, b_layout, a_layout):
    dt = getattr(torch, dtype)
    a, b = operands(torch, dt, *mkn, b_layout, a_layout)
    y = tessera.matmul(a, b)
    assert y.dtype == dt and y.shape == (mkn[0], mkn[2])
    assert rel_err(torch, y, a.double() @ b.double()) < TOL[dtype]


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_epilogue(torch, activation, dtype):
    dt = getattr(torch, dtype)
    a, b = operands(torch, dt, 256, 128, 384)
    bias = torch.randn(384, device="cuda", dtype=dt)
    res = torch.randn(256, 384, device="cuda", dtype=dt)
    y = tessera.matmul(a, b, bias=bias, activation=activation, residual=res, alpha=0.5)
    ref = act_ref(torch, 0.5 * (a.double() @ b.double()) + bias.double(), activation) + res.double()
    assert rel_err(torch, y, ref) < TOL[dtype]


def test_matmul_beta_reads_out_and_out_dtype(torch):
    a, b = operands(torch, torch.bfloat16, 200, 64, 136)
    out = torch.randn(200, 136, device="cuda", dtype=torch.float32)
    old = out.clone()
    r = tessera.matmul(a, b, beta=0.25, out=out, out_dtype=torch.float32)
    assert r is out
    assert rel_err(torch, out, a.double() @ b.double() + 0.25 * old.double()) < 1e-5
    with pytest.raises(ValueError, match=r"argument 'beta': a nonzero beta reads 'out'"):
        tessera.matmul(a, b, beta=1.0)


@pytest.mark.parametrize("shapes", [((3, 130, 96), (3, 96, 200)), ((4, 130, 96), (96, 200)),
                                    ((130, 96), (2, 96, 200)), ((2, 3, 64, 32), (32, 48)),
                                    ((2, 1, 64, 32), (3, 32, 48))])
def test_matmul_batches_broadcast_as_torch(torch, shapes):
    a = torch.randn(*shapes[0], device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*shapes[1], device="cuda", dtype=torch.bfloat16)
    y = tessera.matmul(a, b)
    ref = torch.matmul(a.double(), b.double())
    assert y.shape == ref.shape
    assert rel_err(torch, y, ref) < 1e-2


def test_linear_matches_functional(torch):
    x = torch.randn(4, 77, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16)
    y = tessera.linear(x, w, bias, activation="gelu")
    ref = torch.nn.functional.gelu(x.double() @ w.double().t() + bias.double())
    assert y.shape == (4, 77, 384)
    assert rel_err(torch, y, ref) < 1e-2


def test_matmul_errors_name_the_argument(torch):
    a, b = operands(torch, torch.bfloat16, 64, 32, 48)
    with pytest.raises(ValueError, match=r"tessera\.matmul: argument 'other': expected K = 32 rows"):
        tessera.matmul(a, torch.randn(31, 48, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"tessera\.matmul: argument 'bias': expected shape \[48\]"):
        tessera.matmul(a, b, bias=torch.randn(47, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="same dtype"):  # torch's arguments alone: torch's error
        tessera.matmul(a, b.half())
    with pytest.raises(TypeError, match=r"tessera\.matmul: argument 'other'.*bfloat16.*float16"):
        tessera.matmul(a, b.half(), activation="relu")
    with pytest.raises(ValueError, match=r"argument 'residual'"):
        tessera.matmul(a, b, residual=torch.randn(3, 48, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_matmul_autograd_matches_torch(torch, activation):
    a = torch.randn(3, 40, 24, device="cuda", dtype=torch.float32, requires_grad=True)
    w = torch.randn(56, 24, device="cuda", dtype=torch.float32, requires_grad=True)
    bias = torch.randn(56, device="cuda", dtype=torch.float32, requires_grad=True)
    res = torch.randn(40, 56, device="cuda", dtype=torch.float32, requires_grad=True)
    y = tessera.matmul(a, w.t(), bias=bias, activation=activation, residual=res, alpha=0.75)
    dy = torch.randn_like(y)
    y.backward(dy)
    got = [t.grad.clone() for t in (a, w, bias, res)]
    for t in (a, w, bias, res):
        t.grad = None
    ref = act_ref(torch, 0.75 * (a @ w.t()) + bias, activation) + res
    ref.backward(dy)
    for g, t in zip(got, (a, w, bias, res)):
        assert g.shape == t.shape
        assert rel_err(torch, g, t.grad) < 1e-5


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_matmul_autograd_keeps_the_fused_forward(torch, activation, dtype):
    """Under autograd the forward is the product with its whole epilogue (its kernel also
    storing the product before the activation: matmul.preactivation), with no activation op
    after it; its gradients match torch's."""
    dt = getattr(torch, dtype)
    a = torch.randn(300, 256, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(520, 256, device="cuda", dtype=dt, requires_grad=True)
    bias = torch.randn(520, device="cuda", dtype=dt, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = tessera.linear(a, w, bias, activation=activation)
    names = {e.key for e in prof.key_averages()}
    assert "tessera::matmul" in names, sorted(names)
    assert not {"tessera::gelu", "tessera::silu", "aten::relu", "aten::gelu", "aten::silu"} & names
    z = torch.ops.tessera.matmul.preactivation(a.detach(), w.detach().t(), bias=bias.detach(),
                                               activation=activation)[1]
    assert rel_err(torch, z, a.detach().double() @ w.detach().double().t() + bias.detach().double()) < TOL[dtype]
    dy = torch.randn_like(y)
    y.backward(dy)
    got = [t.grad.clone() for t in (a, w, bias)]
    for t in (a, w, bias):
        t.grad = None
    ref = act_ref(torch, torch.nn.functional.linear(a.float(), w.float(), bias.float()), activation)
    ref.backward(dy.float())
    assert rel_err(torch, y, ref) < TOL[dtype]
    for g, t in zip(got, (a, w, bias)):
        assert rel_err(torch, g, t.grad) < 2 * TOL[dtype], t.shape


def test_swiglu_weight_interleaves_blocks_of_64(torch_cpu):
    torch = torch_cpu
    w1, w3 = torch.randn(128, 8), torch.randn(128, 8)
    w = tessera.swiglu_weight(w1, w3)
    assert w.shape == (256, 8)
    assert torch.equal(w[:64], w1[:64]) and torch.equal(w[64:128], w3[:64])
    assert torch.equal(w[128:192], w1[64:]) and torch.equal(w[192:], w3[64:])
    # F not a multiple of 64: the last block is F % 64 rows of each
    w1, w3 = torch.randn(100, 8), torch.randn(100, 8)
    w = tessera.swiglu_weight(w1, w3)
    assert torch.equal(w, torch.cat((w1[:64], w3[:64], w1[64:], w3[64:])))
    with pytest.raises(ValueError, match="'w_gate' and 'w_up'.*one shape"):
        tessera.swiglu_weight(torch.randn(96, 8), torch.randn(95, 8))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_linear_swiglu_matches_two_projections(torch, dtype):
    """linear(x, swiglu_weight(w1, w3), activation="swiglu") is silu(x w1^T) * (x w3^T), forward
    and backward (the gradients of the fused weight are those of w1 and w3, interleaved)."""
    dt = getattr(torch, dtype)
    x = torch.randn(3, 100, 256, device="cuda", dtype=dt, requires_grad=True)
    w1 = torch.randn(192, 256, device="cuda", dtype=dt) / 16
    w3 = torch.randn(192, 256, device="cuda", dtype=dt) / 16
    w13 = tessera.swiglu_weight(w1, w3).requires_grad_()
    bias = torch.randn(384, device="cuda", dtype=dt, requires_grad=True)
    y = tessera.linear(x, w13, bias, activation="swiglu")
    assert y.shape == (3, 100, 192) and y.dtype == dt
    xr, w1r, w3r = (t.detach().double().requires_grad_() for t in (x, w1, w3))
    b1 = bias.detach().double().view(3, 2, 64)[:, 0].reshape(-1).requires_grad_()
    b3 = bias.detach().double().view(3, 2, 64)[:, 1].reshape(-1).requires_grad_()
    F = torch.nn.functional
    ref = F.silu(F.linear(xr, w1r, b1)) * F.linear(xr, w3r, b3)
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert rel_err(torch, y, ref) < tol
    dy = torch.randn_like(y)
    y.backward(dy)
    ref.backward(dy.double())
    assert rel_err(torch, x.grad, xr.grad) < tol
    assert rel_err(torch, w13.grad, tessera.swiglu_weight(w1r.grad, w3r.grad)) < tol
    db = torch.stack((b1.grad.view(3, 64), b3.grad.view(3, 64)), 1).reshape(-1)
    assert rel_err(torch, bias.grad, db) < tol


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_linear_swiglu_at_sizes_of_the_fused_epilogue(torch, dtype, grad, activation):
    """Sizes the sm90 tier takes, where on Hopper the gated activation (swiglu, geglu) runs in the
    GEMM's epilogue: without autograd only the N / 2 outputs are written, with it the
    pre-activation too (what the backward reads). Cooperative tiles, several per CTA, and a last
    tile half beyond N."""
    dt = getattr(torch, dtype)
    F = torch.nn.functional
    act = F.silu if activation == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))
    for m, k, f in ((2048, 2048, 2816), (1000, 512, 1472)):
        x = torch.randn(m, k, device="cuda", dtype=dt, requires_grad=grad)
        w1 = torch.randn(f, k, device="cuda", dtype=dt) / k ** 0.5
        w3 = torch.randn(f, k, device="cuda", dtype=dt) / k ** 0.5
        bias = torch.randn(2 * f, device="cuda", dtype=dt)
        y = tessera.linear(x, tessera.swiglu_weight(w1, w3), bias, activation=activation)
        assert y.shape == (m, f) and y.dtype == dt
        xr = x.detach().double().requires_grad_()
        b = bias.double().view(-1, 2, 64)
        ref = act(F.linear(xr, w1.double(), b[:, 0].reshape(-1))) * F.linear(xr, w3.double(), b[:, 1].reshape(-1))
        assert rel_err(torch, y, ref) < 1e-2, (m, k, f)
        if grad:
            dy = torch.randn_like(y)
            y.backward(dy)
            ref.backward(dy.double())
            assert rel_err(torch, x.grad, xr.grad) < 2e-2, (m, k, f)


def test_linear_swiglu_compiles_and_refuses_bad_shapes(torch):
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = torch.compile(lambda x, w: tessera.linear(x, w, activation="swiglu").float().sum(), fullgraph=True)
    f(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    tessera.linear(x, w, activation="swiglu").float().sum().backward()
    assert rel_err(torch, gx, x.grad) < 1e-2 and rel_err(torch, gw, w.grad) < 1e-2
    with pytest.raises(ValueError, match=r"argument 'other'.*N even"):
        tessera.linear(x, w[:191], activation="swiglu")
    with pytest.raises(ValueError, match=r"argument 'residual'.*swiglu"):
        tessera.matmul(x.detach(), w.detach().t(), activation="swiglu",
                       residual=torch.randn(64, 128, device="cuda", dtype=torch.bfloat16))


# ---- float32 precision, float8 scaled_mm, autotuning ---------------------------------------------

def test_float32_follows_torch_matmul_precision(torch):
    a = torch.randn(256, 512, device="cuda")
    b = torch.randn(512, 384, device="cuda")
    ref = a.double() @ b.double()
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert rel_err(torch, tessera.matmul(a, b), ref) <= 1e-5
        torch.set_float32_matmul_precision("high")  # TF32 allowed: a 10-bit mantissa
        w = torch.randn(384, 512, device="cuda")
        err = rel_err(torch, tessera.linear(a, w), a.double() @ w.double().t())
        assert 1e-6 < err <= 2e-3  # TF32's rounding is visible: the tensor cores ran
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("out_dtype", [None, "float16", "float32"])
def test_scaled_mm_matches_torch(torch, fp8, out_dtype):
    dt = getattr(torch, fp8)
    a = (torch.rand(300, 512, device="cuda") * 4 - 2).to(dt)
    w = (torch.rand(528, 512, device="cuda") * 4 - 2).to(dt)
    sa = torch.tensor(0.5, device="cuda")
    sb = torch.tensor(1.5, device="cuda")
    bias_dt = getattr(torch, out_dtype) if out_dtype else torch.bfloat16
    bias = torch.randn(528, device="cuda", dtype=bias_dt)
    got = tessera.scaled_mm(a, w.t(), sa, sb, bias=bias,
                            out_dtype=getattr(torch, out_dtype) if out_dtype else None)
    assert got.dtype == bias_dt and got.shape == (300, 528)
    ref = 0.75 * (a.double() @ w.double().t()) + bias.double()
    # float8 products are summed in the tensor cores' narrower accumulator (use_fast_accum).
    assert rel_err(torch, got, ref) <= (1e-3 if out_dtype == "float32" else 1e-2)


def test_scaled_mm_errors_name_the_argument(torch):
    a = torch.ones(64, 32, device="cuda").to(torch.float8_e4m3fn)
    s = torch.tensor(1.0, device="cuda")
    with pytest.raises(TypeError, match=r"tessera\.scaled_mm: argument 'input'.*got bfloat16"):
        tessera.scaled_mm(a.to(torch.bfloat16), a.t(), s, s)
    with pytest.raises(ValueError, match=r"argument 'scale_a'.*one element"):
        tessera.scaled_mm(a, a.t(), torch.ones(2, device="cuda"), s)
    with pytest.raises(ValueError, match=r"argument 'scale_result'"):
        tessera.scaled_mm(a, a.t(), s, s, scale_result=s)


ROWWISE_EXPECTED = (r"expected both of one element \(per-tensor\); 'scale_a' \[64, 1\] and 'scale_b' \[1, 48\], "
                    r"contiguous \(row-wise\); or 'scale_a' \[64, 2\] and 'scale_b' \[2, 1\] or \[2, 48\] "
                    r"\(block-wise: 1 x 128 blocks, and 128 x 128 or 1 x 128\); not two kinds")


def test_scaled_mm_scales_per_tensor_or_rowwise_not_one_of_each():
    """CPU: the scales' kinds and shapes are checked before the device (as torch._scaled_mm
    takes them: both one element, or [M, 1] and [1, N] contiguous, or block-wise ones; K = 256,
    two blocks, so that no row-wise shape is also a block-wise one)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("needs torch's float8_e4m3fn")
    a = torch.ones(64, 256).to(torch.float8_e4m3fn)
    b = torch.ones(48, 256).to(torch.float8_e4m3fn).t()
    one, rows, cols = torch.tensor(1.0), torch.ones(64, 1), torch.ones(1, 48)
    cases = [
        (one, cols, "scale_b", r"got 'scale_a' \[\] and 'scale_b' \[1, 48\]$"),
        (rows, one, "scale_b", r"got 'scale_a' \[64, 1\] and 'scale_b' \[\]$"),
        (torch.ones(64), cols, "scale_a", r"got 'scale_a' \[64\] and"),
        (rows, torch.ones(48, 1), "scale_b", r"'scale_b' \[48, 1\]$"),
        (torch.ones(32, 1), cols, "scale_a", r"got 'scale_a' \[32, 1\] and"),
        (torch.ones(64, 2), torch.ones(2, 2), "scale_b", r"got 'scale_a' \[64, 2\] and 'scale_b' \[2, 2\]$"),
        (torch.ones(64, 2)[:, :1], cols, "scale_a", r"'scale_a' \[64, 1\] \(not contiguous\)"),
        (rows, torch.ones(1, 96)[:, ::2], "scale_b", r"'scale_b' \[1, 48\] \(not contiguous\)$"),
    ]
    for sa, sb, arg, got in cases:
        with pytest.raises(ValueError, match=rf"^tessera\.scaled_mm: argument '{arg}': {ROWWISE_EXPECTED}, .*{got}"):
            tessera.scaled_mm(a, b, sa, sb)
    with pytest.raises(TypeError, match=r"argument 'scale_b': expected dtype in \{float32\}, got float16"):
        tessera.scaled_mm(a, b, rows, cols.half())
    with pytest.raises(ValueError, match=r"argument 'input': expected a CUDA tensor"):  # the scales pass
        tessera.scaled_mm(a, b, rows, cols)
    for sb in (torch.ones(2, 1), torch.ones(2, 48)):  # block-wise, 128 x 128 or per column
        with pytest.raises(ValueError, match=r"argument 'input': expected a CUDA tensor"):
            tessera.scaled_mm(a, b, torch.ones(64, 2), sb)
    with pytest.raises(TypeError, match=r"argument 'input': expected float8_e4m3fn with block-wise scales"):
        tessera.scaled_mm(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2), torch.ones(64, 2), torch.ones(2, 1))


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("out_dtype", [None, "float16", "float32"])
@pytest.mark.parametrize("m,n", [(301, 528), (333, 517), (16, 4096), (63, 71)])
def test_scaled_mm_rowwise_matches_float64(torch, fp8, out_dtype, m, n):
    """Row-wise scales on each path: TMA stores, drain (odd N), split K, the SIMT tier (K = 100
    and odd sizes: rows the copy engine cannot take)."""
    dt = getattr(torch, fp8)
    k = 100 if m == 63 else 512
    a = (torch.rand(m, k, device="cuda") * 4 - 2).to(dt)
    w = (torch.rand(n, k, device="cuda") * 4 - 2).to(dt)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    out_dt = getattr(torch, out_dtype) if out_dtype else torch.bfloat16
    bias = torch.randn(n, device="cuda", dtype=out_dt) if out_dtype != "float32" else None
    got = tessera.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=out_dt if out_dtype else None)
    assert got.dtype == out_dt and got.shape == (m, n)
    ref = sa.double() * (a.double() @ w.double().t()) * sb.double()
    if bias is not None:
        ref = ref + bias.double()
    assert rel_err(torch, got, ref) <= (1e-3 if out_dtype == "float32" else 1e-2)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m,n", [(301, 528), (333, 517), (16, 4096), (63, 71)])
def test_scaled_mm_beta_adds_into_out(torch, out_dtype, m, n):
    """out= and beta: the product added into out's old values (row-wise on each path, per-tensor
    once), as a gradient is summed over chunks of K; the old values are read, not just written."""
    k = 100 if m == 63 else 512
    a = (torch.rand(m, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    w = (torch.rand(n, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    out_dt = getattr(torch, out_dtype)
    for sa, sb in ((torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5),
                   (torch.tensor(0.5, device="cuda"), torch.tensor(1.5, device="cuda"))):
        old = torch.randn(m, n, device="cuda", dtype=out_dt) * 50
        out = old.clone()
        got = tessera.scaled_mm(a, w.t(), sa, sb, out=out, beta=0.5)
        assert got is out
        ref = sa.double() * (a.double() @ w.double().t()) * sb.double() + 0.5 * old.double()
        assert rel_err(torch, out, ref) <= (1e-3 if out_dtype == "float32" else 1e-2)
        tessera.scaled_mm(a, w.t(), sa, sb, out=out)  # beta 0: written over
        assert rel_err(torch, out, ref - 0.5 * old.double()) <= (1e-3 if out_dtype == "float32" else 1e-2)


def test_scaled_mm_beta_errors_name_the_argument(torch):
    a = torch.ones(64, 256, device="cuda").to(torch.float8_e4m3fn)
    s = torch.tensor(1.0, device="cuda")
    with pytest.raises(ValueError, match=r"tessera\.scaled_mm: argument 'beta': a nonzero beta reads 'out'"):
        tessera.scaled_mm(a, a.t(), s, s, beta=1.0)
    with pytest.raises(ValueError, match=r"argument 'out': expected shape \[64, 64\]"):
        tessera.scaled_mm(a, a.t(), s, s, out=torch.empty(64, 32, device="cuda"))
    with pytest.raises(ValueError, match=r"argument 'beta': expected 0 with block-wise scales"):
        tessera.scaled_mm(a, a.t(), torch.ones(64, 2, device="cuda"), torch.ones(2, 1, device="cuda"),
                          out=torch.empty(64, 64, device="cuda", dtype=torch.bfloat16), beta=1.0)


@pytest.mark.parametrize("activation", ["gelu_tanh", "relu", "swiglu", "geglu"])
@pytest.mark.parametrize("scales", ["tensor", "row", "block"])
@pytest.mark.parametrize("into_out", [False, True])
def test_scaled_mm_epilogue_is_matmuls(torch, activation, scales, into_out):
    """activation and residual on the scaled product plus bias, as tessera.matmul's epilogue on the
    dequantized product in float64 (swiglu / geglu: gate and up in blocks of 64 columns, N / 2 out,
    no residual); through the op, and with out= through the extension."""
    m, n, k = 300, 512, 384
    gated = activation in ("swiglu", "geglu")
    a = (torch.rand(m, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    w = (torch.rand(n, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    if scales == "tensor":
        sa, sb = torch.tensor(0.05, device="cuda"), torch.tensor(0.5, device="cuda")
        ex_a, ex_b = sa.double(), sb.double()
    elif scales == "row":
        sa, sb = torch.rand(m, 1, device="cuda") * 0.05 + 0.01, torch.rand(1, n, device="cuda") + 0.5
        ex_a, ex_b = sa.double(), sb.double()
    else:
        sa, sb = torch.rand(m, 3, device="cuda") * 0.05 + 0.01, torch.rand(3, 4, device="cuda") + 0.5
        ex_a = sa.double().repeat_interleave(128, dim=1)
        ex_b = sb.double().repeat_interleave(128, dim=1).repeat_interleave(128, dim=0)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    residual = None if gated else torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    z = (a.double() * ex_a) @ (w.double().t() * ex_b) if scales == "block" else ex_a * (a.double() @ w.double().t()) * ex_b
    z = z + bias.double()
    if gated:
        gate = torch.nn.functional.silu if activation == "swiglu" else \
            (lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
        zb = z.view(m, n // 128, 2, 64)
        ref = (gate(zb[:, :, 0]) * zb[:, :, 1]).reshape(m, n // 2)
    else:
        act = {"gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
               "relu": torch.relu}[activation]
        ref = act(z) + residual.double()
    kw = dict(bias=bias, residual=residual, activation=activation)
    if into_out:
        out = torch.empty(m, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
        got = tessera.scaled_mm(a, w.t(), sa, sb, out=out, **kw)
        assert got is out
    else:
        got = tessera.scaled_mm(a, w.t(), sa, sb, **kw)
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    assert rel_err(torch, got, ref) <= 1e-2


def test_scaled_mm_epilogue_errors_name_the_argument(torch):
    a = torch.ones(64, 256, device="cuda").to(torch.float8_e4m3fn)
    s = torch.tensor(1.0, device="cuda")
    with pytest.raises(ValueError, match=r"tessera\.scaled_mm: argument 'activation': expected None, 'relu'"):
        tessera.scaled_mm(a, a.t(), s, s, activation="tanh")
    with pytest.raises(ValueError, match=r"scaled_mm: argument 'residual': expected none with activation 'swiglu'"):
        tessera.scaled_mm(a, torch.ones(128, 256, device="cuda").to(torch.float8_e4m3fn).t(), s, s,
                          activation="swiglu", residual=torch.ones(64, 128, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("m,n,k", [(301, 528, 512), (128, 256, 16384), (333, 517, 200), (16, 4096, 1024),
                                   (63, 71, 100)])
def test_scaled_mm_blockwise_matches_float64(torch, per_column, m, n, k):
    """Block-wise scales (scale_a [M, K / 128] M-major, scale_b [K / 128, N / 128] or per column
    [K / 128, N]) against float64: the block-scaled sm90 kernel (partial tiles and blocks, long K)
    and the SIMT tier (K = 100: rows the copy engine cannot take)."""
    a = (torch.rand(m, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    w = (torch.rand(n, k, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    kb, nb = -(-k // 128), -(-n // 128)
    sa = (torch.rand(kb, m, device="cuda") + 0.5).t()
    sb = torch.rand(kb, n if per_column else nb, device="cuda") + 0.5
    got = tessera.scaled_mm(a, w.t(), sa, sb, out_dtype=torch.float32)
    ex_a = sa.double().repeat_interleave(128, dim=1)[:, :k]
    ex_b = sb.double().repeat_interleave(1 if per_column else 128, dim=1)[:, :n].repeat_interleave(128, dim=0)[:k]
    ref = (a.double() * ex_a) @ (w.double().t() * ex_b)
    assert rel_err(torch, got, ref) <= 1e-3


@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_rowwise_matches_torch(torch, with_bias):
    """Against torch._scaled_mm's row-wise form (M odd; torch wants K and N multiples of 16)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch._scaled_mm's row-wise scales need sm_90")
    a = (torch.rand(301, 512, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    w = (torch.rand(528, 512, device="cuda") * 4 - 2).to(torch.float8_e4m3fn)
    sa = torch.rand(301, 1, device="cuda") + 0.5
    sb = torch.rand(1, 528, device="cuda") + 0.5
    bias = torch.randn(528, device="cuda", dtype=torch.bfloat16) if with_bias else None
    got = tessera.scaled_mm(a, w.t(), sa, sb, bias=bias)
    want = torch._scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True)
    assert got.dtype == want.dtype == torch.bfloat16
    assert rel_err(torch, got, want) <= 1e-2


def test_set_autotune_toggles(torch):
    was = tessera.autotune_enabled()
    try:
        tessera.set_autotune(True)
        assert tessera.autotune_enabled()
        a = torch.randn(96, 1056, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1000, 1056, device="cuda", dtype=torch.bfloat16)
        y = tessera.linear(a, w)  # tunes this bucket on first use, then runs the winner
        assert rel_err(torch, y, a.double() @ w.double().t()) <= 1e-2
        tessera.set_autotune(False)
        assert not tessera.autotune_enabled()
    finally:
        tessera.set_autotune(was)
