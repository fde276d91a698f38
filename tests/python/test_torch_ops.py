"""tessera's registered torch ops (torch.ops.tessera.*, tessera._torch): every schema the op
descriptions give is registered; torch.library.opcheck passes for each op on CUDA inputs of each
float dtype (schema, fake kernel against the real one, autograd registration, AOT dispatch); the
public functions call them; torch.compile(fullgraph=True) traces a function using them, forward
and backward, with the eager result, also under CUDA graphs (mode="reduce-overhead").

Without a GPU (CI: torch installed, no GPU): every description's schema is registered, and each
op's fake kernel (what torch.compile traces with) runs under FakeTensorMode and gives the outputs'
shapes, dtypes and device. With TESSERA_REQUIRE_TORCH_OPS=1 (scripts/test.sh, where it built the
torch ops) a missing torch or torch library fails these instead of skipping them."""

import pytest

import tessera
from tessera._C import op_descriptions

FLOATS = ("float32", "bfloat16")


def schemas():
    """{qualified overload name ('add', 'add.Scalar'): schema} from the op descriptions."""
    return {s.split("(")[0]: s for o in op_descriptions() for s in o["schemas"]}


@pytest.fixture
def tops(torch):
    from tessera import _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    return _torch.ops


def samples(torch, name, dtype):
    """(args, kwargs) calls of op `name` (an overload name as in schemas()) in `dtype`."""
    dt = getattr(torch, dtype)

    def x(*shape, grad=True):
        return torch.randn(*shape, device="cuda", dtype=dt, requires_grad=grad)

    if name == "add":
        return [((x(4, 8), x(8)), {"alpha": 0.5}), ((x(3, 1), x(1, 5)), {})]
    if name == "add.Scalar":
        return [((x(4, 8), 2.0), {"alpha": 0.5})]
    if name == "gelu":
        return [((x(4, 8),), {}), ((x(4, 8),), {"approximate": "tanh"})]
    if name in ("silu", "softmax", "log_softmax"):
        return [((x(4, 8),), {}) if name == "silu" else ((x(4, 8), -1), {}),
                ((x(2, 3, 5),), {}) if name == "silu" else ((x(2, 3, 5), 1), {})]
    if name in ("gelu_backward", "silu_backward"):
        return [((x(4, 8, grad=False), x(4, 8, grad=False)), {})]
    if name in ("softmax_backward", "log_softmax_backward"):
        y = torch.softmax(x(4, 8, grad=False), -1)
        return [((x(4, 8, grad=False), y if name == "softmax_backward" else y.log(), -1), {})]
    if name == "dropout":
        return [((x(4, 8), 0.25, 123, 4), {})]
    if name == "dropout_backward":
        return [((x(4, 8, grad=False), 0.25, 123, 4), {})]
    if name == "copy":
        return [((x(4, 8, grad=False), torch.empty(8, 4, device="cuda", dtype=dt).t()), {})]
    if name == "layer_norm":
        return [((x(4, 8), [8], x(8), x(8), 1e-5), {}), ((x(2, 3, 4), [3, 4], None, None, 1e-5), {})]
    if name == "rms_norm":
        return [((x(4, 8), [8], x(8), 1e-6), {}), ((x(2, 3, 4), [3, 4], None, 1e-6), {})]
    if name == "layer_norm_backward":
        xi, w = x(4, 8, grad=False), x(8, grad=False)
        _, mean, rstd = torch.ops.tessera.layer_norm(xi, [8], w, None, 1e-5)
        return [((x(4, 8, grad=False), xi, [8], mean, rstd, w, [True, True, True]), {})]
    if name == "rms_norm_backward":
        xi, w = x(4, 8, grad=False), x(8, grad=False)
        _, rstd = torch.ops.tessera.rms_norm(xi, [8], w, 1e-6)
        return [((x(4, 8, grad=False), xi, [8], rstd, w, [True, True]), {})]
    if name == "add_layer_norm":
        return [((x(4, 8), x(4, 8), x(8), x(8), 1e-5), {}), ((x(2, 3, 4), x(2, 3, 4)), {})]
    if name == "add_rms_norm":
        return [((x(4, 8), x(4, 8), x(8), 1e-6), {}), ((x(2, 3, 4), x(2, 3, 4), None, 1e-6), {})]
    if name == "add_layer_norm_backward":
        xi, ri, w = x(4, 8, grad=False), x(4, 8, grad=False), x(8, grad=False)
        _, res, mean, rstd = torch.ops.tessera.add_layer_norm(xi, ri, w, None, 1e-5)
        return [((x(4, 8, grad=False), x(4, 8, grad=False), res, mean, rstd, w, [True, True, True]), {}),
                ((x(4, 8, grad=False), None, res, mean, rstd, None, [True, False, True]), {})]
    if name == "add_rms_norm_backward":
        xi, ri, w = x(4, 8, grad=False), x(4, 8, grad=False), x(8, grad=False)
        _, res, rstd = torch.ops.tessera.add_rms_norm(xi, ri, w, 1e-6)
        return [((x(4, 8, grad=False), x(4, 8, grad=False), res, rstd, w, [True, True]), {}),
                ((x(4, 8, grad=False), None, res, rstd, w, [True, False]), {})]
    if name == "isin":
        e = torch.randint(0, 20, (64,), device="cuda", dtype=torch.int32)
        t = torch.randint(0, 20, (7,), device="cuda", dtype=torch.int32)
        return [((e, t), {}), ((e, t), {"invert": True, "path": "sort"})]
    if name == "matmul":
        return [((x(16, 32), x(32, 24)), {"bias": x(24), "activation": "gelu"}),
                ((x(16, 32), x(32, 24)), {"residual": x(16, 24), "activation": "relu"}),
                ((x(2, 16, 32), x(32, 24)), {"alpha": 0.5, "residual": x(2, 16, 24)}),
                ((x(1, 16, 32), x(3, 32, 24)), {"activation": "silu"}),
                ((x(16, 32), x(32, 256)), {"bias": x(256), "activation": "swiglu"})]
    if name == "matmul.preactivation":  # called below autograd (by matmul's autograd kernel)
        return [((x(16, 32, grad=False), x(32, 24, grad=False)), {"bias": x(24, grad=False), "activation": "gelu"}),
                ((x(2, 16, 32, grad=False), x(32, 24, grad=False)),
                 {"residual": x(2, 16, 24, grad=False), "activation": "silu", "alpha": 0.5}),
                ((x(2, 16, 32, grad=False), x(32, 128, grad=False)), {"activation": "swiglu"})]
    if name in ("swiglu_backward", "swiglu_backward.recompute"):  # gate and up interleaved in blocks of 64
        return [((x(4, 64, grad=False), x(4, 128, grad=False)), {}),
                ((x(2, 3, 128, grad=False), x(2, 3, 256, grad=False)), {})]
    if name == "mlp":  # input [..., K], w_in [N, K], w_out [D, N or N / 2]
        return [((x(16, 32), x(256, 32), x(24, 128)), {}),
                ((x(2, 5, 32), x(256, 32), x(24, 128)), {"activation": "swiglu"}),
                ((x(2, 5, 32), x(48, 32), x(24, 48)), {"activation": "gelu"}),
                ((x(32), x(48, 32), x(24, 48)), {"activation": "relu"})]
    if name == "mlp.preactivation":  # called below autograd (by mlp's autograd kernel)
        return [((x(16, 32, grad=False), x(256, 32, grad=False), x(24, 128, grad=False)), {}),
                ((x(2, 5, 32, grad=False), x(48, 32, grad=False), x(24, 48, grad=False)), {"activation": "silu"})]
    if name == "scaled_mm":
        a = torch.randn(16, 64, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(24, 64, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        return [((a, b, one, one), {"out_dtype": dt})]

    def slopes(*shape):  # ALiBi's, float32 whatever the dtype
        return torch.rand(*shape, device="cuda") * 0.5
    if name == "attention":
        return [((x(2, 17, 4, 64), x(2, 33, 2, 64), x(2, 33, 2, 64)), {"causal": True}),
                ((x(1, 8, 2, 128), x(1, 8, 2, 128), x(1, 8, 2, 128)),
                 {"scale": 0.3, "window_left": 2, "softcap": 20.0}),
                ((x(2, 17, 4, 64), x(2, 33, 2, 64), x(2, 33, 2, 64)), {"alibi_slopes": slopes(4)}),
                ((x(2, 9, 2, 64), x(2, 9, 2, 64), x(2, 9, 2, 64)), {"causal": True, "alibi_slopes": slopes(2, 2)})]
    if name == "attention_backward":
        q, k, v = x(1, 9, 2, 64, grad=False), x(1, 12, 1, 64, grad=False), x(1, 12, 1, 64, grad=False)
        out, lse = torch.ops.tessera.attention(q, k, v, causal=True)
        a = slopes(2)
        out_a, lse_a = torch.ops.tessera.attention(q, k, v, alibi_slopes=a)
        return [((x(1, 9, 2, 64, grad=False), q, k, v, out, lse), {"causal": True}),
                ((x(1, 9, 2, 64, grad=False), q, k, v, out_a, lse_a), {"alibi_slopes": a})]
    if name in ("attention.varlen", "attention_backward.varlen"):
        cu = torch.tensor([0, 5, 5, 17], device="cuda", dtype=torch.int32)
        q, k, v = x(17, 4, 64, grad=name == "attention.varlen"), x(17, 2, 64), x(17, 2, 64)
        if name == "attention.varlen":
            return [((q, k, v, cu, cu, 12, 12), {"causal": True}),
                    ((q, k, v, cu, cu, 12, 12), {"alibi_slopes": slopes(3, 4)})]
        q, k, v = (t.detach() for t in (q, k, v))
        out, lse = torch.ops.tessera.attention.varlen(q, k, v, cu, cu, 12, 12)
        a = slopes(4)
        out_a, lse_a = torch.ops.tessera.attention.varlen(q, k, v, cu, cu, 12, 12, alibi_slopes=a)
        return [((x(17, 4, 64, grad=False), q, k, v, out, lse, cu, cu, 12, 12), {}),
                ((x(17, 4, 64, grad=False), q, k, v, out_a, lse_a, cu, cu, 12, 12), {"alibi_slopes": a})]
    if name in ("cross_entropy", "cross_entropy.inplace", "cross_entropy.backward"):
        t = torch.tensor([1, -100, 5, 0], device="cuda")
        w = torch.rand(10, device="cuda")  # class weights: no gradient with class indices
        q = torch.rand(4, 10, device="cuda", dtype=dt).requires_grad_()  # probabilities, with their gradient
        if name == "cross_entropy":
            return [((x(4, 10), t), {}), ((x(4, 10), t), {"reduction": "none", "label_smoothing": 0.1}),
                    ((x(4, 16), t.int()), {"reduction": "sum", "softcap": 5.0, "z_loss": 1e-3, "with_grad": True}),
                    ((x(4, 10), t, w), {"label_smoothing": 0.1}), ((x(4, 10), t, w), {"reduction": "none"}),
                    ((x(4, 10), q, torch.rand(10, device="cuda", requires_grad=True)),
                     {"label_smoothing": 0.2, "z_loss": 1e-3}),
                    ((x(4, 10), q), {"reduction": "none", "with_grad": True})]
        if name == "cross_entropy.inplace":
            return [((x(4, 10, grad=False), t), {"reduction": "none"}), ((x(4, 16, grad=False), t), {}),
                    ((x(4, 10, grad=False), t, w), {"label_smoothing": 0.1}),
                    ((x(4, 10, grad=False), q.detach()), {"reduction": "sum"})]
        return [((torch.tensor(0.5, device="cuda"), x(4, 10, grad=False)), {}),
                ((torch.rand(4, device="cuda"), x(4, 16, grad=False)), {"reduction": "none"})]
    if name == "linear_cross_entropy":
        t = torch.tensor([1, -100, 5, 0, 9], device="cuda")
        return [((x(5, 8), x(12, 8), None, t), {"chunk_rows": 2}),
                ((x(5, 8), x(12, 8), x(12), t.int()), {"reduction": "sum", "z_loss": 1e-3,
                                                        "output_mask": [True, True, True]}),
                ((x(5, 8), x(12, 8), None, t), {"reduction": "none", "output_mask": [True, False, False],
                                                 "grad_loss": torch.rand(5, device="cuda")})]
    if name == "attention.kvcache":
        k, v = x(6, 16, 2, 64, grad=False), x(6, 16, 2, 64, grad=False)
        lens = torch.tensor([20, 0], device="cuda", dtype=torch.int32)
        table = torch.tensor([[4, 1], [0, 5]], device="cuda", dtype=torch.int32)
        return [((x(2, 1, 4, 64, grad=False), k, v, lens, table), {"softcap": 10.0}),
                ((x(2, 3, 4, 64, grad=False), k[:2], v[:2], lens.clamp(max=16)), {"causal": True}),
                ((x(2, 1, 4, 64, grad=False), k, v, lens, table), {"alibi_slopes": slopes(2, 4)})]
    if name in ("rotary_embedding", "rotary_embedding_backward"):
        grad = name == "rotary_embedding"
        cos = torch.rand(12, 16, device="cuda")  # float32 angles: rotary_dim 32 of 64
        offsets = torch.tensor([0, 5, 11], device="cuda", dtype=torch.int32)
        return [((x(2, 5, 4, 64, grad=grad), x(2, 5, 2, 64, grad=grad), cos, cos.clone()), {}),
                ((x(2, 4, 5, 64, grad=grad), x(2, 2, 5, 64, grad=grad), cos.to(dt), cos.to(dt)),
                 {"layout": "bhsd", "interleaved": True, "seqlen_offset": 3}),
                ((x(3, 1, 4, 64, grad=grad), x(3, 1, 2, 64, grad=grad), cos, cos), {"seqlen_offsets": offsets})]
    generic = {o["name"]: o for o in op_descriptions() if o["generic"]}
    if name in generic:  # an op of the generic kernel: each output like a tensor argument
        args = []
        for a in overload(torch, name)._schema.arguments:
            if a.kwarg_only:
                continue
            kind = str(a.type)
            args.append(x(4, 8, grad=not name.endswith("_backward")) if kind == "Tensor" else
                        0.25 if kind == "float" else 1 if kind == "int" else None)
        return [(tuple(args), {})]
    raise AssertionError(f"no samples for torch.ops.tessera.{name}: add them here")


def test_schemas_name_their_op():
    """Each description's schemas define that op (or an overload of it), once; no GPU needed."""
    seen = set()
    for o in op_descriptions():
        for s in o["schemas"]:
            name = s.split("(")[0]
            assert name.split(".")[0] == o["name"], (o["name"], s)
            assert name not in seen, s
            seen.add(name)
    assert {"add", "silu_mul", "softmax", "layer_norm", "matmul", "attention", "cross_entropy",
            "linear_cross_entropy", "isin"} <= seen


def overload(torch, name):
    base, _, over = name.partition(".")
    return getattr(getattr(torch.ops.tessera, base), over or "default")


def test_every_described_op_is_registered(torch_cpu):
    torch = torch_cpu
    names = schemas()
    assert {"add", "add.Scalar", "softmax", "layer_norm", "isin", "matmul"} <= set(names)
    for name, schema in names.items():
        op = overload(torch, name)
        assert str(op._schema).split("(")[0] == "tessera::" + name, schema


def expected_outputs(torch, name, args, kwargs):
    """[(shape, dtype)] of torch.ops.tessera.<name>(*args, **kwargs) where the contract fixes
    them simply (computed with torch's own ops or the description's rule); None for the ops
    checked for their device only."""
    descriptions = {o["name"]: o for o in op_descriptions()}
    base = name.split(".")[0]
    if name in descriptions and descriptions[name]["generic"]:  # each output like an argument
        bound = dict(zip((a.name for a in overload(torch, name)._schema.arguments), args), **kwargs)
        return [(tuple(bound[like].shape), bound[like].dtype)
                for like in descriptions[name]["outputs"].values()]
    if base == "add":
        r = torch.add(args[0], args[1], alpha=kwargs.get("alpha", 1))
        return [(tuple(r.shape), r.dtype)]
    if name in ("layer_norm", "rms_norm"):
        x, normalized = args[0], args[1]
        lead = tuple(x.shape[:x.dim() - len(normalized)])
        return [(tuple(x.shape), x.dtype)] + [(lead, torch.float32)] * (2 if name == "layer_norm" else 1)
    if name in ("add_layer_norm", "add_rms_norm"):
        x = args[0]
        return [(tuple(x.shape), x.dtype)] * 2 + [(tuple(x.shape[:-1]), torch.float32)] * (2 if name == "add_layer_norm" else 1)
    if base == "matmul":
        r = torch.matmul(args[0], args[1])
        out = tuple(r.shape[:-1]) + (r.shape[-1] // (2 if kwargs.get("activation") == "swiglu" else 1),)
        return [(out, args[0].dtype)] + ([(tuple(r.shape), args[0].dtype)] if name == "matmul.preactivation" else [])
    if base == "mlp":
        x, w_in, w_out = args
        out = [(tuple(x.shape[:-1]) + (w_out.shape[0],), x.dtype)]
        return out + ([(tuple(x.shape[:-1]) + (w_in.shape[0],), x.dtype)] if name == "mlp.preactivation" else [])
    if name == "swiglu_backward.recompute":
        return [(tuple(args[1].shape), args[1].dtype), (tuple(args[0].shape), args[0].dtype)]
    if name == "isin":
        return [(tuple(args[0].shape), torch.bool)]
    return None


@pytest.mark.parametrize("name", sorted(schemas()))
def test_fake_kernels_without_a_gpu(torch_cpu, name):
    """Each op under FakeTensorMode, as torch.compile traces it: no GPU touched."""
    torch = torch_cpu
    from torch._subclasses.fake_tensor import FakeTensorMode

    def plain(v):
        return v.detach() if isinstance(v, torch.Tensor) else v
    with FakeTensorMode():
        for args, kwargs in samples(torch, name, "float32"):
            args, kwargs = tuple(map(plain, args)), {k: plain(v) for k, v in kwargs.items()}
            outs = overload(torch, name)(*args, **kwargs)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            assert all(o.device.type == "cuda" for o in outs if isinstance(o, torch.Tensor)), name
            want = expected_outputs(torch, name, args, kwargs)
            if want is not None:
                assert [(tuple(o.shape), o.dtype) for o in outs] == want, (name, kwargs)


@pytest.mark.parametrize("name", sorted(schemas()))
@pytest.mark.parametrize("dtype", FLOATS)
def test_opcheck(torch, tops, name, dtype):
    op = overload(torch, name)
    # test_schema clones and compares the inputs, which torch cannot do for float8 tensors.
    utils = [u for u in ("test_schema", "test_autograd_registration", "test_faketensor",
                         "test_aot_dispatch_dynamic") if not (name == "scaled_mm" and u == "test_schema")]
    for args, kwargs in samples(torch, name, dtype):
        torch.library.opcheck(op, args, kwargs, test_utils=utils)


def test_public_functions_call_the_ops(torch, tops):
    """The public functions' torch path is the registered op: the profiler's op names say so."""
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tessera.softmax(x, -1).sum().backward()
        tessera.layer_norm(x, (256,)).sum().backward()
        tessera.gelu(x).sum().backward()
    names = {e.key for e in prof.key_averages()}
    for op in ("tessera::softmax", "tessera::softmax_backward", "tessera::layer_norm",
               "tessera::layer_norm_backward", "tessera::gelu", "tessera::gelu_backward"):
        assert op in names, (op, sorted(n for n in names if "tessera" in n))


def _model(torch):
    def f(x, y, w, b, w2):
        h = tessera.add(x, y, alpha=0.5)
        h = tessera.gelu(h, approximate="tanh")
        h = tessera.silu(h)
        h = tessera.layer_norm(h, (64,), w, b)
        h = tessera.rms_norm(h, (64,), w)
        h = tessera.dropout(h, 0.1, seed=7, offset=0)
        h = tessera.linear(h, w2)
        return tessera.softmax(h, -1) * tessera.log_softmax(h, -1)
    return f


def _inputs(torch):
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g, requires_grad=True)
    return r(32, 64), r(32, 64), r(64), r(64), r(48, 64)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_forward_and_backward(torch, tops, mode):
    torch._dynamo.reset()
    f = _model(torch)
    eager_in, compiled_in = _inputs(torch), _inputs(torch)
    want = f(*eager_in)
    want.sum().backward()
    compiled = torch.compile(f, fullgraph=True, mode=mode)
    for _ in range(3):  # CUDA graphs record on a later call: every call must match
        for t in compiled_in:
            t.grad = None
        got = compiled(*compiled_in)
        got.sum().backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for a, b in zip(compiled_in, eager_in):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_compiled_dropout_draws_a_new_mask_each_call(torch, tops):
    # Without a seed, a compiled graph takes torch's dropout (torch's generator, in the graph):
    # tessera's Python-int generator state would be frozen into one mask.
    torch._dynamo.reset()
    x = torch.ones(4096, device="cuda")
    f = torch.compile(lambda t: tessera.dropout(t, 0.5), fullgraph=True)
    a, b = f(x), f(x)
    for y in (a, b):
        assert set(torch.unique(y).tolist()) <= {0.0, 2.0}
        assert 0.4 < (y == 0).float().mean().item() < 0.6
    assert not torch.equal(a, b)
    # With a seed the mask is tessera's and the same on every call, compiled or not.
    g = torch.compile(lambda t: tessera.dropout(t, 0.5, seed=3, offset=0), fullgraph=True)
    assert torch.equal(g(x), g(x))
    assert torch.equal(g(x), tessera.dropout(x, 0.5, seed=3, offset=0))


def test_no_grad_shortcut_takes_plain_tensors_only(torch, tops):
    """tessera._torch_fast takes no-grad calls on exact CUDA tensors in a thread without modes;
    everything else goes through the registered op (and the dispatcher)."""
    from tessera import _torch
    fast = _torch.fast
    if fast is None:
        pytest.skip("built without torch's Python library: no shortcut")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Quiet(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(64, 256, device="cuda")
    assert fast.takes(x) and fast.takes(x.t()) and fast.takes(x.half())
    assert not fast.takes(x.double()) and not fast.takes(x.cpu())
    assert not fast.takes(x.clone().requires_grad_())
    with torch.no_grad():
        assert fast.takes(x.clone().requires_grad_())
    assert not fast.takes(torch.nn.Parameter(x))  # a subclass
    with Quiet():
        assert not fast.takes(x)
    assert not torch.vmap(lambda r: torch.tensor(fast.takes(r)))(x).any()
    # The same kernels either way: the shortcut's results are the op's, bit for bit.
    w, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    m = torch.randn(256, 128, device="cuda")
    pairs = [(tessera.add(x, x, alpha=2.0), tops.add.default(x, x, alpha=2.0)),
             (tessera.add(x, 3), tops.add.Scalar(x, 3)),
             (tessera.gelu(x, "tanh"), tops.gelu.default(x, approximate="tanh")),
             (tessera.silu(x), tops.silu.default(x)),
             (tessera.softmax(x, 0), tops.softmax.default(x, 0)),
             (tessera.log_softmax(x, -1), tops.log_softmax.default(x, -1)),
             (tessera.layer_norm(x, x.shape[-1:], w, b), tops.layer_norm.default(x, [256], w, b)[0]),
             (tessera.rms_norm(x, 256, w), tops.rms_norm.default(x, [256], w, 2.0 ** -23)[0]),
             (tessera.matmul(x, m), tops.matmul.default(x, m)),
             (tessera.linear(x, m.t(), b[:128]), tops.matmul.default(x, m, bias=b[:128]))]
    for got, want in pairs:
        assert torch.equal(got, want)
    # The profiler still names the op.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tessera.softmax(x, -1)
    assert "tessera::softmax" in {e.key for e in prof.key_averages()}
