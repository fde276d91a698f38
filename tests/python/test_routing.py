"""tessera.enable(): torch's own functions routed to tessera's kernels (python/src/torch/routing.cpp).
Routed, torch's functions give torch's results (forward and backward), fall back to torch's
kernels for what tessera does not take (CPU tensors, float64, mixed dtypes) and count what ran
where; disable() and the context manager give the ops back."""

import pytest

import tessera


@pytest.fixture
def routed(torch):
    from tessera import _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    yield torch
    tessera.disable()


def _cases(torch, dtype):
    import torch.nn.functional as F
    d = dict(device="cuda", dtype=dtype)
    x = torch.randn(64, 256, **d, requires_grad=True)
    y = torch.randn(64, 256, **d)
    w, b = torch.randn(256, **d, requires_grad=True), torch.randn(256, **d, requires_grad=True)
    t = torch.randint(0, 256, (64,), device="cuda")
    t[::5] = -100
    return [
        ("add", lambda: torch.add(x, y)),
        ("gelu", lambda: F.gelu(x, approximate="tanh")),
        ("silu", lambda: F.silu(x)),
        ("softmax", lambda: torch.softmax(x, -1)),
        ("log_softmax", lambda: torch.log_softmax(x, -1)),
        ("layer_norm", lambda: F.layer_norm(x, (256,), w, b)),
        ("rms_norm", lambda: F.rms_norm(x, (256,), w)),
        ("cross_entropy", lambda: F.cross_entropy(x, t, label_smoothing=0.1)),
    ], (x, w, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_routed_functions_match_torch_forward_and_backward(routed, dtype):
    torch = routed
    cases, leaves = _cases(torch, getattr(torch, dtype))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(rtol=1e-5, atol=1e-5)
    for name, f in cases:
        want = f()
        want_grads = torch.autograd.grad(want.float().sum(), leaves, allow_unused=True)
        with tessera.use_tessera(include=[name], log=True):
            got = f()
            got_grads = torch.autograd.grad(got.float().sum(), leaves, allow_unused=True)
            counts = tessera.routing_counts()
        torch.testing.assert_close(got, want, **tol)
        for g, h in zip(got_grads, want_grads):
            if h is not None:
                torch.testing.assert_close(g, h, **tol)
        assert sum(c["tessera"] for c in counts.values()) >= 1, (name, counts)


def test_fallbacks_are_torchs_results(routed):
    torch = routed
    cpu = torch.randn(8, 16)
    x64 = torch.randn(8, 16, device="cuda", dtype=torch.float64)
    half, single = torch.randn(8, 16, device="cuda", dtype=torch.float16), torch.randn(8, 16, device="cuda")
    want = [torch.softmax(cpu, -1), torch.softmax(x64, -1), torch.add(half, single)]
    tessera.enable(log=True)
    got = [torch.softmax(cpu, -1), torch.softmax(x64, -1), torch.add(half, single)]  # no error
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
    counts = tessera.routing_counts()
    assert counts["_softmax"]["torch"] == 1 and counts["_softmax"]["tessera"] == 0  # CPU: no CUDA key
    assert counts["add.Tensor"]["torch"] == 1


def test_disable_gives_the_ops_back(routed):
    torch = routed
    with tessera.use_tessera(log=True):
        pass
    x = torch.randn(8, 16, device="cuda")
    tessera.enable(include=["softmax"], log=True)
    tessera.disable()
    torch.softmax(x, -1)
    assert all(c["tessera"] == 0 for c in tessera.routing_counts().values())


def test_each_routable_op_has_its_family(torch_cpu):
    """enable(include=...) takes families; every routable aten op maps to one, its backward too."""
    from tessera import _routing, _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    families = {n: _routing._family(n) for n in tessera.routable()}
    assert set(families.values()) == {"add", "gelu", "silu", "softmax", "log_softmax", "layer_norm",
                                      "rms_norm", "isin", "matmul", "attention", "cross_entropy"}, families
    assert families["_log_softmax_backward_data"] == "log_softmax"
    assert families["cross_entropy_loss"] == "cross_entropy"


def test_include_names_are_checked(routed):
    with pytest.raises(ValueError, match=r"argument 'include'"):
        tessera.enable(include=["matmul_nope"])


def test_strided_inputs_match_torch(routed):
    torch = routed
    x = torch.randn(48, 80, device="cuda").t()  # not contiguous
    w = torch.randn(48, device="cuda")
    want = [torch.softmax(x, -1), torch.nn.functional.layer_norm(x, (48,), w), torch.add(x, x[:1])]
    with tessera.use_tessera(log=True):
        got = [torch.softmax(x, -1), torch.nn.functional.layer_norm(x, (48,), w),
               torch.add(x, x[:1])]
        counts = tessera.routing_counts()
    for g, h in zip(got, want):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-5)
    assert counts["_softmax"]["tessera"] == 1


def test_compile_and_cuda_graphs_with_routing(routed):
    torch = routed
    F = torch.nn.functional
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)

    def f(x, w):
        return F.silu(F.rms_norm(x, (256,), w)).softmax(-1).sum()

    want = torch.autograd.grad(f(x, w), (x, w))
    with tessera.use_tessera():
        compiled = torch.compile(f, fullgraph=True)
        got = torch.autograd.grad(compiled(x, w), (x, w))
        for g, h in zip(got, want):
            torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5)
        # A CUDA graph of routed ops: captured, replayed, torch's result.
        y = torch.randn(64, 256, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.softmax(y, -1)  # warm-up on a side stream, as torch asks before capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = torch.softmax(y, -1)
        y.copy_(torch.randn(64, 256, device="cuda"))
        graph.replay()
        torch.testing.assert_close(out, torch.softmax(y.double(), -1).float(), rtol=1e-5, atol=1e-6)


def test_gemms_are_routed_on_request(routed):
    torch = routed
    F = torch.nn.functional
    d = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 128, **d, requires_grad=True)
    w = torch.randn(96, 128, **d, requires_grad=True)
    b = torch.randn(96, **d, requires_grad=True)
    a3, b3 = torch.randn(4, 32, 64, **d), torch.randn(4, 64, 16, **d)

    def run():
        y = F.linear(x, w, b)  # addmm, its backward mm
        grads = torch.autograd.grad(y.float().sum(), (x, w, b))
        return [y, torch.mm(x, w.t()), torch.bmm(a3, b3), *grads]

    want = run()
    with tessera.use_tessera(log=True):  # the default leaves the GEMMs to torch
        run()
        assert tessera.routing_counts()["mm"]["tessera"] == 0
    with tessera.use_tessera(include=["matmul"], log=True):
        got = run()
        counts = tessera.routing_counts()
    for g, h in zip(got, want):
        torch.testing.assert_close(g, h, rtol=2e-2, atol=5e-2)
    for op in ("mm", "addmm", "bmm"):
        assert counts[op]["tessera"] >= 1, (op, counts[op])


def test_sdpa_routes_to_tesseras_attention(routed):
    """F.scaled_dot_product_attention's cuDNN ops (torch's pick on Hopper) routed when named: the
    forward and backward are tessera's (its own function's results; the backward within
    FlashAttention's rounding of cuDNN's), a masked call stays torch's, and enable() alone does
    not route them."""
    torch = routed
    import torch.nn.functional as F
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if torch._fused_sdp_choice(q, k, v, is_causal=True) != 3:  # SDPBackend.CUDNN_ATTENTION
        pytest.skip("torch does not pick its cuDNN backend for this call here")
    g = torch.randn_like(q)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g)
    ours = tessera.scaled_dot_product_attention(q, k, v, is_causal=True)
    ours_grads = torch.autograd.grad(ours, (q, k, v), g)
    tessera.enable(log=True)
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert tessera.routing_counts()["_scaled_dot_product_cudnn_attention"] == {"tessera": 0, "torch": 0}
    with tessera.use_tessera(include=["attention"], log=True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        got = torch.autograd.grad(out, (q, k, v), g)
        mask = torch.ones(300, 300, device="cuda", dtype=torch.bool).tril()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        counts = tessera.routing_counts()
    assert torch.equal(out, ours)
    for name, a, b, c in zip("qkv", got, ours_grads, want):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=f"d{name} against tessera's own")
        torch.testing.assert_close(a, c, rtol=5e-2, atol=5e-2, msg=f"d{name} against cuDNN")
    assert counts["_scaled_dot_product_cudnn_attention"]["tessera"] == 1
    assert counts["_scaled_dot_product_cudnn_attention_backward"]["tessera"] == 1


def test_cross_entropy_routes_where_tessera_takes_it(routed):
    """F.cross_entropy (routed at the AutogradCUDA key) runs tessera's fused loss for class-index
    targets, every reduction, with torch's loss dtype; class weights and probability targets stay
    torch's."""
    torch = routed
    import torch.nn.functional as F
    x = torch.randn(32, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 1000, (32,), device="cuda")
    for kw in (dict(), dict(reduction="sum", ignore_index=3), dict(reduction="none", label_smoothing=0.2)):
        want = F.cross_entropy(x.float(), t, **kw)
        (want_g,) = torch.autograd.grad(want.sum(), x)
        with tessera.use_tessera(include=["cross_entropy"], log=True):
            got = F.cross_entropy(x, t, **kw)
            (got_g,) = torch.autograd.grad(got.float().sum(), x)
            counts = tessera.routing_counts()["cross_entropy_loss"]
        assert got.dtype == torch.bfloat16 and counts == {"tessera": 1, "torch": 0}, (kw, counts)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got_g.float(), want_g.float(), rtol=2e-2, atol=1e-6)
    with tessera.use_tessera(log=True):
        F.cross_entropy(x, t, weight=torch.rand(1000, device="cuda", dtype=torch.bfloat16))
        F.cross_entropy(x, torch.softmax(torch.randn(32, 1000, device="cuda", dtype=torch.bfloat16), -1))
        assert tessera.routing_counts()["cross_entropy_loss"] == {"tessera": 0, "torch": 2}
