#!/usr/bin/env python3
"""Dropout against torch's, in one run, by one method.

    python benchmarks/dropout.py [--quick] [--ops LIST] [--dtypes LIST] [--stop-on-failure]
                                 [--out DIR]

  dropout      tessera.dropout(x, p, seed=, offset=, out=)    aten.native_dropout(x, p, True)
  dropout+bwd  the forward, then tessera.dropout_backward(dy, p, seed, offset, out=), as one call
               against aten.native_dropout, then aten.native_dropout_backward(dy, mask, 1/(1-p))
               (run when --ops selects dropout_backward; the default, or --ops dropout, does)

Sizes: the bench sizes of dropout's description (tessera.bench.ops) from 2^24 elements on, where
the kept-fraction statistics below are tight (--quick: the smallest of those, and p = 0.5 only);
dtypes --dtypes (default float32,bfloat16) where the description supports them; p = 0.5 and 0.1.
tessera regenerates the mask from (seed, offset) in the backward and never stores it; torch's
forward writes a one-byte mask that its backward reads. Bytes: both providers are credited with
what the descriptions say tessera must move (forward: dropout's; forward + backward: dropout's
plus dropout_backward's), so the GB/s ratio is the time ratio.

Correctness gate, before timing (the two generators differ, so outputs cannot be compared with
torch's): tessera's output, written over a NaN-filled buffer, must hold only 0 or x/(1-p) (within
an ulp or so: x times the float32 scale); the backward must be exactly 0 where the forward
dropped and dy/(1-p) where it kept; the kept fraction must be within 6 standard deviations of
1-p, overall and in each of 64 chunks. Warnings only (noted in the report): the same (seed,
offset) repeating the output bit for bit, another seed giving an independent mask, and an offset
of k shifting the mask by 4k elements (the documented counter layout). A failing case is reported
and left out; the run goes on (--stop-on-failure: it ends) and exits 1.

Output: the full table, CSV, JSON and SVGs in --out, the ratio table against torch and a last
table (with % of the copy bandwidth measured in the same run); also --out/summary.txt.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import torch

import tessera
from common import (DEVICE, Suite, add_selection_args, case, describe, dtype_name, dtypes_of,
                    fmt_size, resolve_selection)

aten = torch.ops.aten

OPS = ["dropout", "dropout_backward"]
MIN_SIZE = 1 << 24  # the smallest size whose kept fractions the gate bounds tightly
FULL_PS = [0.5, 0.1]
QUICK_PS = [0.5]
SEED = 0x5EED
CHUNKS = 64

# Kept values against x * float32(1/(1-p)): float32 within two ulps (x / (1-p) rounds differently
# from x * scale); bfloat16 within one bf16 ulp (2^-7 relative at most) of the rounded product.
# An exactness check of single elements, not the description's bound on the relative norm error.
VALUE_RTOL = {torch.float32: 2.5e-7, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def op_names(p):
    return f"dropout[p={p:g}]", f"dropout+bwd[p={p:g}]"


class GateFailure(Exception):
    pass


def gate(suite, dtype, n, p, x, dy, y, dx) -> None:
    """Checks tessera's dropout on x (and its backward on dy) by its own invariants; raises
    GateFailure on a broken one, notes the warnings."""
    what = f"dropout {dtype_name(dtype)} {fmt_size(n)} p={p:g}"
    scale = 1.0 / (1.0 - p)
    rtol = VALUE_RTOL[dtype]
    y.fill_(float("nan"))
    dx.fill_(float("nan"))
    tessera.dropout(x, p=p, training=True, seed=SEED, offset=0, out=y)
    tessera.dropout_backward(dy, p, SEED, 0, out=dx)
    torch.cuda.synchronize()

    xf, yf = x.float(), y.float()
    expect = (xf * scale).to(dtype).float()  # what x times the float32 scale rounds to
    kept = yf != 0  # a NaN (an element never written) counts as kept and fails the value test
    bad = kept & ~torch.isclose(yf, expect, rtol=rtol, atol=0.0)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise GateFailure(f"{what}: forward: {int(bad.sum())} element(s) neither 0 nor x/(1-p), "
                          f"first at {i}: x={xf[i].item():.6g} y={yf[i].item():.6g} "
                          f"(expected 0 or {expect[i].item():.6g})")

    # Backward: where x != 0 the forward tells kept from dropped; where x == 0 either is fine.
    dxf, dyf = dx.float(), dy.float()
    dexpect = (dyf * scale).to(dtype).float()
    as_kept = torch.isclose(dxf, dexpect, rtol=rtol, atol=0.0)
    as_dropped = dxf == 0
    known = xf != 0
    bad = torch.where(known, torch.where(kept, ~as_kept, ~as_dropped), ~(as_kept | as_dropped))
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise GateFailure(f"{what}: backward: {int(bad.sum())} element(s) disagree with the "
                          f"forward's mask, first at {i}: y={yf[i].item():.6g} "
                          f"dy={dyf[i].item():.6g} dx={dxf[i].item():.6g}")
    del dxf, dyf, dexpect, as_kept, as_dropped, known, bad, expect

    # Kept fractions, counted where x != 0 (where y tells kept from dropped).
    q = 1.0 - p
    known = (xf != 0).view(CHUNKS, -1)
    kept_known = (kept.view(CHUNKS, -1) & known).sum(1).double()
    count = known.sum(1).double()
    frac = (kept_known.sum() / count.sum()).item()
    sigma = math.sqrt(p * q / count.sum().item())
    if abs(frac - q) > 6 * sigma:
        raise GateFailure(f"{what}: kept fraction {frac:.6f}, expected {q:g} +- {6 * sigma:.2g}")
    chunk = kept_known / count
    sigma_c = torch.sqrt(p * q / count)
    worst = int(((chunk - q).abs() / sigma_c).argmax())
    if abs(chunk[worst].item() - q) > 6 * sigma_c[worst].item():
        raise GateFailure(f"{what}: chunk {worst} of {CHUNKS} keeps {chunk[worst].item():.6f}, "
                          f"expected {q:g} +- {6 * sigma_c[worst].item():.2g}")
    del known

    warnings = []
    y2 = torch.empty_like(y)
    tessera.dropout(x, p=p, training=True, seed=SEED, offset=0, out=y2)
    if not torch.equal(y2, y):
        warnings.append("the same seed and offset did not repeat the output bit for bit")
    tessera.dropout(x, p=p, training=True, seed=SEED + 1, offset=0, out=y2)
    differ = ((y2 != 0) != kept).float().mean().item()
    want = 2 * p * q  # two independent masks disagree on this fraction
    if abs(differ - want) > 6 * math.sqrt(want * (1 - want) / n) + 1e-3:
        warnings.append(f"seed+1 changed the mask on {differ:.4f} of the elements, not ~{want:g} "
                        "(independent masks)")
    k = 1000  # offset k: element i draws from counter k + i/4, as element i + 4k did at offset 0
    tessera.dropout(x, p=p, training=True, seed=SEED, offset=k, out=y2)
    shifted = (y2[: n - 4 * k] != 0) == kept[4 * k:]
    known = (x[: n - 4 * k] != 0) & (x[4 * k:] != 0)
    if not bool((shifted | ~known).all()):
        warnings.append(f"offset {k} did not shift the mask by {4 * k} elements (counter "
                        "offset + i/4 per element, as include/tessera/ops/elementwise.hpp says)")
    for w in warnings:
        print(f"  WARNING: {what}: {w}", flush=True)
        suite.note(f"{what}: WARNING: {w}")
    print(f"  gate passed: {what}: kept {frac:.5f} (expected {q:g})", flush=True)


def bench(suite, ops, dtype, n, p) -> None:
    fwd_op, both_op = op_names(p)
    # Normal samples drawn in float32 and rounded (so no exact zeros, where kept and dropped
    # would look alike).
    fwd = case(describe("dropout"), dtype, n)
    x = torch.randn(fwd.shapes[0], device=DEVICE).to(dtype)
    dy = torch.randn(fwd.shapes[0], device=DEVICE).to(dtype)
    y = torch.empty_like(x)
    dx = torch.empty_like(x)
    gate(suite, dtype, n, p, x, dy, y, dx)
    scale = 1.0 / (1.0 - p)

    def tessera_fwd():
        return tessera.dropout(x, p=p, training=True, seed=SEED, offset=0, out=y)

    def tessera_both():
        tessera.dropout(x, p=p, training=True, seed=SEED, offset=0, out=y)
        return tessera.dropout_backward(dy, p, SEED, 0, out=dx)

    def torch_fwd():
        return aten.native_dropout(x, p, True)

    def torch_both():
        _, mask = aten.native_dropout(x, p, True)
        return aten.native_dropout_backward(dy, mask, scale)

    # Different generators: no output comparison (reference=None); gate() checked tessera's.
    if "dropout" in ops:
        suite.run(fwd_op, dtype, n, fwd.bytes, {"tessera": tessera_fwd, "torch": torch_fwd},
                  reference=None, flops=fwd.flops)
    if "dropout_backward" in ops:
        bwd = case(describe("dropout_backward"), dtype, n)
        suite.run(both_op, dtype, n, fwd.bytes + bwd.bytes,
                  {"tessera": tessera_both, "torch": torch_both}, reference=None,
                  flops=fwd.flops + bwd.flops)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, OPS)
    p.add_argument("--stop-on-failure", action="store_true",
                   help="end the run at the first failing case (default: report it, go on)")
    p.add_argument("--out", default="report", type=Path,
                   help="directory for the CSV, JSON, SVG and summary files (default: ./report)")
    args = p.parse_args()
    resolve_selection(p, args, OPS)
    return args


def main() -> int:
    args = parse_args()
    torch.manual_seed(0)
    suite = Suite("benchmarks/dropout.py")
    suite.stop_on_failure = args.stop_on_failure
    suite.note("bytes: both providers credited with tessera's minimum, from the descriptions "
               "(forward: dropout's; forward + backward: dropout's plus dropout_backward's); torch "
               "also writes (forward) and reads (backward) a one-byte mask, so GB/s ratios are "
               "time ratios")
    suite.note("tessera: explicit seed and offset 0 on every call, out= preallocated; torch: "
               "aten.native_dropout(x, p, True) (what F.dropout runs in training on CUDA) and "
               "aten.native_dropout_backward(dy, mask, 1/(1-p)), outputs from the caching "
               "allocator; each 'dropout+bwd' row times forward and backward as one call")
    desc = describe("dropout")
    sizes = sorted(n for n in desc.bench_sizes if n >= MIN_SIZE)
    if args.quick:
        sizes = sizes[:1]
    ps = QUICK_PS if args.quick else FULL_PS
    t0 = time.time()
    for p in ps:
        for dtype in dtypes_of(desc, args.dtypes):
            for n in sizes:
                what = f"dropout {dtype_name(dtype)} {fmt_size(n)} p={p:g}"
                print(f"[{time.time() - t0:6.0f}s] {what}", flush=True)
                suite.attempt(what, lambda: bench(suite, args.ops, dtype, n, p))
                gc.collect()
                torch.cuda.empty_cache()
    failed = suite.finish(args.out, best_peer=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
