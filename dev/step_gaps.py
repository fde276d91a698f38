#!/usr/bin/env python3
"""Where a Llama step's GPU sits idle: the gaps between consecutive kernels (and copies) in two
steps run back to back without a synchronisation, from torch.profiler's device timestamps, for
each run asked for (llama_step's runs and pieces).

    python3 dev/step_gaps.py --runs "torch compile,tessera compile" --tessera all,swiglu [--small]

Prints per run: the GPU span of the two steps, the kernels' busy time, the idle time split into
gaps under 10 us (launch-to-launch on a busy stream) and above, and the largest gaps with the
kernels either side.
"""
import argparse
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from llama_step import FULL, SMALL, build, parse_pieces  # noqa: E402


def gaps_of(run, c, pieces, data, top):
    compiled = run.endswith("compile")
    torch._dynamo.reset()
    model = build(c, pieces if run.startswith("tessera") else ())
    fn = torch.compile(model) if compiled else model

    def step():
        fn(*data).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        step()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy = sum(e - s for s, e, _ in spans)
    gaps = [(spans[i + 1][0] - spans[i][1], spans[i][2], spans[i + 1][2]) for i in range(len(spans) - 1)]
    small = sum(g for g, _, _ in gaps if 0 < g < 10)
    large = sorted((g for g in gaps if g[0] >= 10), reverse=True)
    print(f"\n== {run}: {len(spans)} kernels in 2 steps, span {(spans[-1][1] - spans[0][0]) / 1e3:.2f} ms, "
          f"busy {busy / 1e3:.2f} ms, gaps < 10 us {small / 1e3:.2f} ms, gaps >= 10 us "
          f"{sum(g for g, _, _ in large) / 1e3:.2f} ms ({len(large)})")
    for g, before, after in large[:top]:
        print(f"  {g:8.1f} us  after {before[:70]}  before {after[:70]}")
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="torch compile,tessera compile")
    ap.add_argument("--tessera", default="all,swiglu")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    c = SimpleNamespace(**(SMALL if args.small else FULL))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g).cuda()
    data = (tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1))
    for run in (r.strip().replace("-", " ") for r in args.runs.split(",")):
        gaps_of(run, c, parse_pieces(args.tessera), data, args.top)


if __name__ == "__main__":
    main()
