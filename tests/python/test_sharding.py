"""DTensor sharding rules of tessera's torch ops (tessera/_sharding.py), on a CPU: a fake process
group of two ranks, a CPU device mesh, and DTensors made under FakeTensorMode, so that each op's
fake kernel runs on the local shard. Each test checks the placements DTensor chose from the rule,
the local shapes, and whether the op itself communicated."""

import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def mesh():
    torch = pytest.importorskip("torch", reason="torch not installed")
    dist = pytest.importorskip("torch.distributed", reason="torch without torch.distributed")
    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield init_device_mesh("cpu", (2,))
    if created:
        dist.destroy_process_group()
    del torch


class Run:
    """Builds DTensors and calls ops under FakeTensorMode, counting the op's own collectives."""

    def __init__(self, torch, mesh):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.debug import CommDebugMode
        self.torch, self.mesh, self.DTensor = torch, mesh, DTensor
        self.Shard, self.R, self.distribute, self.comm = Shard, Replicate(), distribute_tensor, CommDebugMode
        self.mode = FakeTensorMode()

    def tensor(self, shape, placement, dtype=None):
        with self.mode:
            return self.distribute(self.torch.randn(*shape, dtype=dtype or self.torch.float32), self.mesh, [placement])

    def call(self, op, *args, **kwargs):
        """(outputs as a tuple, collectives the call issued)."""
        with self.mode, self.comm() as c:
            out = op(*args, **kwargs)
        return (out if isinstance(out, tuple) else (out,)), c.get_total_counts()


@pytest.fixture
def run(torch_cpu, mesh):
    from tessera import _sharding
    assert _sharding.register(torch_cpu), "this torch has no register_sharding"
    return Run(torch_cpu, mesh)


def placements(outs):
    return [tuple(o.placements) for o in outs]


def test_elementwise_ops_keep_any_sharding(run):
    ops = run.torch.ops.tessera
    for d in (0, 1):
        x = run.tensor((8, 16), run.Shard(d))
        (y,), comms = run.call(ops.silu.default, x)
        assert placements([y]) == [(run.Shard(d),)] and comms == 0
        assert y.shape == (8, 16) and y.to_local().shape == ((4, 16) if d == 0 else (8, 8))
        (z,), comms = run.call(ops.silu_mul.default, x, run.tensor((8, 16), run.Shard(d)))
        assert placements([z]) == [(run.Shard(d),)] and comms == 0


def test_softmax_shards_rows_and_gathers_its_own_dimension(run):
    ops = run.torch.ops.tessera
    (y,), comms = run.call(ops.softmax.default, run.tensor((8, 16), run.Shard(0)), -1)
    assert placements([y]) == [(run.Shard(0),)] and comms == 0
    (y,), comms = run.call(ops.softmax.default, run.tensor((8, 16), run.Shard(1)), -1)
    assert run.Shard(1) not in y.placements and comms > 0  # redistributed: rows stay whole
    assert y.shape == (8, 16)


def test_norms_shard_rows_and_sum_parameter_gradients(run):
    ops = run.torch.ops.tessera
    from torch.distributed.tensor import Partial
    x, w = run.tensor((8, 16), run.Shard(0)), run.tensor((16,), run.R)
    (out, rstd), comms = run.call(ops.rms_norm.default, x, [16], w, 1e-6)
    assert placements([out, rstd]) == [(run.Shard(0),)] * 2 and comms == 0
    assert out.to_local().shape == (4, 16) and rstd.shape == (8,)
    g = run.tensor((8, 16), run.Shard(0))
    (gi, gw), comms = run.call(ops.rms_norm_backward.default, g, x, [16], rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    (out, mean, rstd), comms = run.call(ops.layer_norm.default, x, [16], w, w, 1e-5)
    assert placements([out, mean, rstd]) == [(run.Shard(0),)] * 3 and comms == 0
    # Sharded along the normalized dimension: gathered first.
    (out, _), comms = run.call(ops.rms_norm.default, run.tensor((8, 16), run.Shard(1)), [16], w, 1e-6)
    assert run.Shard(1) not in out.placements and comms > 0


def test_add_norms_shard_rows_and_sum_parameter_gradients(run):
    ops = run.torch.ops.tessera
    from torch.distributed.tensor import Partial
    x, r = run.tensor((8, 16), run.Shard(0)), run.tensor((8, 16), run.Shard(0))
    w = run.tensor((16,), run.R)
    (out, res, rstd), comms = run.call(ops.add_rms_norm.default, x, r, w, 1e-6)
    assert placements([out, res, rstd]) == [(run.Shard(0),)] * 3 and comms == 0
    assert res.to_local().shape == (4, 16) and rstd.shape == (8,)
    g = run.tensor((8, 16), run.Shard(0))
    (gi, gw), comms = run.call(ops.add_rms_norm_backward.default, g, g, res, rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    (gi, gw), comms = run.call(ops.add_rms_norm_backward.default, g, None, res, rstd, w, [True, True])
    assert placements([gi, gw]) == [(run.Shard(0),), (Partial(),)] and comms == 0
    outs, comms = run.call(ops.add_layer_norm.default, x, r, w, w, 1e-5)
    assert placements(outs) == [(run.Shard(0),)] * 4 and comms == 0
    _, res, mean, rstd = outs
    outs, comms = run.call(ops.add_layer_norm_backward.default, g, g, res, mean, rstd, w, [True, True, True])
    assert placements(outs) == [(run.Shard(0),), (Partial(),), (Partial(),)] and comms == 0
    # The residual sharded along the normalized dimension: gathered first.
    (out, res, _), comms = run.call(ops.add_rms_norm.default, x, run.tensor((8, 16), run.Shard(1)), w, 1e-6)
    assert run.Shard(1) not in res.placements and comms > 0


def test_dropout_does_not_run_sharded(run):
    (y,), comms = run.call(run.torch.ops.tessera.dropout.default, run.tensor((8, 16), run.Shard(0)), 0.1, 7, 0)
    assert placements([y]) == [(run.R,)] and comms > 0


def test_rotary_and_attention_shard_by_heads(run):
    ops = run.torch.ops.tessera
    q, k = run.tensor((2, 6, 4, 16), run.Shard(2)), run.tensor((2, 6, 2, 16), run.Shard(2))
    angles = run.tensor((6, 8), run.R)
    outs, comms = run.call(ops.rotary_embedding.default, q, k, angles, angles)
    assert placements(outs) == [(run.Shard(2),)] * 2 and comms == 0
    assert outs[0].to_local().shape == (2, 6, 2, 16) and outs[1].to_local().shape == (2, 6, 1, 16)
    v = run.tensor((2, 6, 2, 16), run.Shard(2))
    (out, lse), comms = run.call(ops.attention.default, q, k, v, causal=True)
    assert placements([out, lse]) == [(run.Shard(2),), (run.Shard(1),)] and comms == 0
    assert out.shape == (2, 6, 4, 16) and lse.shape == (2, 4, 6)


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
