"""tessera.cross_entropy against torch's F.cross_entropy and a float64 reference (z-loss and
soft-cap, which torch lacks): loss and gradient through autograd for every option, bf16 within
1e-2 relative and float32 within 1e-5 of float64; the in-place gradient, torch's edge cases, the
errors that name their argument."""

import pytest

import tessera


def reference(torch, logits, target, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
              softcap=None):
    """The loss in float64 from the formulas of tessera's documentation, through torch's autograd."""
    x = logits if logits.requires_grad and logits.dtype == torch.float64 else logits.detach().double().requires_grad_()
    y = softcap * torch.tanh(x / softcap) if softcap else x
    loss = torch.nn.functional.cross_entropy(y, target.long(), ignore_index=ignore_index, reduction="none",
                                             label_smoothing=label_smoothing)
    keep = target != ignore_index
    lse = torch.logsumexp(y, -1)
    loss = loss + z_loss * lse * lse * keep
    if reduction == "mean":
        loss = loss.sum() / keep.sum()
    elif reduction == "sum":
        loss = loss.sum()
    return loss, x


def close(got, want, rel, atol=0.0):
    """||got - want|| <= rel ||want|| + atol (atol for results that are exactly 0, where only
    float32 rounding remains)."""
    err = (got.double() - want).norm()
    assert err <= rel * want.norm() + atol, (err.item(), want.norm().item())


CASES = [
    dict(),
    dict(reduction="sum", label_smoothing=0.1),
    dict(reduction="none", z_loss=1e-3),
    dict(softcap=15.0, ignore_index=3),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("vocab", [1, 3, 1000, 50257, 128256, 256000])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_loss_and_gradient_against_float64(torch, dtype, vocab, case):
    opts = CASES[case]
    n = 64 if vocab < 50000 else 8
    logits = (torch.randn(n, vocab, device="cuda") * 4).to(getattr(torch, dtype)).requires_grad_()
    target = torch.randint(0, vocab, (n,), device="cuda")
    target[::5] = opts.get("ignore_index", -100)
    loss = tessera.cross_entropy(logits, target, **opts)
    want, x = reference(torch, logits, target, **opts)
    seed = torch.rand_like(want)
    (grad,) = torch.autograd.grad(loss, logits, seed.to(loss.dtype))
    (want_grad,) = torch.autograd.grad(want, x, seed)
    rel = 1e-5 if dtype == "float32" else 1e-2
    atol = 1e-3 if vocab == 1 else 0.0  # one class: the loss and gradient are 0 (rounding aside)
    close(loss, want.detach(), rel, atol)
    close(grad, want_grad, rel, atol)


def test_matches_torch_and_lse(torch):
    logits = torch.randn(300, 5000, device="cuda", requires_grad=True)
    target = torch.randint(0, 5000, (300,), device="cuda")
    loss, lse = tessera.cross_entropy(logits, target, label_smoothing=0.05, return_lse=True)
    want = torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.05)
    assert torch.allclose(loss, want, rtol=1e-5)
    assert torch.allclose(lse, torch.logsumexp(logits.detach(), -1), rtol=1e-5)
    g, = torch.autograd.grad(loss, logits)
    w, = torch.autograd.grad(want, logits)
    assert torch.allclose(g, w, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_inplace_grad_overwrites_the_logits(torch, reduction):
    base = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 4096, (64,), device="cuda")
    a = base.clone().requires_grad_()
    la = tessera.cross_entropy(a, target, reduction=reduction)
    ga, = torch.autograd.grad(la.sum(), a)
    b_leaf = base.clone().requires_grad_()
    b = b_leaf * 1.0
    lb = tessera.cross_entropy(b, target, reduction=reduction, inplace_grad=True)  # b made by an op
    assert torch.equal(la, lb)
    gb, = torch.autograd.grad(lb.sum(), b_leaf)
    assert torch.equal(ga, gb)
    assert torch.equal(b.detach(), gb)  # b's storage now holds the gradient


def test_edge_cases_follow_torch(torch):
    logits = torch.randn(4, 10, device="cuda", requires_grad=True)
    ignored = torch.full((4,), -100, device="cuda")
    loss = tessera.cross_entropy(logits, ignored)
    assert loss.isnan()
    g, = torch.autograd.grad(tessera.cross_entropy(logits, ignored, reduction="sum"), logits)
    assert torch.equal(g, torch.zeros_like(g))
    assert tessera.cross_entropy(logits, ignored, reduction="sum").item() == 0.0
    bad = torch.tensor([1, 10, -1, 3], device="cuda")
    rows = tessera.cross_entropy(logits.detach(), bad, reduction="none")
    assert rows[1].isnan() and rows[2].isnan() and not rows[0].isnan() and not rows[3].isnan()
    one = tessera.cross_entropy(logits[0], torch.tensor(2, device="cuda"))
    assert torch.allclose(one, torch.nn.functional.cross_entropy(logits[0], torch.tensor(2, device="cuda")))
    # Non-contiguous logits: a padded row stride and a transposed view.
    wide = torch.randn(8, 40, device="cuda")
    t = torch.randint(0, 32, (8,), device="cuda")
    assert torch.allclose(tessera.cross_entropy(wide[:, :32], t),
                          torch.nn.functional.cross_entropy(wide[:, :32], t), rtol=1e-5)
    tall = torch.randn(32, 8, device="cuda")
    assert torch.allclose(tessera.cross_entropy(tall.t(), t), torch.nn.functional.cross_entropy(tall.t(), t), rtol=1e-5)


def test_second_backward_is_refused(torch):
    logits = torch.randn(4, 10, device="cuda", requires_grad=True)
    loss = tessera.cross_entropy(logits, torch.tensor([1, 2, 3, 4], device="cuda"))
    torch.autograd.grad(loss, logits, retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        torch.autograd.grad(loss, logits)


def test_errors_name_the_argument(torch):
    logits = torch.randn(4, 10, device="cuda")
    with pytest.raises(TypeError, match="argument 'target'"):
        tessera.cross_entropy(logits, torch.zeros(4, device="cuda"))
    with pytest.raises(ValueError, match="argument 'target'"):
        tessera.cross_entropy(logits, torch.zeros(3, device="cuda", dtype=torch.long))
    with pytest.raises(ValueError, match="argument 'reduction'"):
        tessera.cross_entropy(logits, torch.zeros(4, device="cuda", dtype=torch.long), reduction="avg")
    with pytest.raises(ValueError, match="argument 'label_smoothing'"):
        tessera.cross_entropy(logits, torch.zeros(4, device="cuda", dtype=torch.long), label_smoothing=2.0)
    with pytest.raises(ValueError, match="argument 'logits'"):
        tessera.cross_entropy(logits[None], torch.zeros(4, device="cuda", dtype=torch.long))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", [dict(), dict(reduction="sum", label_smoothing=0.1, bias=True),
                                  dict(reduction="none", z_loss=1e-3)])
def test_linear_cross_entropy_against_float64(torch, dtype, case):
    """The fused linear cross-entropy in chunks (three of 128 rows and a remainder) against
    F.linear then the loss in float64: loss and the gradients of hidden, weight and bias."""
    case = dict(case)
    dt = getattr(torch, dtype)
    n, h, v = 300, 64, 1000
    hidden = (torch.randn(n, h, device="cuda") / 4).to(dt).requires_grad_()
    weight = torch.randn(v, h, device="cuda").to(dt).requires_grad_()
    bias = torch.randn(v, device="cuda").to(dt).requires_grad_() if case.pop("bias", False) else None
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    loss = tessera.linear_cross_entropy(hidden, weight, target, bias, chunk_size=128, **case)
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    seed = torch.rand_like(loss, dtype=torch.float32)
    grads = torch.autograd.grad(loss, leaves, seed.to(loss.dtype))
    x64 = [t.detach().double().requires_grad_() for t in leaves]
    logits = x64[0] @ x64[1].t() + (x64[2] if bias is not None else 0)
    want, x = reference(torch, logits, target, **case)
    want_grads = torch.autograd.grad(want, x64, seed.double())
    rel = 2e-5 if dtype == "float32" else 1e-2
    close(loss, want.detach(), rel)
    for g, w in zip(grads, want_grads):
        close(g, w, rel)


def test_linear_cross_entropy_edges_and_errors(torch):
    """All rows ignored: a NaN mean and zero gradients (torch's); a second backward refused; the
    chunk loop's argument errors name the argument."""
    hidden = torch.randn(6, 8, device="cuda", requires_grad=True)
    weight = torch.randn(10, 8, device="cuda", requires_grad=True)
    ignored = torch.full((6,), -100, device="cuda")
    loss = tessera.linear_cross_entropy(hidden, weight, ignored, chunk_size=4)
    assert torch.isnan(loss)
    dh, dw = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    assert dh.abs().max() == 0 and dw.abs().max() == 0
    with pytest.raises(RuntimeError, match="retain_graph"):
        torch.autograd.grad(loss, (hidden, weight))
    target = torch.randint(0, 10, (6,), device="cuda")
    strided = torch.randint(0, 10, (12,), device="cuda")[::2]  # taken as a contiguous copy
    assert torch.equal(tessera.linear_cross_entropy(hidden.detach(), weight.detach(), strided),
                       tessera.linear_cross_entropy(hidden.detach(), weight.detach(), strided.contiguous()))
    with pytest.raises(ValueError, match="argument 'weight'"):
        tessera.linear_cross_entropy(hidden, weight[:, :4], target)
    with pytest.raises(ValueError, match="argument 'target'"):
        tessera.linear_cross_entropy(hidden, weight, target[:5])
    with pytest.raises(ValueError, match="argument 'bias'"):
        tessera.linear_cross_entropy(hidden, weight, target, torch.zeros(9, device="cuda"))
    with pytest.raises(ValueError, match="argument 'reduction'"):
        tessera.linear_cross_entropy(hidden, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="argument 'chunk_size'"):
        tessera.linear_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(TypeError, match="argument 'weight'"):
        tessera.linear_cross_entropy(hidden, weight.double(), target)


def test_linear_cross_entropy_frozen_weight(torch):
    """A weight that needs no gradient gets none computed (the op's output_mask), and d_hidden is
    still right."""
    hidden = (torch.randn(40, 32, device="cuda") / 4).requires_grad_()
    weight = torch.randn(100, 32, device="cuda")
    target = torch.randint(0, 100, (40,), device="cuda")
    loss = tessera.linear_cross_entropy(hidden, weight, target, chunk_size=16)
    (dh,) = torch.autograd.grad(loss, hidden)
    h64 = hidden.detach().double().requires_grad_()
    want = torch.nn.functional.cross_entropy(h64 @ weight.double().t(), target)
    (want_dh,) = torch.autograd.grad(want, h64)
    close(dh, want_dh, 2e-5)
    out = torch.ops.tessera.linear_cross_entropy(hidden.detach(), weight, None, target, output_mask=[True, False, False])
    assert out[2].shape == hidden.shape and out[3].numel() == 0 and out[4].numel() == 0
