#!/usr/bin/env python3
"""The kernels of one Float8Linear forward + backward per recipe (torch.profiler), GPU us each, at
a Llama-3-8B projection's shape: which tier each GEMM took and what the quantization costs.

    python dev/fp8_kernels.py [--tokens 4096] [--in 4096] [--out 14336] [--recipes rowwise,blockwise]
"""
import argparse
from collections import defaultdict

import torch

import tessera.float8 as f8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--in", dest="inp", type=int, default=4096)
    ap.add_argument("--out", type=int, default=14336)
    ap.add_argument("--recipes", default="tensorwise,rowwise,blockwise")
    args = ap.parse_args()
    for recipe in args.recipes.split(","):
        lin = torch.nn.Linear(args.inp, args.out, bias=False, device="cuda", dtype=torch.bfloat16)
        f8.convert_to_float8_training(lin, recipe=recipe)
        x = torch.randn(args.tokens, args.inp, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(args.tokens, args.out, device="cuda", dtype=torch.bfloat16)

        def step():
            f8._last_x = None
            lin(x).backward(dy)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name[:110]] += e.device_time / 5
        total = sum(per.values())
        flops = 6 * args.tokens * args.inp * args.out
        print(f"== {recipe}: {total:.0f} us a step, {flops / total / 1e6:.0f} TFLOP/s over the GEMMs' FLOPs")
        for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"{us:9.1f} us  {name}")


if __name__ == "__main__":
    main()
