"""tessera.mlp from Python: linear(linear(x, w_in, activation=...), w_out) whose autograd saves the
pre-activation product and recomputes the hidden activation in the backward.

CPU-side tests (any machine with torch and tessera's torch ops): what is refused before anything
reaches the GPU; the op's shapes under FakeTensorMode; what autograd saves, on fake CUDA tensors
(the forward only: no device runs) against the two-linear composition, which saves the hidden
activation; the backward's ops and gradient shapes on fake CPU tensors. GPU tests (the `torch`
fixture): forward and the three gradients against the composition in float64, every activation and
dtype, batched inputs; the no-grad path; what is saved, on real tensors; torch.compile; errors.
"""

import pytest
from fake_dist import dispatch_log

import tessera

ACTIVATIONS = ["swiglu", "geglu", "gelu", "gelu_tanh", "silu", "relu", None]
TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}


def hidden_of(n, activation):
    return n // 2 if activation in ("swiglu", "geglu") else n


def composition(x, w_in, w_out, activation):
    """What tessera.mlp computes, as two tessera.linear calls."""
    return tessera.linear(tessera.linear(x, w_in, activation=activation), w_out)


def saved_shapes(torch, fn):
    """The shapes of the tensors autograd saves while `fn` runs its forward."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


# ---- CPU side ---------------------------------------------------------------------------------

def test_mlp_refuses_a_bad_activation_and_non_tensors_first(torch_cpu, np):
    torch = torch_cpu
    x = torch.ones(4, 8)
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'activation': expected None, 'relu', "
                                         r"'gelu', 'gelu_tanh', 'silu', 'swiglu' or 'geglu', got 'tanh'"):
        tessera.mlp(x, x, x, activation="tanh")
    with pytest.raises(TypeError, match=r"tessera\.mlp: argument 'w_in': expected a torch tensor.*got ndarray"):
        tessera.mlp(x, np.ones((8, 8), np.float32), x)


def test_mlp_takes_cuda_tensors_only(torch_cpu):
    # No torch function has mlp's contract: CPU tensors get the library's message, as linear's
    # activation does.
    torch = torch_cpu
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with pytest.raises(ValueError, match=r"^tessera\.mlp: argument 'input': expected a CUDA tensor, got a "
                                         r"tensor on cpu$"):
        tessera.mlp(x, w, w, activation="gelu")
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'input': expected at least 1 dimension"):
        torch.ops.tessera.mlp(torch.tensor(1.0), w, w)


def _fake_cuda(torch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    try:
        with mode:
            torch.empty(1, device="cuda")
    except Exception as e:  # a CPU-only build of torch
        pytest.skip(f"this torch makes no fake CUDA tensors: {e}")
    return mode


@pytest.mark.parametrize("activation", ["swiglu", "gelu", None])
def test_mlp_shapes_under_fake_tensors(torch_cpu, activation):
    torch = torch_cpu
    mode = _fake_cuda(torch)
    with mode:
        x = torch.randn(2, 5, 64, device="cuda", dtype=torch.bfloat16)
        w_in = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
        w_out = torch.randn(48, hidden_of(256, activation), device="cuda", dtype=torch.bfloat16)
        y = tessera.mlp(x, w_in, w_out, activation=activation)
        y1 = tessera.mlp(x[0, 0], w_in, w_out, activation=activation)  # 1-d input: one row
        out, z = torch.ops.tessera.mlp.preactivation(x, w_in, w_out, activation=activation or "none")
    assert y.shape == (2, 5, 48) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
    assert y1.shape == (48,)
    assert out.shape == (2, 5, 48) and z.shape == (2, 5, 256)


@pytest.mark.parametrize("activation", ["swiglu", "gelu", "relu"])
def test_mlp_does_not_save_the_hidden_activation_fake(torch_cpu, activation):
    """What autograd saves, on fake CUDA tensors (the forward only): x, the weights and the
    pre-activation product z [tokens, N]; not h [tokens, N'], which the two-linear composition
    saves (for the second linear's weight gradient) beside z, so the check can tell them apart
    (for the activations other than swiglu, h and z have one shape: counted)."""
    torch = torch_cpu
    mode = _fake_cuda(torch)
    b, s, k, n, d = 2, 64, 64, 256, 96
    f = hidden_of(n, activation)
    with mode:
        x = torch.randn(b, s, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w_in = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w_out = torch.randn(d, f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        mine = saved_shapes(torch, lambda: tessera.mlp(x, w_in, w_out, activation=activation))
        theirs = saved_shapes(torch, lambda: composition(x, w_in, w_out, activation))
    h = (b, s, f)
    assert theirs.count(h) == mine.count(h) + 1, (mine, theirs)  # the composition keeps h too
    assert (b * s, f) not in mine, mine
    assert sorted(mine) == sorted([(b, s, k), (n, k), (d, f), (b, s, n)]), mine


def test_mlp_backward_ops_and_gradient_shapes_fake(torch_cpu):
    """The backward on fake CPU tensors (autograd's engine needs a real device type): the
    gradients have their tensors' shapes, and for swiglu it runs four products and one pass of
    swiglu_backward.recompute (dz and the recomputed h together), nothing else of tessera's."""
    torch = torch_cpu
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.randn(2, 8, 64, requires_grad=True)
        w_in = torch.randn(256, 64, requires_grad=True)
        w_out = torch.randn(48, 128, requires_grad=True)
        y = tessera.mlp(x, w_in, w_out)
        with dispatch_log() as log:
            y.sum().backward()
    assert x.grad.shape == x.shape and w_in.grad.shape == w_in.shape and w_out.grad.shape == w_out.shape
    ours = [s for s in log.seen if s.startswith("tessera.")]
    assert sorted(ours) == ["tessera.matmul.default"] * 4 + ["tessera.swiglu_backward.recompute"], ours


# ---- GPU ---------------------------------------------------------------------------------------

def rel_err(torch, got, ref):
    ref = ref.double()
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def weights(torch, dt, k, n, d, activation, grad=True):
    w_in = (torch.randn(n, k, device="cuda", dtype=torch.float32) / k ** 0.5).to(dt)
    w_out = (torch.randn(d, hidden_of(n, activation), device="cuda", dtype=torch.float32) / n ** 0.5).to(dt)
    return w_in.requires_grad_(grad), w_out.requires_grad_(grad)


def reference(torch, x, w_in, w_out, activation):
    """The composition in float64 with torch's functions: y and the gradient function."""
    F = torch.nn.functional
    z = F.linear(x, w_in)
    if activation in ("swiglu", "geglu"):
        act = F.silu if activation == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))
        f = z.shape[-1] // 2
        whole = f - f % 64  # blocks of 64 features, the last F % 64 wide
        g = z[..., :2 * whole].unflatten(-1, (-1, 2, 64))
        h = (act(g[..., 0, :]) * g[..., 1, :]).flatten(-2)
        if whole < f:
            tail = z[..., 2 * whole:]
            h = torch.cat((h, act(tail[..., :f - whole]) * tail[..., f - whole:]), -1)
    else:
        h = {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
             "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](z)
    return F.linear(h, w_out)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_mlp_matches_the_composition(torch, activation, dtype):
    """Forward and the gradients of x, w_in and w_out against torch's composition in float64, for
    a batched x [B, S, K]; the two-linear tessera composition gives the same within the bound."""
    dt = getattr(torch, dtype)
    x = torch.randn(3, 100, 192, device="cuda", dtype=dt, requires_grad=True)
    w_in, w_out = weights(torch, dt, 192, 384, 136, activation)
    y = tessera.mlp(x, w_in, w_out, activation=activation)
    assert y.shape == (3, 100, 136) and y.dtype == dt
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w_in, w_out)]
    ref = reference(torch, *leaves, activation)
    ref.backward(dy.double())
    tol = TOL[dtype] * (1 if dtype == "float32" else 2)
    assert rel_err(torch, y, ref) < tol
    for t, r in zip((x, w_in, w_out), leaves):
        assert t.grad.shape == t.shape and t.grad.dtype == dt
        assert rel_err(torch, t.grad, r.grad) < tol, t.shape
    got = [t.grad.clone() for t in (x, w_in, w_out)]
    for t in (x, w_in, w_out):
        t.grad = None
    composition(x, w_in, w_out, activation).backward(dy)
    assert rel_err(torch, y, composition(x, w_in, w_out, activation).detach()) < tol
    for g, t in zip(got, (x, w_in, w_out)):
        assert rel_err(torch, g, t.grad) < tol


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("h,f", [(96, 100), (96, 40), (96, 1000), (123, 431)])
def test_mlp_any_intermediate_size(torch, dtype, activation, h, f):
    """Intermediate sizes that are not multiples of 64: the last gate/up block F % 64 wide (none
    whole for F = 40), forward and backward, and swiglu_weight's layout for them; and Liger's odd
    case, hidden 123 and intermediate 431, whose rows are not 16-byte aligned."""
    dt = getattr(torch, dtype)
    x = torch.randn(3, 70, h, device="cuda", dtype=dt, requires_grad=True)
    w_in, w_out = weights(torch, dt, h, 2 * f, h if h % 2 else 80, activation)
    y = tessera.mlp(x, w_in, w_out, activation=activation)
    assert y.shape == (3, 70, w_out.shape[0])
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w_in, w_out)]
    ref = reference(torch, *leaves, activation)
    ref.backward(dy.double())
    tol = 1e-5 if dtype == "float32" else 2e-2
    assert rel_err(torch, y, ref) < tol
    for t, r in zip((x, w_in, w_out), leaves):
        assert rel_err(torch, t.grad, r.grad) < tol, t.shape
    w1, w3 = w_in.detach()[:f], w_in.detach()[f:]  # two projections, interleaved by swiglu_weight
    F = torch.nn.functional
    act = F.silu if activation == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))
    want = act(F.linear(x.detach().double(), w1.double())) * F.linear(x.detach().double(), w3.double())
    got = tessera.linear(x.detach(), tessera.swiglu_weight(w1, w3), activation=activation)
    assert rel_err(torch, got, want) < tol


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mlp_at_sizes_of_the_fused_epilogue(torch, dtype, activation):
    """Llama-like sizes where on Hopper the gated activation runs in the first GEMM's epilogue
    (with the pre-activation stored beside it under autograd), a last tile half beyond N, 2-d x."""
    dt = getattr(torch, dtype)
    x = torch.randn(1000, 512, device="cuda", dtype=dt, requires_grad=True)
    w_in, w_out = weights(torch, dt, 512, 2944, 512, activation)
    y = tessera.mlp(x, w_in, w_out, activation=activation)
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w_in, w_out)]
    ref = reference(torch, *leaves, activation)
    ref.backward(dy.double())
    assert rel_err(torch, y, ref) < 2e-2
    for t, r in zip((x, w_in, w_out), leaves):
        assert rel_err(torch, t.grad, r.grad) < 2e-2, t.shape


def test_mlp_without_autograd_is_two_gemms(torch):
    """Under no_grad (or with nothing requiring grad) the fast path takes plain CUDA tensors, with
    the composition's result; the profiler sees the op."""
    from tessera import _state
    x = torch.randn(2, 50, 256, device="cuda", dtype=torch.bfloat16)
    w_in, w_out = weights(torch, torch.bfloat16, 256, 512, 128, "swiglu", grad=False)
    want = composition(x, w_in, w_out, "swiglu")
    if _state.fast is not None:
        assert _state.fast.mlp(x, w_in, w_out, "swiglu") is not None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = tessera.mlp(x, w_in, w_out)
    assert "tessera::mlp" in {e.key for e in prof.key_averages()}
    assert rel_err(torch, got, want) < 1e-2
    with torch.no_grad():
        assert rel_err(torch, tessera.mlp(x, w_in.requires_grad_(), w_out), want) < 1e-2


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_mlp_does_not_save_the_hidden_activation(torch, activation):
    """On the GPU: the bytes autograd saves are the composition's less h's, one tensor of h's
    shape fewer (for gelu z has that shape too); the memory held between forward and backward is
    smaller by h."""
    b, s, k, n, d = 2, 256, 256, 1024, 256
    f = hidden_of(n, activation)
    x = torch.randn(b, s, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_in, w_out = weights(torch, torch.bfloat16, k, n, d, activation)
    saved = {}

    def record(name):
        def pack(t):
            saved.setdefault(name, []).append((tuple(t.shape), t.numel() * t.element_size()))
            return t
        return pack
    held = {}
    for name, fn in (("mlp", lambda: tessera.mlp(x, w_in, w_out, activation=activation)),
                     ("composition", lambda: composition(x, w_in, w_out, activation))):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autograd.graph.saved_tensors_hooks(record(name), lambda t: t):
            y = fn()
        held[name] = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        y.sum().backward()
        del y
    shapes = {name: [sh for sh, _ in v] for name, v in saved.items()}
    assert shapes["composition"].count((b, s, f)) == shapes["mlp"].count((b, s, f)) + 1, shapes
    assert sorted(shapes["mlp"]) == sorted([(b, s, k), (n, k), (d, f), (b, s, n)]), shapes
    h_bytes = b * s * f * 2
    total = {name: sum(nb for _, nb in v) for name, v in saved.items()}
    assert total["mlp"] == total["composition"] - h_bytes, total
    assert held["composition"] - held["mlp"] >= h_bytes, held


def test_mlp_compiles_fullgraph(torch):
    x = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_in, w_out = weights(torch, torch.bfloat16, 128, 256, 96, "swiglu")
    torch._dynamo.reset()
    f = torch.compile(lambda x, a, b: tessera.mlp(x, a, b).float().sum(), fullgraph=True)
    f(x, w_in, w_out).backward()
    got = [t.grad.clone() for t in (x, w_in, w_out)]
    for t in (x, w_in, w_out):
        t.grad = None
    tessera.mlp(x, w_in, w_out).float().sum().backward()
    for g, t in zip(got, (x, w_in, w_out)):
        assert rel_err(torch, g, t.grad) < 1e-2, t.shape


def test_mlp_opcheck(torch):
    x = torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_in, w_out = weights(torch, torch.bfloat16, 64, 256, 48, "swiglu")
    torch.library.opcheck(torch.ops.tessera.mlp.default, (x, w_in, w_out))
    torch.library.opcheck(torch.ops.tessera.mlp.default, (x, w_in, w_out[:, :64].contiguous().repeat(1, 4)),
                          {"activation": "gelu"})


def test_mlp_errors_name_the_argument(torch):
    bf = torch.bfloat16
    x = torch.randn(8, 64, device="cuda", dtype=bf)
    w_in, w_out = weights(torch, bf, 64, 256, 32, "swiglu", grad=False)
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'w_in': expected \[N, K\] with K = 64"):
        tessera.mlp(x, w_in[:, :63], w_out)
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'w_in': expected N even"):
        tessera.mlp(x, w_in[:191], w_out)
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'w_out': expected \[D, 128\]"):
        tessera.mlp(x, w_in, w_out[:, :100])
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'w_out': expected \[D, 256\]"):
        tessera.mlp(x, w_in, w_out, activation="gelu")
    with pytest.raises(ValueError, match=r"tessera\.mlp: argument 'w_in': expected a 2-d tensor"):
        tessera.mlp(x, w_in[0], w_out)
    with pytest.raises(TypeError, match=r"tessera\.mlp: argument 'w_out'.*bfloat16.*float16"):
        tessera.mlp(x, w_in, w_out.half())
    with pytest.raises(TypeError, match=r"tessera\.mlp: argument 'input'.*float64"):
        tessera.mlp(x.double(), w_in.double(), w_out.double())
