#!/usr/bin/env python3
"""The Llama-style model of benchmarks/llama_step.py, with tessera's pieces, trained data-parallel
under torch.distributed: DDP or FSDP2, launched with torchrun, its loss curve checked against one
GPU's on the same global batch.

    # the reference: one GPU, the whole global batch
    python examples/llama_distributed.py --mode single --steps 20 --out report/dist/single.json
    # 2 GPUs, each rank its half of the same global batches, compared with the reference
    torchrun --standalone --nproc-per-node 2 examples/llama_distributed.py --mode ddp \\
        --steps 20 --out report/dist/ddp.json --compare report/dist/single.json
    torchrun --standalone --nproc-per-node 2 examples/llama_distributed.py --mode fsdp2 \\
        --steps 20 --out report/dist/fsdp2.json --compare report/dist/single.json
    # the three as one markdown table, report/dist/llama_distributed.md
    python examples/llama_distributed.py --table report/dist

Add --small for a quick check (llama_step's small model), --tessera none for torch's functions
alone (llama_step's syntax: all, none, all,linear, all,-add_norm, rope,loss, ...), --batch for
the global batch (a multiple of the world size; default llama_step's 2). Every run of one
comparison must have the same model, pieces, --batch, --steps, --seed, --optim and --lr (--compare
refuses a reference that differs). The plumbing runs on CPU too, with torch's functions and the
gloo backend (tessera's ops need CUDA; slow, so a tiny model):

    torchrun --standalone --nproc-per-node 2 examples/llama_distributed.py --mode fsdp2 \\
        --device cpu --tessera none --small --layers 1 --seq 64 --steps 3

Modes; the same precision in all three, mixed precision with float32 master weights:
  single  no process group (world size 1): the model in bf16, as llama_step builds it, with
          float32 master copies of its parameters that the optimizer steps (each step copies
          the gradients into the masters and the updated masters, rounded, back into the model);
  ddp     the same, the bf16 model wrapped in DistributedDataParallel, with a communication hook
          that all-reduces the gradients in float32 (--ddp-reduce bf16: DDP's own, in bf16);
  fsdp2   float32 parameters, fully_shard on each decoder block and on the root with
          MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32): float32 master
          parameters sharded over the ranks, all-gathered in bf16 for the compute, gradients
          reduce-scattered in float32; the optimizer steps the float32 shards.
So the three differ only in how the global batch is split: the forward's GEMMs see fewer rows,
and a gradient is each rank's bf16 partial sum, added in float32, where one GPU rounds the whole
sum once.

Data: sequences of a random Markov chain (every token has four equally likely successors), made
on the CPU from --seed, so every rank and every run sees the same global batches; the loss falls
from ln(vocab). Step i's global batch is rows [i * batch, (i + 1) * batch) of it, rank r takes
rows [r * batch / world, (r + 1) * batch / world) of that (local_rows). The loss reported per step
is the mean over the global batch (the ranks' means averaged: equal slices). A step is forward,
backward, optimizer step (AdamW by default, --optim sgd: plain SGD), zero_grad.

On rank 0 it prints each step's loss and time, then tokens/s (global tokens over the median wall
time of the steps after --warmup, each step timed between device synchronisations) and each
rank's peak memory, and writes --out (JSON: per-step losses and times, tokens/s, world size,
mode, the configuration). Under ddp it also checks that every rank holds the same parameters.

--compare REF.json prints the largest |loss - reference| over the steps and the ratio of
tokens/s (the scaling over the reference run: the same global batch, so 2 GPUs give 2x at best),
and exits with 1 where the configurations differ or the losses differ beyond bf16 noise (see
compare()): the first step's by more than STEP0_TOL = 1e-3 (the same weights and tokens, only
the batch's split over GEMMs differs: a float32 mean over batch x seq tokens moves by ~1e-5; a
rank that took the wrong rows moves it by ~1e-2 to 1e-1), any step's by more than LOSS_TOL =
0.02 (after updates the ranks' partial sums of the gradients, rounded to bf16 apart, move the
weights by ~2^-9 of an update per step). Measured with the small model on the CPU (seq 128,
global batch 4, 20 steps, ddp and fsdp2 against single): at most 2.4e-4 with either optimizer,
0 at step 0; against that, the bugs the check is for: a gradient summed over the ranks instead of
averaged moves SGD's curve by 0.2 by step 20 (AdamW does not see a gradient's scale: --optim sgd
is the sharper check), a rank taking another rank's rows moves step 0 by 0.07, an AdamW learning
rate 10% off moves step 20 by 0.02. The 0.02 is also llama_step's bound between two bf16
implementations. --tol and --step0-tol override them; --min-scaling X also fails a tokens/s ratio
below X.

Scaling: under ddp every rank steps the optimizer over all the parameters (fsdp2: its shard), a
cost that does not shrink with the batch per rank; a larger --batch (8 on 80 GB GPUs for the full
model) brings tokens/s closer to world-size times the reference's.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import tessera  # noqa: E402
from llama_step import FULL, PIECES, SMALL, add_shape_args, build, shape_and_pieces  # noqa: E402

MODES = ("single", "ddp", "fsdp2")
STEP0_TOL = 1e-3  # the first step's |loss - reference|: same weights, same tokens
LOSS_TOL = 0.02   # any step's (the module's docstring says why these)
# What must be equal for two runs' losses to be comparable.
SAME = ("model", "pieces", "global_batch", "steps", "seed", "optim", "lr")


# ---- pure Python: the batch split and the comparison (tested on CPU) ----------------------------

def local_rows(global_batch: int, rank: int, world: int) -> slice:
    """The rows of a global batch that `rank` of `world` takes: equal contiguous slices, in rank
    order, so that the ranks' means average to the global batch's mean."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of a world of {world}")
    if global_batch % world:
        raise ValueError(f"the global batch ({global_batch}) must be a multiple of the world size ({world})")
    n = global_batch // world
    return slice(rank * n, (rank + 1) * n)


def compare(run: dict, ref: dict, tol: float = LOSS_TOL, step0_tol: float = STEP0_TOL,
            min_scaling: float | None = None) -> dict:
    """A run's losses against a reference's (both --out JSONs): max_diff (the largest |loss -
    reference| over the steps; inf where either is not finite), at_step, step0_diff, scaling
    (tokens/s over the reference's; None without both), problems (why it fails: the
    configurations differ, a loss beyond its tolerance, scaling below min_scaling) and ok."""
    problems = [f"{k} differs: {run.get(k)!r} here, {ref.get(k)!r} in the reference"
                for k in SAME if run.get(k) != ref.get(k)]
    a, b = run.get("losses") or [], ref.get("losses") or []
    if len(a) != len(b) or not a:
        problems.append(f"{len(a)} losses here, {len(b)} in the reference")
    diffs = [abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf for x, y in zip(a, b)]
    max_diff = max(diffs, default=math.inf)
    at_step = diffs.index(max_diff) if diffs else None
    step0 = diffs[0] if diffs else math.inf
    if step0 > step0_tol:
        problems.append(f"step 0's loss differs by {step0:.3g} (tolerance {step0_tol:g})")
    if max_diff > tol:
        problems.append(f"step {at_step}'s loss differs by {max_diff:.3g} (tolerance {tol:g})")
    tps, ref_tps = run.get("tokens_per_s"), ref.get("tokens_per_s")
    scaling = tps / ref_tps if tps and ref_tps else None
    if min_scaling is not None and (scaling is None or scaling < min_scaling):
        problems.append(f"tokens/s {'unknown' if scaling is None else f'{scaling:.2f}x'} the "
                        f"reference's, below {min_scaling:g}x")
    return dict(max_diff=max_diff, at_step=at_step, step0_diff=step0, scaling=scaling,
                problems=problems, ok=not problems)


def table(runs: list) -> str:
    """The runs (--out JSONs; the first, the one-GPU run, is the reference) as a markdown table."""
    ref = runs[0]
    lines = ["| run | GPUs | step (ms) | tokens/s | vs 1 GPU | peak memory per rank (GiB) | max \\|loss - 1 GPU's\\| |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        c = compare(r, ref)
        step = statistics.median(r["step_ms"][r["warmup"]:])
        peaks = r["peak_gib_per_rank"]
        peak = "n/a" if peaks[0] is None else ", ".join(f"{p:.2f}" for p in peaks)
        diff = "-" if r is ref else f"{c['max_diff']:.2g} (step 0: {c['step0_diff']:.2g})"
        scaling = "n/a" if c["scaling"] is None else f"{c['scaling']:.2f}x"
        lines.append(f"| {r['mode']} ({r['precision']}) | {r['world_size']} | {step:.0f} | "
                     f"{r['tokens_per_s']:,.0f} | {scaling} | {peak} | {diff} |")
    return "\n".join(lines) + "\n"


def write_table(folder: str) -> int:
    """folder/llama_distributed.md from the runs' JSONs there (single, ddp, fsdp2: those present)."""
    runs = []
    for mode in MODES:
        path = os.path.join(folder, f"{mode}.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                runs.append(json.load(f))
    if not runs or runs[0]["mode"] != "single":
        print(f"llama_distributed --table: no single.json in {folder} (the reference)", file=sys.stderr)
        return 2
    return write_markdown(os.path.join(folder, "llama_distributed.md"), table(runs))


def write_markdown(path: str, text: str) -> int:
    """Writes a --table's markdown and says where; 0, the exit status."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}")
    return 0


# ---- arguments ----------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n" + __doc__.split("\n\n")[1] + "\n\nThe module's "
                                        "docstring says what each mode does and how runs are compared.")
    ap.add_argument("--mode", choices=MODES, default="single",
                    help="single: one process, the reference; ddp, fsdp2: under torchrun")
    ap.add_argument("--tessera", default="all",
                    help=f"pieces on tessera, as llama_step's: all, none, names of {','.join(PIECES)}, -name")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="first steps left out of tokens/s (their losses count; default 3)")
    ap.add_argument("--small", action="store_true", help="llama_step's small model: " + ", ".join(
        f"{k} {v}" for k, v in SMALL.items() if FULL[k] != v))
    ap.add_argument("--optim", choices=("adamw", "sgd"), default="adamw",
                    help="AdamW (betas 0.9, 0.95; no weight decay) or plain SGD (no momentum)")
    ap.add_argument("--lr", type=float, default=None, help="default 3e-4 for adamw, 0.5 for sgd")
    ap.add_argument("--seed", type=int, default=0, help="of the weights and the data")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the gloo backend and torch's functions (--tessera none), to check the plumbing")
    ap.add_argument("--ddp-reduce", choices=("fp32", "bf16"), default="fp32",
                    help="ddp's gradient all-reduce: float32 (a hook) or DDP's own in bf16")
    ap.add_argument("--out", default=None, help="the JSON to write (default report/llama_distributed/MODE.json)")
    ap.add_argument("--table", metavar="DIR", default=None,
                    help="write DIR/llama_distributed.md from the runs' JSONs in DIR (single, ddp, fsdp2); no run")
    ap.add_argument("--compare", metavar="REF.json", default=None,
                    help="a reference run's --out: prints max |loss - ref| and the tokens/s ratio; "
                         "exits with 1 beyond bf16 noise")
    ap.add_argument("--tol", type=float, default=LOSS_TOL, help=f"any step's |loss - ref| (default {LOSS_TOL})")
    ap.add_argument("--step0-tol", type=float, default=STEP0_TOL,
                    help=f"the first step's |loss - ref| (default {STEP0_TOL})")
    ap.add_argument("--min-scaling", type=float, default=None,
                    help="with --compare: also fail where tokens/s is below this times the reference's")
    add_shape_args(ap, {"batch": "the GLOBAL batch, split over the ranks; "})
    args = ap.parse_args(argv)
    c = shape_and_pieces(ap, args)
    if args.lr is None:
        args.lr = 3e-4 if args.optim == "adamw" else 0.5
    if c.heads % c.kv_heads or c.head_dim % 2 or args.steps < 1 or args.warmup < 0 or c.batch < 1:
        ap.error("heads must be a multiple of kv-heads, head-dim even, steps >= 1, warmup >= 0, batch >= 1")
    if args.device == "cpu" and args.pieces:
        ap.error("--device cpu runs torch's functions alone: add --tessera none (tessera's ops need CUDA)")
    if args.warmup >= args.steps:
        args.warmup = args.steps - 1  # at least one timed step
    if args.out is None:
        args.out = os.path.join("report", "llama_distributed", f"{args.mode}.json")
    return c, args


# ---- data ---------------------------------------------------------------------------------------

def markov_tokens(vocab: int, rows: int, length: int, seed: int) -> torch.Tensor:
    """rows sequences of `length` tokens of a Markov chain in which every token has four
    equally likely successors; on the CPU, from `seed` alone (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    choice = torch.randint(0, 4, (rows, length - 1), generator=g)
    x = torch.empty(rows, length, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    for t in range(length - 1):
        x[:, t + 1] = succ[x[:, t], choice[:, t]]
    return x


# ---- precision ----------------------------------------------------------------------------------

class MasterWeights:
    """float32 master copies of a bf16 model's parameters (FSDP2's mixed precision, unsharded):
    the optimizer steps the masters, whose values are then rounded into the model's parameters,
    which the next forward uses."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [torch.nn.Parameter(p.detach().float()) for p in self.params]

    def step(self, opt):
        for p, m in zip(self.params, self.masters):  # float32 gradients, kept from step to step
            if p.grad is None:
                m.grad = None
            elif m.grad is None:
                m.grad = torch.empty_like(m)
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        with torch.no_grad():  # foreach: multi-tensor kernels, not a launch per parameter
            torch._foreach_copy_([self.masters[i].grad for i in have], [self.params[i].grad for i in have])
        for p in self.params:
            p.grad = None
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)


def fp32_allreduce_hook(process_group, bucket):
    """A DDP communication hook: the bucket's bf16 gradients averaged in float32 (DDP's default
    all-reduces in the gradients' dtype), then rounded back into the bucket."""
    group = process_group if process_group is not None else dist.group.WORLD
    buf = bucket.buffer()
    wide = buf.float().div_(dist.get_world_size(group))
    fut = dist.all_reduce(wide, group=group, async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))


# ---- the run ------------------------------------------------------------------------------------

def setup(c, args):
    """(rank, world, device); initialises the process group for ddp and fsdp2."""
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.mode == "single":
        if env_world > 1:
            sys.exit(f"llama_distributed: --mode single runs one process; torchrun started {env_world}")
        rank, world = 0, 1
    elif "RANK" not in os.environ:
        sys.exit(f"llama_distributed: --mode {args.mode} runs under torchrun: torchrun --standalone "
                 f"--nproc-per-node N {' '.join(sys.argv)}")
    else:
        rank, world = int(os.environ["RANK"]), env_world
    try:
        local_rows(c.batch, rank, world)
    except ValueError as e:
        sys.exit(f"llama_distributed: {e}")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"llama_distributed: needs a CUDA GPU ({tessera.no_gpu_reason() or 'torch sees none'}); "
                     "--device cpu --tessera none runs torch's functions on the CPU")
        if local >= torch.cuda.device_count():
            sys.exit(f"llama_distributed: local rank {local}, but {torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if args.mode != "single":
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return rank, world, device


def gather(obj, world):
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def train(c, args, rank, world, device):
    """Trains; returns the result dict (every rank; rank 0's times)."""
    rows = local_rows(c.batch, rank, world)
    data = markov_tokens(c.vocab, args.steps * c.batch, c.seq + 1, args.seed + 1)
    data = data.view(args.steps, c.batch, c.seq + 1)[:, rows].contiguous().to(device)  # this rank's slices

    model = build(c, args.pieces, seed=args.seed, device=device)  # bf16 parameters
    masters = None
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        for p in model.parameters():  # float32 masters (exact: the bf16 initial values)
            p.data = p.data.float()
        mesh = init_device_mesh(device.type, (world,))
        # cast_forward_inputs=False: the blocks take the rope tables as arguments, which must stay
        # float32 for tessera's rope (the activations are bf16 already).
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  cast_forward_inputs=False)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        params = list(model.parameters())
        step_model = model
    else:
        step_model = model
        if args.mode == "ddp":  # (which broadcasts rank 0's parameters)
            from torch.nn.parallel import DistributedDataParallel as DDP
            # gradient_as_bucket_view: the gradients are views of DDP's buckets, not copied into them
            step_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                             broadcast_buffers=False,  # the rope tables: the same on every rank
                             gradient_as_bucket_view=True)
            if args.ddp_reduce == "fp32":
                step_model.register_comm_hook(None, fp32_allreduce_hook)
        masters = MasterWeights(model.parameters())
        params = masters.masters
    if args.optim == "adamw":  # fused: one kernel (on DTensor shards too); the same math in every mode
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                fused=device.type == "cuda")
    else:
        opt = torch.optim.SGD(params, lr=args.lr)

    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    if world > 1:
        dist.barrier()
    losses, times = [], []
    for i in range(args.steps):
        tokens = data[i]
        sync()
        t0 = time.perf_counter()
        loss = step_model(tokens[:, :-1], tokens[:, 1:].reshape(-1))
        loss.backward()
        if masters is not None:
            masters.step(opt)
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.detach().float())
        if rank == 0:
            print(f"step {i:3d}  local loss {losses[-1].item():.5f}  {times[-1]:8.1f} ms", flush=True)
    local = torch.stack(losses)
    if world > 1:  # the global batch's mean: the ranks' means over equal slices, averaged
        dist.all_reduce(local)
        local /= world
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    timed = times[args.warmup:]
    result = dict(
        mode=args.mode, world_size=world, device=torch.cuda.get_device_name(device) if cuda else "cpu",
        torch=torch.__version__, tessera=tessera.__version__, model=vars(c), pieces=list(args.pieces),
        global_batch=c.batch, local_batch=rows.stop - rows.start, seq=c.seq, steps=args.steps,
        warmup=args.warmup, seed=args.seed, optim=args.optim, lr=args.lr,
        precision=("fp32 master params sharded, bf16 compute, fp32 reduce-scatter" if args.mode == "fsdp2"
                   else "bf16 params, fp32 master copies" + (f", {args.ddp_reduce} all-reduce"
                                                            if args.mode == "ddp" else "")),
        losses=[float(x) for x in local.tolist()], step_ms=times,
        tokens_per_s=c.batch * c.seq / statistics.median(timed) * 1e3,
        peak_gib_per_rank=gather(peak, world),
        timer=f"wall time between device synchronisations; median over steps {args.warmup}..{args.steps - 1}")
    if args.mode == "ddp":  # every rank must hold the same weights
        sums = gather([float(m.detach().double().sum()) for m in masters.masters], world)
        result["ranks_in_sync"] = all(s == sums[0] for s in sums)
    return result


def report(result, args):
    """Prints the summary (rank 0), writes --out, compares with --compare; the exit status."""
    print("\nloss per step (global batch): " + " ".join(f"{x:.4f}" for x in result["losses"]))
    peaks = result["peak_gib_per_rank"]
    print(f"{result['mode']} on {result['world_size']} x {result['device']}: "
          f"{result['tokens_per_s']:,.0f} tokens/s ({result['global_batch']} x {result['seq']} tokens a step), "
          "peak memory per rank: " + (", ".join(f"{p:.2f}" for p in peaks) + " GiB"
                                      if peaks[0] is not None else "n/a (CPU)"))
    status = 0
    if "ranks_in_sync" in result:
        print(f"parameters equal on every rank: {'yes' if result['ranks_in_sync'] else 'NO'}")
    if result.get("ranks_in_sync") is False:
        print("FAIL: the ranks' parameters differ after training (DDP out of sync)")
        status = 1
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            ref = json.load(f)
        r = compare(result, ref, args.tol, args.step0_tol, args.min_scaling)
        scaling = "n/a" if r["scaling"] is None else f"{r['scaling']:.2f}x"
        print(f"vs {args.compare} ({ref.get('mode')}, world size {ref.get('world_size')}): max |loss - ref| "
              f"{r['max_diff']:.3g} at step {r['at_step']} (step 0: {r['step0_diff']:.3g}; tolerance "
              f"{args.tol:g}, step 0 {args.step0_tol:g}); tokens/s {scaling} the reference's")
        for p in r["problems"]:
            print(f"FAIL: {p}")
        if not r["ok"]:
            status = 1
    return status


def main(argv=None):
    c, args = parse_args(argv)
    if args.table:
        return write_table(args.table)
    rank, world, device = setup(c, args)
    if rank == 0:
        pieces = ", ".join(args.pieces) or "none"
        print(f"llama_distributed --mode {args.mode}: world size {world}, {device.type}; torch "
              f"{torch.__version__}, tessera {tessera.__version__}\nmodel {vars(c)}; global batch "
              f"{c.batch} ({c.batch // world} a rank); tessera pieces: {pieces}; {args.optim} lr {args.lr}",
              flush=True)
    try:
        result = train(c, args, rank, world, device)
        status = report(result, args) if rank == 0 else 0
        if dist.is_initialized():
            dist.barrier()  # every rank past its last collective before any leaves
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return status


def exit_now(status):
    """Ends the process without Python's finalisation, after a distributed run. DDP and FSDP2
    keep the process group alive past destroy_process_group, and with it the backend's threads;
    one still releasing a finished collective's tensors (they are Python objects) while the
    interpreter finalises aborts the process ("terminate called without an active exception":
    gloo, about one run in six; seen with torch 2.11)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:  # under torchrun
        exit_now(code)
    sys.exit(code)
