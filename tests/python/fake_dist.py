"""Shared by the tests of DTensor sharding (test_sharding.py, test_distributed.py): a fake process
group of two ranks, CPU and "cuda" device meshes on it, and Run, which builds DTensors under
FakeTensorMode and counts the collectives a call issues. The fixtures are imported by name into
the test modules that use them. Also dispatch_log, which other tests use to see the ops a call
reaches."""

import pytest


def dispatch_log():
    """A TorchDispatchMode that records the name of every op it sees in `.seen`, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))
    return Log()


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


@pytest.fixture(scope="module")
def cuda_mesh(mesh):
    """A mesh of the device type "cuda" on the same fake process group: its DTensors (fake CUDA
    tensors) are what the public functions give the registered ops."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    try:
        with FakeTensorMode():
            torch.empty(1, device="cuda")
        return init_device_mesh("cuda", (2,))
    except Exception as e:  # a CPU-only build of torch
        pytest.skip(f"this torch makes no fake CUDA tensors or CUDA meshes: {e}")


class Run:
    """Builds DTensors and calls ops under FakeTensorMode, counting the op's own collectives."""

    def __init__(self, torch, mesh):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
        from torch.distributed.tensor.debug import CommDebugMode
        self.torch, self.mesh, self.DTensor = torch, mesh, DTensor
        self.Shard, self.R, self.distribute, self.comm = Shard, Replicate(), distribute_tensor, CommDebugMode
        self.P = Partial()
        self.mode = FakeTensorMode()
        self.ops = torch.ops.tessera

    def tensor(self, shape, placement, dtype=None, requires_grad=False):
        with self.mode:
            t = self.distribute(self.torch.randn(shape, dtype=dtype or self.torch.float32,
                                                 device=self.mesh.device_type), self.mesh, [placement])
        return t.requires_grad_() if requires_grad else t

    def ints(self, shape, high, placement):
        with self.mode:
            return self.distribute(self.torch.randint(0, high, shape, device=self.mesh.device_type), self.mesh,
                                   [placement])

    def call(self, op, *args, **kwargs):
        """(outputs as a tuple, collectives the call issued)."""
        with self.mode, self.comm() as c:
            out = op(*args, **kwargs)
        return (out if isinstance(out, tuple) else (out,)), c.get_total_counts()

    def traced(self, fn, *args, **kwargs):
        """(outputs as a tuple, collectives, the ops called on the DTensors themselves: what the
        public function handed to the dispatcher, before DTensor ran them on the shards)."""
        with self.mode, self.comm() as c, dispatch_log() as log:
            out = fn(*args, **kwargs)
        return (out if isinstance(out, tuple) else (out,)), c.get_total_counts(), log.seen


@pytest.fixture
def run(torch_cpu, mesh):
    from tessera import _sharding
    assert _sharding.register(torch_cpu), "this torch has no register_sharding"
    return Run(torch_cpu, mesh)


@pytest.fixture
def cuda_run(torch_cpu, cuda_mesh):
    from tessera import _sharding
    assert _sharding.register(torch_cpu), "this torch has no register_sharding"
    return Run(torch_cpu, cuda_mesh)


def placements(outs):
    return [tuple(o.placements) for o in outs]
