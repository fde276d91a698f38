#!/usr/bin/env python3
"""The host's cost of the float8 producers' calls: rms_norm_float8's autograd Function (with a
residual and the columns) and gated_grads on 16 x 1024 bfloat16 tensors, whose kernels take a few
microseconds, so that 1000 calls' wall time is the host's; through tessera._torch_fast's entries
and through the nanobind extension (_state.fast set to None), the median of 3 interleaved rounds.

    python dev/fp8_host_cost.py
"""
import time

import torch

import tessera  # noqa: F401  (loads the torch ops, which set _state.fast)
from tessera import _state
from tessera._float8_producers import gated_grads, norm_function


def main():
    x, r, d, g, u = (torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(5))
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    tessera.rms_norm(x, (1024,), w, 1e-6)  # the first torch call loads the ops
    fast = _state.fast
    calls = {"rms_norm_float8": lambda: norm_function().apply(x, r, w, 1e-6, 0.0, "row", True),
             "gated_grads": lambda: gated_grads("silu", d, g, u, "row")}
    for name, fn in calls.items():
        us = {"fast entry": [], "extension": []}
        for _ in range(3):
            for label, module in (("fast entry", fast), ("extension", None)):
                _state.fast = module
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(1000):
                    fn()
                torch.cuda.synchronize()
                us[label].append((time.perf_counter() - t0) * 1e3)  # ms per 1000 calls = us a call
        _state.fast = fast
        print(f"{name}: " + ", ".join(f"{k} {sorted(v)[1]:.1f} us a call" for k, v in us.items()))


if __name__ == "__main__":
    main()
