"""Sample calls of every torch op tessera registers (torch.ops.tessera.*), by overload name and
dtype: the inputs test_torch_ops.py runs opcheck and the fake kernels on."""

from tessera._C import op_descriptions


def overload(torch, name):
    """torch.ops.tessera's overload packet entry for 'op' or 'op.overload'."""
    base, _, over = name.partition(".")
    return getattr(getattr(torch.ops.tessera, base), over or "default")


def samples(torch, name, dtype):
    """(args, kwargs) calls of op `name` (an overload name as in test_torch_ops.schemas()) in `dtype`."""
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
    if name.split(".")[0] == "float8_quantize_gated":  # act(gate) * up: the granularities, both activations
        def pair(m, k):
            return x(m, k, grad=False), x(m, k, grad=False)
        return [(pair(32, 48), {}), (pair(16, 64), {"granularity": "tensor", "activation": "gelu_tanh"}),
                (pair(80, 144), {"granularity": "row", "activation": "silu"}), (pair(144, 272), {"granularity": "block"}),
                (pair(256, 128), {"granularity": "block2d", "activation": "gelu_tanh"})]
    if name.split(".")[0] == "float8_quantize":  # rows; per tensor; a partial tile (M, K multiples of 16); blocks
        return [((x(32, 48, grad=False),), {}), ((x(16, 64, grad=False),), {"granularity": "tensor"}),
                ((x(80, 144, grad=False),), {"granularity": "row"}), ((x(144, 272, grad=False),), {"granularity": "block"}),
                ((x(256, 128, grad=False),), {"granularity": "block2d"})]
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
