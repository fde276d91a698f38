"""tessera.dropout, tessera.dropout_backward, tessera.copy and the tessera.random generator.

CPU-side tests (any machine): the generator's state arithmetic and argument checks, the offset
increment, checks of p/seed/offset that raise before the library is called, the identity cases
(training=False, p=0) that never reach it, and the library's device errors.

GPU tests (the `torch` fixture): the same (seed, offset) gives the same mask on every call and for
any layout; get/set_rng_state replays; statistics over 2^24 elements (kept fraction within 4
sigma of 1-p, overall and per Philox lane; kept values exactly x/(1-p)); the Philox counter
contract (offset + i/4); gradients equal mask/(1-p) * grad; p=0, p=1, training=False, in-place.
"""

import math
import subprocess
import sys

import pytest

import tessera
from tessera import random as trandom

CPU_DEVICE_MSG = "expected a CUDA tensor, got a tensor on cpu"
DEV = "cuda"
U64 = (1 << 64) - 1


@pytest.fixture(autouse=True)
def keep_rng_state():
    """Tests reseed the process-wide generator; put it back after each."""
    state = trandom.get_rng_state()
    yield
    trandom.set_rng_state(state)


# ---- CPU side: the generator ------------------------------------------------------------------

def test_public_names():
    for name in ("dropout", "dropout_backward", "copy", "softmax", "log_softmax",
                 "softmax_backward", "log_softmax_backward", "layer_norm", "layer_norm_forward",
                 "layer_norm_backward", "rms_norm", "rms_norm_forward", "rms_norm_backward"):
        fn = getattr(tessera, name)
        assert callable(fn) and fn.__doc__, name
    for name in ("manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state"):
        assert callable(getattr(tessera.random, name)), name
    # Names that would shadow standard modules on `from tessera import *` stay out of __all__.
    assert "dropout" in tessera.__all__ and "layer_norm" in tessera.__all__
    assert "copy" not in tessera.__all__ and "random" not in tessera.__all__


def test_manual_seed_and_state_round_trip():
    trandom.manual_seed(1234)
    assert trandom.get_rng_state() == (1234, 0)
    assert trandom.initial_seed() == 1234
    trandom.set_rng_state((7, 99))
    assert trandom.get_rng_state() == (7, 99)
    trandom.manual_seed(5)  # rewinds the offset
    assert trandom.get_rng_state() == (5, 0)
    trandom.manual_seed(-1)  # negative seeds wrap, as torch.manual_seed's do
    assert trandom.get_rng_state() == (U64, 0)
    trandom.manual_seed(U64)
    assert trandom.get_rng_state() == (U64, 0)


def test_take_advances_the_offset_modulo_2_64():
    trandom.manual_seed(3)
    assert trandom._take(10) == (3, 0)
    assert trandom._take(1) == (3, 10)
    assert trandom.get_rng_state() == (3, 11)
    trandom.set_rng_state((3, U64 - 1))
    assert trandom._take(5) == (3, U64 - 1)
    assert trandom.get_rng_state() == (3, 3)


def test_seed_draws_a_new_seed():
    s = trandom.seed()
    assert 0 <= s <= U64
    assert trandom.get_rng_state() == (s, 0) and trandom.initial_seed() == s
    assert len({trandom.seed() for _ in range(4)}) == 4  # 64 random bits: no repeats


def test_first_seed_comes_from_os_urandom():
    code = "import tessera; print(*tessera.random.get_rng_state())"
    states = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True).stdout.split() for _ in range(2)]
    assert states[0][1] == "0" and states[1][1] == "0"
    assert states[0][0] != states[1][0]


@pytest.mark.parametrize("bad, exc", [(1.0, TypeError), ("1", TypeError), (None, TypeError),
                                      (True, TypeError), (1 << 64, ValueError),
                                      (-(1 << 63) - 1, ValueError)])
def test_bad_seeds(bad, exc):
    with pytest.raises(exc, match=r"tessera\.random\.manual_seed: argument 'seed'"):
        trandom.manual_seed(bad)


@pytest.mark.parametrize("bad, exc", [(5, TypeError), ((1, 2, 3), TypeError), ((1.5, 0), TypeError),
                                      ((1, -1), ValueError), ((1, 1 << 64), ValueError),
                                      ((1, 0.5), TypeError)])
def test_bad_states(bad, exc):
    trandom.manual_seed(11)
    with pytest.raises(exc, match=r"tessera\.random\.set_rng_state: argument 'state'"):
        trandom.set_rng_state(bad)
    assert trandom.get_rng_state() == (11, 0)  # unchanged


@pytest.mark.parametrize("n, counters", [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (1000, 250),
                                         ((1 << 31) + 1, (1 << 29) + 1),
                                         ((1 << 40) + 3, (1 << 38) + 1)])
def test_offset_increment_is_one_counter_per_four_elements(n, counters):
    assert tessera._C.dropout_offset_increment(n) == counters


def test_offset_increment_of_a_negative_size():
    with pytest.raises(ValueError, match=r"dropout_offset_increment: argument 'numel'"):
        tessera._C.dropout_offset_increment(-1)


# ---- CPU side: dropout's arguments ------------------------------------------------------------

@pytest.mark.parametrize("p", [-0.1, 1.5, math.nan, math.inf])
def test_p_out_of_range(np, p):
    x = np.ones(8, np.float32)
    for call in (lambda: tessera.dropout(x, p), lambda: tessera.dropout(x, p, training=False),
                 lambda: tessera.dropout(x, p, seed=1)):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == (f"tessera.dropout: argument 'p': expected a probability in "
                                f"[0, 1], got {p!r}")
    with pytest.raises(ValueError, match=r"tessera\.dropout_backward: argument 'p'"):
        tessera.dropout_backward(x, p, 1, 0)


@pytest.mark.parametrize("p", ["0.5", None, 1j])
def test_p_must_be_a_real_number(np, p):
    with pytest.raises(TypeError, match=r"tessera\.dropout: argument 'p': expected a real number"):
        tessera.dropout(np.ones(8, np.float32), p)


def test_seed_and_offset_checks(np):
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match=r"argument 'seed': expected an integer in \[0, 2\*\*64\)"):
        tessera.dropout(x, 0.5, seed=-1)
    with pytest.raises(ValueError, match=r"argument 'offset'.*got 18446744073709551616"):
        tessera.dropout(x, 0.5, seed=1, offset=1 << 64)
    with pytest.raises(TypeError, match=r"argument 'seed': expected an integer, got float"):
        tessera.dropout(x, 0.5, seed=1.0)
    with pytest.raises(ValueError, match=r"argument 'offset': expected 0 when seed is None"):
        tessera.dropout(x, 0.5, offset=4)
    with pytest.raises(TypeError, match=r"tessera\.dropout_backward: argument 'offset'"):
        tessera.dropout_backward(x, 0.5, 1, None)


def test_identity_cases_return_the_input(np):
    # As torch: training=False and p=0 return the input itself, without the library or the
    # generator (so this holds for CPU arrays too).
    x = np.ones((3, 5), np.float32)
    trandom.manual_seed(8)
    assert tessera.dropout(x, 0.5, training=False) is x
    assert tessera.dropout(x, 0.0) is x
    assert tessera.dropout(x, 0, inplace=True) is x
    assert trandom.get_rng_state() == (8, 0)


def test_cpu_array_gets_the_device_error_and_advances_the_generator(np):
    x = np.ones((3, 5), np.float32)
    trandom.manual_seed(8)
    with pytest.raises(ValueError) as e:
        tessera.dropout(x, 0.5)
    assert str(e.value) == f"tessera.dropout: argument 'input': {CPU_DEVICE_MSG}"
    assert trandom.get_rng_state() == (8, 4)  # ceil(15 / 4) counters taken
    with pytest.raises(ValueError, match=r"tessera\.dropout: argument 'input': " + CPU_DEVICE_MSG):
        tessera.dropout(x, 0.5, seed=3, offset=7)
    assert trandom.get_rng_state() == (8, 4)  # an explicit seed leaves the generator alone
    with pytest.raises(ValueError, match=r"tessera\.dropout_backward: argument 'grad_output': "
                                         + CPU_DEVICE_MSG):
        tessera.dropout_backward(x, 0.5, 3, 7)
    with pytest.raises(ValueError, match=r"tessera\.copy: argument 'src': " + CPU_DEVICE_MSG):
        tessera.copy(x, x)


def test_inplace_with_another_out(np):
    x, y = np.ones(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"tessera\.dropout: argument 'out'.*inplace=True"):
        tessera.dropout(x, 0.5, inplace=True, out=y)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch", reason="torch not installed")
    x = torch.ones(4, 4)
    assert tessera.dropout(x, 0.3, training=False) is x
    assert tessera.dropout(x, 0.0) is x
    e = torch.empty(0, 3)
    assert tessera.dropout(e, 0.3) is e  # no elements: the input itself, as torch
    y = tessera.dropout(x.requires_grad_(), 0.3)  # torch's own dropout, from torch's generator
    assert y.requires_grad and y.shape == x.shape
    with pytest.raises(ValueError, match=r"tessera\.dropout: argument 'input': " + CPU_DEVICE_MSG):
        tessera.dropout(x, 0.3, seed=1)  # a seed asks for tessera's masks
    with pytest.raises(RuntimeError, match=r"tessera\.copy: argument 'src'.*automatic diff"):
        tessera.copy(x, torch.empty(4, 4))
    with pytest.raises(ValueError, match=r"tessera\.copy: argument 'src': " + CPU_DEVICE_MSG):
        tessera.copy(x.detach(), torch.empty(4, 4))


# ---- GPU: helpers -----------------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16"]


def dt(torch, name):
    return getattr(torch, name)


def positive(torch, shape, dtype):
    """Inputs in [0.5, 1.5): never 0, so a 0 in the output marks a dropped element."""
    return (0.5 + torch.rand(shape, device=DEV)).to(dtype)


def kept_ok(torch, x, y, p):
    """Every output element is 0 or x/(1-p) as the kernel computes it (x times the float32 scale,
    rounded once to the output dtype)."""
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)
    expected = (x.float() * scale.to(x.device)).to(x.dtype)
    kept = y != 0
    assert torch.equal(y[kept], expected[kept])
    return kept


# ---- GPU: dropout -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_same_seed_same_mask(torch, dtype):
    x = positive(torch, (1000, 37), dt(torch, dtype))
    a = tessera.dropout(x, 0.3, seed=42, offset=5)
    assert a.dtype == x.dtype and a.shape == x.shape
    assert torch.equal(a, tessera.dropout(x, 0.3, seed=42, offset=5))
    assert not torch.equal(a, tessera.dropout(x, 0.3, seed=43, offset=5))
    assert not torch.equal(a, tessera.dropout(x, 0.3, seed=42, offset=6))
    kept_ok(torch, x, a, 0.3)


def test_mask_follows_the_row_major_index_whatever_the_strides(torch):
    base = positive(torch, (300, 500), torch.float32)
    for x in (base.t(), base[::3, 1::2], base.t()[7:200:2]):
        a = tessera.dropout(x, 0.5, seed=9, offset=3)
        assert torch.equal(a, tessera.dropout(x.contiguous(), 0.5, seed=9, offset=3))
    out = torch.empty(500, 300, device=DEV).t()  # a strided out
    assert tessera.dropout(base, 0.5, seed=9, out=out) is out
    assert torch.equal(out, tessera.dropout(base, 0.5, seed=9))


def test_philox_counter_is_offset_plus_index_over_4(torch):
    # Element i uses counter offset + i // 4, lane i % 4: dropping the first 4 * j elements and
    # adding j to the offset draws the same numbers for the rest.
    x = positive(torch, 4099, torch.float32)
    full = tessera.dropout(x, 0.5, seed=77, offset=10)
    for j in (1, 2, 25):
        tail = tessera.dropout(x[4 * j:], 0.5, seed=77, offset=10 + j)
        assert torch.equal(tail, full[4 * j:])


def test_generator_advances_and_replays(torch):
    x = positive(torch, (123, 45), torch.float32)  # 5535 elements: 1384 counters
    trandom.manual_seed(2024)
    state = trandom.get_rng_state()
    a = tessera.dropout(x, 0.4)
    assert trandom.get_rng_state() == (2024, 1384)
    b = tessera.dropout(x, 0.4)
    assert trandom.get_rng_state() == (2024, 2 * 1384)
    assert not torch.equal(a, b)
    assert torch.equal(a, tessera.dropout(x, 0.4, seed=2024, offset=0))
    assert torch.equal(b, tessera.dropout(x, 0.4, seed=2024, offset=1384))
    assert trandom.get_rng_state() == (2024, 2 * 1384)  # explicit seeds do not advance it
    trandom.set_rng_state(state)
    assert torch.equal(tessera.dropout(x, 0.4), a)
    assert torch.equal(tessera.dropout(x, 0.4), b)
    trandom.manual_seed(2024)
    assert torch.equal(tessera.dropout(x, 0.4), a)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", DTYPES)
def test_statistics(torch, dtype, p):
    n = 1 << 24
    x = positive(torch, n, dt(torch, dtype))
    y = tessera.dropout(x, p, seed=12345)
    kept = kept_ok(torch, x, y, p)
    sigma = math.sqrt(p * (1 - p) / n)
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) < 4 * sigma, f"kept {frac:.6f}, expected {1 - p} +- {4 * sigma:.2g}"
    # Each of the four numbers of a Philox block, and each half of the tensor, on its own.
    for part, m in [(f"lane {lane}", kept[lane::4]) for lane in range(4)] + \
                   [("first half", kept[:n // 2]), ("second half", kept[n // 2:])]:
        s = math.sqrt(p * (1 - p) / m.numel())
        f = m.double().mean().item()
        assert abs(f - (1 - p)) < 4 * s, f"{part}: kept {f:.6f}, expected {1 - p} +- {4 * s:.2g}"
    # Two seeds: independent masks, both kept with probability (1-p)^2.
    both = (kept & (tessera.dropout(x, p, seed=54321) != 0)).double().mean().item()
    q = (1 - p) ** 2
    assert abs(both - q) < 4 * math.sqrt(q * (1 - q) / n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_is_mask_over_keep_probability(torch, dtype):
    d = dt(torch, dtype)
    x = positive(torch, (257, 129), d).requires_grad_()
    g = torch.randn(x.shape, device=DEV).to(d)
    p = 0.25
    y = tessera.dropout(x, p, seed=31, offset=2)
    assert y.grad_fn is not None
    y.backward(g)
    mask = (y != 0).to(torch.float32)
    expected = (g.float() * mask * torch.tensor(1 / (1 - p), dtype=torch.float32)).to(d)
    assert torch.equal(x.grad, expected)
    assert torch.equal(tessera.dropout_backward(g, p, 31, 2), expected)
    # Unseeded: the backward reuses the (seed, offset) the forward took.
    x.grad = None
    trandom.manual_seed(4)
    y = tessera.dropout(x, p)
    y.sum().backward()  # an expanded (stride 0) gradient
    ones = torch.ones_like(g)
    assert torch.equal(x.grad, tessera.dropout_backward(ones, p, 4, 0))
    assert torch.equal((y != 0), (x.grad != 0))


def test_p_zero_one_training_false_and_empty(torch):
    x = positive(torch, (64, 33), torch.float32)
    trandom.manual_seed(1)
    assert tessera.dropout(x, 0.0) is x
    assert tessera.dropout(x, 0.7, training=False) is x
    e = torch.empty(0, 5, device=DEV)
    assert tessera.dropout(e, 0.5) is e
    assert trandom.get_rng_state() == (1, 0)  # none of these drew numbers
    z = tessera.dropout(x, 1.0)
    assert torch.equal(z, torch.zeros_like(x))
    xg = x.clone().requires_grad_()
    tessera.dropout(xg, 1.0).sum().backward()
    assert torch.equal(xg.grad, torch.zeros_like(x))
    xg.grad = None
    assert tessera.dropout(xg, 0.5, training=False) is xg  # gradients pass unchanged
    (tessera.dropout(xg, 0.0) * 2).sum().backward()
    assert torch.equal(xg.grad, torch.full_like(x, 2.0))
    out = torch.full_like(x, math.nan)
    assert tessera.dropout(x, 0.5, training=False, out=out) is out  # copied into out=
    assert torch.equal(out, x)


def test_inplace(torch):
    x = positive(torch, (100, 70), torch.float32)
    expected = tessera.dropout(x, 0.3, seed=5)
    y = x.clone()
    assert tessera.dropout(y, 0.3, inplace=True, seed=5) is y
    assert torch.equal(y, expected)
    leaf = x.clone().requires_grad_()
    h = leaf * 1.0  # in place on a non-leaf, under autograd
    r = tessera.dropout(h, 0.3, inplace=True, seed=5)
    assert r is h and torch.equal(h, expected)
    h.sum().backward()
    assert torch.equal(leaf.grad != 0, expected != 0)
    assert torch.equal(leaf.grad, tessera.dropout_backward(torch.ones_like(x), 0.3, 5, 0))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        tessera.dropout(leaf, 0.3, inplace=True, seed=5)
    assert torch.equal(leaf, x)  # refused before anything was written


def test_dropout_errors_on_the_gpu(torch):
    x = positive(torch, 100, torch.float32)
    with pytest.raises(TypeError, match=r"tessera\.dropout: argument 'input'.*got float64"):
        tessera.dropout(x.double(), 0.5, seed=1)
    with pytest.raises(ValueError, match=r"tessera\.dropout: argument 'out'.*shape"):
        tessera.dropout(x, 0.5, seed=1, out=torch.empty(99, device=DEV))
    with pytest.raises(RuntimeError, match=r"argument 'out'.*automatic differentiation"):
        tessera.dropout(x.clone().requires_grad_(), 0.5, out=torch.empty_like(x))
    with pytest.raises(TypeError, match=r"tessera\.dropout_backward: argument 'out'"):
        tessera.dropout_backward(x, 0.5, 1, 0, out=torch.empty(100, device=DEV, dtype=torch.half))


def test_device_array_and_copy(torch):
    x = positive(torch, (31, 17), torch.float32)
    arr = tessera.DeviceArray([31, 17], "float32", 0)
    torch.from_dlpack(arr).copy_(x)
    torch.cuda.synchronize()
    y = tessera.dropout(arr, 0.5, seed=3)
    assert isinstance(y, tessera.DeviceArray)
    g = tessera.dropout_backward(arr, 0.5, 3, 0)
    dst = tessera.DeviceArray([31, 17], "float32", 0)
    assert tessera.copy(y, dst) is dst
    torch.cuda.synchronize()
    expected = tessera.dropout(x, 0.5, seed=3)
    assert torch.equal(torch.from_dlpack(y), expected)
    assert torch.equal(torch.from_dlpack(g), expected)
    assert torch.equal(torch.from_dlpack(dst), expected)


def test_copy_between_layouts(torch):
    src = torch.randn(64, 96, device=DEV).to(torch.bfloat16)
    dst = torch.empty(96, 64, device=DEV, dtype=torch.bfloat16).t()
    assert tessera.copy(src, dst) is dst
    assert torch.equal(dst, src)
    dst2 = torch.empty(32, 48, device=DEV, dtype=torch.bfloat16)
    tessera.copy(src[::2, 1::2], dst2)
    assert torch.equal(dst2, src[::2, 1::2])
    with pytest.raises(ValueError, match=r"tessera\.copy: argument 'dst'.*shape"):
        tessera.copy(src, dst2)
    with pytest.raises(TypeError, match=r"tessera\.copy: argument 'dst'.*float32"):
        tessera.copy(src.float(), dst)
