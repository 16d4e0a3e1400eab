#!/usr/bin/env python3
"""One task of a tests/gpu/cluster/check job: records what the task got from
slurmd, srun and gsrun-bind, then does its part (stdlib + torch only).

    job_probe.py --out DIR --mode train|load|idle|segv [--seconds S] [--train PATH]

Writes ``DIR/task-<rank>.json`` (environment, CPU affinity, Cpus_allowed_list,
cgroup, uid) and ``DIR/started-<rank>`` before the work, ``DIR/done-<rank>.json``
after. ``train``: runs examples/train.py (bf16 on GPUs) as a child, then an
all-reduce bus-bandwidth measurement over NCCL when there are GPUs and >= 2
ranks; ``load``: a GPU matmul loop (CPU without GPUs); ``idle``: sleeps;
``segv``: reads address 0 (the task dies of SIGSEGV).
"""

import argparse
import json
import os
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["train", "load", "idle", "segv"], default="train")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--train", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"))
    a = ap.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    os.makedirs(a.out, exist_ok=True)
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Cpus_allowed_list", "Mems_allowed_list", "Uid"):
                status[k] = v.strip()
    with open("/proc/self/cgroup") as f:
        cgroup = f.read().strip()
    rec = {"rank": rank, "pid": os.getpid(), "uid": os.getuid(), "env": dict(os.environ),
           "affinity": sorted(os.sched_getaffinity(0)), "status": status, "cgroup": cgroup,
           "devices": sorted(d for d in os.listdir("/dev") if d.startswith("nvidia")),
           "t": time.time()}
    with open(os.path.join(a.out, f"task-{rank}.json"), "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    open(os.path.join(a.out, f"started-{rank}"), "w").close()
    done = {"rank": rank, "mode": a.mode}
    if a.mode == "segv":
        import ctypes
        ctypes.string_at(0)
    elif a.mode == "idle":
        time.sleep(a.seconds)
    elif a.mode == "load":
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.randn(4096 if dev == "cuda" else 256, 4096 if dev == "cuda" else 256, device=dev)
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < a.seconds:
            x = torch.tanh(x @ x)
            n += 1
            if dev == "cuda" and n % 50 == 0:
                torch.cuda.synchronize()
        done["matmuls"] = n
    else:
        cp = subprocess.run([sys.executable, a.train, "--seconds", str(a.seconds), "--bf16"],
                            capture_output=True, text=True)
        done["train_rc"] = cp.returncode
        done["train_stdout"] = cp.stdout[-4000:]
        done["train_stderr"] = cp.stderr[-8000:]
        sys.stdout.write(cp.stdout)
        sys.stderr.write(cp.stderr)
        done["allreduce"] = allreduce_busbw()
    done["t"] = time.time()
    with open(os.path.join(a.out, f"done-{rank}.json"), "w") as f:
        json.dump(done, f, indent=1, sort_keys=True)
    return done.get("train_rc", 0)


def allreduce_busbw() -> dict:
    """NCCL all-reduce bus bandwidth (nccl-tests' definition:
    algbw * 2 (n-1) / n) of a 256 MiB bf16 tensor, median of 10; None without
    GPUs or with one rank."""
    import torch
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    if not torch.cuda.is_available() or world < 2:
        return {"busbw_gb_s": None, "why": "no GPU" if not torch.cuda.is_available() else "one rank"}
    import torch.distributed as dist
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    local = int(os.environ.get("SLURM_LOCALID", "0"))
    os.environ["MASTER_PORT"] = str(int(os.environ.get("MASTER_PORT", "29500")) + 1)
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    n_bytes = 256 << 20
    t = torch.ones(n_bytes // 2, dtype=torch.bfloat16, device="cuda")
    times = []
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    med = sorted(times)[len(times) // 2]
    algbw = n_bytes / med / 1e9
    return {"bytes": n_bytes, "median_s": med, "algbw_gb_s": algbw, "busbw_gb_s": algbw * 2 * (world - 1) / world}


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
