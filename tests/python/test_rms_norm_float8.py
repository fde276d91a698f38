"""tessera.float8.rms_norm (rms_norm_float8: the norm whose output is quantized as it is written,
the float8 copies handed to the next Float8Linear of the output): on the GPU, its output and
gradients are tessera.rms_norm's, the copies are _quantize_both's bytes, and the Float8Linears
after it quantize nothing; elsewhere it is tessera.rms_norm; its errors."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("needs torch's float8_e4m3fn", allow_module_level=True)

import tessera  # noqa: E402
import tessera.float8 as f8  # noqa: E402
from test_float8 import _need_cuda, _same_bits  # noqa: E402


def _need_sm90():
    _need_cuda()
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the float8 GEMMs run on tessera's kernels on sm_90 only")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("granularity", ["row", "tensor"])
@pytest.mark.parametrize("shape", [(2, 128, 4096), (48, 2048), (32, 12288)])
def test_output_gradients_and_copies_are_the_two_ops(dtype, granularity, shape):
    """The output and its gradients bit for bit tessera.rms_norm's; the copies left for the next
    Float8Linear those of _quantize_both on the output (rows and columns), also past the fused
    kernel's rows (12288: the norm, then float8_quantize)."""
    _need_sm90()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=g).requires_grad_()
    w = (torch.rand(shape[-1], device="cuda", generator=g) + 0.5).to(dtype).requires_grad_()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = f8.rms_norm(x, w, 1e-6, granularity)
    want = tessera.rms_norm(x2, (shape[-1],), w2, 1e-6)
    assert torch.equal(y, want)
    y2d = y.reshape(-1, shape[-1])
    held = f8._quantize_reusing(y2d, granularity, True, quantize=lambda *a: pytest.fail("quantized again"))
    fresh = f8._quantize_both(y2d.detach().clone(), granularity, True)
    for a, b in zip(held, fresh):
        assert _same_bits(a, b)
    dy = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    y.backward(dy)
    want.backward(dy)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 64, 2048), (32, 8192)])
def test_with_a_residual_it_is_add_rms_norm(dtype, shape):
    """float8.add_rms_norm: output, residual_out and the gradients of input, residual and weight
    bit for bit tessera.add_rms_norm's; the copies those of _quantize_both on the output."""
    _need_sm90()
    g = torch.Generator(device="cuda").manual_seed(1)
    x, r = (torch.randn(shape, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(2))
    w = (torch.rand(shape[-1], device="cuda", generator=g) + 0.5).to(dtype).requires_grad_()
    x2, r2, w2 = (t.detach().clone().requires_grad_() for t in (x, r, w))
    y, s = f8.add_rms_norm(x, r, w, 1e-6)
    y2, s2 = tessera.add_rms_norm(x2, r2, w2, 1e-6)
    assert torch.equal(y, y2) and torch.equal(s, s2)
    y2d = y.reshape(-1, shape[-1])
    held = f8._quantize_reusing(y2d, "row", True, quantize=lambda *a: pytest.fail("quantized again"))
    for a, b in zip(held, f8._quantize_both(y2d.detach().clone(), "row", True)):
        assert _same_bits(a, b)
    dy, ds = (torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    torch.autograd.backward((y, s), (dy, ds))
    torch.autograd.backward((y2, s2), (dy, ds))
    for a, b in ((x, x2), (r, r2), (w, w2)):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_the_projections_after_it_quantize_nothing(monkeypatch, recipe):
    """q, k and v projections after the norm: their float8 GEMMs take the norm's copies (no
    quantizing call for x), and give what they give on tessera.rms_norm's output."""
    _need_sm90()
    torch.manual_seed(0)
    h, t = 256, 128
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    seq = torch.nn.Sequential(*(torch.nn.Linear(h, n, bias=False, device="cuda", dtype=torch.bfloat16)
                                for n in (256, 64, 64)))
    f8.convert_to_float8_training(seq, recipe=recipe)
    projections = list(seq)
    assert all(isinstance(p, f8.Float8Linear) for p in projections)
    want = [p(tessera.rms_norm(x, (h,), w, 1e-6)) for p in projections]
    calls = []
    real = f8._quantize_both
    monkeypatch.setattr(f8, "_quantize_both", lambda t, *a, **k: calls.append(t.shape) or real(t, *a, **k))
    y = f8.rms_norm(x, w, 1e-6, f8._OPERANDS[recipe][0])
    got = [p(y) for p in projections]
    assert [c for c in calls if c == (t, h)] == []  # the weights' copies may be made, x's not
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_elsewhere_it_is_rms_norm():
    """On the CPU, and on the GPU for rows the float8 layouts do not take (20 rows, not a multiple
    of 16) or float32, the plain norm runs and nothing is left for the next Float8Linear."""
    x = torch.randn(20, 64)
    w = torch.rand(64) + 0.5
    f8._last_x = None
    assert torch.equal(f8.rms_norm(x, w, 1e-6), tessera.rms_norm(x, (64,), w, 1e-6))
    assert f8._last_x is None
    if torch.cuda.is_available() and tessera.is_available():
        for xc, wc in ((x.cuda().bfloat16(), w.cuda().bfloat16()), (x[:16].cuda(), w.cuda())):
            assert torch.equal(f8.rms_norm(xc, wc, 1e-6), tessera.rms_norm(xc, (64,), wc, 1e-6))
            assert f8._last_x is None


def test_granularity_is_row_or_tensor():
    with pytest.raises(ValueError, match="rms_norm: argument 'granularity'.*'row' or 'tensor'"):
        f8.rms_norm(torch.randn(16, 64), torch.ones(64), 1e-6, "block")
    with pytest.raises(ValueError, match="add_rms_norm: argument 'granularity'"):
        f8.add_rms_norm(torch.randn(16, 64), torch.randn(16, 64), torch.ones(64), 1e-6, "block2d")
    y, s = f8.add_rms_norm(torch.ones(16, 64), torch.ones(16, 64), torch.ones(64), 1e-6)  # the CPU: tessera's
    assert torch.equal(s, torch.full((16, 64), 2.0)) and torch.allclose(y, torch.ones(16, 64))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("columns", [False, True])
def test_the_fast_entry_is_the_extensions_call(residual, columns):
    """The Function's forward takes tessera._torch_fast's entry (outputs allocated in C++): the same
    bits as the nanobind extension's call with outputs allocated in Python, None where a part is not
    asked for; and the entry declines (None) what it does not take: a weight of another dtype, a
    call autograd would record."""
    _need_sm90()
    from tessera import _state
    from tessera._float8_producers import _norm_float8
    if _state.fast is None:
        pytest.skip("tessera._torch_fast is not built")
    g = torch.Generator(device="cuda").manual_seed(2)
    x, r = (torch.randn(2, 64, 1024, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    w = (torch.rand(1024, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    res = r if residual else None
    got = _state.fast.rms_norm_float8(x, res, w, 1e-6, 0.0, "row", columns)
    want = _norm_float8(x, res, w, 1e-6, 0.0, "row", columns)
    assert len(got) == 7
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype and _same_bits(a, b)
    assert _state.fast.rms_norm_float8(x, res, w.half(), 1e-6, 0.0, "row", columns) is None
    with torch.enable_grad():
        assert _state.fast.rms_norm_float8(x.requires_grad_(), res, w, 1e-6, 0.0, "row", columns) is None
    with pytest.raises(ValueError, match="rms_norm_float8.*granularity"):
        _state.fast.rms_norm_float8(x.detach(), res, w, 1e-6, 0.0, "block9", columns)
