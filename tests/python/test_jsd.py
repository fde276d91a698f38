"""tessera.jsd (Liger's LigerJSD: the generalized Jensen-Shannon divergence, or either KL, of a
student's distribution from a teacher's) against a float64 reference written from the formula:
the value by each reduction, the student's gradient, ignored rows, log-probability inputs, the
errors. CPU tensors take torch's functions; on a GPU, tessera::jsd's kernel."""

import pytest

torch = pytest.importorskip("torch")
import tessera  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = [("cpu", torch.float32), pytest.param("cuda", torch.float32, marks=gpu),
           pytest.param("cuda", torch.bfloat16, marks=gpu)]


def reference(s, t, beta, temperature):
    """Each row's divergence in float64."""
    ls = torch.log_softmax(s.double() / temperature, -1)
    lt = torch.log_softmax(t.double() / temperature, -1)
    ps, pt = ls.exp(), lt.exp()
    if beta == 0:
        return (pt * (lt - ls)).sum(-1)
    if beta == 1:
        return (ps * (ls - lt)).sum(-1)
    lm = (beta * pt + (1 - beta) * ps).log()
    return beta * (pt * (lt - lm)).sum(-1) + (1 - beta) * (ps * (ls - lm)).sum(-1)


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_jsd_matches_the_formula(device, dtype, beta, reduction):
    g = torch.Generator().manual_seed(3)
    s = (torch.randn(3, 5, 1001, generator=g) * 2).to(device, dtype)
    t = (torch.randn(3, 5, 1001, generator=g) * 2).to(device, dtype)
    target = torch.randint(0, 1001, (3, 5), generator=g)
    target[0, :2] = -100
    target = target.to(device)
    x = s.clone().requires_grad_()
    got = tessera.jsd(x, t, target, beta=beta, temperature=2.0, reduction=reduction)
    dy = torch.randn(got.shape, generator=g).to(device) if reduction == "none" else torch.tensor(1.5, device=device)
    got.backward(dy)
    x64 = s.double().requires_grad_()
    keep = target != -100
    rows = reference(x64, t, beta, 2.0) * keep
    want = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / keep.sum()}[reduction]
    want.backward(dy.double())
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.double(), want.detach(), **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    assert x.grad[0, :2].abs().max() == 0  # ignored rows take no gradient


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_jsd_takes_log_probabilities_and_no_target(device, dtype):
    """Liger's LigerJSD takes log-probabilities: softmax leaves them as they are; without a
    target, 'mean' is over every row."""
    g = torch.Generator().manual_seed(4)
    s = torch.log_softmax(torch.randn(6, 300, generator=g), -1).to(device, dtype)
    t = torch.log_softmax(torch.randn(6, 300, generator=g), -1).to(device, dtype)
    got = tessera.jsd(s, t, beta=0.5)
    want = reference(s, t, 0.5, 1.0).mean()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got.double(), want, **tol)


def test_jsd_errors_name_the_argument():
    s = torch.randn(4, 10)
    with pytest.raises(ValueError, match="'teacher'"):
        tessera.jsd(s, torch.randn(4, 11))
    with pytest.raises(ValueError, match="'beta'"):
        tessera.jsd(s, s, beta=1.5)
    with pytest.raises(ValueError, match="'temperature'"):
        tessera.jsd(s, s, temperature=0.0)
    with pytest.raises(ValueError, match="'reduction'"):
        tessera.jsd(s, s, reduction="batchmean")
    with pytest.raises(ValueError, match="'target'"):
        tessera.jsd(s, s, torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="'student'"):
        tessera.jsd([1.0], s)


@gpu
def test_jsd_refuses_a_second_backward():
    s = torch.randn(4, 10, device="cuda", requires_grad=True)
    loss = tessera.jsd(s, torch.randn(4, 10, device="cuda"))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
