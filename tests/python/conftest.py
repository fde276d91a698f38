"""Shared fixtures. CPU-side tests run anywhere the package is installed; GPU tests ask for the
`torch` fixture (or the `gpu` marker) and skip, with the reason, where there is no usable GPU or
no PyTorch."""

import os

import pytest

import tessera


def gpu_skip_reason():
    if not tessera.is_available():
        return f"needs a CUDA GPU: {tessera.no_gpu_reason() or 'none usable'}"
    return None


@pytest.fixture
def torch():
    """PyTorch with a usable CUDA device, or a skip saying which is missing."""
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    torch = pytest.importorskip("torch", reason="GPU tests compare against PyTorch, not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (a CPU-only build of torch?)")
    torch.manual_seed(0)
    return torch


@pytest.fixture
def np():
    return pytest.importorskip("numpy", reason="the CPU-side checks build inputs with numpy")


@pytest.fixture
def torch_cpu():
    """torch with tessera's torch ops loaded, GPU or not. With TESSERA_REQUIRE_TORCH_OPS=1
    (scripts/test.sh, where it built them) a missing torch or torch library fails the test
    instead of skipping it."""
    required = os.environ.get("TESSERA_REQUIRE_TORCH_OPS") == "1"
    try:
        import torch
    except ImportError:
        if required:
            pytest.fail("TESSERA_REQUIRE_TORCH_OPS=1, but torch is not importable")
        pytest.skip("torch not installed")
    from tessera import _torch
    if _torch.ops is None:
        if required:
            pytest.fail("TESSERA_REQUIRE_TORCH_OPS=1, but tessera was built without its torch ops")
        pytest.skip("the wheel was built without torch (an isolated build): no torch ops")
    return torch


def pytest_collection_modifyitems(items):
    # Tests that take the torch fixture are GPU tests: mark them, so `-m "not gpu"` selects the rest.
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)
