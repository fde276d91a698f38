"""DTensor sharding rules of tessera's torch ops, as the public functions meet them (tessera.rms_norm,
tessera.linear, ...), on a "cuda" mesh of fake CUDA tensors (no GPU needed): they take the
registered op for CUDA tensors only, CPU ones take torch's functions; and when the rules are
registered (once torch.distributed.tensor is imported). The rules op by op: test_sharding.py."""

import subprocess
import sys

import pytest
from fake_dist import cuda_mesh, cuda_run, mesh, placements, run  # noqa: F401 (fixtures)


# ---- the public functions: DTensors reach the registered ops -----------------------------------

def test_public_functions_take_the_registered_ops_on_dtensors(cuda_run):
    import tessera
    run = cuda_run
    S, R, P = run.Shard, run.R, run.P
    bf = run.torch.bfloat16
    x, g = run.tensor((8, 16), S(0), bf), run.tensor((8, 16), S(0), bf)
    w = run.tensor((16,), R, bf)
    q, k = run.tensor((2, 6, 4, 16), S(2), bf), run.tensor((2, 6, 2, 16), S(2), bf)
    angles = run.tensor((6, 8), R)
    target = run.ints((8,), 32, S(0))
    cases = [  # (call, the op it must reach, the first output's placements)
        (lambda: tessera.silu(x), "silu", S(0)),
        (lambda: tessera.gelu(x, "tanh"), "gelu", S(0)),
        (lambda: tessera.silu_backward(g, x), "silu_backward", S(0)),
        (lambda: tessera.gelu_backward(g, x), "gelu_backward", S(0)),
        (lambda: tessera.silu_mul(x, g), "silu_mul", S(0)),
        (lambda: tessera.softmax(x, -1), "softmax", S(0)),
        (lambda: tessera.log_softmax(x, -1), "log_softmax", S(0)),
        (lambda: tessera.softmax_backward(g, x, -1), "softmax_backward", S(0)),
        (lambda: tessera.add(x, g), "add.default", S(0)),
        (lambda: tessera.add(x, w), "add.default", S(0)),
        (lambda: tessera.add(x, 2.0), "add.Scalar", S(0)),
        (lambda: tessera.rms_norm(x, [16], w), "rms_norm", S(0)),
        (lambda: tessera.rms_norm_forward(x, 16, w), "rms_norm", S(0)),
        (lambda: tessera.layer_norm(x, [16], w, w), "layer_norm", S(0)),
        (lambda: tessera.layer_norm_forward(x, 16, w, w), "layer_norm", S(0)),
        (lambda: tessera.add_rms_norm(x, g, w), "add_rms_norm", S(0)),
        (lambda: tessera.add_layer_norm(x, g, w, w), "add_layer_norm", S(0)),
        (lambda: tessera.dropout(x, 0.1, seed=1), "dropout", R),  # tessera's mask: replicated
        (lambda: tessera.dropout_backward(g, 0.1, 1, 0), "dropout_backward", R),
        (lambda: tessera.linear(run.tensor((8, 16), R, bf), run.tensor((32, 16), S(0), bf)), "matmul", S(1)),
        (lambda: tessera.linear(run.tensor((8, 16), S(1), bf), run.tensor((32, 16), S(1), bf),
                                run.tensor((32,), R, bf)), "matmul", P),
        (lambda: tessera.matmul(run.tensor((2, 8, 16), S(0), bf), run.tensor((16, 32), R, bf), activation="gelu",
                                residual=run.tensor((2, 8, 32), S(0), bf)), "matmul", S(0)),
        (lambda: tessera.mlp(run.tensor((8, 16), R, bf), run.tensor((256, 16), S(0), bf),
                             run.tensor((16, 128), S(1), bf)), "mlp", P),
        (lambda: tessera.mlp(run.tensor((2, 8, 16), S(1), bf), run.tensor((96, 16), R, bf),
                             run.tensor((16, 96), R, bf), activation="silu"), "mlp", S(1)),
        (lambda: tessera.rotary_embedding(q, k, angles, angles), "rotary_embedding", S(2)),
        (lambda: tessera.flash_attention(q, k, k, causal=True), "attention", S(2)),
        (lambda: tessera.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2)),
         "attention", S(1)),
        (lambda: tessera.cross_entropy(run.tensor((8, 32), S(0), bf), target, reduction="sum"), "cross_entropy", P),
        (lambda: tessera.linear_cross_entropy(run.tensor((8, 16), S(0), bf), run.tensor((32, 16), R, bf), target,
                                              reduction="none"), "linear_cross_entropy", S(0)),
        (lambda: tessera.isin(run.ints((8, 16), 32, S(0)), run.ints((5,), 32, R)), "isin", S(0)),
    ]
    for fn, op, placement in cases:
        outs, _, seen = run.traced(fn)
        name = op if "." in op else op + ".default"
        assert f"tessera.{name}" in seen, (op, seen)
        assert isinstance(outs[0], run.DTensor) and outs[0].placements == (placement,), (op, outs[0].placements)


def test_public_functions_communicate_only_where_the_rule_gathers(cuda_run):
    import tessera
    run = cuda_run
    S, R = run.Shard, run.R
    x, w = run.tensor((8, 16), S(0)), run.tensor((16,), R)
    for fn in (lambda: tessera.rms_norm(x, [16], w), lambda: tessera.silu(x), lambda: tessera.softmax(x, -1)):
        outs, comms, _ = run.traced(fn)
        assert comms == 0 and outs[0].to_local().shape == (4, 16)
    outs, comms, _ = run.traced(lambda: tessera.softmax(x, 0))  # along the sharded rows: gathered
    assert comms > 0


def test_public_functions_place_keyword_tensors_as_the_rules_take_them(cuda_run):
    """The ops take matmul's bias and residual and attention's ALiBi slopes by keyword, which
    DTensor does not redistribute: tessera.matmul, tessera.linear and tessera.flash_attention
    split replicated ones where the operands are sharded (a local slice or division, no
    communication), so the operands need not move."""
    import tessera
    run = cuda_run
    S, R, P = run.Shard, run.R, run.P
    t = run.tensor
    cases = [  # (function, its arguments, the output's placement)
        (tessera.linear, (t((8, 16), R), t((32, 16), S(0)), t((32,), R)), {}, S(1)),  # column-parallel
        (tessera.matmul, (t((8, 16), R), t((16, 32), S(1))),
         dict(bias=t((32,), R), activation="gelu", residual=t((8, 32), R)), S(1)),
        (tessera.linear, (t((8, 16), R), t((256, 16), S(0)), t((256,), R)), dict(activation="swiglu"), S(1)),
        (tessera.linear, (t((8, 16), S(1)), t((32, 16), S(1)), t((32,), R)), {}, P),  # row-parallel
        (tessera.matmul, (t((2, 8, 16), S(2)), t((16, 32), S(0))), dict(bias=t((32,), R), residual=t((2, 8, 32), R)),
         P),
        (tessera.matmul, (t((8, 16), P), t((16, 32), R)), dict(bias=t((32,), R)), P),
        (tessera.matmul, (t((2, 8, 16), S(1)), t((16, 32), R)), dict(residual=t((2, 8, 32), R)), S(1)),  # rows
        (tessera.matmul, (t((2, 8, 16), S(0)), t((2, 16, 32), S(0))), dict(residual=t((2, 8, 32), R)), S(0)),  # batch
        (tessera.flash_attention, (t((2, 6, 4, 16), S(2)),) * 3, dict(alibi_slopes=t((4,), R)), S(2)),  # heads
        (tessera.flash_attention, (t((2, 6, 4, 16), S(2)),) * 3, dict(alibi_slopes=t((2, 4), R)), S(2)),
        (tessera.flash_attention, (t((2, 6, 4, 16), S(0)),) * 3, dict(alibi_slopes=t((2, 4), R)), S(0)),  # batch
    ]
    for fn, args, kwargs, placement in cases:
        outs, comms, _ = run.traced(fn, *args, **kwargs)
        assert outs[0].placements == (placement,) and comms == 0, (fn.__name__, outs[0].placements, comms)
    # swiglu whose column shards would split gate/up blocks: the bias stays replicated and the
    # weight is gathered (no error).
    outs, comms, _ = run.traced(tessera.linear, t((8, 16), R), t((128, 16), S(0)), t((128,), R), activation="swiglu")
    assert S(1) not in outs[0].placements and comms > 0


def test_dropout_of_a_dtensor_without_a_seed_is_torch_dropout(cuda_run, monkeypatch):
    """tessera's mask follows the global index, so its op runs replicated; without a seed a DTensor
    takes torch's dropout, which DTensor runs on the shards with its own generator."""
    import tessera
    run = cuda_run
    x = run.tensor((8, 16), run.Shard(0))
    calls = []
    monkeypatch.setattr(run.torch.nn.functional, "dropout",
                        lambda input, p=0.5, training=True, inplace=False: calls.append(input) or input)
    with run.mode:
        y = tessera.dropout(x, 0.1)
    assert calls == [x] and y is x


def test_cpu_dtensors_keep_torchs_functions(run):
    """A CPU DTensor is torch's to compute (tessera's kernels are CUDA ones), as a CPU tensor is."""
    import tessera
    x, w = run.tensor((8, 16), run.Shard(0)), run.tensor((16,), run.R)
    for fn in (lambda: tessera.silu(x), lambda: tessera.rms_norm(x, [16], w), lambda: tessera.add(x, x),
               lambda: tessera.linear(x, run.tensor((32, 16), run.R))):
        outs, _, seen = run.traced(fn)
        assert not any(s.startswith("tessera.") for s in seen), seen
        assert isinstance(outs[0], run.DTensor) and outs[0].placements == (run.Shard(0),)


def test_tensor_parallel_mlp_runs_tesseras_matmuls(cuda_run):
    """parallelize_module's column- and row-wise linears (nn.Linear subclasses calling
    tessera.linear): the forward runs tessera's matmul on the shards, with one all-reduce (the
    row-wise output's)."""
    import tessera
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    run = cuda_run

    class Linear(nn.Linear):
        def __init__(self, *args, activation=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.activation = activation

        def forward(self, x):
            return tessera.linear(x, self.weight, self.bias, activation=self.activation)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = Linear(16, 256, bias=False, activation="swiglu", device="cuda")
            self.down = Linear(128, 16, device="cuda")

        def forward(self, x):
            return self.down(self.up(x))

    with run.mode:
        model = parallelize_module(MLP(), run.mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        x = run.torch.randn(2, 8, 16, device="cuda")
    assert model.up.weight.placements == (run.Shard(0),) and model.down.weight.placements == (run.Shard(1),)
    (y,), comms, seen = run.traced(model, x)
    # The parameters require grad: the swiglu product's autograd keeps the product (preactivation).
    assert [s for s in seen if s.startswith("tessera.")] == ["tessera.matmul.preactivation", "tessera.matmul.default"]
    assert comms == 1
    assert y.shape == (2, 8, 16)


def test_rules_wait_for_torch_distributed_tensor():
    """Importing tessera (and torch) does not import torch.distributed.tensor; importing it
    registers the rules."""
    pytest.importorskip("torch", reason="torch not installed")
    code = ("import sys, torch, tessera\n"
            "from tessera import _torch, _sharding\n"
            "if _torch.ops is None: sys.exit(3)\n"
            "assert 'torch.distributed.tensor' not in sys.modules\n"
            "assert not _sharding._done\n"
            "import torch.distributed.tensor\n"
            "assert _sharding._done\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip("built without the torch ops")
    assert r.returncode == 0, r.stderr[-2000:]
