"""tessera.float8.linear_cross_entropy, an output head's loss with its logits and d_hidden GEMMs
in float8: its formula in each recipe (emulated on the CPU, chunked), its errors, and the
kernels against the emulation on the GPU."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("needs torch's float8_e4m3fn", allow_module_level=True)

import tessera.float8 as f8  # noqa: E402
from test_float8 import _need_cuda  # noqa: E402


def _head_reference(x, w, t, recipe, ignore_index, reduction, most, compact):
    """The loss, d_hidden and d_weight of the float8 head, written out chunk by chunk (``most`` rows
    a chunk at most, as even as multiples of 16 make them) over every row, an ignored row's loss
    and gradient zeros, or (``compact``) over the rows not ignored: logits of the recipe's
    dequantized operands, torch's cross-entropy, the logits' gradient quantized along the
    vocabulary for d_hidden and along the chunk's rows, with x's columns, for d_weight (blockwise:
    d_weight unquantized, in float32)."""
    act, wgt = f8._OPERANDS[recipe]
    keep = t != ignore_index
    rows = keep if compact else torch.ones_like(keep)
    xk, tk = x[rows], t[rows]
    n = len(tk)
    per = -(-n // -(-n // most) // 16) * 16
    loss, dxk, dw = torch.zeros(()), torch.zeros_like(xk), torch.zeros(w.shape)
    for i in range(0, n, per):
        xc, tc = xk[i:i + per], tk[i:i + per]
        logits = (f8._fake(xc, act) @ f8._fake(w, wgt).t()).to(x.dtype).float()
        loss += torch.nn.functional.cross_entropy(logits, tc, reduction="sum", ignore_index=ignore_index)
        g = torch.softmax(logits, -1)
        g[torch.arange(len(tc)), tc.clamp(min=0)] -= 1
        g = (g * (tc != ignore_index).unsqueeze(1)).to(x.dtype)  # a row's own gradient, before the mean
        dxk[i:i + per] = (f8._fake(g, act) @ f8._fake(w.t().contiguous(), wgt).t()).to(x.dtype)
        g, xc = g.float(), xc.float()
        if recipe == "blockwise":
            dw += g.t() @ xc
        else:
            dw += f8._fake(g.t().contiguous(), act) @ f8._fake(xc.t().contiguous(), act).t()
    dx = torch.zeros_like(x)
    dx[rows] = dxk
    dx[~keep] = 0
    divisor = int(keep.sum()) if reduction == "mean" else 1
    return loss / divisor, dx / divisor, dw / divisor


@pytest.mark.parametrize("recipe,shape,chunk_rows", [("rowwise", (24, 32, 48), 0), ("rowwise", (40, 32, 64), 7),
                                                     ("tensorwise", (24, 48, 32), 0),
                                                     ("tensorwise", (60, 48, 32), 20),
                                                     ("blockwise", (40, 256, 128), 6)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("compact", [False, True])
def test_linear_cross_entropy_in_float8_is_its_formula(monkeypatch, recipe, shape, chunk_rows, reduction, compact):
    """float8.linear_cross_entropy (emulated on the CPU) against its formula: the loss, d_hidden
    (the logits' gradient quantized along the vocabulary) and d_weight (quantized along each
    chunk's rows, summed over chunks), ignored rows taking nothing, the upstream gradient scaling
    both; in several chunks (of 16 rows: d_weight's K step) where ``chunk_rows`` is set; over every
    row, or over the rows not ignored (``compact_rows``)."""
    from tessera import _head_chunks
    n, h, v = shape
    most = chunk_rows or n
    monkeypatch.setattr(_head_chunks, "BUDGET_BYTES", most * v * 4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g, requires_grad=True)
    w = (torch.randn(v, h, generator=g) * 0.2).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[::5] = -100
    loss = f8.linear_cross_entropy(x, w, t, recipe=recipe, reduction=reduction, compact_rows=compact)
    (loss * 3).backward()
    assert len(range(0, int((t != -100).sum()), 16)) > 1 or not chunk_rows  # several chunks
    want, dx, dw = _head_reference(x.detach(), w.detach(), t, recipe, -100, reduction, most, compact)
    torch.testing.assert_close(loss, want.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, dx * 3, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, dw * 3, rtol=1e-4, atol=1e-5)  # summed chunk by chunk


def test_linear_cross_entropy_in_float8_reads_nothing_on_the_host_by_default(monkeypatch):
    """Without compact_rows the chunks are slices of every row: no kept-row gather, whose count the
    host must read (a synchronization in the middle of a training step)."""
    from tessera import _head_chunks

    def gathered(*args):
        raise AssertionError("kept_rows called")

    monkeypatch.setattr(_head_chunks, "kept_rows", gathered)
    x, w = torch.randn(40, 32, requires_grad=True), torch.randn(48, 32, requires_grad=True)
    t = torch.randint(0, 48, (40,))
    t[::3] = -100
    f8.linear_cross_entropy(x, w, t).backward()
    with pytest.raises(AssertionError, match="kept_rows called"):
        f8.linear_cross_entropy(x, w, t, compact_rows=True)


def test_linear_cross_entropy_in_float8_refuses_what_it_cannot_take():
    x, w, t = torch.randn(4, 32), torch.randn(48, 32), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="argument 'recipe'"):
        f8.linear_cross_entropy(x, w, t, recipe="float8")
    with pytest.raises(ValueError, match="argument 'weight'"):
        f8.linear_cross_entropy(x, torch.randn(40, 32), t)  # V not a multiple of 16
    with pytest.raises(ValueError, match="argument 'weight'"):
        f8.linear_cross_entropy(x, w, t, recipe="blockwise")  # multiples of 128
    with pytest.raises(ValueError, match="argument 'weight'"):
        f8.linear_cross_entropy(x, torch.randn(48, 16), t)
    with pytest.raises(ValueError, match="argument 'target'"):
        f8.linear_cross_entropy(x, w, t.float())
    with pytest.raises(ValueError, match="argument 'reduction'"):
        f8.linear_cross_entropy(x, w, t, reduction="none")
    with pytest.raises(ValueError, match="argument 'hidden'"):
        f8.linear_cross_entropy(x[None], w, t)
    for compact in (False, True):  # torch's mean of nothing; the gradients zeros
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        all_ignored = f8.linear_cross_entropy(xg, wg, torch.full((4,), -100), compact_rows=compact)
        assert torch.isnan(all_ignored)
        all_ignored.backward()
        assert not xg.grad.any() and not wg.grad.any()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
@pytest.mark.parametrize("compact", [False, True])
def test_linear_cross_entropy_in_float8_on_the_kernels(monkeypatch, recipe, compact):
    """On the GPU's kernels: the loss and gradients of the emulated head within float8's
    accumulation and bf16 output rounding, the weight cached or not; in three chunks of the same
    rows either way (d_weight added up in its bf16 output: scaled_mm's beta)."""
    from tessera import _head_chunks
    _need_cuda()
    if not f8._on_kernels(torch.ones(1, device="cuda", dtype=torch.bfloat16), recipe):
        pytest.skip("needs the sm90 float8 kernels")
    torch.manual_seed(0)
    x = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(2048, 256, device="cuda") * 0.05).bfloat16().requires_grad_()
    t = torch.randint(0, 2048, (1000,), device="cuda")
    t[::7] = -100
    want_x, want_w = x.detach().cpu().float().requires_grad_(), w.detach().cpu().float().requires_grad_()
    monkeypatch.setattr(_head_chunks, "BUDGET_BYTES", 300 * 2048 * 4)  # float32 rows here, bfloat16 there
    want = f8.linear_cross_entropy(want_x, want_w, t.cpu(), recipe=recipe, compact_rows=compact)
    want.backward()
    monkeypatch.setattr(_head_chunks, "BUDGET_BYTES", 300 * 2048 * 2)
    for cache in (False, True):
        x.grad = w.grad = None
        loss = f8.linear_cross_entropy(x, w, t, recipe=recipe, cache_weights=cache, compact_rows=compact)
        loss.backward()
        torch.testing.assert_close(loss.cpu(), want, rtol=2e-3, atol=2e-3)
        for got, ref in ((x.grad, want_x.grad), (w.grad, want_w.grad)):
            err = (got.float().cpu() - ref).norm() / ref.norm()
            assert err < 3e-2, (cache, err)
    f8.drop_cached_weights()
