"""What test_rowwise.py and test_add_norm.py share: the tolerances (the row-wise ops'
descriptions'), the float64 comparison, and the GPU inputs and parameters they build."""

import tessera

CPU_DEVICE_MSG = "expected a CUDA tensor, got a tensor on cpu"
DEV = "cuda"

# Bounds on the relative norm error against float64, per dtype: the ops' descriptions, as
# `tessera verify` applies them (one bound per dtype for all the ops here, which
# test_rowwise.py's test_one_tolerance_per_dtype checks), for sums as long as the longest row
# the tests reduce (ROW_K).
ROW_K = 1 << 18
DESCRIPTIONS = tessera.bench.ops("softmax,log_softmax,layer_norm,rms_norm")
DTYPES = DESCRIPTIONS[0].dtypes
TOL = {d: DESCRIPTIONS[0].tolerance(d, k=ROW_K) for d in DTYPES}


def rel_err(out, ref):
    """Relative norm error; for a reference that is 0 up to rounding (the gradients of a
    1-element LayerNorm row), the absolute error over 1e-6."""
    out, ref = out.double(), ref.double()
    err = (out - ref).norm().item()
    return err / max(ref.norm().item(), 1e-6)


def assert_close(out, ref, dtype_name, what="result"):
    assert out is not None, f"{what}: None"
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not out.isnan().any(), f"{what}: NaN (an element not written?)"
    err = rel_err(out, ref)
    assert err <= TOL[dtype_name], f"{what}: relative norm error {err:.3g} > {TOL[dtype_name]}"


def dt(torch, name):
    return getattr(torch, name)


def randn(torch, shape, dtype, scale=1.0):
    return (scale * torch.randn(shape, device=DEV, dtype=torch.float32)).to(dtype)


def leaf(t):
    return t.detach().requires_grad_()


def ref_leaf(t):
    return None if t is None else t.detach().double().requires_grad_()


# The weight and bias combinations of the norms' tests: (with weight, with bias).
AFFINE = [(False, False), (True, False), (False, True), (True, True)]


def norm_params(torch, normalized, dtype, with_weight, with_bias):
    w = leaf(1.0 + 0.5 * randn(torch, normalized, dtype)) if with_weight else None
    b = leaf(0.5 * randn(torch, normalized, dtype)) if with_bias else None
    return w, b
