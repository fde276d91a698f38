#!/usr/bin/env python3
"""The Llama-style model of benchmarks/llama_step.py, with tessera's pieces, tensor-parallel over
DTensor with torch's `parallelize_module`, checked against the same model unsharded.

    torchrun --standalone --nproc-per-node 2 examples/llama_tensor_parallel.py
    torchrun --standalone --nproc-per-node 2 examples/llama_tensor_parallel.py --small --tessera all,swiglu,linear
    # each run's figures as JSON, then the runs in DIR as one markdown table, DIR/llama_tensor_parallel.md
    torchrun --standalone --nproc-per-node 2 examples/llama_tensor_parallel.py --out DIR/all.json
    python examples/llama_tensor_parallel.py --table DIR

The plan is Megatron's, written with torch's parallel styles: in each block, the attention's q, k
and v projections column-wise (ColwiseParallel: each rank holds whole heads, whole GQA groups with
them) and its output projection row-wise (RowwiseParallel); the feed-forward's gate and up
column-wise (or the swiglu piece's interleaved w13 by rows, in whole 128-row gate/up blocks) and
its down projection row-wise. Each sublayer takes its input replicated and returns the all-reduced
sum of the ranks' partial outputs (PrepareModuleInputOutput), so the norms, the embedding and the
loss run on plain tensors. The model's functions are unchanged: tessera's public functions send
the DTensors to the registered ops, which run on the local shards by tessera's sharding rules.

Each rank builds the same model (same seed), keeps an unsharded copy as the reference, shards the
other, and runs one forward and backward of both on the same batch (--batch x --seq tokens). It
checks, on every rank:
  - the loss against the reference's (|difference| <= --loss-tol; the row-wise projections' partial
    sums are rounded to bf16 before the all-reduce, where the reference rounds the whole sum once);
  - every parameter's gradient (sharded ones gathered with full_tensor()) against the reference's:
    the norm of the difference over the reference's norm <= --grad-tol;
  - the collectives DTensor issued (CommDebugMode): 4 all-reduces per block (two sublayer outputs
    forward, two input gradients backward) and nothing else, so no rule gathered a shard;
  - under torch.profiler, the GPU kernels of a sharded step: tessera's ran on the rank.
Rank 0 prints each rank's figures (and writes them to --out as JSON) and exits with 1 where a
check failed on any rank.

CUDA only: torch's own attention on the CPU has no DTensor rule for heads-sharded inputs (its
flash kernel has none, its math form flattens batch and heads), so --tessera none needs GPUs too.
"""
import argparse
import copy
import glob
import json
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
sys.path.insert(0, HERE)
from llama_distributed import exit_now, markov_tokens, write_markdown  # noqa: E402
from llama_step import PIECES, add_shape_args, build, shape_and_pieces  # noqa: E402

LOSS_TOL = 2e-3   # |loss - reference's|
GRAD_TOL = 3e-2   # |grad - reference's| / |reference's|, per parameter


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n" + __doc__.split("\n\n")[1])
    ap.add_argument("--tessera", default="all",
                    help=f"pieces on tessera, as llama_step's: all, none, names of {','.join(PIECES)}, -name")
    ap.add_argument("--small", action="store_true", help="llama_step's small model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loss-tol", type=float, default=LOSS_TOL)
    ap.add_argument("--grad-tol", type=float, default=GRAD_TOL)
    add_shape_args(ap)
    ap.add_argument("--out", default=None, help="the JSON rank 0 writes: every rank's figures")
    ap.add_argument("--table", metavar="DIR", default=None,
                    help="write DIR/llama_tensor_parallel.md from the runs' JSONs in DIR; no run")
    args = ap.parse_args(argv)
    return shape_and_pieces(ap, args), args


def table(runs: list) -> str:
    """The runs (--out JSONs) as a markdown table, a row each."""
    lines = ["| pieces | loss \\|diff\\| | worst gradient (norm of difference / norm) | collectives | "
             "tessera kernels launched / all (per rank) | peak memory per rank (GiB) | checks |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in runs:
        ranks = r["ranks"]
        worst = max(ranks, key=lambda x: x["worst_grad"][1])["worst_grad"]
        comms = ", ".join(f"{n} {k}" for k, n in sorted(ranks[0]["comms"].items())) or "none"
        kernels = ", ".join(f"{x['tessera_kernels']} / {x['kernels']}" for x in ranks)
        peaks = ", ".join(f"{x['peak_gib']:.2f}" for x in ranks)
        problems = "; ".join(p for x in ranks for p in x["problems"]) or "ok"
        lines.append(f"| {r['pieces'] or 'none'} | {max(x['loss_diff'] for x in ranks):.2g} | "
                     f"{worst[1]:.3g} ({worst[0]}) | {comms} | {kernels} | {peaks} | {problems} |")
    return "\n".join(lines) + "\n"


def write_table(folder: str) -> int:
    """folder/llama_tensor_parallel.md from every run's JSON there, in file-name order."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        if "ranks" in run:
            runs.append(run)
    if not runs:
        print(f"llama_tensor_parallel --table: no run's JSON in {folder}", file=sys.stderr)
        return 2
    return write_markdown(os.path.join(folder, "llama_tensor_parallel.md"), table(runs))


def tp_plan(model, mesh):
    """Shards `model` in place (see the module's docstring); returns the number of blocks."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInputOutput,
                                                   RowwiseParallel, parallelize_module)

    def sublayer(n_inputs):  # replicated inputs in, the all-reduced output out as a plain tensor
        return PrepareModuleInputOutput(
            input_layouts=(Replicate(),) * n_inputs, desired_input_layouts=(Replicate(),) * n_inputs,
            use_local_input=False, output_layouts=(Partial(),),
            desired_output_layouts=(Replicate(),), use_local_output=True)

    for block in model.layers:
        plan = {"attention": sublayer(3),  # x, cos, sin
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward": sublayer(1), "feed_forward.w2": RowwiseParallel()}
        ff = block.feed_forward
        if hasattr(ff, "w13"):  # a parameter, not a Linear: rows in whole gate/up blocks
            ff.w13 = torch.nn.Parameter(distribute_tensor(ff.w13.data, mesh, [Shard(0)]))
        else:
            plan.update({"feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel()})
        parallelize_module(block, mesh, plan)
    return len(model.layers)


def grads(model) -> dict:
    """Every parameter's gradient, whole (a DTensor's gathered), in float32."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[name] = None if g is None else g.float()
    return out


def step(model, tokens, targets):
    loss = model(tokens, targets)
    loss.backward()
    return loss.detach().float()


def main(argv=None):
    c, args = parse_args(argv)
    if args.table:
        return write_table(args.table)
    if "RANK" not in os.environ:
        sys.exit("llama_tensor_parallel: runs under torchrun: torchrun --standalone --nproc-per-node 2 "
                 + " ".join(sys.argv))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if local >= torch.cuda.device_count():
        sys.exit(f"llama_tensor_parallel: local rank {local}, but {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    if c.heads % world or c.kv_heads % world or c.ffn % world or (c.ffn // world) % 64:
        sys.exit(f"llama_tensor_parallel: heads {c.heads}, kv heads {c.kv_heads} and ffn {c.ffn} "
                 f"must split over {world} ranks (ffn in whole blocks of 64 per rank)")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    mesh = init_device_mesh(device.type, (world,))

    data = markov_tokens(c.vocab, c.batch, c.seq + 1, args.seed + 1).to(device)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].reshape(-1)
    model = build(c, args.pieces, seed=args.seed, device=device)
    ref = copy.deepcopy(model)
    blocks = tp_plan(model, mesh)

    want_loss = step(ref, tokens, targets)
    want = grads(ref)
    del ref
    comm = CommDebugMode()
    with comm:
        loss = step(model, tokens, targets)
    got = grads(model)
    counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}

    problems = []
    loss_diff = abs(loss - want_loss).item()
    if not loss_diff <= args.loss_tol:
        problems.append(f"loss {loss.item():.5f} against {want_loss.item():.5f} unsharded")
    worst = ("", 0.0)
    for name, g in want.items():
        if (g is None) != (got[name] is None):
            problems.append(f"{name}: a gradient on one side only")
            continue
        if g is None:
            continue
        rel = ((got[name] - g).norm() / g.norm().clamp_min(1e-30)).item()
        if rel != rel or rel > worst[1]:  # NaN is the worst
            worst = (name, rel)
        if not rel <= args.grad_tol:
            problems.append(f"{name}: gradient off by {rel:.3g} of its norm")
    expected = {"all_reduce": 4 * blocks}
    if counts != expected:
        problems.append(f"collectives {counts}, expected {expected}")

    from torch.profiler import ProfilerActivity, profile
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, tokens, targets)
        torch.cuda.synchronize()
    kernels = [(e.key, e.count) for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    if args.pieces and not any("tessera" in k.lower() for k, _ in kernels):
        problems.append("no tessera kernel ran")
    ours = sum(n for k, n in kernels if "tessera" in k.lower())
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    mine = dict(rank=rank, loss=loss.item(), ref_loss=want_loss.item(), loss_diff=loss_diff,
                worst_grad=worst, comms=counts, tessera_kernels=ours,
                kernels=sum(n for _, n in kernels), peak_gib=peak, problems=problems,
                top=[k for k, _ in kernels if "tessera" in k.lower()][:6])
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    failed = False
    if rank == 0:
        print(f"llama_tensor_parallel: TP = {world}, {blocks} blocks, pieces "
              f"{','.join(args.pieces) or 'none'}, {c.batch} x {c.seq} tokens")
        for r in everyone:
            print(f"rank {r['rank']}: loss {r['loss']:.5f} (unsharded {r['ref_loss']:.5f}, "
                  f"|diff| {r['loss_diff']:.2e}); worst gradient {r['worst_grad'][0]} "
                  f"{r['worst_grad'][1]:.2e}; collectives {r['comms']}; tessera kernels "
                  f"{r['tessera_kernels']} of {r['kernels']} launched; peak {r['peak_gib']:.2f} GiB")
            for k in r["top"]:
                print(f"    {k[:110]}")
            for p in r["problems"]:
                print(f"  FAIL rank {r['rank']}: {p}")
                failed = True
        print("ok" if not failed else "FAILED")
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(dict(world_size=world, blocks=blocks, pieces=",".join(args.pieces),
                               tokens=c.batch * c.seq, ranks=everyone), f, indent=1)
    dist.barrier()  # every rank past its last collective before any leaves
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    exit_now(main())
