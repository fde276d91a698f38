"""tessera.isin against torch.isin: every path, dtypes, invert, scalars, empty inputs, duplicates,
NaN and signed zeros, non-contiguous elements, and the argument checks."""

import pytest

import tessera
from tessera.set import isin_path, isin_thresholds

PATHS = ["automatic", "brute_force", "sort", "hash"]
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]


def values(torch, n, dtype, span):
    d = getattr(torch, dtype)
    lo = 0 if dtype == "uint8" else -span // 2
    return torch.randint(lo, lo + span, (n,), device="cuda").to(d)


def span_for(dtype, n):
    return {"int8": 250, "uint8": 250, "int16": 60000, "float16": 4000, "bfloat16": 500}.get(dtype, 4 * n)


@pytest.mark.parametrize("path", PATHS + ["bitmap"])
@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES)
@pytest.mark.parametrize("m, n", [(1000, 1000), (100003, 777), (5000, 70000)])
@pytest.mark.parametrize("invert", [False, True])
def test_matches_torch(torch, path, dtype, m, n, invert):
    if path == "bitmap" and dtype not in ("int8", "int16", "uint8", "float16", "bfloat16"):
        with pytest.raises(ValueError, match="bitmap"):
            tessera.isin(values(torch, 4, dtype, 8), values(torch, 4, dtype, 8), path="bitmap")
        return
    span = span_for(dtype, max(m, n))
    e, t = values(torch, m, dtype, span), values(torch, n, dtype, span)
    got = tessera.isin(e, t, invert=invert, path=path)
    assert got.dtype == torch.bool and got.shape == e.shape
    assert torch.equal(got, torch.isin(e, t, invert=invert))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_nan_and_signed_zero(torch, path, dtype):
    d = getattr(torch, dtype)
    e = torch.tensor([float("nan"), 0.0, -0.0, 1.0, float("inf"), -float("inf"), 2.0], dtype=d, device="cuda")
    t = torch.tensor([float("nan"), -0.0, float("inf"), 3.0], dtype=d, device="cuda")
    want = torch.tensor([False, True, True, False, True, False, False], device="cuda")
    assert torch.equal(tessera.isin(e, t, path=path), want)
    assert torch.equal(tessera.isin(e, t, path=path), torch.isin(e, t))
    assert torch.equal(tessera.isin(e, t, path=path, invert=True), ~want)


@pytest.mark.parametrize("path", PATHS)
def test_integer_extremes(torch, path):
    # The all-ones key of each integer type is a real value (its maximum): it must still be found.
    for dtype, hi, lo in (("int32", 2**31 - 1, -2**31), ("int64", 2**63 - 1, -2**63), ("uint8", 255, 0)):
        d = getattr(torch, dtype)
        e = torch.tensor([hi, lo, 7, 0], dtype=d, device="cuda")
        t = torch.tensor([hi, 0], dtype=d, device="cuda")
        assert torch.equal(tessera.isin(e, t, path=path), torch.isin(e, t)), dtype


def test_scalars_and_promotion(torch):
    t = torch.tensor([1, 2, 3], device="cuda")
    assert tessera.isin(2, t).item() is True and tessera.isin(2, t).dim() == 0
    e = torch.tensor([[1, 5], [3, 4]], device="cuda")
    assert torch.equal(tessera.isin(e, 3), torch.isin(e, 3))
    assert torch.equal(tessera.isin(e, torch.tensor(5)), torch.isin(e, torch.tensor(5, device="cuda")))
    f = torch.tensor([1.0, 2.5], device="cuda")
    assert torch.equal(tessera.isin(f, t), torch.isin(f, t.float()))  # promoted to float32


def test_empty_and_non_contiguous(torch):
    t = torch.tensor([1, 2, 3], device="cuda")
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    assert tessera.isin(empty, t).shape == (0,)
    e = torch.tensor([1, 9], device="cuda")
    assert torch.equal(tessera.isin(e, empty), torch.tensor([False, False], device="cuda"))
    assert torch.equal(tessera.isin(e, empty, invert=True), torch.tensor([True, True], device="cuda"))
    big = torch.randint(0, 50, (300, 200), device="cuda")
    for view in (big.t(), big[:, ::3], big[::2]):
        for path in PATHS:
            assert torch.equal(tessera.isin(view, t, path=path), torch.isin(view, t)), path


def test_out_and_duplicates(torch):
    e = torch.randint(0, 10, (1000,), device="cuda", dtype=torch.int32)
    t = torch.tensor([3, 3, 3, 7, 7], device="cuda", dtype=torch.int32)
    out = torch.empty(1000, dtype=torch.bool, device="cuda")
    assert tessera.isin(e, t, out=out, assume_unique=False) is out
    assert torch.equal(out, torch.isin(e, t))


def test_errors(torch):
    e = torch.tensor([1, 2], device="cuda")
    assert torch.equal(tessera.isin(e.cpu(), e.cpu()), torch.isin(e.cpu(), e.cpu()))  # torch's
    with pytest.raises(ValueError, match="'elements'.*CUDA"):
        tessera.isin(e.cpu(), e, path="sort")  # a path is tessera's argument: its checks
    with pytest.raises(TypeError, match="two numbers"):
        tessera.isin(1, 2)
    with pytest.raises(TypeError, match="'out'.*bool"):
        tessera.isin(e, e, out=torch.empty(2, device="cuda"))
    with pytest.raises(ValueError, match="'path'"):
        tessera.isin(e, e, path="fast")


def test_dispatch_and_thresholds_without_gpu():
    # The dispatch is host code: this runs on CI.
    assert isin_path("int32", 1 << 10, 1 << 10) == "brute_force"
    assert isin_path("int16", 1 << 20, 1 << 20) == "bitmap"
    assert isin_path("int32", 1 << 24, 1 << 24) == "hash"
    saved = dict(isin_thresholds)
    try:
        isin_thresholds["brute_force_max_test"] = 0
        assert isin_path("int32", 1 << 10, 1 << 10) != "brute_force"
    finally:
        isin_thresholds.update(saved)
    with pytest.raises(ValueError, match="'path'"):
        tessera.isin([1], [1], path="nope")
