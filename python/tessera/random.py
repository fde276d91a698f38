"""The default generator of tessera's dropout: one (seed, offset) pair per process.

tessera's dropout draws its mask from a counter-based generator (Philox4x32-10): the numbers of a
call are a pure function of (seed, offset), so nothing but those two integers is state. A call to
:func:`tessera.dropout` without ``seed=`` takes the current pair and advances ``offset`` by the
counters it consumed (``ceil(numel / 4)``), so that no two calls share random numbers; a call with
``seed=`` given uses (seed, offset) as passed and leaves the generator alone.

    tessera.random.manual_seed(0)
    state = tessera.random.get_rng_state()
    a = tessera.dropout(x, 0.1)
    tessera.random.set_rng_state(state)
    b = tessera.dropout(x, 0.1)          # the same mask as a, bit for bit

The generator is shared by all devices and threads of the process; its first seed comes from
``os.urandom`` when it is first used (as torch seeds its default generator nondeterministically,
unless :func:`manual_seed` is called first). It is not torch's generator: ``torch.manual_seed``
does not seed it.
"""

from __future__ import annotations

import operator
import os
import threading

__all__ = ["manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state"]

_MASK = (1 << 64) - 1
_lock = threading.Lock()
_seed: int | None = None  # None until first use
_offset = 0
_initial_seed: int | None = None


def _as_uint64(value, fn: str, arg: str) -> int:
    """A Python integer as a 64-bit unsigned one. Negative values down to -2**63 wrap modulo 2**64,
    as torch.manual_seed accepts them."""
    if isinstance(value, bool):
        raise TypeError(f"tessera.random.{fn}: argument '{arg}': expected an integer, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"tessera.random.{fn}: argument '{arg}': expected an integer, "
                        f"got {type(value).__name__}") from None
    if not -(1 << 63) <= v <= _MASK:
        raise ValueError(f"tessera.random.{fn}: argument '{arg}': expected an integer in "
                         f"[-2**63, 2**64), got {v}")
    return v & _MASK


def _random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


def _reseed(value: int) -> None:
    global _seed, _offset, _initial_seed
    _seed, _offset, _initial_seed = value, 0, value


def manual_seed(seed: int) -> None:
    """Sets the seed and rewinds the offset to 0 (as ``torch.manual_seed`` does for its Philox
    generators). Accepts integers in [-2**63, 2**64); negative ones wrap modulo 2**64."""
    value = _as_uint64(seed, "manual_seed", "seed")
    with _lock:
        _reseed(value)


def seed() -> int:
    """Reseeds from ``os.urandom`` (offset 0) and returns the new seed, as ``torch.seed``."""
    value = _random_seed()
    with _lock:
        _reseed(value)
    return value


def initial_seed() -> int:
    """The seed last set by :func:`manual_seed` or :func:`seed` (or drawn at first use)."""
    with _lock:
        _ensure_seeded()
        return _initial_seed


def get_rng_state() -> tuple[int, int]:
    """The current ``(seed, offset)``: what the next unseeded dropout call will use."""
    with _lock:
        _ensure_seeded()
        return _seed, _offset


def set_rng_state(state: tuple[int, int]) -> None:
    """Restores a ``(seed, offset)`` pair from :func:`get_rng_state`, so that the calls after it
    repeat the numbers drawn after that ``get_rng_state``."""
    global _seed, _offset
    try:
        s, o = state
    except (TypeError, ValueError):
        raise TypeError("tessera.random.set_rng_state: argument 'state': expected a (seed, offset) "
                        f"pair from get_rng_state(), got {state!r}") from None
    s = _as_uint64(s, "set_rng_state", "state")
    o = _as_uint64(o, "set_rng_state", "state") if _is_int(o) and o >= 0 else _bad_offset(o)
    with _lock:
        _ensure_seeded()  # keeps initial_seed() meaningful
        _seed, _offset = s, o


def _is_int(v) -> bool:
    return not isinstance(v, bool) and hasattr(v, "__index__")


def _bad_offset(o):
    if _is_int(o):
        raise ValueError("tessera.random.set_rng_state: argument 'state': expected an offset in "
                         f"[0, 2**64), got {operator.index(o)}")
    raise TypeError("tessera.random.set_rng_state: argument 'state': expected an integer offset, "
                    f"got {type(o).__name__}")


def _ensure_seeded() -> None:  # with _lock held
    if _seed is None:
        _reseed(_random_seed())


def _take(increment: int) -> tuple[int, int]:
    """The (seed, offset) for a call that consumes ``increment`` Philox counters; advances the
    offset past them (modulo 2**64, where the counter space wraps)."""
    global _offset
    with _lock:
        _ensure_seeded()
        state = (_seed, _offset)
        _offset = (_offset + increment) & _MASK
        return state
