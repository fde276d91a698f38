"""tessera.float8: the quantization (each granularity's groups, the e4m3 rounding and saturation, zero
and non-finite groups), the emulated Float8Linear against float64 products of the dequantized
operands (each GEMM quantized along its own K), and convert_to_float8_training (in place, the
state_dict unchanged, the filter, the recipes' shape rules, errors naming the argument): CPU.
On a Hopper GPU, Float8Linear's three GEMMs on tessera.scaled_mm against the emulated ones."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("needs torch's float8_e4m3fn", allow_module_level=True)

import tessera.float8 as f8  # noqa: E402


def groups_amax(x, granularity):
    """The float64 amax of each group, by loops over the groups' index ranges."""
    m, k = x.shape
    x = x.double().abs()
    if granularity == "tensor":
        return x.max().reshape(())
    if granularity == "row":
        return x.amax(1, keepdim=True)
    if granularity == "block":
        return torch.stack([torch.stack([x[i, j:j + 128].max() for j in range(0, k, 128)]) for i in range(m)])
    return torch.stack([torch.stack([x[i:i + 128, j:j + 128].max() for j in range(0, k, 128)])
                        for i in range(0, m, 128)])


@pytest.mark.parametrize("granularity,shape", [("tensor", (5, 48)), ("row", (7, 64)), ("block", (3, 300)),
                                               ("block2d", (256, 384))])
def test_quantize_groups_and_rounding(granularity, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[1])  # groups of very different ranges
    q, scale = f8.quantize(x.bfloat16(), granularity)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and q.shape == shape
    amax = groups_amax(x.bfloat16().float(), granularity)
    torch.testing.assert_close(scale.double(), amax / 448, rtol=1e-6, atol=0)
    deq = f8.dequantize(q, scale, granularity).double()
    # e4m3 keeps 3 mantissa bits: each element within half an ulp of its group's grid (ties to
    # even after the product's float32 rounding), the group's largest element at 448, none past it
    want = x.bfloat16().double()
    full = f8._expand(scale.double(), shape, granularity)
    ulp = torch.exp2(torch.floor(torch.log2((want / full).abs().clamp(min=2 ** -6)))) * 2 ** -3 * full
    assert ((deq - want).abs() <= ulp / 2 + want.abs() * 2 ** -22).all()
    assert (q.float().abs().max() == 448) and (q.float().abs() <= 448).all()


def test_zero_and_non_finite_groups():
    x = torch.randn(4, 256)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 200] = float("nan")
    q, scale = f8.quantize(x, "row")
    # an all-zero group: amax taken as 1e-12 (torchao's floor), so its scale is 1e-12 / 448
    assert scale[1].item() == pytest.approx(1e-12 / 448, rel=1e-6) and (q[1].float() == 0).all()
    assert torch.isnan(scale[2]).all() and torch.isnan(scale[3]).all()
    assert torch.isnan(f8.dequantize(q, scale, "row")[2:]).all()  # never a silent finite value
    qb, sb = f8.quantize(x, "block")
    assert torch.isfinite(sb[2, 1]) and torch.isnan(sb[2, 0]) and torch.isnan(sb[3, 1]) and torch.isfinite(sb[3, 0])


def test_quantize_errors_name_the_argument():
    with pytest.raises(ValueError, match="argument 'granularity'"):
        f8.quantize(torch.randn(4, 128), "column")
    with pytest.raises(ValueError, match="argument 'x'.*2-d"):
        f8.quantize(torch.randn(2, 4, 128), "row")
    with pytest.raises(TypeError, match="argument 'x'"):
        f8.quantize(torch.ones(4, 128, dtype=torch.long), "row")
    with pytest.raises(ValueError, match="argument 'x'.*128 x 128"):
        f8.quantize(torch.randn(128, 200), "block2d")


def fake64(x, granularity):
    return f8.dequantize(*f8.quantize(x, granularity), granularity).double()


@pytest.mark.parametrize("recipe", f8.RECIPES)
def test_float8_linear_against_the_dequantized_products(recipe):
    """Forward, dgrad and wgrad: each the float64 product of its operands quantized along its K
    (the tokens, 200, not a multiple of 128: wgrad's last 1 x 128 block partial)."""
    act, wgt = f8._OPERANDS[recipe]
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(256, 384, bias=True)
    x = torch.randn(2, 100, 256, generator=g, requires_grad=True)
    dy = torch.randn(2, 100, 384, generator=g)
    f8.convert_to_float8_training(lin, recipe=recipe)
    assert isinstance(lin, f8.Float8Linear) and lin.recipe == recipe
    out = lin(x)
    out.backward(dy)
    x2, w, d2 = x.detach().reshape(-1, 256), lin.weight.detach(), dy.reshape(-1, 384)
    want = fake64(x2, act) @ fake64(w, wgt).t() + lin.bias.detach().double()
    want_dx = fake64(d2, act) @ fake64(w.t().contiguous(), wgt).t()
    want_dw = fake64(d2.t().contiguous(), act) @ fake64(x2.t().contiguous(), act).t()
    torch.testing.assert_close(out.reshape(-1, 384).double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.reshape(-1, 256).double(), want_dx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.weight.grad.double(), want_dw, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin.bias.grad, dy.reshape(-1, 384).sum(0), rtol=1e-5, atol=1e-5)
    # and within e4m3's error of the exact product
    exact = x2.double() @ w.double().t() + lin.bias.detach().double()
    assert ((out.reshape(-1, 384).double() - exact).norm() / exact.norm()).item() < 0.05


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_float8_linear_on_the_tensor_cores_matches_the_emulation(recipe, monkeypatch):
    """Forward, dgrad and wgrad on CUDA, each one tessera.scaled_mm call, against the same layer's
    emulated GEMMs on the CPU (the same quantized operands): within the float8 sums' accumulation
    (about 14 bits) and the bfloat16 outputs' rounding. 200 tokens: wgrad's K padded."""
    import tessera
    if not tessera.is_available() or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and torch with CUDA")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the float8 GEMMs run on tessera's kernels on sm_90 only (emulated elsewhere)")
    calls = []
    real = f8._scaled
    monkeypatch.setattr(f8, "_scaled", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(256, 384, bias=True).to(torch.bfloat16)
    f8.convert_to_float8_training(lin, recipe=recipe)
    x = torch.randn(2, 100, 256, generator=g).to(torch.bfloat16)
    dy = torch.randn(2, 100, 384, generator=g).to(torch.bfloat16)
    results = []
    for device in ("cpu", "cuda"):
        lin.to(device)
        lin.zero_grad()
        xd = x.detach().to(device).requires_grad_()  # a leaf on each device
        out = lin(xd)
        out.backward(dy.to(device))
        results.append([t.detach().double().cpu() for t in (out, xd.grad, lin.weight.grad, lin.bias.grad)])
    assert len(calls) == 3  # the CPU's GEMMs emulated, the GPU's on the kernels
    for name, want, got in zip(("out", "dx", "dw", "dbias"), *results):
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, f"{recipe} {name}: relative error {err}"


def test_convert_in_place_with_the_state_dict_and_the_filter():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.Linear(64, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    f8.convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn not in ("2", "3"))
    assert [type(m).__name__ for m in model] == ["Float8Linear", "ReLU", "Linear", "Linear"]
    assert [n for n, _ in model.named_parameters()] == names
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    plain = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.Linear(64, 10))
    plain.load_state_dict(model.state_dict())  # either way
    model.load_state_dict(plain.state_dict())
    assert model(torch.randn(3, 64)).shape == (3, 10)
    with pytest.raises(ValueError, match="'out_features' = 10 is not a multiple of 16"):  # a filter's choice
        f8.convert_to_float8_training(model, module_filter_fn=lambda m, fqn: True)
    assert type(model[2]).__name__ == "Linear"  # nothing converted where one cannot be
    rest = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(64, 10))
    f8.convert_to_float8_training(rest)  # without a filter: the Linears the recipe takes
    assert [type(m).__name__ for m in rest] == ["Float8Linear", "Linear"]
    blocks = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 64))
    f8.convert_to_float8_training(blocks, recipe="blockwise")  # 64 is no whole block: left as it is
    assert [type(m).__name__ for m in blocks] == ["Float8Linear", "Linear"]
    with pytest.raises(ValueError, match="'out_features' = 64.*blockwise"):
        f8.Float8Linear.from_float(torch.nn.Linear(128, 64), "blockwise")
    with pytest.raises(ValueError, match="argument 'recipe'"):
        f8.convert_to_float8_training(blocks, recipe="rowwise_gw_hp")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_float8_linears_under_torch_compile(recipe):
    """torch.compile(fullgraph=True) traces converted Linears whole (the recipe's quantization, the
    products, the backward); aot_eager runs the traced graphs without compiling kernels: the
    outputs and gradients of the eager model (the CPU's emulated GEMMs)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128))
    f8.convert_to_float8_training(model, recipe=recipe)
    assert all(type(m).__name__ == "Float8Linear" for m in (model[0], model[2]))
    x = torch.randn(4, 32, 128)
    model(x).square().mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    out = model(x).detach()
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(x)
    got.square().mean().backward()
    torch.testing.assert_close(got.detach(), out)
    for g, w in zip((p.grad for p in model.parameters()), want):
        torch.testing.assert_close(g, w)


def test_quantize_reusing_serves_the_same_unchanged_tensor_only():
    """The one-entry reuse of an activation's quantization (Float8Matmul on the kernels), with a
    stand-in quantizer: the same elements through another view of the same tensor reuse it, as do
    fewer layouts; another granularity, more layouts, an in-place change, another tensor of equal
    values, or the tensor freed do not."""
    calls = []

    def fake(t, granularity, columns):
        calls.append((tuple(t.shape), granularity, columns))
        return t.clone(), torch.ones(()), t.t().clone() if columns else None, torch.ones(()) if columns else None

    f8._last_x = None
    x = torch.randn(2, 3, 32)
    first = f8._quantize_reusing(x.reshape(-1, 32), "row", True, fake)  # q_proj's view of x
    assert f8._quantize_reusing(x.reshape(-1, 32), "row", True, fake) is first  # k_proj's
    rows = f8._quantize_reusing(x.reshape(-1, 32), "row", False, fake)
    assert rows[0] is first[0] and rows[2] is None and len(calls) == 1
    f8._quantize_reusing(x.reshape(-1, 32), "tensor", True, fake)
    assert len(calls) == 2  # another granularity
    f8._quantize_reusing(x.reshape(-1, 32), "tensor", False, fake)
    f8._quantize_reusing(x.reshape(-1, 32), "tensor", True, fake)
    assert len(calls) == 2  # the entry with columns serves without them, and stays
    f8._quantize_reusing(x.reshape(-1, 32)[:4], "tensor", True, fake)
    assert len(calls) == 3  # other elements of the same tensor
    f8._quantize_reusing(x.reshape(-1, 32), "row", False, fake)
    f8._quantize_reusing(x.reshape(-1, 32), "row", True, fake)
    assert len(calls) == 5  # an entry without columns does not serve a call with them
    x.mul_(2)  # in place, through the base: every view's version moves
    again = f8._quantize_reusing(x.reshape(-1, 32), "row", True, fake)
    assert len(calls) == 6 and torch.equal(again[0], x.reshape(-1, 32))
    f8._quantize_reusing(x.reshape(-1, 32)[1:].view(-1), "row", True, fake)  # a 1-d view: keyed as well
    f8._quantize_reusing(x.clone().reshape(-1, 32), "row", True, fake)
    assert len(calls) == 8  # another tensor, equal values
    z = torch.randn(6, 32)
    f8._quantize_reusing(z, "row", True, fake)
    anchor = f8._last_x[0]
    del z
    assert anchor() is None  # the entry does not keep its tensor alive
    f8._quantize_reusing(torch.randn(6, 32), "row", True, fake)
    assert len(calls) == 10
    f8._last_x = None


def _stand_in_kernels(monkeypatch, record):
    """Float8Matmul's kernels' path on the CPU: an identity quantizer (scales 1) that calls
    record(t, columns, rows) first, and a float GEMM for scaled_mm."""
    def fake(t, granularity, columns, rows=True):
        record(t, columns, rows)
        one = torch.ones(())
        return (t.detach().clone() if rows else None, one if rows else None,
                t.detach().t().contiguous() if columns else None, one if columns else None)

    monkeypatch.setattr(f8, "_on_kernels", lambda x, recipe: True)
    monkeypatch.setattr(f8, "_quantize_both", fake)
    # _cast as _scaled casts: a same-dtype .to() would be an alias, which torch.compile's autograd
    # gives a zero gradient
    monkeypatch.setattr(f8, "_scaled", lambda qa, sa, qb_t, sb, dtype: f8._cast(qa @ qb_t, dtype))


def test_float8_matmul_quantizes_a_shared_input_once(monkeypatch):
    """Three Float8Linears on one x (q, k, v) with the kernels' path stood in for on the CPU
    (identity quantizer, float GEMM): x quantized once, each weight once, and the outputs and
    gradients those of the plain Linears (the backward's saved copies of x shared, intact)."""
    calls = []
    _stand_in_kernels(monkeypatch, lambda t, columns, rows: calls.append(tuple(t.shape)))
    f8._last_x = None
    plain = [torch.nn.Linear(32, n, bias=False) for n in (48, 16, 16)]
    lins = [f8.convert_to_float8_training(torch.nn.Linear(32, n, bias=False)) for n in (48, 16, 16)]
    for p, q in zip(plain, lins):
        q.weight.data.copy_(p.weight.data)
    x = torch.randn(2, 5, 32, requires_grad=True)
    outs = [lin(x) for lin in lins]
    assert calls == [(10, 32), (48, 32), (16, 32), (16, 32)]  # x once, then the weights
    sum(o.square().sum() for o in outs).backward()
    xp = x.detach().clone().requires_grad_()
    sum(lin(xp).square().sum() for lin in plain).backward()
    torch.testing.assert_close(x.grad, xp.grad)
    for p, q in zip(plain, lins):
        torch.testing.assert_close(q.weight.grad, p.weight.grad)
    f8._last_x = None


# ---- tessera's float8_quantize kernel: the torch code's bits, one call per tensor --------------

def _need_cuda():
    import tessera
    if not tessera.is_available() or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and torch with CUDA")


def _special(m, k, dtype, special):
    """[m, k] of groups of very different ranges; `special`: a zero row, an inf, a NaN, a row of
    magnitudes near and past 448, one huge value beside small ones (subnormal products), a row of
    scale 1 whose values lie halfway between two e4m3 values (rounded to the even one)."""
    g = torch.Generator().manual_seed(m * 1000 + k)
    x = torch.randn(m, k, generator=g) * torch.logspace(-2, 2, k)
    if special and m > 5:
        x[1] = 0
        x[2, k // 2] = float("-inf")
        x[3, k - 1] = float("nan")
        x[4] = torch.linspace(-470, 470, k)
        x[5] = x[5] * 1e-3
        x[5, 0] = 3e4
    if special and m > 6:
        j = torch.arange(k)
        x[6] = (1 - 2 * (j % 2)) * (1 + (2 * (j % 8) + 1) / 16) * torch.exp2((j % 13 - 6).float())
        x[6, 0] = 448
    return x.to(dtype).cuda()


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("granularity", ["row", "tensor", "block", "block2d"])
@pytest.mark.parametrize("shape,special", [((33, 131), True), ((64, 1000), True), ((96, 208), True),
                                           ((1008, 528), False), ((80, 48), False), ((16, 16), False),
                                           ((128, 64), True), ((272, 336), True), ((256, 384), True),
                                           ((384, 256), False)])
def test_kernel_matches_the_torch_quantize_bit_for_bit(dtype, granularity, shape, special):
    """q's bytes and the scales' bits equal the torch code's on the same CUDA tensor; with the
    transposed copy (M and K multiples of 16) also q_t and scale_t, against the torch code on
    x.t() (scale_t [1, K] for 'row', the 0-d scale for 'tensor', [M / 128, K] for 'block': the
    columns' 1 x 128 blocks along M; 'block2d' x.t()'s blocks, which are x's transposed)."""
    _need_cuda()
    if granularity == "block2d" and (shape[0] % 128 or shape[1] % 128):
        pytest.skip("128 x 128 blocks tile x whole")
    x = _special(*shape, getattr(torch, dtype), special)
    tq, ts = f8._torch_quantize(x, granularity)
    q, s = f8._kernel_quantize(x, granularity)
    assert _same_bits(q, tq) and _same_bits(s, ts)
    q, s = f8.quantize(x, granularity)  # the public function takes the kernel on CUDA
    assert _same_bits(q, tq) and _same_bits(s, ts)
    if shape[0] % 16 or shape[1] % 16:
        return
    q, s, qt, st = f8._kernel_quantize(x, granularity, columns=True)
    rq, rs = f8._torch_quantize(x.t().contiguous(), granularity)
    assert _same_bits(q, tq) and _same_bits(s, ts)
    want_st = {"row": rs.reshape(1, -1), "tensor": rs, "block": rs.t().contiguous(), "block2d": ts}[granularity]
    assert _same_bits(qt, rq) and _same_bits(st, want_st)
    qt, st = f8._kernel_quantize(x, granularity, columns=True, rows=False)  # the columns alone
    assert _same_bits(qt, rq) and _same_bits(st, want_st)
    if granularity == "block2d":
        assert _same_bits(rs, ts.t().contiguous())  # the transposed blocks' scales


@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_quantize_is_torchao_cast(granularity):
    """quantize gives torchao's cast (its tensorwise, and its axiswise without power-of-two
    scales): torchao's multiplier, the same saturated e4m3 bytes, and as the scale the
    multiplier's reciprocal, the factor torchao hands to scaled_mm."""
    _need_cuda()
    ao = pytest.importorskip("torchao.float8.float8_utils")
    from torchao.float8.config import ScalingGranularity
    x = _special(256, 384, torch.bfloat16, False)
    x[1] = 0  # amax below torchao's floor
    kw = {} if granularity == "tensor" else {"scaling_granularity": ScalingGranularity.AXISWISE, "axiswise_dim": -1}
    m = ao.tensor_to_scale(x, torch.float8_e4m3fn, **kw)
    q_ao = ao.to_fp8_saturated(x.float() * m, torch.float8_e4m3fn)
    q, scale = f8.quantize(x, granularity)
    assert _same_bits(q, q_ao)
    assert _same_bits(scale, m.reciprocal().reshape(scale.shape))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_columns_of_strided_rows(dtype):
    """The transposed copy from rows with a stride (16-byte aligned for float32 only: bfloat16
    takes the element-wise loads): the torch code's bits on a contiguous copy."""
    _need_cuda()
    wide = _special(272, 340, getattr(torch, dtype), True)
    x = wide[:, :336]
    q, s, qt, st = f8._kernel_quantize(x, "row", columns=True)
    tq, ts = f8._torch_quantize(x.contiguous(), "row")
    rq, rs = f8._torch_quantize(x.t().contiguous(), "row")
    assert _same_bits(q, tq) and _same_bits(s, ts)
    assert _same_bits(qt, rq) and _same_bits(st, rs.reshape(1, -1))


def test_quantize_takes_the_kernel_on_cuda_for_floats(monkeypatch):
    _need_cuda()
    calls = []
    real = f8._kernel_quantize
    monkeypatch.setattr(f8, "_kernel_quantize", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    x = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    for granularity in f8.GRANULARITIES:
        f8.quantize(x, granularity)
    f8.quantize(x.cpu(), "row")
    f8.quantize(x.double(), "row")  # float64: the torch code
    assert calls == list(f8.GRANULARITIES)
    # strided rows and a non-contiguous K (copied first) give the same bits
    wide = torch.randn(64, 520, device="cuda")
    for view in (wide[:, :512], wide.t()[:512, :64]):
        q, s = f8.quantize(view, "row")
        tq, ts = f8._torch_quantize(view, "row")
        assert _same_bits(q, tq) and _same_bits(s, ts)


def test_fast_entries_give_the_torch_ops_bits():
    """tessera._torch_fast's scaled_mm and float8_quantize (Float8Matmul's calls, without the
    dispatcher) give the registered ops' outputs bit for bit, and decline what they do not take:
    CPU tensors, inputs requiring grad (the op then records nothing, as the registered one)."""
    _need_cuda()
    from tessera import _state
    fast, ops = _state.fast, _state.ops
    if fast is None or ops is None:
        pytest.skip("the torch ops and their fast entries are not built")
    x = torch.randn(256, 384, device="cuda", dtype=torch.bfloat16)
    for columns in (False, True):
        for g in ("row", "block", "tensor"):
            got = fast.float8_quantize(x, g, columns)
            want = (ops.float8_quantize.columns if columns else ops.float8_quantize.default)(x, granularity=g)
            assert len(got) == len(want) and all(_same_bits(a, b) for a, b in zip(got, want)), (g, columns)
    for g in ("row", "block", "tensor"):  # the columns alone: .transposed's outputs, the columns' of .columns
        got = fast.float8_quantize(x, g, True, False)
        want = ops.float8_quantize.transposed(x, granularity=g)
        both = ops.float8_quantize.columns(x, granularity=g)
        assert len(got) == 2 and all(_same_bits(a, b) and _same_bits(a, c) for a, b, c in zip(got, want, both[2:])), g
    assert fast.float8_quantize(x, "row", False, False) is None  # neither layout: declined
    assert fast.float8_quantize(x.cpu(), "row", False) is None
    assert fast.float8_quantize(x.clone().requires_grad_(), "row", False) is None
    qa, sa = ops.float8_quantize.default(x, granularity="row")
    qb, sb = ops.float8_quantize.default(torch.randn(128, 384, device="cuda"), granularity="row")
    for dtype in (torch.bfloat16, torch.float32, None):
        got = fast.scaled_mm(qa, qb.t(), sa, sb.reshape(1, -1), dtype)
        want = ops.scaled_mm.default(qa, qb.t(), sa, sb.reshape(1, -1), out_dtype=dtype)
        assert got.dtype == want.dtype and _same_bits(got, want), dtype
    assert fast.scaled_mm(qa.cpu(), qb.t().cpu(), sa.cpu(), sb.reshape(1, -1).cpu(), None) is None
    assert fast.scaled_mm(qa, qb.t(), sa, sb, "bfloat16") is None  # not a dtype


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_float8_linear_quantizes_each_operand_where_its_gemm_runs(recipe, monkeypatch):
    """Forward: x by rows and columns in one call, the weight by rows; backward: the output
    gradient by rows and columns in one call, the weight's columns for dgrad (no float8 copy of
    the weight kept from the forward). 200 tokens: padded to 208 for the columns."""
    _need_cuda()
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the float8 GEMMs run on tessera's kernels on sm_90 only (emulated elsewhere)")
    calls = []
    real = f8._kernel_quantize
    monkeypatch.setattr(f8, "_kernel_quantize", _recording(calls, real))
    lin = f8.convert_to_float8_training(torch.nn.Linear(256, 384).cuda().bfloat16(), recipe=recipe)
    x = torch.randn(200, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lin(x).sum().backward()
    assert calls == [((208, 256), "both"), ((384, 256), "rows"), ((208, 384), "both"), ((384, 256), "columns")]
    calls.clear()
    with torch.no_grad():  # the same x: its quantization (with columns) reused, the weight by rows
        lin(x)
    assert calls == [((384, 256), "rows")]
    calls.clear()
    with torch.no_grad():  # no backward: rows alone
        lin(x * 2)
    assert calls == [((200, 256), "rows"), ((384, 256), "rows")]


def test_cached_weights_are_cast_once_per_optimizer_step(monkeypatch):
    """cache_weights: over two micro-batches each weight is quantized once, both layouts in one
    call (the forward's rows, dgrad's columns), and again only after an in-place update (the
    optimizer's step); the gradients are those of the uncached layers. The kernels' path stood in
    for on the CPU (identity quantizer, float GEMM)."""
    calls = []
    _stand_in_kernels(monkeypatch, lambda t, columns, rows: calls.append(
        (tuple(t.shape), "both" if columns and rows else "columns" if columns else "rows")))
    torch.manual_seed(0)
    plain = torch.nn.Linear(32, 48, bias=False)
    lin = f8.convert_to_float8_training(torch.nn.Linear(32, 48, bias=False), cache_weights=True)
    lin.weight.data.copy_(plain.weight.data)
    assert lin.cache_weights and "cache_weights=True" in repr(lin)
    xs = [torch.randn(16, 32, requires_grad=True) for _ in range(2)]
    for x in xs:
        f8._last_x = None
        lin(x).square().sum().backward()
        plain(x.detach()).square().sum().backward()
    weight_calls = [c for c in calls if c[0] == (48, 32)]
    assert weight_calls == [((48, 32), "both")]  # once for both micro-batches, forward and dgrad
    torch.testing.assert_close(lin.weight.grad, plain.weight.grad)
    with torch.no_grad():
        lin.weight.add_(0.5)  # an in-place write: the weight's version moves on
    calls.clear()
    f8._last_x = None
    lin(xs[0]).sum().backward()
    assert [c for c in calls if c[0] == (48, 32)] == [((48, 32), "both")]
    # A write the version counter does not see (FSDP2 refills its unsharded weights so): the
    # optimizer's step drops the copies all the same.
    lin.weight.data.mul_(2.0)
    torch.optim.SGD(lin.parameters(), lr=0.0).step()
    calls.clear()
    f8._last_x = None
    lin.weight.grad = None
    lin(xs[0]).square().sum().backward()
    assert [c for c in calls if c[0] == (48, 32)] == [((48, 32), "both")]
    ref = torch.nn.Linear(32, 48, bias=False)
    ref.weight.data.copy_(lin.weight.data)
    ref(xs[0].detach()).square().sum().backward()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    f8.drop_cached_weights(lin)
    assert f8._weights.get(lin.weight) is None
    lin.cache_weights = False  # uncached: rows in the forward, columns alone for dgrad
    calls.clear()
    f8._last_x = None
    lin(xs[0]).sum().backward()
    assert [c for c in calls if c[0] == (48, 32)] == [((48, 32), "rows"), ((48, 32), "columns")]
    f8._last_x = None


def _recording(calls, real):
    """_kernel_quantize recording (shape, 'rows' | 'columns' | 'both') of each call, then calling ``real``."""
    def record(t, g, columns=False, rows=True):
        calls.append((tuple(t.shape), "both" if columns and rows else "columns" if columns else "rows"))
        return real(t, g, columns, rows)
    return record


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_float8_linears_taking_one_input_quantize_it_once(recipe, monkeypatch):
    """q, k and v's shape: three Float8Linears on one x quantize it once (then each weight), and
    give the outputs and gradients of the same layers quantizing x each time."""
    _need_cuda()
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the float8 GEMMs run on tessera's kernels on sm_90 only (emulated elsewhere)")
    calls = []
    real = f8._kernel_quantize
    monkeypatch.setattr(f8, "_kernel_quantize", _recording(calls, real))
    torch.manual_seed(0)
    lins = [f8.convert_to_float8_training(torch.nn.Linear(256, n).cuda().bfloat16(), recipe=recipe)
            for n in (384, 128, 128)]
    x = torch.randn(2, 100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        f8._last_x = None
        x.grad = None
        for lin in lins:
            lin.zero_grad()
        outs = [lin(x) for lin in lins]
        sum(o.float().square().sum() for o in outs).backward()
        return [o.detach() for o in outs] + [x.grad] + [lin.weight.grad for lin in lins]

    got = step()
    assert calls[:4] == [((208, 256), "both"), ((384, 256), "rows"), ((128, 256), "rows"), ((128, 256), "rows")]
    assert len(calls) == 10  # and each output gradient and each weight's columns
    monkeypatch.setattr(f8, "_quantize_reusing", lambda t, g, columns, quantize=None: f8._quantize_both(t, g, columns))
    want = step()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    f8._last_x = None


def test_kernel_errors_name_the_argument():
    """The op's own checks, on the CPU (the torch ops refuse a CPU input by name)."""
    from tessera import _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    with pytest.raises(ValueError, match="argument 'granularity'.*'row', 'tensor', 'block' or 'block2d'"):
        _torch.ops.float8_quantize(torch.randn(16, 32), granularity="blocks")
    with pytest.raises(ValueError, match="argument 'input'.*CUDA"):
        _torch.ops.float8_quantize(torch.randn(16, 32))
    with pytest.raises(ValueError, match="argument 'input'.*CUDA"):
        _torch.ops.float8_quantize.columns(torch.randn(16, 32), granularity="tensor")
    with pytest.raises(ValueError, match="argument 'input'.*CUDA"):
        _torch.ops.float8_quantize.transposed(torch.randn(16, 32))
