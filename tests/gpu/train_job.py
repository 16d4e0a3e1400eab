#!/usr/bin/env python3
"""A small real training job for the H200 device machine (used by the
real-node lifecycle check and the training benchmark, see BENCHMARKS.md).

    python3 tests/gpu/train_job.py --seconds 40 --out result.json [--workers 4]

A 6-layer transformer language model (d_model 512, 8 heads, vocab 4096,
sequence 256, batch 32) trained in bf16 autocast with AdamW on synthetic data
that has a learnable rule (``x[t+1] = (5 * x[t] + 7) mod vocab`` with 10 %
noise), produced by a ``DataLoader`` with ``--workers`` worker processes and
pinned memory. Runs for ``--seconds`` of wall time after a warm-up.

Writes (and prints) one JSON object: steps, median/p90 step time (ms, host
clock around a synchronized step, warm-up excluded), loss first/last,
``torch.cuda.max_memory_reserved`` (bytes), the process's CPU affinity and
``Cpus_allowed_list``/``Mems_allowed_list`` (``/proc/self/status``), the
binding/MPS environment it saw, and the wall-clock start/end (epoch s) of
the timed phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

VOCAB, SEQ, DMODEL, HEADS, LAYERS = 4096, 256, 512, 8, 6


class RuleTokens(IterableDataset):
    """Endless sequences following ``x[t+1] = (5 x[t] + 7) % VOCAB``, 10 % noise."""

    def __init__(self, seed: int):
        self.seed = seed

    def __iter__(self):
        wi = get_worker_info()
        g = torch.Generator().manual_seed(self.seed + (wi.id if wi else 0))
        while True:
            v = [int(torch.randint(0, VOCAB, (1,), generator=g))]
            for _ in range(SEQ):          # CPU work in the workers
                v.append((5 * v[-1] + 7) % VOCAB)
            x = torch.tensor(v, dtype=torch.long)
            noise = torch.rand(SEQ + 1, generator=g) < 0.1
            x[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=g)
            yield x[:-1], x[1:]


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DMODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, DMODEL))
        layer = nn.TransformerEncoderLayer(DMODEL, HEADS, 4 * DMODEL, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(DMODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, x):
        h = self.emb(x) + self.pos
        h = self.enc(h, mask=self.mask, is_causal=True)
        return self.head(h)


def proc_status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Cpus_allowed_list", "Mems_allowed_list"):
                out[k] = v.strip()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = LM().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    dl = DataLoader(RuleTokens(1234), batch_size=args.batch, num_workers=args.workers, pin_memory=True,
                    persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers else None)
    it = iter(dl)
    lossf = nn.CrossEntropyLoss()

    def step():
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(model(x).float().view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    losses = []
    for _ in range(args.warmup_steps):
        losses.append(float(step()))
    torch.cuda.synchronize()
    times = []
    t0 = time.time()
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        a = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - a) * 1000)
        if len(times) % 20 == 0:
            losses.append(float(loss))
    t1 = time.time()
    losses.append(float(loss))
    st = sorted(times)
    out = {
        "ok": bool(losses[-1] < losses[0] and torch.isfinite(loss).item()),
        "steps": len(times), "warmup_steps": args.warmup_steps,
        "step_ms_median": round(statistics.median(times), 3),
        "step_ms_p90": round(st[int(0.9 * (len(st) - 1))], 3),
        "tokens_per_s": round(len(times) * args.batch * SEQ / (t1 - t0), 1),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "device_name": torch.cuda.get_device_name(0),
        "affinity": sorted(os.sched_getaffinity(0)),
        **proc_status(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS",
                                                "GSRUN_BIND_CPUS", "LOCAL_RANK", "CUDA_MPS_PIPE_DIRECTORY",
                                                "SLURM_JOB_ID", "SLURM_LOCALID")},
        "uid": os.getuid(), "pid": os.getpid(),
        "process_start": t_start, "timed_start": t0, "timed_end": t1,
    }
    text = json.dumps(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, flush=True)
    del it, dl


if __name__ == "__main__":
    main()
