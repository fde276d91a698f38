"""tessera's preference losses (DPO and its loss types, ORPO, CPO, SimPO) against float64
references written from the papers' formulas on the whole logits: the loss, its gradients in the
hidden states, the weight and the bias, and Liger's auxiliary outputs; the module classes'
signatures; the errors. The losses' chunked mechanism (tessera/_head_chunks.py) runs on CPU
tensors with torch's functions in place of the kernels, so this runs anywhere; on a GPU, tessera's
kernels in bfloat16 too."""

import math

import pytest

torch = pytest.importorskip("torch")
import tessera  # noqa: E402
import tessera.post_training as tp  # noqa: E402
from tessera import _head_chunks  # noqa: E402

F = torch.nn.functional
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = [("cpu", torch.float32), pytest.param("cuda", torch.bfloat16, marks=gpu)]
B, S, H, V = 3, 7, 16, 50


def data(device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2 * B, S, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5
    bias = torch.randn(V, generator=g) / 10
    target = torch.randint(0, V, (2 * B, S), generator=g)
    target[:, :2] = -100  # the prompt
    target[1, 5:] = -100  # padding
    ref = hidden + 0.1 * torch.randn(2 * B, S, H, generator=g)
    return [t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in (hidden, weight, bias, target, ref)]


def logps64(hidden, weight, bias, target, average):
    logits = hidden.double() @ weight.double().t() + (0 if bias is None else bias.double())
    lp = torch.log_softmax(logits, -1)
    mask = target != -100
    tok = lp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    total = tok.sum(-1)
    return (total / mask.sum(-1) if average else total), tok, mask, logits


def reference(kind, hidden, weight, bias, target, ref, o):
    """(loss, chosen logps, rejected logps, logits means, nll) in float64 from the whole logits."""
    n = hidden.shape[0] // 2
    average = o.get("average_log_prob", kind in ("orpo", "simpo"))
    logps, tok, mask, logits = logps64(hidden, weight, bias, target, average)
    c, r = logps[:n], logps[n:]
    nll = -tok[:n].sum() / mask[:n].sum()
    beta = o.get("beta", 0.1)
    if kind == "dpo":
        rc, rr = logps64(ref, weight, None, target, average)[0].detach().split(n)  # ref_bias None
        d = beta * ((c - rc) - (r - rr))
        ls = o.get("label_smoothing", 0.0)
        pair = {"sigmoid": -F.logsigmoid(d), "hinge": torch.relu(1 - d),
                "robust": (-(1 - ls) * F.logsigmoid(d) + ls * F.logsigmoid(-d)) / (1 - 2 * ls)}[o.get("loss_type", "sigmoid")]
        loss = pair.sum() / n + (o.get("alpha", 1.0) * nll if o.get("compute_nll_loss") else 0)
    elif kind == "orpo":
        odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        loss = -beta * F.logsigmoid(odds).sum() / n + nll
    else:
        d = beta * (c - r) - (o.get("gamma", 0.5) if kind == "simpo" else 0.0)
        loss = -F.logsigmoid(d).sum() / n + o.get("alpha", 1.0) * nll
    means = (logits[:n].mean(), logits[n:].mean())
    return loss, c, r, means, nll


CASES = [("dpo", {}), ("dpo", {"loss_type": "hinge", "beta": 0.5}), ("dpo", {"loss_type": "robust", "label_smoothing": 0.1,
         "compute_nll_loss": True}), ("orpo", {}), ("cpo", {"alpha": 0.5}), ("simpo", {"gamma": 0.3})]


@pytest.fixture(params=["one-chunk", "chunk-a-unit"])
def chunks(request, monkeypatch):
    """The losses' chunks: all rows in one, or (a budget of one byte) each unit, a sequence or a
    pair of them, in its own."""
    if request.param == "chunk-a-unit":
        monkeypatch.setattr(_head_chunks, "BUDGET_BYTES", 1)
    return request.param


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("kind,o", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_loss_and_gradients_match_the_formula(device, dtype, kind, o, chunks):
    hidden, weight, bias, target, ref = data(device, dtype)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    fn = getattr(tessera, f"{kind}_loss")
    args = (leaves[1], leaves[0], target, leaves[2]) + ((ref,) if kind == "dpo" else ())
    loss, aux = fn(*args, **o)
    loss.backward()
    ref64 = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    want, c, r, means, nll = reference(kind, ref64[0], ref64[1], ref64[2], target, ref, o)
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    for name, got, exp in zip(("d_hidden", "d_weight", "d_bias"), leaves, ref64):
        torch.testing.assert_close(got.grad.double(), exp.grad, **tol, msg=name)
    torch.testing.assert_close(aux[0].double(), c.detach(), **tol)
    torch.testing.assert_close(aux[1].double(), r.detach(), **tol)
    torch.testing.assert_close(torch.stack(aux[2:4]).double(), torch.stack(means).detach(), **tol)
    computed = o.get("compute_nll_loss", kind != "dpo")  # the NLL reported where computed, else 0 (Liger's)
    torch.testing.assert_close(aux[4].double(), nll.detach() if computed else torch.zeros_like(nll), **tol)
    assert not any(a.requires_grad for a in aux)


def test_modules_take_ligers_signature():
    hidden, weight, bias, target, ref = data("cpu", torch.float32)
    dpo = tp.FusedLinearDPOLoss(beta=0.2, compiled=True, chunk_size=1)
    assert isinstance(dpo, torch.nn.Module)
    loss, aux = dpo(weight, hidden, target, bias, ref, None, None)
    want, *_ = tessera.dpo_loss(weight, hidden, target, bias, ref, beta=0.2)
    torch.testing.assert_close(loss, want)
    assert len(aux) == 7
    assert dpo.beta == 0.2 and dpo.loss_type == "sigmoid"  # the options are attributes, as Liger's are
    dpo.beta = 0.5  # and a change to one reaches the next call
    torch.testing.assert_close(dpo(weight, hidden, target, bias, ref, None, None)[0],
                               tessera.dpo_loss(weight, hidden, target, bias, ref, beta=0.5)[0])
    loss, aux = tp.FusedLinearORPOLoss()(weight, hidden, target)
    assert len(aux) == 9 and math.isfinite(loss.item())
    for cls in (tp.FusedLinearCPOLoss, tp.FusedLinearSimPOLoss):
        assert math.isfinite(cls()(weight, hidden, target)[0].item())
    with pytest.raises(TypeError, match="unexpected keyword"):
        tp.FusedLinearSimPOLoss(temperature=2.0)


def test_sequence_logps_temperature_and_average():
    hidden, weight, bias, target, _ = data("cpu", torch.float32)
    got, tok, mask = tessera.sequence_logps(hidden, weight, target, bias, temperature=2.0, average=True)
    logits = (hidden.double() @ weight.double().t() + bias.double()) / 2.0
    lp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    want = (lp * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(got.double(), want)


def test_errors_name_the_argument():
    hidden, weight, bias, target, ref = data("cpu", torch.float32)
    with pytest.raises(ValueError, match="argument 'loss_type'"):
        tessera.dpo_loss(weight, hidden, target, loss_type="kto")
    with pytest.raises(ValueError, match="argument 'label_smoothing'"):
        tessera.dpo_loss(weight, hidden, target, loss_type="exo_pair")
    with pytest.raises(ValueError, match="'hidden', 'target'"):
        tessera.orpo_loss(weight, hidden[:5], target[:5])
    with pytest.raises(ValueError, match="argument 'temperature'"):
        tessera.sequence_logps(hidden, weight, target, temperature=0.0)


def grpo64(hidden, weight, ids, mask, adv, old, ref, o, vllm=None):
    """(GRPO's loss, the fraction of tokens clipped) in float64 from the whole logits (every
    token's log-probability, masked ones too), TRL's formulas; ``vllm`` [B, T] or [B, 1]."""
    logits = (hidden.double() @ weight.double().t()) / o.get("temperature", 1.0)
    lp = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    m = mask.double()
    token_lr = lp - old.double()
    lr = token_lr
    if o.get("importance_sampling_level") == "sequence":
        lr = ((lr * m).sum(-1) / m.sum(-1)).unsqueeze(-1)
    r = lr.exp()
    a = adv.double().unsqueeze(1)
    kind = o.get("loss_type", "dapo")
    if kind == "sapo":  # a soft gate in place of the clip, its temperature by the advantage's sign
        t = torch.where(a > 0, o.get("sapo_temperature_pos", 1.0), o.get("sapo_temperature_neg", 1.05)).double()
        per = -torch.sigmoid(t * (r - 1)) * 4 / t * a
    elif kind == "vespo":  # log p weighted by phi(w) = w^k exp(lambda (1 - w)), w the sequence's ratio
        log_w = (token_lr * m).sum(-1, keepdim=True)
        if vllm is not None:
            log_w = log_w + vllm.double().log().sum(-1, keepdim=True)
        w = log_w.exp()
        k = torch.where(a >= 0, o.get("vespo_k_pos", 2.0), o.get("vespo_k_neg", 3.0)).double()
        lam = torch.where(a >= 0, o.get("vespo_lambda_pos", 3.0), o.get("vespo_lambda_neg", 2.0)).double()
        per = -(w ** k * torch.exp(lam * (1 - w))).detach() * a * lp
    else:
        high = o.get("epsilon_high", 0.28)
        if kind == "cispo":  # the weight clipped above, detached
            per = -r.clamp(max=high).detach() * a * lp
        else:
            per = -torch.min(r * a, r.clamp(1 - 0.2, 1 + high) * a)
    clipped = {"cispo": (r > o.get("epsilon_high", 0.28)) & (a > 0), "sapo": r < 0, "vespo": r < 0}.get(
        kind, ((r < 0.8) & (a < 0)) | ((r > 1.28) & (a > 0)))
    clipped = (clipped.expand_as(m) * m).sum() / m.sum()
    if vllm is not None and kind != "vespo":
        per = per * vllm.double()
    kl = (ref.double() - lp).exp() - (ref.double() - lp) - 1
    if o.get("use_bias_correction_kl"):
        kl = kl * r
    per = per + 0.04 * kl
    if kind in ("grpo", "sapo"):
        loss = ((per * m).sum(-1) / m.sum(-1)).sum() / m.shape[0]
    elif kind == "dr_grpo":
        loss = (per * m).sum() / (m.shape[0] * ids.shape[1])
    elif kind == "luspo":  # each entry times its sequence's length, the mean over all B x T (masked too)
        loss = (per * m.sum(-1, keepdim=True)).mean()
    else:
        loss = (per * m).sum() / m.sum()
    return loss, clipped


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("o", [{}, {"loss_type": "grpo"}, {"loss_type": "bnpo", "temperature": 0.7},
                               {"loss_type": "dr_grpo"}, {"importance_sampling_level": "sequence"}])
def test_grpo_matches_trls_formula(device, dtype, o, chunks):
    g = torch.Generator().manual_seed(3)
    b, t = 4, 9
    hidden = torch.randn(b, t, H, generator=g).to(device, dtype)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(device, dtype)
    ids = torch.randint(0, V, (b, t), generator=g).to(device)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, 6:] = 0
    mask = mask.to(device)
    adv = torch.randn(b, generator=g).to(device)
    old = (torch.log_softmax(torch.randn(b, t, V, generator=g), -1)[..., 0] * 0 - 3.0
           + 0.3 * torch.randn(b, t, generator=g)).to(device)
    ref = (-3.0 + 0.3 * torch.randn(b, t, generator=g)).to(device)
    old[mask == 0] = -150.0  # a padding's: its ratio, exp(150), overflows float32 where its log-probability is 0
    extra = dict(max_completion_length=t) if o.get("loss_type") == "dr_grpo" else {}
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, metrics = tessera.grpo_loss(h, w, ids, mask, adv, None, ref, old, epsilon_high=0.28, **o, **extra)
    loss.backward()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    want = grpo64(h64, w64, ids, mask, adv, old, ref, o)[0]
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)
    torch.testing.assert_close(w.grad.double(), w64.grad, **tol)
    assert len(metrics) == 2 and 0 <= metrics[1].item() <= 1
    module = tp.FusedLinearGRPOLoss(epsilon_high=0.28, **o, **extra)
    torch.testing.assert_close(module(hidden, weight, ids, mask, adv, None, ref, old)[0], loss.detach(), **tol)


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("o,vllm_shape", [
    ({"loss_type": "sapo"}, None), ({"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0}, None),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, None), ({"loss_type": "luspo"}, None),
    ({"loss_type": "vespo"}, None), ({"loss_type": "vespo", "vespo_k_neg": 1.0, "vespo_lambda_pos": 1.5}, "BT"),
    ({"loss_type": "vespo"}, "B"), ({}, "BT"), ({"loss_type": "grpo"}, "B"), ({"loss_type": "cispo", "epsilon_high": 1.1}, "BT"),
    ({"loss_type": "sapo"}, "B1"), ({"use_bias_correction_kl": True}, None),
    ({"use_bias_correction_kl": True, "importance_sampling_level": "sequence", "loss_type": "grpo"}, "BT")])
def test_grpo_variants_match_trls_formulas(device, dtype, o, vllm_shape, chunks):
    """SAPO, LUSPO, VESPO, vLLM's importance-sampling correction and the bias-corrected KL, each
    against its formula in float64 from the whole logits: the loss and its gradients. The old
    log-probabilities near the policy's, so that ratios clip sometimes and VESPO's weight is not
    vanishing; advantages of both signs (the temperatures and gamma weights differ by sign)."""
    g = torch.Generator().manual_seed(11)
    b, t = 4, 9
    hidden = torch.randn(b, t, H, generator=g).to(device, dtype)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(device, dtype)
    ids = torch.randint(0, V, (b, t), generator=g).to(device)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, 6:] = 0
    mask[2, 4:] = 0
    mask = mask.to(device)
    adv = torch.tensor([-0.7, 1.2, 0.4, -1.5]).to(device)
    with torch.no_grad():
        lp = torch.log_softmax(hidden.double() @ weight.double().t(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    old = (lp.cpu() + 0.25 * torch.randn(b, t, generator=g, dtype=torch.float64)).float().to(device)
    ref = (lp.cpu() + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)).float().to(device)
    vllm = None
    if vllm_shape is not None:
        shape = {"BT": (b, t), "B1": (b, 1), "B": (b,)}[vllm_shape]
        vllm = (0.3 + 0.7 * torch.rand(shape, generator=g)).to(device)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, metrics = tessera.grpo_loss(h, w, ids, mask, adv, None, ref, old, vllm_is_ratio=vllm,
                                      **{"epsilon_high": 0.28, **o})
    loss.backward()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    want, clipped = grpo64(h64, w64, ids, mask, adv, old, ref, o, None if vllm is None else vllm.reshape(b, -1))
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    if dtype != torch.float32 and o.get("loss_type") == "vespo":
        tol = dict(atol=1e-1, rtol=1e-1)  # the weight is exponential in a sum of bfloat16 logits' log-ratios
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)
    torch.testing.assert_close(w.grad.double(), w64.grad, **tol)
    assert len(metrics) == 2
    torch.testing.assert_close(metrics[1].double(), clipped, **tol)
    module = tp.FusedLinearGRPOLoss(**{"epsilon_high": 0.28, **o})  # vllm_is_ratio: forward's 12th argument
    got = module(hidden, weight, ids, mask, adv, None, ref, old, None, None, None, vllm)[0]
    torch.testing.assert_close(got, loss.detach(), **tol)


def test_luspo_reads_the_masked_tokens():
    """LUSPO's mean runs over every position (TRL's): a masked token's KL term counts, so its
    log-probability is computed; changing it changes the loss, where for DAPO it does not."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 5, H, generator=g), torch.randn(V, H, generator=g) / H ** 0.5
    ids = torch.randint(0, V, (2, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    ref, adv = torch.full((2, 5), -4.0), torch.tensor([0.5, -0.5])
    other = ids.clone()
    other[0, 4] = (ids[0, 4] + 1) % V  # a masked position's token
    for kind, changes in (("luspo", True), ("dapo", False)):
        a = tessera.grpo_loss(x, w, ids, mask, adv, None, ref, loss_type=kind)[0]
        b = tessera.grpo_loss(x, w, other, mask, adv, None, ref, loss_type=kind)[0]
        assert (a != b).item() == changes, kind


def test_grpo_errors_name_the_argument():
    x, w = torch.randn(2, 3, H), torch.randn(V, H)
    ids, mask = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)
    with pytest.raises(ValueError, match="argument 'loss_type'"):
        tessera.grpo_loss(x, w, ids, mask, torch.zeros(2), loss_type="ppo")
    with pytest.raises(ValueError, match="argument 'max_completion_length'"):
        tessera.grpo_loss(x, w, ids, mask, torch.zeros(2), loss_type="dr_grpo")
    with pytest.raises(ValueError, match="argument 'advantages'"):
        tessera.grpo_loss(x, w, ids, mask, torch.zeros(3))
    adv = torch.zeros(2)
    with pytest.raises(ValueError, match="argument 'importance_sampling_level'.*Sequence-level"):
        tessera.grpo_loss(x, w, ids, mask, adv, loss_type="sapo", importance_sampling_level="sequence")
    for name, value, kind in (("sapo_temperature_neg", 0.0, "sapo"), ("vespo_lambda_pos", -1.0, "vespo"),
                              ("vespo_k_neg", -0.5, "vespo"), ("delta", 0.0, "dapo"), ("temperature", 0.0, "dapo")):
        with pytest.raises(ValueError, match=f"argument '{name}'"):
            tessera.grpo_loss(x, w, ids, mask, adv, loss_type=kind, **{name: value})
    tessera.grpo_loss(x, w, ids, mask, adv, loss_type="dapo", sapo_temperature_neg=0.0)  # not read: not checked
    with pytest.raises(ValueError, match="argument 'vllm_is_ratio'"):
        tessera.grpo_loss(x, w, ids, mask, adv, vllm_is_ratio=torch.ones(2, 2))
    with pytest.raises(ValueError, match="argument 'loss_type'"):
        tp.FusedLinearGRPOLoss(loss_type="ppo")(x, w, ids, mask, adv)


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("use_ref,kl", [(False, None), (True, 0.3)])
def test_kto_matches_its_formula(device, dtype, use_ref, kl, chunks):
    hidden, weight, bias, target, ref = data(device, dtype)
    labels = torch.tensor([True, False, True, True, False, False], device=device)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, aux = tessera.kto_loss(h, w, target, bias, labels, ref if use_ref else None, kl=kl, use_ref_model=use_ref,
                                 beta=0.2)
    loss.backward()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    lp = logps64(h64, w64, bias, target, False)[0]
    r = lp - (logps64(ref, weight, None, target, False)[0] if use_ref else 0)
    m = labels.double() * 2 - 1
    want = (1 - torch.sigmoid(0.2 * (r - (kl or 0.0)) * m)).sum() / len(labels)
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)
    torch.testing.assert_close(w.grad.double(), w64.grad, **tol)
    torch.testing.assert_close(aux[0].double(), (lp * labels).sum().detach(), **tol)
    module = tp.FusedLinearKTOLoss(beta=0.2, use_ref_model=use_ref)
    got = module(hidden, weight, target, bias, labels, ref if use_ref else None, None, None, kl)[0]
    torch.testing.assert_close(got, loss.detach(), **tol)


DISTILL = {"jsd": (tessera.jsd_loss, "FusedLinearJSDLoss"),
           "cosine": (tessera.cosine_similarity_loss, "FusedLinearCosineSimilarityLoss")}


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("soft_kind,beta", [("jsd", 0.0), ("jsd", 0.5), ("jsd", 1.0), ("cosine", 0.5),
                                            ("cosine", 1.0)])
@pytest.mark.parametrize("hard_w", [0.3, 0.0])
def test_distillation_matches_the_formula(device, dtype, soft_kind, beta, hard_w, chunks):
    """jsd_loss (the generalized JSD, or either KL) and cosine_similarity_loss against float64."""
    g = torch.Generator().manual_seed(5)
    n, hs, ht = 37, H, 24
    sx = torch.randn(n, hs, generator=g).to(device, dtype)
    sw = (torch.randn(V, hs, generator=g) / hs ** 0.5).to(device, dtype)
    tx = torch.randn(n, ht, generator=g).to(device, dtype)
    tw = (torch.randn(V, ht, generator=g) / ht ** 0.5).to(device, dtype)
    labels = torch.randint(0, V, (n,), generator=g)
    labels[::5] = -100
    labels = labels.to(device)
    x, w = sx.clone().requires_grad_(), sw.clone().requires_grad_()
    function, module_name = DISTILL[soft_kind]
    loss, soft, hard = function(x, w, tx, tw, labels, beta=beta, temperature=2.0, chunk_size=8,
                                weight_hard_loss=hard_w, weight_soft_loss=0.7, return_soft_hard_loss=True)
    loss.backward()
    x64, w64 = sx.double().requires_grad_(), sw.double().requires_grad_()
    s = torch.log_softmax(x64 @ w64.t() / 2.0, -1)
    t = torch.log_softmax(tx.double() @ tw.double().t() / 2.0, -1)
    p_s, p_t = s.exp(), t.exp()
    if soft_kind == "cosine":  # of the logits themselves (log_softmax's shift would change it)
        d = beta * (1 - F.cosine_similarity(x64 @ w64.t() / 2.0, tx.double() @ tw.double().t() / 2.0, dim=-1))
    elif beta == 0:
        d = (p_t * (t - s)).sum(-1)
    elif beta == 1:
        d = (p_s * (s - t)).sum(-1)
    else:
        m = (beta * p_t + (1 - beta) * p_s).log()
        d = beta * (p_t * (t - m)).sum(-1) + (1 - beta) * (p_s * (s - m)).sum(-1)
    keep = labels != -100
    soft64 = d[keep].sum() / keep.sum()
    hard64 = F.cross_entropy(x64 @ w64.t(), labels, ignore_index=-100, reduction="sum") / keep.sum()
    want = hard_w * hard64 + 0.7 * soft64
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    torch.testing.assert_close(soft.double(), soft64.detach(), **tol)
    torch.testing.assert_close(hard.double(), hard64.detach(), **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    torch.testing.assert_close(w.grad.double(), w64.grad, **tol)
    module = getattr(tp, module_name)(beta=beta, temperature=2.0, weight_hard_loss=hard_w, weight_soft_loss=0.7)
    torch.testing.assert_close(module(sx, sw, tx, tw, labels), loss.detach(), **tol)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_second_backward_is_refused(device, dtype):
    """The gradients are computed in the forward and scaled in place by the backward: a second
    backward through one loss would scale them twice, so it is refused."""
    hidden, weight, bias, target, ref = data(device, dtype)
    w = weight.clone().requires_grad_()
    loss, _ = tessera.cpo_loss(w, hidden, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_chunks_hold_whole_units_within_the_budget():
    counts = [3, 0, 5, 2]
    assert _head_chunks.plan_chunks(counts, [[0], [1], [2], [3]], row_bytes=1, budget=5) == [[0, 1], [2], [3]]
    assert _head_chunks.plan_chunks(counts, [[0, 2], [1, 3]], row_bytes=1, budget=4) == [[0, 2], [1, 3]]
    assert _head_chunks.plan_chunks(counts, [[0, 2], [1, 3]], row_bytes=1, budget=100) == [[0, 2, 1, 3]]


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_orpo_nll_against_its_own_targets(device, dtype):
    """ORPO's nll_target (Liger's): the chosen NLL against other targets than the log-odds'."""
    hidden, weight, bias, target, _ = data(device, dtype)
    nll_target = torch.randint(0, V, target.shape, generator=torch.Generator().manual_seed(7)).to(device)
    nll_target[:, :3] = -100
    h = hidden.clone().requires_grad_()
    loss, aux = tessera.orpo_loss(weight, h, target, bias, nll_target=nll_target)
    loss.backward()
    h64 = hidden.double().requires_grad_()
    n = hidden.shape[0] // 2
    plain = reference("orpo", h64, weight.double(), bias.double(), target, None, {})
    logits = h64[:n] @ weight.double().t() + bias.double()
    nll = F.cross_entropy(logits.reshape(-1, V), nll_target[:n].reshape(-1), ignore_index=-100)
    want = plain[0] - plain[4] + nll  # the log-odds term with the NLL against nll_target
    want.backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(loss.double(), want.detach(), **tol)
    torch.testing.assert_close(h.grad.double(), h64.grad, **tol)
    torch.testing.assert_close(aux[4].double(), nll.detach(), **tol)


def test_modules_take_ligers_keyword_names():
    """Liger's modules' forward keywords (lin_weight, _input) reach tessera's functions."""
    hidden, weight, bias, target, ref = data("cpu", torch.float32)
    labels = torch.tensor([True, False, True, True, False, False])
    got = tp.FusedLinearKTOLoss(beta=0.2)(_input=hidden, lin_weight=weight, target=target, preference_labels=labels)
    want = tessera.kto_loss(hidden, weight, target, preference_labels=labels, beta=0.2)
    torch.testing.assert_close(got[0], want[0])
    got = tp.FusedLinearCPOLoss()(lin_weight=weight, _input=hidden, target=target)
    torch.testing.assert_close(got[0], tessera.cpo_loss(weight, hidden, target)[0])
