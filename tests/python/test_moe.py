"""tessera.moe_sort, moe_permute and moe_unpermute against torch's indexing in float64, forward and
backward (the routing weights' gradients too), the dropped pairs, determinism and the errors;
CPU tensors take torch's arithmetic, so the contract is checked without a GPU as well."""

import pytest

torch = pytest.importorskip("torch")
import tessera  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=gpu)]
TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-2, 1e-2), torch.bfloat16: (8e-2, 2e-2)}


def routing(t, k, e, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.zeros(0, k).long()
    return idx.to(device)


def reference(permute, x, rows, w):
    """float64 of the op: permute [T, H] -> [T k, H], unpermute [T k, H] -> [T, H]."""
    t, k = rows.shape
    w = torch.ones(t, k, dtype=torch.float64, device=x.device) if w is None else w.double()
    flat = rows.reshape(-1).long()
    if permute:
        out = torch.zeros(t * k, x.shape[-1], dtype=torch.float64, device=x.device)
        return out.index_copy(0, flat, (x.double()[:, None, :] * w[..., None]).reshape(t * k, -1))
    return (x.double()[flat].view(t, k, -1) * w[..., None]).sum(1)


@pytest.mark.parametrize("device", DEVICES)
def test_sort_is_stable_and_ends_are_cumulative(device):
    idx = routing(50, 4, 16, device)
    rows, offs = tessera.moe_sort(idx, 16)
    assert rows.dtype == torch.int32 and offs.dtype == torch.int32 and offs.shape == (16,)
    flat = rows.reshape(-1).long().cpu()
    assert torch.equal(flat.sort().values, torch.arange(200))  # a permutation
    expert_of_row = torch.empty(200, dtype=torch.long)
    expert_of_row[flat] = idx.reshape(-1).cpu()
    assert torch.equal(expert_of_row, expert_of_row.sort().values)  # in expert order
    pair_of_row = torch.empty(200, dtype=torch.long)
    pair_of_row[flat] = torch.arange(200)
    for e in range(16):  # each expert's pairs keep their order
        mine = pair_of_row[expert_of_row == e]
        assert torch.equal(mine, mine.sort().values)
    assert torch.equal(offs.cpu().long(), torch.bincount(idx.reshape(-1).cpu(), minlength=16).cumsum(0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,k,h,wdtype", [(1, 1, 8, None), (37, 8, 2048, "same"), (20, 2, 1001, torch.float32),
                                          (9, 4, 2880, torch.float32), (12, 16, 256, "same")])
def test_permute_and_unpermute_match_torch_with_gradients(device, dtype, t, k, h, wdtype):
    if device == "cpu" and dtype == torch.float16 and h > 1024:
        pytest.skip("slow on the CPU")
    atol, rtol = TOL[dtype]
    torch.manual_seed(0)
    rows, _ = tessera.moe_sort(routing(t, k, 64, device), 64)
    wd = dtype if wdtype == "same" else wdtype
    for permute in (True, False):
        x = torch.randn(t if permute else t * k, h, device=device, dtype=dtype, requires_grad=True)
        w = None if wd is None else torch.rand(t, k, device=device, dtype=wd, requires_grad=True)
        out = (tessera.moe_permute if permute else tessera.moe_unpermute)(x, rows, w)
        xr = x.detach().double().requires_grad_()
        wr = None if w is None else w.detach().double().requires_grad_()
        want = reference(permute, xr, rows, wr)
        assert out.dtype == dtype and out.shape == want.shape
        torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g.double())
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol, rtol=rtol)
        if w is not None:  # dots of h terms
            assert w.grad.dtype == wd
            scale = h ** 0.5
            torch.testing.assert_close(w.grad.double(), wr.grad, atol=atol * scale, rtol=rtol * scale)


@gpu
def test_dropped_pairs_and_strided_rows():
    t, k, h = 6, 4, 128
    rows, _ = tessera.moe_sort(routing(t, k, 8, "cuda"), 8)
    rows = rows.clone()
    rows[0, 1], rows[3, 2] = -1, t * k + 5
    wide = torch.randn(t * k, h + 8, device="cuda")
    pairs = wide[:, :h]  # a row stride past H
    w = torch.rand(t, k, device="cuda")
    keep = (rows >= 0) & (rows < t * k)
    want = (pairs[rows.clamp(0, t * k - 1).long()] * (w * keep)[..., None]).sum(1)
    torch.testing.assert_close(tessera.moe_unpermute(pairs, rows, w), want)
    x = torch.randn(t, h, device="cuda")
    out = torch.zeros(t * k, h, device="cuda")
    got = tessera.moe_permute(x, rows, w)
    out[rows[keep].long()] = (x[:, None, :] * w[..., None])[keep]
    written = torch.zeros(t * k, dtype=torch.bool, device="cuda")
    written[rows[keep].long()] = True
    torch.testing.assert_close(got[written], out[written])


@gpu
def test_unpermute_is_deterministic():
    rows, _ = tessera.moe_sort(routing(512, 8, 128, "cuda"), 128)
    y = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(512, 8, device="cuda")
    first = tessera.moe_unpermute(y, rows, w)
    for _ in range(3):
        assert torch.equal(tessera.moe_unpermute(y, rows, w), first)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_argument(device):
    x = torch.randn(4, 8, device=device)
    rows, _ = tessera.moe_sort(routing(4, 2, 4, device), 4)
    with pytest.raises(TypeError, match="argument 'rows'"):
        tessera.moe_permute(x, rows.long())
    with pytest.raises(ValueError, match="argument 'top_k_index'.*k <= num_experts"):
        tessera.moe_sort(routing(4, 2, 4, device), 1)
    with pytest.raises(TypeError, match="argument 'top_k_index'"):
        tessera.moe_sort(torch.zeros(4, 2, device=device), 4)
    with pytest.raises(ValueError, match="argument 'num_experts'"):
        tessera.moe_sort(routing(4, 2, 4, device), 0)
    if device == "cuda":
        with pytest.raises(ValueError, match="argument 'input'"):
            tessera.moe_unpermute(x, rows)  # 4 rows, not T k = 8
        with pytest.raises(ValueError, match="argument 'weight'"):
            tessera.moe_permute(x, rows, torch.rand(4, 3, device=device))
        with pytest.raises(ValueError, match="argument 'rows'"):
            tessera.moe_permute(x, rows.t())


def hf_router(name, experts, k, hidden, **config):
    """transformers' router of a family (module, its config) on the CPU, float32, random weights."""
    transformers = pytest.importorskip("transformers", minversion="5.0")
    module = {"qwen3_moe": "Qwen3Moe", "mixtral": "Mixtral", "deepseek_v3": "DeepseekV3"}[name]
    import importlib
    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cls = getattr(modeling, f"{module}TopKRouter", None) or getattr(modeling, f"{module}TopkRouter")
    cfg = getattr(transformers, f"{module}Config")(hidden_size=hidden, num_experts_per_tok=k, **config)
    router = cls(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        router.weight.normal_()
        if hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.uniform_(-0.1, 0.1)
    return router


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_moe_unnormalized", "mixtral", "deepseek_v3"])
def test_route_matches_the_families_routers(family):
    x = torch.randn(64, 32)
    if family == "deepseek_v3":
        router = hf_router("deepseek_v3", 0, 8, 32, n_routed_experts=64, num_local_experts=64, n_group=8,
                           topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5)
        _, want_w, want_i = router(x)
        w, i = tessera.moe_route(router(x)[0], 8, scoring="sigmoid", bias=router.e_score_correction_bias,
                                 n_group=8, topk_group=4, routed_scaling_factor=2.5)
    else:
        norm = family != "qwen3_moe_unnormalized"
        name = "mixtral" if family == "mixtral" else "qwen3_moe"
        extra = {"num_local_experts": 16} if name == "mixtral" else {"num_experts": 16, "norm_topk_prob": norm}
        router = hf_router(name, 16, 4, 32, **extra)
        logits, want_w, want_i = router(x)
        w, i = tessera.moe_route(logits, 4, norm_topk_prob=norm)
    order, want_order = i.sort(-1), want_i.sort(-1)
    assert torch.equal(order.values, want_order.values)
    torch.testing.assert_close(w.gather(1, order.indices), want_w.float().gather(1, want_order.indices))


def test_route_softmax_after_topk_is_gpt_oss():
    logits = torch.randn(40, 32)
    top, index = torch.topk(logits, 4, dim=-1)
    w, i = tessera.moe_route(logits, 4, softmax_after_topk=True)
    assert torch.equal(i, index)
    torch.testing.assert_close(w, torch.softmax(top, dim=-1))


def test_losses_match_transformers():
    transformers = pytest.importorskip("transformers", minversion="5.0")
    import importlib
    func = importlib.import_module("transformers.models.qwen3_moe.modeling_qwen3_moe").load_balancing_loss_func
    layers = tuple(torch.randn(2 * 24, 16) for _ in range(3))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 17:] = 0
    for m in (None, mask):
        torch.testing.assert_close(tessera.moe_load_balancing_loss(layers, 16, 4, m), func(layers, 16, 4, m))
    z = torch.cat([torch.logsumexp(x, -1) for x in layers])
    torch.testing.assert_close(tessera.moe_z_loss(layers), (z ** 2).mean())


def test_route_errors_name_the_argument():
    logits = torch.randn(8, 16)
    with pytest.raises(ValueError, match="argument 'k'"):
        tessera.moe_route(logits, 17)
    with pytest.raises(ValueError, match="'n_group'"):
        tessera.moe_route(logits, 2, scoring="sigmoid", n_group=3)
    with pytest.raises(ValueError, match="argument 'scoring'"):
        tessera.moe_route(logits, 2, scoring="relu")
    with pytest.raises(TypeError, match="argument 'router_logits'"):
        tessera.moe_route(logits.long(), 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss", "silu"])
def test_experts_match_a_per_expert_loop(device, activation):
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    t, h, i, e, k = 48, 64, 32, 8, 2
    torch.manual_seed(0)
    x = torch.randn(t, h, device=device, dtype=dt, requires_grad=True)
    gated = activation != "silu"
    w1 = (torch.randn(e, (2 if gated else 1) * i, h, device=device, dtype=dt) / 8).requires_grad_()
    w2 = (torch.randn(e, h, i, device=device, dtype=dt) / 8).requires_grad_()
    b1 = torch.randn(e, w1.shape[1], device=device, dtype=dt) if activation == "gpt_oss" else None
    b2 = torch.randn(e, h, device=device, dtype=dt) if activation == "gpt_oss" else None
    logits = torch.randn(t, e, device=device, requires_grad=True)
    out = tessera.moe_experts(x, w1, w2, router_logits=logits, k=k, activation=activation,
                              gate_up_bias=b1, down_bias=b2)
    weights, index = tessera.moe_route(logits, k)
    want = torch.zeros(t, h, device=device, dtype=torch.float64)
    for tok in range(t):
        for j in range(k):
            ex = index[tok, j]
            u = x[tok].double() @ w1[ex].double().t() + (0 if b1 is None else b1[ex].double())
            if activation == "swiglu":
                u = torch.nn.functional.silu(u[:i]) * u[i:]
            elif activation == "gpt_oss":
                g, up = u[::2].clamp(max=7.0), u[1::2].clamp(-7.0, 7.0)
                u = (up + 1) * g * torch.sigmoid(1.702 * g)
            else:
                u = torch.nn.functional.silu(u)
            y = u @ w2[ex].double().t() + (0 if b2 is None else b2[ex].double())
            want[tok] = want[tok] + weights[tok, j].double() * y
    tol = dict(atol=2e-4, rtol=2e-4) if dt == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(out.double(), want, **tol)
    out.float().square().sum().backward()
    for p in (x, w1, w2, logits):  # every input gets a gradient (the indices none)
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_validate_names_bad_indices_and_offsets(device):
    idx = routing(6, 2, 8, device)
    idx[2, 1] = 8
    rows, offs = tessera.moe_sort(idx, 8)  # dropped without validate
    assert rows[2, 1] == -1 and int(offs[-1]) == 11
    with pytest.raises(ValueError, match=r"argument 'top_k_index': expected expert indices in \[0, 8\)"):
        tessera.moe_sort(idx, 8, validate=True)
    dt = torch.float32
    a, b = torch.randn(12, 16, device=device, dtype=dt), torch.randn(3, 16, 8, device=device, dtype=dt)
    for ends in ([4, 2, 12], [4, 8, 11], [4, 8, 13]):
        with pytest.raises(ValueError, match="argument 'offs'"):
            tessera.grouped_mm(a, b, torch.tensor(ends, dtype=torch.int32, device=device), validate=True)
    good = torch.tensor([4, 4, 12], dtype=torch.int32, device=device)
    torch.testing.assert_close(tessera.grouped_mm(a, b, good, validate=True), tessera.grouped_mm(a, b, good))
    w1, w2 = torch.randn(8, 16, 16, device=device), torch.randn(8, 16, 8, device=device)
    with pytest.raises(ValueError, match="argument 'top_k_index'"):
        tessera.moe_experts(torch.randn(6, 16, device=device), w1, w2, idx, torch.rand(6, 2, device=device),
                            validate=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_fused_experts_node_equals_the_composed_ops(device, kind):
    """The one-node experts (h held, the rest recomputed) against the same ops under autograd:
    outputs and every gradient, with a dropped pair and an expert that gets nothing."""
    from tessera.moe import routed_experts
    from tessera import elementwise
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    t, h, i, e, k = 40, 64, 32, 8, 2
    torch.manual_seed(0)
    idx = routing(t, k, e - 1, device)  # expert e - 1 gets no token
    idx[3, 1] = e + 2  # dropped
    x = torch.randn(t, h, device=device, dtype=dt)
    w1 = torch.randn(e, 2 * i, h, device=device, dtype=dt) / 8
    w2 = torch.randn(e, h, i, device=device, dtype=dt) / 8
    w = torch.rand(t, k, device=device, dtype=dt)
    composed = lambda z: elementwise.gated(kind, *z.chunk(2, dim=-1))  # noqa: E731
    grads = []
    # bf16 rounds the intermediates in another order than the composed ops: against them in float32,
    # to a bound on the error relative to each tensor's largest element
    for act, at in ((kind, dt), (composed, torch.float32)):
        leaves = [p.to(at, copy=True).requires_grad_() for p in (x, w1, w2, w)]
        out = routed_experts(leaves[0], leaves[1].transpose(-2, -1), leaves[2].transpose(-2, -1), idx, leaves[3],
                             e, act)
        out.backward(torch.ones_like(out))
        grads.append([out.detach()] + [p.grad for p in leaves])
    rel = 1e-5 if dt == torch.float32 else 2e-2
    for name, a, b in zip(("out", "dx", "dw1", "dw2", "dweights"), *grads):
        assert a.dtype == dt, name
        torch.testing.assert_close(a.float(), b.float(), atol=rel * b.abs().max().item(), rtol=rel,
                                   msg=lambda m, name=name: f"{name}: {m}")
        assert a.is_contiguous() or a.transpose(-2, -1).is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
def test_fused_experts_refuse_a_second_backward(device):
    """The one-node experts write their gradients over the saved gate-up product: a second
    backward through the same call is refused, not computed from spent values."""
    from tessera.moe import routed_experts
    t, h, i, e, k = 6, 16, 8, 4, 2
    x = torch.randn(t, h, device=device, requires_grad=True)
    w1, w2 = torch.randn(e, 2 * i, h, device=device), torch.randn(e, h, i, device=device)
    out = routed_experts(x, w1.transpose(-2, -1), w2.transpose(-2, -1), routing(t, k, e, device),
                         torch.rand(t, k, device=device), e, "silu")
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        out.sum().backward()
