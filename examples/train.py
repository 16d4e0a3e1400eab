#!/usr/bin/env python3
"""A small real distributed training job for gsrun's demo and tests.

Each rank prints its rank, its GPU and its CPU affinity, then trains a small
MLP with DistributedDataParallel on synthetic data for a few seconds: NCCL on
GPUs, gloo on CPU when no GPU is present (the emulated test cluster).

    gsrun --gpus 8 --wait examples/train.py [--seconds 5] [--fail-rank R] [ARGS...]

Extra arguments are echoed back literally by rank 0 (the tests use that to
prove hostile arguments reach the script unchanged).
"""

import argparse
import contextlib
import os
import socket
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--fail-rank", type=int, default=None, help="exit 3 from this rank (-1: every rank; tests)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for forward/loss on GPUs")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()

    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    cpus = sorted(os.sched_getaffinity(0))
    host = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    print(f"rank {rank}/{world} node {host} local_rank {local_rank} "
          f"gpu {os.environ.get('GSRUN_GPU', 'n/a')} cuda_visible {os.environ.get('CUDA_VISIBLE_DEVICES', '')} "
          f"cpus {','.join(map(str, cpus))} omp {os.environ.get('OMP_NUM_THREADS', '')} "
          f"python {sys.prefix}", flush=True)
    if rank == 0 and a.rest:
        print("args: " + repr(a.rest), flush=True)
    if a.fail_rank is not None and a.fail_rank in (rank, -1):
        print(f"rank {rank}: failing on purpose", file=sys.stderr, flush=True)
        return 3

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    try:
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    except RuntimeError as e:
        # a torch built without libuv (Debian's) has only the classic TCPStore, which
        # torch >= 2.4 asks for only with USE_LIBUV=0; every rank fails alike, so every rank retries
        if "libuv" not in str(e):
            raise
        os.environ["USE_LIBUV"] = "0"
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    torch.manual_seed(1234 + rank)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7)).to(device)
    steps, t0 = 0, time.monotonic()
    loss = torch.tensor(0.0)
    while True:
        x = torch.randn(a.batch, 64, device=device)
        y = (x @ w_true).argmax(dim=1)
        opt.zero_grad(set_to_none=True)
        # no CUDA autocast object at all on a CPU-only torch (1.13 raises for one even when disabled)
        with (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if use_cuda and a.bf16
              else contextlib.nullcontext()):
            loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        steps += 1
        # every rank must agree to stop (DDP needs matching step counts)
        done = torch.tensor([1.0 if time.monotonic() - t0 >= a.seconds else 0.0], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item() > 0:
            break
    loss_t = loss.detach().clone()
    dist.all_reduce(loss_t)
    if rank == 0:
        print(f"trained {steps} steps in {time.monotonic() - t0:.1f} s on {world} ranks ({backend}); "
              f"mean loss {loss_t.item() / world:.4f}; step {1000 * (time.monotonic() - t0) / steps:.2f} ms"
              f"{' bf16' if use_cuda and a.bf16 else ''}", flush=True)
    dist.barrier()                 # nobody tears gloo down while a peer still talks
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: gloo's threads can abort() in static
    # destructors at exit ("terminate called without an active exception")
    os._exit(rc)
