"""What the torchrun worker scripts (dist_*.py) share: every rank's problems gathered and printed
by rank 0 with the verdict, and the exit that skips Python's finalisation."""
import os
import sys


def setup(dist):
    """The worker's rank, world size and device from torchrun's environment and --device (cpu:
    gloo; cuda: NCCL on LOCAL_RANK's GPU), its process group initialized."""
    import argparse

    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, world, device


def finish(dist, rank: int, world: int, problems: list) -> int:
    """Gathers each rank's problems (strings), ends the process group, and on rank 0 prints them
    and "ok" or "FAILED". Returns the exit status: 1 where any rank found a problem."""
    everyone = [None] * world
    dist.all_gather_object(everyone, problems)
    dist.barrier()  # every rank past its last collective before any leaves
    dist.destroy_process_group()
    if rank == 0:
        for p in sum(everyone, []):
            print(f"FAIL {p}", flush=True)
        print("ok" if not any(everyone) else "FAILED", flush=True)
    return 1 if any(everyone) else 0


def exit_now(status: int) -> None:
    """Exits without Python's finalisation: a gloo thread still releasing a finished collective's
    tensors while the interpreter finalises can abort the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
