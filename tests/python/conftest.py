"""Shared fixtures. CPU-side tests run anywhere the package is installed; GPU tests ask for the
`torch` fixture (or the `gpu` marker) and skip, with the reason, where there is no usable GPU or
no PyTorch."""

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


def pytest_collection_modifyitems(items):
    # Tests that take the torch fixture are GPU tests: mark them, so `-m "not gpu"` selects the rest.
    for item in items:
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)
