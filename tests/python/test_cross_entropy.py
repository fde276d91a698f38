"""tessera.cross_entropy against torch's F.cross_entropy and a float64 reference (z-loss and
soft-cap, which torch lacks): loss and gradient through autograd for every option, class weights
and probability targets (with their own gradients), bf16 within 1e-2 relative and float32 within
1e-5 of float64; the in-place gradient, torch's edge cases, the errors that name their argument."""

import pytest

import tessera


def reference(torch, logits, target, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              z_loss=0.0, softcap=None):
    """The loss in float64 from the formulas of tessera's documentation, through torch's autograd:
    F.cross_entropy of the (capped) logits, plus z_loss * lse^2 times the row's weight on lse."""
    x = logits if logits.requires_grad and logits.dtype == torch.float64 else logits.detach().double().requires_grad_()
    y = softcap * torch.tanh(x / softcap) if softcap else x
    probs = target.shape == logits.shape
    w = None if weight is None else weight.double()
    e, v = label_smoothing, y.shape[-1]
    loss = torch.nn.functional.cross_entropy(y, target.double() if probs else target.long(), weight=w,
                                             ignore_index=ignore_index, reduction="none", label_smoothing=e)
    ones = torch.ones(v, dtype=torch.float64, device=y.device) if w is None else w
    if probs:  # the weight on lse: sum_c w_c q'_c; the mean over the rows
        rw = (((1 - e) * target.double() + e / v) * ones).sum(-1)
        divisor = y.shape[0]
    else:  # (1 - e) w_t + e / V sum_c w_c; the mean over the targets' weights
        keep = target != ignore_index
        wt = ones[torch.where(keep, target.long(), 0)] * keep
        rw = (1 - e) * wt + e / v * ones.sum() * keep
        divisor = wt.sum()
    lse = torch.logsumexp(y, -1)
    loss = loss + z_loss * rw * lse * lse
    if reduction == "mean":
        loss = loss.sum() / divisor
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


WEIGHTED = [
    dict(weight=True),                                                   # rows scaled: the plain kernels
    dict(weight=True, label_smoothing=0.1, reduction="sum"),             # the per-class kernel
    dict(weight=True, ignore_index=3, reduction="none", z_loss=1e-3),
    dict(probs=True),
    dict(probs=True, weight=True, label_smoothing=0.2, reduction="none"),
    dict(probs=True, weight=True, z_loss=1e-3, softcap=15.0, reduction="sum"),
    dict(weight=True, label_smoothing=0.3, softcap=15.0),
]


def weighted_inputs(torch, dtype, n, vocab, opts):
    """Logits, target (indices with every fifth row ignored, or probabilities) and weights for a
    WEIGHTED case; the keyword arguments left for cross_entropy."""
    opts = dict(opts)
    logits = (torch.randn(n, vocab, device="cuda") * 4).to(dtype).requires_grad_()
    if opts.pop("probs", False):
        target = torch.softmax(torch.randn(n, vocab, device="cuda") * 2, -1)
    else:
        target = torch.randint(0, vocab, (n,), device="cuda")
        target[::5] = opts.get("ignore_index", -100)
    weight = torch.rand(vocab, device="cuda") * 1.75 + 0.25 if opts.pop("weight", False) else None
    return logits, target, weight, opts


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("vocab", [3, 1000, 50257])
@pytest.mark.parametrize("case", range(len(WEIGHTED)))
def test_weights_and_probabilities_against_float64(torch, dtype, vocab, case):
    """Class weights and probability targets on every tier (V = 1000: 16-byte rows; 50257: a
    scalar head and tail), loss and gradient against F.cross_entropy in float64 (probabilities
    rounded to the logits' dtype, as tessera reads them)."""
    dt = getattr(torch, dtype)
    logits, target, weight, opts = weighted_inputs(torch, dt, 64 if vocab < 50000 else 8, vocab, WEIGHTED[case])
    loss = tessera.cross_entropy(logits, target, weight, **opts)
    held = target.to(dt) if target.is_floating_point() else target
    want, x = reference(torch, logits, held, weight, **opts)
    seed = torch.rand_like(want)
    (grad,) = torch.autograd.grad(loss, logits, seed.to(loss.dtype))
    (want_grad,) = torch.autograd.grad(want, x, seed)
    rel = 1e-5 if dtype == "float32" else 1e-2
    close(loss, want.detach(), rel)
    close(grad, want_grad, rel)


def test_weights_match_torch_exactly_where_torch_computes_in_float32(torch):
    """float32 logits, as torch computes them: class weights with and without smoothing and
    probability targets, every reduction, loss and gradient; the one-row form."""
    F = torch.nn.functional
    logits = torch.randn(300, 5000, device="cuda", requires_grad=True)
    target = torch.randint(0, 5000, (300,), device="cuda")
    target[::7] = -100
    probs = torch.softmax(torch.randn(300, 5000, device="cuda"), -1)
    weight = torch.rand(5000, device="cuda") + 0.5
    for t in (target, probs):
        for kw in (dict(), dict(label_smoothing=0.1), dict(reduction="sum"), dict(reduction="none", label_smoothing=0.3)):
            got = tessera.cross_entropy(logits, t, weight, **kw)
            want = F.cross_entropy(logits, t, weight, **kw)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            (g,) = torch.autograd.grad(got.sum(), logits)
            (w,) = torch.autograd.grad(want.sum(), logits)
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    one = tessera.cross_entropy(logits[0], probs[0], weight, reduction="none")
    torch.testing.assert_close(one, F.cross_entropy(logits[0], probs[0], weight, reduction="none"), rtol=1e-5, atol=0)
    one = tessera.cross_entropy(logits[1], target[1], weight)
    torch.testing.assert_close(one, F.cross_entropy(logits[1], target[1], weight), rtol=1e-5, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_probability_and_weight_gradients(torch, reduction):
    """Probability targets and class weights that require grad get torch's gradients (float64
    reference, with smoothing, z-loss and soft-cap); the logits' too."""
    logits = torch.randn(32, 700, device="cuda", requires_grad=True)
    q = torch.softmax(torch.randn(32, 700, device="cuda"), -1).requires_grad_()
    w = (torch.rand(700, device="cuda") + 0.5).requires_grad_()
    opts = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3, softcap=20.0)
    loss = tessera.cross_entropy(logits, q, w, **opts)
    seed = torch.rand_like(loss)
    got = torch.autograd.grad(loss, (logits, q, w), seed)
    q64, w64 = q.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want, x = reference(torch, logits, q64, w64, **opts)
    wanted = torch.autograd.grad(want, (x, q64, w64), seed.double())
    for g, r in zip(got, wanted):
        close(g, r, 1e-5)
    (gq,) = torch.autograd.grad(tessera.cross_entropy(logits.detach(), q, **opts), q, seed)  # logits need none
    (rq,) = torch.autograd.grad(reference(torch, logits.detach(), q64, **opts)[0], q64, seed.double())
    close(gq, rq, 1e-5)


def test_weighted_edge_cases_follow_torch(torch):
    """All rows ignored: NaN mean, zero gradient; targets whose weights are 0: NaN (torch's);
    masked (-inf) classes keep the loss finite."""
    F = torch.nn.functional
    logits = torch.randn(4, 10, device="cuda", requires_grad=True)
    w = torch.rand(10, device="cuda") + 0.5
    ignored = torch.full((4,), -100, device="cuda")
    for e in (0.0, 0.1):
        loss = tessera.cross_entropy(logits, ignored, w, label_smoothing=e)
        assert loss.isnan()
        (g,) = torch.autograd.grad(loss, logits)
        assert torch.equal(g, torch.zeros_like(g))
    t = torch.tensor([1, 2, 3, 4], device="cuda")
    assert tessera.cross_entropy(logits.detach(), t, torch.zeros(10, device="cuda")).isnan()
    masked = torch.randn(4, 10, device="cuda")
    masked[:, 5:] = float("-inf")
    for weight in (None, w):
        got = tessera.cross_entropy(masked, t, weight)
        torch.testing.assert_close(got, F.cross_entropy(masked, t, weight), rtol=1e-5, atol=0)
        assert got.isfinite()
    empty = torch.zeros(0, 10, device="cuda")
    assert tessera.cross_entropy(empty, empty).isnan() and tessera.cross_entropy(empty, empty, reduction="sum") == 0


def test_weighted_loss_compiles_fullgraph(torch):
    """torch.compile(fullgraph=True) traces the op with class weights and probability targets
    (the fake kernels take the weight), forward and backward, with the eager result."""
    logits = torch.randn(16, 300, device="cuda", requires_grad=True)
    t = torch.randint(0, 300, (16,), device="cuda")
    q = torch.softmax(torch.randn(16, 300, device="cuda"), -1)
    w = torch.rand(300, device="cuda") + 0.5

    def f(x):
        return tessera.cross_entropy(x, t, w, label_smoothing=0.1) + tessera.cross_entropy(x, q, w)
    want = f(logits)
    (want_g,) = torch.autograd.grad(want, logits)
    got = torch.compile(f, fullgraph=True)(logits)
    (got_g,) = torch.autograd.grad(got, logits)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_g, want_g)


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


def test_shortcut_takes_class_indices_and_float32_weights(torch):
    """The no-grad shortcut (tessera._torch_fast) takes the logits of one of the op's dtypes,
    class indices of their own dtype and float32 class weights; it declines the rest (None) for
    the registered op. Either way the same kernel, bit for bit."""
    from tessera import _state
    from tessera._surface import _FAST_INDEX
    tessera.cross_entropy(torch.randn(2, 8, device="cuda"), torch.zeros(2, dtype=torch.long, device="cuda"))
    if _state.fast is None:
        pytest.skip("built without torch's Python library: no shortcut")
    call, i = _state.fast.call, _FAST_INDEX["cross_entropy"]
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 1000, (64,), device="cuda")
    w = torch.rand(1000, device="cuda")
    opts = (-100, "mean", 0.1, 0.0, 0.0, False)
    got = call(i, x, t, w, *opts)
    want = torch.ops.tessera.cross_entropy(x, t, w, label_smoothing=0.1)
    assert got[2] is None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(tessera.cross_entropy(x, t, w, label_smoothing=0.1), want[0])
    assert call(i, x, t, w.half(), *opts) is None  # weights not float32
    assert call(i, x, t.cpu(), w, *opts) is None  # indices off the logits' device
    assert call(i, x.double(), t, None, *opts) is None  # a dtype the kernels lack
    # Through autograd (the op's autograd kernel, reached from C++): torch's gradient.
    xg = x.float().requires_grad_()
    tessera.cross_entropy(xg, t, w).backward()
    x64 = x.double().requires_grad_()
    torch.nn.functional.cross_entropy(x64, t, w.double()).backward()
    close(xg.grad, x64.grad, 1e-5, 1e-7)


@pytest.mark.parametrize("weighted", [False, True])
def test_loss_without_gradient_is_the_same_mean(torch, weighted):
    """Without a gradient the mean's divisor is counted in the sum's launch, not before the rows:
    the same loss bit for bit as with one, ignored rows and class weights included."""
    x = torch.randn(300, 1000, device="cuda")
    t = torch.randint(0, 1000, (300,), device="cuda")
    t[::7] = -100
    w = torch.rand(1000, device="cuda") + 0.5 if weighted else None
    with torch.no_grad():
        alone = tessera.cross_entropy(x, t, w, label_smoothing=0.1)
    with_grad = tessera.cross_entropy(x.clone().requires_grad_(), t, w, label_smoothing=0.1)
    assert torch.equal(alone, with_grad.detach())
    close(alone, torch.nn.functional.cross_entropy(x.double(), t, None if w is None else w.double(),
                                                   label_smoothing=0.1), 1e-5, 1e-6)
    with torch.no_grad():
        assert tessera.cross_entropy(x, torch.full_like(t, -100)).isnan()  # all ignored: 0 / 0


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
    t = torch.zeros(4, device="cuda", dtype=torch.long)
    with pytest.raises(ValueError, match="argument 'weight'.*V = 10"):
        tessera.cross_entropy(logits, t, torch.ones(9, device="cuda"))
    with pytest.raises(TypeError, match="argument 'weight'"):
        tessera.cross_entropy(logits, t, torch.ones(10, device="cuda", dtype=torch.long))
    with pytest.raises(ValueError, match="argument 'weight'"):
        tessera.cross_entropy(logits, t, torch.ones(10))  # on the CPU
    with pytest.raises(ValueError, match="argument 'weight'.*detach"):  # as torch's nll_loss
        tessera.cross_entropy(logits.requires_grad_(), t, torch.ones(10, device="cuda", requires_grad=True))
    q = torch.rand(4, 10, device="cuda")
    with pytest.raises(ValueError, match="argument 'ignore_index'"):  # torch's rule for probabilities
        tessera.cross_entropy(logits, q, ignore_index=0)
    with pytest.raises(TypeError, match="argument 'target'.*probabilities"):
        tessera.cross_entropy(logits, q.long())
    with pytest.raises(ValueError, match="argument 'target'"):
        tessera.cross_entropy(logits, q[:, :9])
    with pytest.raises(ValueError, match="inplace_grad"):
        tessera.cross_entropy(logits.detach().clone().requires_grad_() * 1, q.requires_grad_(), inplace_grad=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", [dict(), dict(reduction="sum", label_smoothing=0.1, bias=True),
                                  dict(reduction="none", z_loss=1e-3), dict(class_weights=True),
                                  dict(reduction="none", label_smoothing=0.1, class_weights=True),
                                  dict(class_weights=True, z_loss=1e-3),
                                  dict(reduction="sum", label_smoothing=0.1, class_weights=True, z_loss=1e-3)])
def test_linear_cross_entropy_against_float64(torch, dtype, case):
    """The fused linear cross-entropy in chunks (three of 128 rows and a remainder) against
    F.linear then the loss in float64: loss and the gradients of hidden, weight and bias; class
    weights as torch's (the mean over the rows' target weights)."""
    case = dict(case)
    dt = getattr(torch, dtype)
    n, h, v = 300, 64, 1000
    hidden = (torch.randn(n, h, device="cuda") / 4).to(dt).requires_grad_()
    weight = torch.randn(v, h, device="cuda").to(dt).requires_grad_()
    bias = torch.randn(v, device="cuda").to(dt).requires_grad_() if case.pop("bias", False) else None
    cw = torch.rand(v, device="cuda") * 1.75 + 0.25 if case.pop("class_weights", False) else None
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    loss = tessera.linear_cross_entropy(hidden, weight, target, bias, chunk_size=128, ce_weight=cw, **case)
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    seed = torch.rand_like(loss, dtype=torch.float32)
    grads = torch.autograd.grad(loss, leaves, seed.to(loss.dtype))
    x64 = [t.detach().double().requires_grad_() for t in leaves]
    logits = x64[0] @ x64[1].t() + (x64[2] if bias is not None else 0)
    want, x = reference(torch, logits, target, cw, **case)
    want_grads = torch.autograd.grad(want, x64, seed.double())
    rel = 2e-5 if dtype == "float32" else 1e-2
    close(loss, want.detach(), rel)
    for g, w in zip(grads, want_grads):
        close(g, w, rel)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_accum_dtype(torch, reduction):
    """accum_dtype=float32: a bfloat16 weight's gradient summed over 64 chunks in float32 and
    rounded once, closer to float64's than the sum in bfloat16; returned in the weight's dtype."""
    n, h, v = 4096, 64, 512
    hidden = (torch.randn(n, h, device="cuda") / 4).bfloat16().requires_grad_()
    weight = torch.randn(v, h, device="cuda").bfloat16().requires_grad_()
    target = torch.randint(0, v, (n,), device="cuda")
    x64 = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    want, _ = reference(torch, x64[0] @ x64[1].t(), target, None, reduction=reduction)
    seed = torch.rand_like(want, dtype=torch.float32)
    want_dw = torch.autograd.grad(want, x64[1], seed.double())[0]
    err = {}
    for accum in (None, torch.float32):
        loss = tessera.linear_cross_entropy(hidden, weight, target, chunk_size=64, reduction=reduction,
                                            accum_dtype=accum)
        dh, dw = torch.autograd.grad(loss, (hidden, weight), seed)
        assert dw.dtype == torch.bfloat16 and dh.dtype == torch.bfloat16
        close(dw, want_dw, 1e-2)
        err[accum] = ((dw.double() - want_dw).norm() / want_dw.norm()).item()
    assert err[torch.float32] < err[None], err
    with pytest.raises(ValueError, match="argument 'accum_dtype'.*float32"):
        tessera.linear_cross_entropy(hidden, weight, target, accum_dtype=torch.float16)


@pytest.mark.parametrize("v", [1000, 1003])  # whole 16-byte rows, and not
def test_linear_cross_entropy_token_accuracy(torch, v):
    """The token accuracy (return_token_accuracy) against torch's argmax over chunks of rows,
    ignored rows left out, ties to the first index; NaN where every row is ignored."""
    n, h = 300, 64
    hidden = (torch.randn(n, h, device="cuda") / 4).bfloat16()
    weight = torch.randn(v, h, device="cuda").bfloat16()
    bias = torch.zeros(v, device="cuda").bfloat16()
    bias[[5, 9]] = 100.0  # two equal maxima where hidden is 0: the first (5) is the argmax
    hidden[:20] = 0
    pred = torch.nn.functional.linear(hidden, weight, bias).argmax(-1)  # bf16 logits, as the kernel's
    target = torch.where(torch.rand(n, device="cuda") < 0.5, pred, torch.randint(0, v, (n,), device="cuda"))
    target[:10] = 9  # a tie lost
    target[10:20] = 5  # a tie won
    target[::7] = -100
    keep = target != -100
    want = (pred == target)[keep].float().mean()
    loss, acc = tessera.linear_cross_entropy(hidden.requires_grad_(), weight, target, bias, chunk_size=128,
                                             return_token_accuracy=True)
    assert acc.dtype == torch.float32 and acc.shape == () and not acc.requires_grad
    # (a row whose top two logits round to one bf16 value in one GEMM and not the other may differ)
    assert acc.item() == pytest.approx(want.item(), abs=2.5 / keep.sum().item())
    _, ties = tessera.linear_cross_entropy(hidden[:20].detach(), weight, target[:20], bias,
                                           return_token_accuracy=True)  # exact: the logits are the bias
    assert ties.item() == pytest.approx(((target[:20] == 5) & keep[:20]).sum().item() / keep[:20].sum().item())
    assert loss.item() == pytest.approx(tessera.linear_cross_entropy(hidden, weight, target, bias).item())
    loss.backward()  # the accuracy takes no part in the gradients
    _, lse, acc2 = tessera.linear_cross_entropy(hidden.detach(), weight, target, bias, return_lse=True,
                                                return_token_accuracy=True)
    assert acc2.item() == acc.item() and lse.shape == (n,)
    _, none = tessera.linear_cross_entropy(hidden.detach(), weight, torch.full_like(target, -100), bias,
                                           return_token_accuracy=True)
    assert torch.isnan(none)


@pytest.mark.parametrize("tdtype", ["int64", "int32"])
def test_predicted_tokens_and_accuracy(torch, tdtype):
    """return_predicted_tokens (each row's argmax, -1 where ignored, in the target's dtype) and the
    token accuracy: the fused loss's from its argmax pass, cross_entropy's from torch's argmax
    (before an inplace_grad call overwrites the logits); the loss as without them."""
    n, h, v = 300, 64, 1003
    hidden = (torch.randn(n, h, device="cuda") / 4).bfloat16()
    weight = torch.randn(v, h, device="cuda").bfloat16()
    logits = torch.nn.functional.linear(hidden, weight)  # bf16 logits, as the fused loss's
    pred = logits.argmax(-1)
    target = torch.where(torch.rand(n, device="cuda") < 0.5, pred, torch.randint(0, v, (n,), device="cuda"))
    target[::7] = -100
    target = target.to(getattr(torch, tdtype))
    keep = target != -100
    want_pred = torch.where(keep, pred, -1).to(target.dtype)
    want_acc = (pred == target)[keep].float().mean()
    loss, acc, got = tessera.linear_cross_entropy(hidden.requires_grad_(), weight, target, chunk_size=128,
                                                  return_token_accuracy=True, return_predicted_tokens=True)
    assert got.dtype == target.dtype and got.shape == (n,) and not got.requires_grad
    # (a row whose top two logits round to one bf16 value in one GEMM and not the other may differ)
    assert (got != want_pred).sum().item() <= 2 and torch.equal(got[~keep], want_pred[~keep])
    assert acc.item() == pytest.approx(want_acc.item(), abs=2.5 / keep.sum().item())
    assert loss.item() == pytest.approx(tessera.linear_cross_entropy(hidden, weight, target).item())
    loss.backward()
    _, alone = tessera.linear_cross_entropy(hidden.detach(), weight, target, return_predicted_tokens=True)
    assert torch.equal(alone, got)
    for inplace in (False, True):
        x = logits.float().clone().requires_grad_(not inplace)
        loss, lse, acc, got = tessera.cross_entropy(x, target, return_lse=True, return_token_accuracy=True,
                                                    return_predicted_tokens=True, inplace_grad=inplace)
        assert torch.equal(got, want_pred) and acc.item() == pytest.approx(want_acc.item())
        assert lse.shape == (n,) and loss.shape == ()
    row, got = tessera.cross_entropy(logits[3].float(), target[3], reduction="none", return_predicted_tokens=True)
    assert row.shape == () and got.shape == () and got.item() == want_pred[3].item()
    _, none = tessera.cross_entropy(logits.float(), torch.full_like(target, -100), return_token_accuracy=True)
    assert torch.isnan(none)
    with pytest.raises(ValueError, match="argument 'return_token_accuracy'.*probabilities"):
        tessera.cross_entropy(logits.float(), torch.rand(n, v, device="cuda"), return_token_accuracy=True)


@pytest.mark.parametrize("case", [dict(), dict(reduction="sum", softcap=30.0, bias=True),
                                  dict(reduction="none", label_smoothing=0.1, class_weights=True),
                                  dict(class_weights=True, z_loss=1e-3)])
def test_linear_cross_entropy_token_scaling(torch, case):
    """use_token_scaling (Liger's): each row's loss and gradient times its target's probability,
    detached, against float64; 'mean' over the unscaled loss's divisor."""
    case = dict(case)
    n, h, v = 300, 64, 1000
    hidden = (torch.randn(n, h, device="cuda") / 4).requires_grad_()
    weight = torch.randn(v, h, device="cuda").requires_grad_()
    bias = torch.randn(v, device="cuda").requires_grad_() if case.pop("bias", False) else None
    cw = torch.rand(v, device="cuda") * 1.75 + 0.25 if case.pop("class_weights", False) else None
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    reduction = case.pop("reduction", "mean")
    loss = tessera.linear_cross_entropy(hidden, weight, target, bias, chunk_size=128, ce_weight=cw,
                                        reduction=reduction, use_token_scaling=True, **case)
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    seed = torch.rand_like(loss, dtype=torch.float32)
    grads = torch.autograd.grad(loss, leaves, seed)
    x64 = [t.detach().double().requires_grad_() for t in leaves]
    logits = x64[0] @ x64[1].t() + (x64[2] if bias is not None else 0)
    rows, x = reference(torch, logits, target, cw, reduction="none", **case)
    cap = case.get("softcap")
    y = cap * torch.tanh(logits / cap) if cap else logits
    keep = target != -100
    p = torch.softmax(y.detach(), -1).gather(-1, torch.where(keep, target, 0)[:, None])[:, 0] * keep
    want = rows * p
    if reduction == "sum":
        want = want.sum()
    elif reduction == "mean":
        want = want.sum() / (keep.sum() if cw is None else (cw.double()[torch.where(keep, target, 0)] * keep).sum())
    want_grads = torch.autograd.grad(want, x64, seed.double())
    close(loss, want.detach(), 2e-5)
    for g, w in zip(grads, want_grads):
        close(g, w, 2e-5)


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
    with pytest.raises(ValueError, match="class weights.*V = 10"):
        tessera.linear_cross_entropy(hidden, weight, target, ce_weight=torch.ones(9, device="cuda"))
    with pytest.raises(ValueError, match="argument 'ce_weight'.*grad"):
        tessera.linear_cross_entropy(hidden, weight, target, ce_weight=torch.ones(10, device="cuda", requires_grad=True))


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
    assert out[2].shape == hidden.shape and out[3] is None and out[4] is None  # not asked for: None


def test_validate_names_an_out_of_range_class():
    """validate=True: a class index outside [0, V) and not ignored is a ValueError naming the target,
    before any kernel runs (so on any device); ignored rows pass."""
    torch = pytest.importorskip("torch")
    logits, hidden, weight = torch.randn(4, 10), torch.randn(4, 8), torch.randn(10, 8)
    for bad in (10, -3):
        target = torch.tensor([1, bad, -100, 9])
        with pytest.raises(ValueError, match=rf"argument 'target': expected class indices in \[0, 10\).*got {bad}"):
            tessera.cross_entropy(logits, target, validate=True)
        with pytest.raises(ValueError, match="argument 'target'"):
            tessera.linear_cross_entropy(hidden, weight, target, validate=True)
