"""Where a call's host time goes, natively: dev/sampler/libsampler.so samples the process's stacks
(SIGPROF, every 200 us of CPU time) while one case runs in a loop, for tessera and for torch.

    python dev/sample_host.py [--cases ln_grad_x,rms_grad] [--seconds 4] [--out DIR]
"""
import argparse
import ctypes
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tessera

ROOT = Path(__file__).resolve().parent


def cases(dev):
    x = torch.randn(64, 256, device=dev, requires_grad=True)
    w = torch.randn(256, device=dev, requires_grad=True)
    b = torch.randn(256, device=dev, requires_grad=True)
    g = torch.randn(64, 256, device=dev)
    y = torch.randn(64, 256, device=dev)

    def grad_only(f, wrt):
        o = f()
        return lambda: torch.autograd.grad(o, wrt, g, retain_graph=True)

    def fb(f):
        return lambda: torch.autograd.backward(f(), g)
    return {
        "ln_grad_x": (grad_only(lambda: tessera.layer_norm(x, (256,), w, b), (x,)),
                      grad_only(lambda: F.layer_norm(x, (256,), w, b), (x,))),
        "rms_grad": (grad_only(lambda: tessera.rms_norm(x, (256,), w, 1e-6), (x, w)),
                     grad_only(lambda: F.rms_norm(x, (256,), w, 1e-6), (x, w))),
        "ln_fwd": (lambda: tessera.layer_norm(x, (256,), w, b), lambda: F.layer_norm(x, (256,), w, b)),
        "ln_fb": (fb(lambda: tessera.layer_norm(x, (256,), w, b)), fb(lambda: F.layer_norm(x, (256,), w, b))),
        "rms_fb": (fb(lambda: tessera.rms_norm(x, (256,), w, 1e-6)), fb(lambda: F.rms_norm(x, (256,), w, 1e-6))),
        "gelu_fb": (fb(lambda: tessera.gelu(x)), fb(lambda: F.gelu(x))),
        "add_fb": (fb(lambda: tessera.add(x, y)), fb(lambda: torch.add(x, y))),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="ln_grad_x,rms_grad")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default="/tmp/samples")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    lib = ctypes.CDLL(str(ROOT / "sampler" / "libsampler.so"))
    os.makedirs(a.out, exist_ok=True)
    all_cases = cases(a.device)
    for name in a.cases.split(","):
        for who, fn in zip(("tessera", "torch"), all_cases[name]):
            for _ in range(200):
                fn()
            torch.cuda.synchronize() if a.device == "cuda" else None
            calls, t0 = 0, time.perf_counter()
            lib.sampler_start(200)
            while time.perf_counter() - t0 < a.seconds:
                for _ in range(100):
                    fn()
                calls += 100
            n = lib.sampler_stop(f"{a.out}/{name}_{who}.txt".encode(), 60)
            us = (time.perf_counter() - t0) / calls * 1e6
            print(f"{name:10s} {who:8s} {us:8.2f} us per call, {n} samples -> {a.out}/{name}_{who}.txt")


if __name__ == "__main__":
    main()
