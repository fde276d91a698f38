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
        return [((x(4, 8), [8], x(8), 1e-6), {}), ((x(2, 3, 4), [3, 4], None, 1e-6), {}),
                ((x(4, 8), [8], x(8), 1e-6, 1.0), {})]  # Gemma's weight offset
    if name == "layer_norm_backward":
        xi, w = x(4, 8, grad=False), x(8, grad=False)
        _, mean, rstd = torch.ops.tessera.layer_norm(xi, [8], w, None, 1e-5)
        return [((x(4, 8, grad=False), xi, [8], mean, rstd, w, x(8, grad=False), [True, True, True]), {}),
                ((x(4, 8, grad=False), xi, [8], mean, rstd, None, None, [True, True, False]), {})]
    if name == "rms_norm_backward":
        xi, w = x(4, 8, grad=False), x(8, grad=False)
        _, rstd = torch.ops.tessera.rms_norm(xi, [8], w, 1e-6)
        return [((x(4, 8, grad=False), xi, [8], rstd, w, [True, True]), {}),
                ((x(4, 8, grad=False), xi, [8], rstd, w, [True, True], 1.0), {})]
    if name == "add_layer_norm":
        return [((x(4, 8), x(4, 8), x(8), x(8), 1e-5), {}), ((x(2, 3, 4), x(2, 3, 4)), {})]
    if name == "add_rms_norm":
        return [((x(4, 8), x(4, 8), x(8), 1e-6), {}), ((x(2, 3, 4), x(2, 3, 4), None, 1e-6), {})]
    if name == "add_layer_norm_backward":
        xi, ri, w = x(4, 8, grad=False), x(4, 8, grad=False), x(8, grad=False)
        _, res, mean, rstd = torch.ops.tessera.add_layer_norm(xi, ri, w, None, 1e-5)
        return [((x(4, 8, grad=False), x(4, 8, grad=False), res, mean, rstd, w, x(8, grad=False),
                  [True, True, True]), {}),
                ((x(4, 8, grad=False), None, res, mean, rstd, None, x(8, grad=False), [True, False, True]), {})]
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
                ((x(16, 32), x(32, 256)), {"bias": x(256), "activation": "swiglu"}),
                ((x(16, 32), x(32, 256)), {"activation": "geglu"})]
    if name == "matmul.preactivation":  # called below autograd (by matmul's autograd kernel)
        return [((x(16, 32, grad=False), x(32, 24, grad=False)), {"bias": x(24, grad=False), "activation": "gelu"}),
                ((x(2, 16, 32, grad=False), x(32, 24, grad=False)),
                 {"residual": x(2, 16, 24, grad=False), "activation": "silu", "alpha": 0.5}),
                ((x(2, 16, 32, grad=False), x(32, 128, grad=False)), {"activation": "swiglu"})]
    if name.split(".")[0] in ("swiglu_backward", "geglu_blocks_backward"):  # gate and up in blocks of 64
        return [((x(4, 64, grad=False), x(4, 128, grad=False)), {}),
                ((x(2, 3, 128, grad=False), x(2, 3, 256, grad=False)), {})]
    if name == "mlp":  # input [..., K], w_in [N, K], w_out [D, N or N / 2]
        return [((x(16, 32), x(256, 32), x(24, 128)), {}),
                ((x(2, 5, 32), x(256, 32), x(24, 128)), {"activation": "swiglu"}),
                ((x(2, 5, 32), x(256, 32), x(24, 128)), {"activation": "geglu"}),
                ((x(2, 5, 32), x(48, 32), x(24, 48)), {"activation": "gelu"}),
                ((x(32), x(48, 32), x(24, 48)), {"activation": "relu"})]
    if name == "mlp.preactivation":  # called below autograd (by mlp's autograd kernel)
        return [((x(16, 32, grad=False), x(256, 32, grad=False), x(24, 128, grad=False)), {}),
                ((x(2, 5, 32, grad=False), x(48, 32, grad=False), x(24, 48, grad=False)), {"activation": "silu"})]
    if name == "grouped_mm":  # rows, columns, depth and batched forms; offs int32 on the device
        def offs(*ends):
            return torch.tensor(ends, device="cuda", dtype=torch.int32)
        return [((x(40, 32), x(3, 32, 24), offs(10, 10, 33)), {}),
                ((x(3, 16, 32), x(32, 40), offs(8, 30, 40)), {}),
                ((x(16, 40), x(40, 24), offs(0, 17, 40)), {"out_dtype": torch.float32}),
                ((x(2, 16, 32), x(2, 32, 24)), {})]
    if name.startswith("moe_"):  # rows [T, k] int32, a permutation of the T k pairs; weight float32
        rows = torch.randperm(5 * 3, device="cuda").to(torch.int32).view(5, 3)
        w = torch.rand(5, 3, device="cuda", requires_grad=not name.endswith("_backward"))
        tokens, pairs = x(5, 16), x(15, 16)
        if name == "moe_permute":
            return [((tokens, rows), {}), ((tokens, rows, w), {})]
        if name == "moe_unpermute":
            return [((pairs, rows, w), {}), ((pairs, rows), {})]
        grad = x(15, 16, grad=False) if name == "moe_permute_backward" else x(5, 16, grad=False)
        inp = x(5, 16, grad=False) if name == "moe_permute_backward" else x(15, 16, grad=False)
        return [((grad, inp, rows, w.detach()), {}), ((grad, inp, rows, None), {})]
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
    if name in ("jsd", "jsd.inplace"):  # no autograd: the post-training losses scale its gradient themselves
        t = torch.tensor([1, -100, 5, 0], device="cuda")
        if name == "jsd":
            return [((x(4, 10, grad=False), x(4, 10, grad=False)), {}),
                    ((x(4, 10, grad=False), x(4, 10, grad=False), t), {"beta": 0.0, "with_grad": True}),
                    ((x(4, 16, grad=False), x(4, 16, grad=False)), {"beta": 1.0, "temperature": 2.0,
                                                                    "with_grad": True})]
        return [((x(4, 10, grad=False), x(4, 10, grad=False), t), {"beta": 0.3}),
                ((x(4, 16, grad=False), x(4, 16, grad=False)), {"beta": 1.0, "temperature": 0.5})]
    if name == "linear_cross_entropy":
        t = torch.tensor([1, -100, 5, 0, 9], device="cuda")
        return [((x(5, 8), x(12, 8), None, t), {"chunk_rows": 2}),
                ((x(5, 8), x(12, 8), x(12), t.int()), {"reduction": "sum", "z_loss": 1e-3,
                                                        "output_mask": [True, True, True]}),
                ((x(5, 8), x(12, 8), None, t), {"reduction": "none", "output_mask": [True, False, False],
                                                 "grad_loss": torch.rand(5, device="cuda")}),
                ((x(5, 8), x(12, 8), None, t), {"chunk_rows": 2, "token_accuracy": True, "output_mask": [True, True, False],
                                                 "accum_dtype": torch.float32}),
                ((x(5, 8), x(12, 8), None, t.int()), {"predicted_tokens": True, "output_mask": [True, False, False]})]
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
