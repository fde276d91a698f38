"""tessera.float8's gated product quantized where it is computed: float8_quantize_gated (the
kernel, bit for bit the gated op's output quantized; its torch op where dynamo traces) and
gated_linear, the fp8 MLP's down projection (the module's outputs and gradients, on the kernels
and emulated, eager and compiled)."""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("needs torch's float8_e4m3fn", allow_module_level=True)

import tessera.float8 as f8  # noqa: E402
from test_float8 import _need_cuda, _same_bits, _special, _stand_in_kernels  # noqa: E402


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_linear_is_the_linear_of_the_gated_product(kind, monkeypatch):
    """float8.gated_linear on the kernels' path, stood in for on the CPU (identity quantizer, float
    GEMM): the down projection of act(gate) * up, its gradients those of the plain composition;
    the product quantized once (by rows and, for wgrad, columns), the output gradient once."""
    calls = []
    _stand_in_kernels(monkeypatch, lambda t, columns, rows: calls.append((tuple(t.shape), columns)))
    from tessera.elementwise import gated
    plain = torch.nn.Linear(32, 48)
    lin = f8.convert_to_float8_training(torch.nn.Linear(32, 48))
    lin.load_state_dict(plain.state_dict())
    gate = torch.randn(2, 5, 32, requires_grad=True)
    up = torch.randn(2, 5, 32, requires_grad=True)
    out = f8.gated_linear(kind, gate, up, lin)
    assert calls == [((10, 32), True), ((48, 32), False)]  # the product (both layouts), the weight
    g2, u2 = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    want = plain(gated(kind, g2, u2))
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    assert calls[2] == ((10, 48), True)  # the output gradient: rows (dgrad) and columns (wgrad)
    for a, b in ((gate.grad, g2.grad), (up.grad, u2.grad), (lin.weight.grad, plain.weight.grad),
                 (lin.bias.grad, plain.bias.grad)):
        torch.testing.assert_close(a, b)


def test_gated_linear_falls_back_to_the_module():
    """Off the kernels (the CPU's emulation), another Linear, or a bad kind: the module on the
    gated op's output, or an error naming the argument."""
    from tessera.elementwise import gated
    lin = f8.convert_to_float8_training(torch.nn.Linear(32, 16))
    gate, up = torch.randn(4, 32), torch.randn(4, 32)
    torch.testing.assert_close(f8.gated_linear("silu", gate, up, lin), lin(gated("silu", gate, up)), rtol=0, atol=0)
    other = torch.nn.Linear(32, 16)
    torch.testing.assert_close(f8.gated_linear("silu", gate, up, other), other(gated("silu", gate, up)))
    with pytest.raises(ValueError, match="'kind'"):
        f8.gated_linear("relu", gate, up, lin)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("granularity", ["row", "tensor", "block"])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_quantize_gated_gives_the_gated_outputs_bits(dtype, granularity, kind):
    """_quantize_gated on the GPU (tessera's float8_quantize_gated, the product never written)
    gives the bytes of the gated op's output quantized, rows alone and with the transposed copy,
    gate and up halves of one tensor (a row stride of twice their width) too."""
    _need_cuda()
    from tessera import _state
    from tessera.elementwise import gated
    if _state.fast is None:
        pytest.skip("the torch ops' fast entries are not built")
    dt = getattr(torch, dtype)
    both = _special(272, 2 * 208, dt, True)
    for gate, up in ((both[:, :208].contiguous(), both[:, 208:].contiguous() * 3), both.chunk(2, dim=1)):
        for columns in (False, True):
            got = f8._quantize_gated(gate, up, kind, granularity, columns)
            want = f8._quantize_both(gated(kind, gate, up), granularity, columns)
            for a, b in zip(got, want):
                assert (a is None) == (b is None) and (a is None or _same_bits(a, b)), (columns, gate.stride())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
def test_gated_linear_on_the_kernels_matches_the_module(recipe):
    """On the GPU's kernels, gated_linear (the product quantized where it is computed) gives the
    module path's output and gradients bit for bit: the same quantized bytes, the same GEMMs."""
    _need_cuda()
    from tessera.elementwise import gated
    if not f8._on_kernels(torch.ones(1, device="cuda", dtype=torch.bfloat16), recipe):
        pytest.skip("needs the sm90 float8 kernels")
    torch.manual_seed(0)
    lin = f8.convert_to_float8_training(torch.nn.Linear(512, 256, bias=False), recipe=recipe).cuda().bfloat16()
    gate = torch.randn(2, 64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(2, 64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = f8.gated_linear("silu", gate, up, lin)
    grad = torch.randn_like(out)
    out.backward(grad)
    got = (out, gate.grad, up.grad, lin.weight.grad)
    gate.grad = up.grad = lin.weight.grad = None
    f8._last_x = None
    want_out = lin(gated("silu", gate, up))
    want_out.backward(grad)
    for a, b in zip(got, (want_out, gate.grad, up.grad, lin.weight.grad)):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gated_linear_compiled_on_the_kernels_keeps_the_fused_quantization(recipe):
    """Compiled on the GPU's kernels, gated_linear's forward graph calls float8_quantize_gated (the
    product quantized where it is computed), and its output and gradients are the eager call's bit
    for bit."""
    _need_cuda()
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    if not f8._on_kernels(torch.ones(1, device="cuda", dtype=torch.bfloat16), recipe):
        pytest.skip("needs the sm90 float8 kernels")
    torch.manual_seed(0)
    lin = f8.convert_to_float8_training(torch.nn.Linear(512, 256, bias=False), recipe=recipe).cuda().bfloat16()
    gate = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)

    def step(fn):
        f8._last_x = None
        out = fn(gate, up)
        out.backward(grad)
        got = [out.detach()] + [t.grad.clone() for t in (gate, up, lin.weight)]
        gate.grad = up.grad = lin.weight.grad = None
        return got

    def call(g, u):
        return f8.gated_linear("silu", g, u, lin)

    want = step(call)
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    got = step(torch.compile(call, backend=backend, fullgraph=True))
    assert "float8_quantize_gated" in "".join(g.code for g in backend.fw_graphs)
    for a, b in zip(got, want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_gated_linear_under_torch_compile(monkeypatch):
    """torch.compile(fullgraph=True) traces gated_linear's Function whole on the kernels' path
    (stood in for on the CPU): the eager call's output and gradients."""
    _stand_in_kernels(monkeypatch, lambda t, columns, rows: None)
    torch.manual_seed(0)
    lin = f8.convert_to_float8_training(torch.nn.Linear(32, 48, bias=False))
    gate = torch.randn(2, 5, 32, requires_grad=True)
    up = torch.randn(2, 5, 32, requires_grad=True)

    def step(fn):
        out = fn(gate, up)
        out.square().sum().backward()
        grads = [t.grad.clone() for t in (gate, up, lin.weight)]
        for t in (gate, up, lin.weight):
            t.grad = None
        return out.detach(), grads

    def call(g, u):
        return f8.gated_linear("silu", g, u, lin)

    want = step(call)
    torch._dynamo.reset()
    got = step(torch.compile(call, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)


def test_quantize_gated_fuses_where_the_quantization_takes_two_passes(monkeypatch):
    """_quantize_gated takes the fused kernel (the fast entry) per row with the columns and per
    tensor, and composes the gated op and _quantize_both for rows alone, the block granularities,
    gate and up of different layouts, and M not a multiple of 16 with columns."""
    from tessera import _state
    fused, composed = [], []

    class Fast:
        @staticmethod
        def float8_quantize_gated(g, u, kind, granularity, columns):
            fused.append((granularity, columns))
            return (g, g, g, g) if columns else (g, g)

    monkeypatch.setattr(_state, "fast", Fast)
    monkeypatch.setattr(_state, "dynamo_compiling", lambda: False)
    monkeypatch.setattr(f8, "_kernel_takes", lambda t, g, columns=False: not columns or t.shape[0] % 16 == 0)
    monkeypatch.setattr(f8, "_quantize_both", lambda t, g, columns: composed.append((g, columns)) or (t,) * 4)
    import tessera.elementwise
    monkeypatch.setattr(tessera.elementwise, "gated", lambda kind, g, u: g)  # the op itself not called
    gate, up = torch.randn(32, 64), torch.randn(32, 64)
    for granularity, columns in (("row", True), ("tensor", False), ("tensor", True)):
        f8._quantize_gated(gate, up, "silu", granularity, columns)
    assert fused == [("row", True), ("tensor", False), ("tensor", True)] and not composed
    fused.clear()
    for granularity, columns in (("row", False), ("block", True), ("block", False)):
        f8._quantize_gated(gate, up, "silu", granularity, columns)
    f8._quantize_gated(gate, up.t().contiguous().t(), "silu", "row", True)  # another layout
    f8._quantize_gated(gate[:20], up[:20], "silu", "row", True)  # M = 20 with columns
    assert not fused and composed == [("row", False), ("block", True), ("block", False), ("row", True), ("row", True)]


@pytest.mark.parametrize("where", ["compiling", "no fast entry", "subclass"])
def test_quantize_gated_takes_the_registered_op_where_the_fast_entry_does_not(monkeypatch, where):
    """Where dynamo traces (the compiled graph keeps the fused op) and where no fast entry is built,
    the fused cases call torch.ops.tessera.float8_quantize_gated (.columns with the transposed
    copy); rows alone still compose, as a tensor subclass does (the fast entry declines it, and the
    op's sharding rules would gather gate and up where the composition gathers the product)."""
    from types import SimpleNamespace
    from tessera import _state
    calls, composed = [], []

    def op(name):
        def call(g, u, *, activation, granularity):
            calls.append((name, activation, granularity))
            return (g,) * (4 if name == "columns" else 2)
        return call

    class Fast:
        @staticmethod
        def float8_quantize_gated(g, u, kind, granularity, columns):
            assert where != "compiling", "the fast entry is skipped while dynamo traces"
            return None  # as for a subclass

    class Sub(torch.Tensor):
        pass

    monkeypatch.setattr(_state, "ops", SimpleNamespace(
        float8_quantize_gated=SimpleNamespace(default=op("default"), columns=op("columns"))))
    monkeypatch.setattr(_state, "fast", None if where == "no fast entry" else Fast)
    monkeypatch.setattr(_state, "dynamo_compiling", lambda: where == "compiling")
    monkeypatch.setattr(f8, "_kernel_takes", lambda t, g, columns=False: True)
    monkeypatch.setattr(f8, "_quantize_both", lambda t, g, columns: composed.append((g, columns)) or (t,) * 4)
    import tessera.elementwise
    monkeypatch.setattr(tessera.elementwise, "gated", lambda kind, g, u: g)
    gate, up = torch.randn(32, 64), torch.randn(32, 64)
    if where == "subclass":
        gate, up = gate.as_subclass(Sub), up.as_subclass(Sub)
    out = f8._quantize_gated(gate, up, "gelu_tanh", "row", True)
    assert len(out) == 4 and all(o is not None for o in out)
    out = f8._quantize_gated(gate, up, "silu", "tensor", False)
    assert len(out) == 4
    f8._quantize_gated(gate, up, "silu", "row", False)
    if where == "subclass":
        assert calls == [] and composed == [("row", True), ("tensor", False), ("row", False)]
    else:
        assert calls == [("columns", "gelu_tanh", "row"), ("default", "silu", "tensor")]
        assert composed == [("row", False)]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_backward_hands_its_gradients_copies_to_the_projections(monkeypatch, recipe, kind):
    """A float8 MLP (gate, up and down projections): the gated backward quantizes grad_gate and
    grad_up as it writes them (float8_quantize_gated_backward) and the gate and up projections'
    backward GEMMs take those copies (no quantizing call of a [T, I] gradient); the gradients are
    those of the gated backward op then each projection's own quantization, bit for bit."""
    _need_cuda()
    if not f8._on_kernels(torch.ones(1, device="cuda", dtype=torch.bfloat16), recipe):
        pytest.skip("needs the sm90 float8 kernels")
    torch.manual_seed(0)
    t, h, i = 128, 256, 512
    mlp = torch.nn.ModuleDict({n: torch.nn.Linear(*io, bias=False) for n, io in
                               (("gate", (h, i)), ("up", (h, i)), ("down", (i, h)))}).cuda().bfloat16()
    f8.convert_to_float8_training(mlp, recipe=recipe)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)

    def step():
        for p in (x, *mlp.parameters()):
            p.grad = None
        f8._last_x = None
        f8.gated_linear(kind, mlp["gate"](x), mlp["up"](x), mlp["down"]).backward(grad)
        return [p.grad.clone() for p in (x, *mlp.parameters())]

    calls = []
    real = f8._quantize_both
    monkeypatch.setattr(f8, "_quantize_both", lambda g, *a, **k: calls.append(tuple(g.shape)) or real(g, *a, **k))
    got = step()
    assert (t, i) not in calls  # grad_gate's and grad_up's copies came from the gated backward
    from tessera import _float8_producers as producers
    assert not producers.grad_copies  # both taken
    from tessera.elementwise import gated_backward
    monkeypatch.setattr(producers, "gated_grads", lambda kind_, d, g, u, gran: gated_backward(kind_, d, g, u))
    want = step()
    for a, b in zip(got, want):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_gated_backward_fast_entry_is_the_extensions_call(granularity):
    """gated_grads takes tessera._torch_fast's entry (outputs allocated in C++): the same bits as
    the nanobind extension's call with outputs allocated in Python; a gate of another dtype
    declined (None)."""
    _need_cuda()
    from tessera import _state
    from tessera._float8_producers import _gated_grads
    if _state.fast is None or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs tessera._torch_fast and the sm90 float8 kernels")
    g = torch.Generator(device="cuda").manual_seed(3)
    d, gate, up = (torch.randn(96, 320, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    got = _state.fast.float8_quantize_gated_backward(d, gate, up, "silu", granularity)
    want = _gated_grads("silu", d, gate, up, granularity)
    want = (want[0], want[1], *want[2], *want[3])
    assert len(got) == 10
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and _same_bits(a, b)
    assert _state.fast.float8_quantize_gated_backward(d, gate.half(), up, "silu", granularity) is None
