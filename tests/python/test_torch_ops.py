"""tessera's registered torch ops (torch.ops.tessera.*, tessera._torch): every schema the op
descriptions give is registered; torch.library.opcheck passes for each op on CUDA inputs of each
float dtype (schema, fake kernel against the real one, autograd registration, AOT dispatch); the
public functions call them; torch.compile(fullgraph=True) traces a function using them, forward
and backward, with the eager result, also under CUDA graphs (mode="reduce-overhead").

Without a GPU (CI: torch installed, no GPU): every description's schema is registered, and each
op's fake kernel (what torch.compile traces with) runs under FakeTensorMode and gives the outputs'
shapes, dtypes and device. With TESSERA_REQUIRE_TORCH_OPS=1 (scripts/test.sh, where it built the
torch ops) a missing torch or torch library fails these instead of skipping them."""

import subprocess
import sys

import pytest
from fake_dist import dispatch_log
from torch_op_samples import overload, samples

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
    descriptions = {d["name"]: d for o in op_descriptions() for d in [o] + o["overloads"]}
    base = name.split(".")[0]
    if name == "isin":  # torch's contract, apart from the description's rule
        return [(tuple(args[0].shape), torch.bool)]
    if name in descriptions and descriptions[name]["generic"]:  # each output by its rule
        schema = overload(torch, name)._schema.arguments
        bound = {a.name: a.default_value for a in schema if a.has_default_value()}
        bound.update(zip((a.name for a in schema), args), **kwargs)
        want = []
        for r in descriptions[name]["output_rules"].values():
            t, other, mask = bound[r["like"]], bound.get(r["other"]), bound.get(r["mask"], True)
            if t is None or not (mask if r["mask_index"] < 0 else mask[r["mask_index"]]):
                want.append(None)  # an output like an absent tensor, or masked off: None
                continue
            if r["shape"] in ("reduced", "scalar"):  # a loss: per row for 'none', else 0-d
                want.append((tuple(t.shape[:-1]) if other == "none" else (), torch.float32))
                continue
            drop = (r["drop"] if not r["other"] else
                    len(other) if isinstance(other, (list, tuple)) else other.dim())
            size = (tuple(t.shape) if r["shape"] == "like" else
                    tuple(t.shape[:t.dim() - drop]) if r["shape"] == "leading" else
                    tuple(torch.broadcast_shapes(t.shape, other.shape)))
            dtype = bound.get(r["dtype_from"]) or {"like": t.dtype, "float32": torch.float32, "bool": torch.bool}[r["dtype"]]
            want.append((size, dtype))
        return want
    if base == "matmul":
        r = torch.matmul(args[0], args[1])
        out = tuple(r.shape[:-1]) + (r.shape[-1] // (2 if kwargs.get("activation") in ("swiglu", "geglu") else 1),)
        return [(out, args[0].dtype)] + ([(tuple(r.shape), args[0].dtype)] if name == "matmul.preactivation" else [])
    if base in ("float8_quantize", "float8_quantize_gated"):  # q and its scales by granularity; .columns
        # transposed too; .transposed those alone (float8_quantize_gated: act(gate) * up's)
        m, k = args[0].shape
        mb, kb = -(-m // 128), -(-k // 128)
        scales = {"row": ((m, 1), (1, k)), "tensor": ((), ()), "block": ((m, kb), (mb, k)),
                  "block2d": ((mb, kb), (mb, kb))}[kwargs.get("granularity", "row")]
        rows = [((m, k), torch.float8_e4m3fn), (scales[0], torch.float32)]
        columns = [((k, m), torch.float8_e4m3fn), (scales[1], torch.float32)]
        return {"float8_quantize.columns": rows + columns, "float8_quantize_gated.columns": rows + columns,
                "float8_quantize.transposed": columns}.get(name, rows)
    if base == "grouped_mm":
        a, b = args[0], args[1]
        m, n = a.shape[-2], b.shape[-1]
        shape = (m, n) if a.dim() != b.dim() else (a.shape[0] if a.dim() == 3 else args[2].shape[0], m, n)
        return [(shape, kwargs.get("out_dtype") or a.dtype)]
    if name in ("moe_permute", "moe_unpermute"):
        t, k = args[1].shape
        return [((t * k if name == "moe_permute" else t, args[0].shape[-1]), args[0].dtype)]
    if base == "mlp":
        x, w_in, w_out = args
        out = [(tuple(x.shape[:-1]) + (w_out.shape[0],), x.dtype)]
        return out + ([(tuple(x.shape[:-1]) + (w_in.shape[0],), x.dtype)] if name == "mlp.preactivation" else [])
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
            outs = list(outs) if isinstance(outs, (tuple, list)) else [] if outs is None else [outs]
            assert all(o.device.type == "cuda" for o in outs if isinstance(o, torch.Tensor)), name
            want = expected_outputs(torch, name, args, kwargs)
            if want is not None:
                assert [None if o is None else (tuple(o.shape), o.dtype) for o in outs] == want, (name, kwargs)


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


@pytest.mark.parametrize("first", ["tessera", "inductor"])
def test_ops_have_inductor_lowerings_before_any_graph(torch_cpu, first):
    """Every tessera op that reaches inductor has its fallback lowering once inductor's lowerings
    are loaded, whichever is imported first: inductor's own registration at an op's first use
    formats the call's arguments, exponential in the depth of the extern kernels before it."""
    inductor = "import torch._inductor.lowering\n"
    code = ("import sys, torch\n" + (inductor if first == "inductor" else "") +
            "import tessera\nfrom tessera import _torch\n"
            "assert (first == 'inductor') == ('torch._inductor.lowering' in sys.modules)\n" + inductor +
            "from torch._inductor.lowering import lowerings, decompositions\n"
            "names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith('tessera::')]\n"
            "ops = [getattr(getattr(torch.ops.tessera, n[9:].partition('.')[0]), n.partition('.')[2] or 'default')"
            " for n in names]\n"
            "missing = [str(op) for op in ops if op not in lowerings and op not in decompositions]\n"
            "assert len(ops) > 40 and not missing, missing\n"
            "assert torch.ops.tessera.add_rms_norm.default in lowerings\n")
    r = subprocess.run([sys.executable, "-c", f"first = {first!r}\n" + code],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_inductor_lowers_a_deep_graph_of_tessera_ops_without_formatting_their_calls(torch_cpu, monkeypatch):
    """Inductor's lowering of layers of tessera ops on fake CUDA tensors (no GPU): it finds every op
    registered and never formats a call's arguments (what its registration at first use does, at
    a cost exponential in the depth of extern kernels before the call)."""
    torch = torch_cpu
    from tessera import _torch
    if _torch.ops is None:
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    from torch._inductor import exc
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    formatted = []
    monkeypatch.setattr(exc.OperatorIssue, "operator_str",
                        staticmethod(lambda target, *a: formatted.append(str(target)) or ""))

    def layers(x, w, g):
        h, r = x, x
        for _ in range(6):
            h, r = torch.ops.tessera.add_rms_norm(torch.ops.tessera.matmul(h, w), r, g, 1e-5)[:2]
        return torch.ops.tessera.softmax(h, -1)
    mode = FakeTensorMode()
    with mode:
        args = [torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((64, 64), (64, 64), (64,))]
        gm = make_fx(layers)(*args)
    with V.set_fake_mode(mode):
        graph = GraphLowering(gm, example_inputs=args)
        with V.set_graph_handler(graph):
            graph.run(*args)
    assert formatted == []
    assert sum("tessera" in str(n.target) for n in gm.graph.nodes) == 13


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


def _fast(torch):
    from tessera import _torch
    if _torch.fast is None:
        pytest.skip("built without torch's Python library: no shortcut")
    return _torch.fast


def test_shortcut_takes_plain_tensors_only(torch, tops):
    """tessera._torch_fast takes calls on exact CUDA tensors in a thread without modes (those
    autograd records through the dispatcher, fast.records); everything else goes through the
    registered op (torch.ops)."""
    fast = _fast(torch)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Quiet(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(64, 256, device="cuda")
    assert fast.takes(x) and fast.takes(x.t()) and fast.takes(x.half())
    assert not fast.takes(x.double()) and not fast.takes(x.cpu())
    xg = x.clone().requires_grad_()
    assert fast.takes(xg) and fast.records(xg) and not fast.records(x)
    with torch.no_grad():
        assert fast.takes(xg) and not fast.records(xg)
    # nn.Parameter is a plain tensor to torch's C++ (THPVariable_CheckExact), other subclasses not.
    assert fast.takes(torch.nn.Parameter(x)) and fast.records(torch.nn.Parameter(x))

    class Sub(torch.Tensor):
        pass
    assert not fast.takes(x.as_subclass(Sub))
    with Quiet():
        assert not fast.takes(x) and not fast.takes(xg)
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


def _autograd_cases(torch, tops):
    """(name, public call, the registered op's call through torch.ops, leaves): each call takes
    the leaves (tensors requiring grad, fresh for each call) and returns its outputs."""
    def r(*shape):
        return torch.randn(*shape, device="cuda")
    a, b, bias, w = r(16, 64), r(16, 64), r(64), 1.0 + 0.1 * r(64)
    m, lin = r(64, 32), r(32, 64)
    q, k = r(2, 8, 4, 32), r(2, 8, 2, 32)
    cos, sin = r(8, 16), r(8, 16)
    eps = 2.0 ** -23
    return [
        ("add", lambda x, y: tessera.add(x, y, alpha=0.5),
         lambda x, y: tops.add.default(x, y, alpha=0.5), (a, b)),
        ("add (broadcast)", lambda x, y: tessera.add(x, y), lambda x, y: tops.add.default(x, y), (a, bias)),
        ("add (scalar)", lambda x: tessera.add(x, 3), lambda x: tops.add.Scalar(x, 3), (a,)),
        ("gelu", lambda x: tessera.gelu(x, "tanh"),
         lambda x: tops.gelu.default(x, approximate="tanh"), (a,)),
        ("silu", tessera.silu, tops.silu.default, (a,)),
        ("softmax", lambda x: tessera.softmax(x, 0), lambda x: tops.softmax.default(x, 0), (a,)),
        ("log_softmax", lambda x: tessera.log_softmax(x, -1),
         lambda x: tops.log_softmax.default(x, -1), (a,)),
        ("silu_mul", tessera.silu_mul, tops.silu_mul.default, (a, b)),
        ("layer_norm", lambda x, g, c: tessera.layer_norm(x, (64,), g, c),
         lambda x, g, c: tops.layer_norm.default(x, [64], g, c, 1e-5)[0], (a, w, bias)),
        ("layer_norm (weight only requires grad)",
         lambda g: tessera.layer_norm(a, (64,), g, bias),
         lambda g: tops.layer_norm.default(a, [64], g, bias, 1e-5)[0], (w,)),
        ("rms_norm", lambda x, g: tessera.rms_norm(x, 64, g),
         lambda x, g: tops.rms_norm.default(x, [64], g, eps)[0], (a, w)),
        ("add_layer_norm", lambda x, y, g, c: tessera.add_layer_norm(x, y, g, c),
         lambda x, y, g, c: tops.add_layer_norm.default(x, y, g, c, 1e-5)[:2], (a, b, w, bias)),
        ("add_rms_norm", lambda x, y, g: tessera.add_rms_norm(x, y, g),
         lambda x, y, g: tops.add_rms_norm.default(x, y, g, eps)[:2], (a, b, w)),
        ("matmul", tessera.matmul, tops.matmul.default, (a, m)),
        ("linear", lambda x, v, c: tessera.linear(x, v, c),
         lambda x, v, c: tops.matmul.default(x, v.transpose(-1, -2), bias=c), (a, lin, bias[:32])),
        ("rotary_embedding", lambda x, y: tessera.rotary_embedding(x, y, cos, sin),
         lambda x, y: tops.rotary_embedding.default(x, y, cos, sin), (q, k)),
    ]


def _run(torch, call, leaves):
    """Outputs, grad_fn names (and their edges'), the saved tensors' shapes and dtypes, and the
    leaves' gradients of one forward and backward of `call` on fresh copies of `leaves`."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = call(*leaves)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    nodes = [(o.grad_fn.name(), [type(f).__name__ if f is not None else None
                                 for f, _ in o.grad_fn.next_functions]) for o in outs]
    gen = torch.Generator(device="cuda").manual_seed(1)
    torch.autograd.backward(outs, [torch.randn(o.shape, device="cuda", generator=gen) for o in outs])
    return outs, nodes, saved, [t.grad for t in leaves]


def test_shortcut_records_autograd_as_the_op(torch, tops, monkeypatch):
    """A call autograd records on plain CUDA tensors takes tessera._torch_fast, which calls the
    registered op through the dispatcher: the same outputs, node (grad_fn and its edges), saved
    tensors and gradients as the call through torch.ops."""
    fast = _fast(torch)
    from tessera import _state
    for name, public, op, leaves in _autograd_cases(torch, tops):
        with monkeypatch.context() as patch:
            # Without torch.ops the public functions' Python paths refuse a differentiable call
            # (needs_ops): a result says the shortcut took it.
            patch.setattr(_state, "ops", None)
            got = _run(torch, public, leaves)
        want = _run(torch, op, leaves)
        for g, w in zip(got[0], want[0]):
            assert torch.equal(g, w), name
        assert got[1] == want[1], (name, got[1], want[1])
        assert got[2] == want[2], (name, got[2], want[2])
        for g, w in zip(got[3], want[3]):
            assert (g is None and w is None) or torch.equal(g, w), name
    # A model's weights (nn.Parameter) take it too.
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    lin = torch.nn.Linear(64, 32, device="cuda")
    with monkeypatch.context() as patch:
        patch.setattr(_state, "ops", None)
        got = tessera.linear(x, lin.weight, lin.bias)
    want = tops.matmul.default(x, lin.weight.transpose(-1, -2), bias=lin.bias)
    assert torch.equal(got, want) and got.grad_fn.name() == want.grad_fn.name()
    # The dispatcher records the op for the profiler, forward and backward.
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    assert fast.records(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tessera.gelu(x).sum().backward()
        tessera.layer_norm(x, (256,)).sum().backward()
    names = {e.key for e in prof.key_averages()}
    for op in ("tessera::gelu", "tessera::gelu_backward", "tessera::layer_norm",
               "tessera::layer_norm_backward"):
        assert op in names, (op, sorted(n for n in names if "tessera" in n))
    # Operands the Python function reshapes first (a 3-d matmul) take the Python path, as before.
    a3 = torch.randn(2, 16, 64, device="cuda", requires_grad=True)
    m = torch.randn(64, 32, device="cuda", requires_grad=True)
    assert fast.matmul(a3, m) is None and fast.linear(a3, m.t()) is None


def test_shortcut_autograd_bypassed_for_modes_subclasses_and_compile(torch, tops):
    """Calls that something else must see keep torch.ops: under a TorchDispatchMode, for a
    subclass of torch.Tensor, and in a torch.compile graph (the same results and gradients)."""
    fast = _fast(torch)
    x0 = torch.randn(16, 64, device="cuda")
    w0 = torch.randn(64, device="cuda")
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = tessera.layer_norm(tessera.gelu(x), (64,), w)
    want.sum().backward()
    # A dispatch mode sees the op.
    xm, wm = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    with dispatch_log() as log:
        assert not fast.takes(xm)
        assert fast.call(tessera._state.FAST["gelu"], xm, "none") is None
        got = tessera.layer_norm(tessera.gelu(xm), (64,), wm)
    assert "tessera.gelu.default" in log.seen and "tessera.layer_norm.default" in log.seen, log.seen
    got.sum().backward()
    assert torch.equal(got, want) and torch.equal(xm.grad, x.grad) and torch.equal(wm.grad, w.grad)

    # A subclass takes torch.ops.
    class Sub(torch.Tensor):
        pass

    xs = x0.clone().as_subclass(Sub).requires_grad_()
    assert not fast.takes(xs) and fast.call(tessera._state.FAST["gelu"], xs, "none") is None
    ys = tessera.gelu(xs)
    node = ys.grad_fn  # torch wraps a subclass's result as the subclass: an alias of the op's output
    node = node.next_functions[0][0] if node.name() == "AliasBackward0" else node
    assert node.name() == tessera.gelu(x).grad_fn.name()
    ys.sum().backward()
    xp = x0.clone().requires_grad_()
    tessera.gelu(xp).sum().backward()
    assert torch.equal(xs.grad, xp.grad)

    # torch.compile: the graph holds the registered ops, forward and backward as eager.
    torch._dynamo.reset()
    targets = []

    def backend(gm, inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    f = torch.compile(lambda t, v: tessera.layer_norm(tessera.gelu(t), (64,), v), backend=backend,
                      fullgraph=True)
    xc, wc = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    got = f(xc, wc)
    assert "tessera.gelu.default" in targets and "tessera.layer_norm.default" in targets, targets
    got.sum().backward()
    assert torch.equal(got, want) and torch.equal(xc.grad, x.grad) and torch.equal(wc.grad, w.grad)


def test_shortcut_takes_the_norms_backward_ops(torch, tops):
    """layer_norm_backward and rms_norm_backward without grad take tessera._torch_fast's call: the
    op's kernel, the op's results (statistics of the leading shape or torch's, masks, no weight,
    no bias)."""
    fast = _fast(torch)
    ln, rms = fast.index("layer_norm_backward"), fast.index("rms_norm_backward")
    x, g = torch.randn(16, 64, device="cuda"), torch.randn(16, 64, device="cuda")
    w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    _, mean, rstd = tops.layer_norm.default(x, [64], w, b, 1e-5)
    for stats in ((mean, rstd), (mean.view(16, 1), rstd.view(16, 1))):
        for weight, bias, mask in ((w, b, (True, True, True)), (w, None, [True, False, True]),
                                   (None, b, (True, True, False))):
            assert fast.call(ln, g, x, (64,), *stats, weight, bias, mask) is not None
            got = tessera.layer_norm_backward(g, x, (64,), *stats, weight, bias, mask)
            want = tops.layer_norm_backward.default(g, x, [64], mean, rstd, weight, bias, list(mask))
            assert len(got) == 3
            for p, q in zip(got, want):
                assert (p is None and q is None) or torch.equal(p, q), (weight is None, bias is None, mask)
    _, rstd = tops.rms_norm.default(x, [64], w, 1e-6)
    for r in (rstd, rstd.view(16, 1)):
        for weight, mask in ((w, (True, True)), (w, (False, True)), (None, (True, True))):
            assert fast.call(rms, g, x, 64, r, weight, mask, 0.0) is not None
            got = tessera.rms_norm_backward(g, x, 64, r, weight, mask)
            want = tops.rms_norm_backward.default(g, x, [64], rstd, weight, list(mask))
            assert len(got) == 2
            for p, q in zip(got, want):
                assert (p is None and q is None) or torch.equal(p, q), (weight is None, mask)
    # Not a call the shortcut takes: a mask of other objects, double tensors, float32 statistics
    # of another dtype.
    assert fast.call(ln, g, x, (64,), mean, rstd, w, b, (1, 1, 1)) is None
    assert fast.call(ln, g.double(), x.double(), (64,), mean, rstd, None, None, (True,) * 3) is None
    assert fast.call(ln, g, x, (64,), mean.double(), rstd, w, b, (True,) * 3) is None
    gi, gw, gb = tessera.layer_norm_backward(g, x, (64,), mean, rstd, w, b, (1, 1, 1))
    assert gi is not None and gw is not None and gb is not None
