#!/usr/bin/env python3
"""Pinned host-to-device copy bandwidth: a rank bound by gsrun-bind vs an
unbound one, in the same run, against the best plain copy and the link limit
(docs/history/benchmarks-log.md, "Pinned host-to-device copy bandwidth"). For the H200 device
machine (needs torch and gsrun-bind on PATH).

    python3 tests/bench/bench_h2d.py [--rounds 3] [--gib 1] [--ntasks 4]

Each measurement is a fresh process copying a ``--gib`` GiB pinned host
tensor to the GPU 20 times (CUDA events around each copy, 3 warm-ups), plus
5 pageable copies. ``bound``: ``gsrun-bind -- python3 ...`` in the Slurm task
environment of local rank 0 of ``--ntasks`` tasks on GPU 0; ``unbound``: the
same command without gsrun-bind. Rounds alternate the order. The link limit
is PCIe Gen5 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s per direction
(the PCIe generation and width are read from NVML and reported).

Prints JSON: per mode the median of the per-process median GB/s and the best
single copy, the pageable median, the ratios bound/unbound,
best/link-limit and median/link-limit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import slurm_env  # noqa: E402

CHILD = r"""
import json, os, sys, torch
n = int(float(sys.argv[1]) * (1 << 30))
h = torch.empty(n, dtype=torch.uint8, pin_memory=True); h.fill_(1)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
def gbs(src, reps, warm):
    out = []
    for i in range(warm + reps):
        ev[0].record(); d.copy_(src, non_blocking=True); ev[1].record(); torch.cuda.synchronize()
        if i >= warm: out.append(n / (ev[0].elapsed_time(ev[1]) / 1e3) / 1e9)
    return out
pinned = gbs(h, 20, 3)
pageable = gbs(torch.ones(n, dtype=torch.uint8), 5, 1)
pinned.sort(); pageable.sort()
print(json.dumps({"pinned_median": pinned[len(pinned)//2], "pinned_best": pinned[-1],
                  "pageable_median": pageable[len(pageable)//2], "affinity": sorted(os.sched_getaffinity(0)),
                  "cpus_allowed": [l.split(":")[1].strip() for l in open("/proc/self/status") if l.startswith("Cpus_allowed_list")][0]}))
"""

LINK_GBS = 32e9 * 16 * 128 / 130 / 8 / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ntasks", type=int, default=4)
    args = ap.parse_args()
    bind = shutil.which("gsrun-bind")
    env = slurm_env.task_env("990010", os.getuid(), "root", "h200", "0", os.cpu_count() or 1, "/tmp",
                             ntasks=args.ntasks, local_rank=0)
    cmd = [sys.executable, "-c", CHILD, str(args.gib)]
    runs = {"bound": [], "unbound": []}
    for r in range(args.rounds):
        for mode in (("bound", "unbound") if r % 2 == 0 else ("unbound", "bound")):
            argv = ([bind, "--"] + cmd) if mode == "bound" else cmd
            cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            if cp.returncode != 0:
                print(json.dumps({"error": f"{mode}: {cp.stderr[-2000:]}"}))
                return 1
            runs[mode].append(json.loads(cp.stdout.strip().splitlines()[-1]))
    link = {}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        link = {"pcie_gen_current": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                "pcie_width_current": pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                "pcie_gen_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                "pcie_width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)}
    except Exception as e:  # noqa: BLE001
        link = {"error": str(e)}
    res = {}
    for mode, rs in runs.items():
        res[mode] = {"pinned_median_gbs": round(statistics.median(x["pinned_median"] for x in rs), 2),
                     "pinned_best_gbs": round(max(x["pinned_best"] for x in rs), 2),
                     "pageable_median_gbs": round(statistics.median(x["pageable_median"] for x in rs), 2),
                     "cpus_allowed": rs[0]["cpus_allowed"]}
    best = max(res["bound"]["pinned_best_gbs"], res["unbound"]["pinned_best_gbs"])
    out = {"gib": args.gib, "rounds": args.rounds, "ntasks": args.ntasks, "link": link,
           "link_limit_gbs": round(LINK_GBS, 2), "modes": res, "runs": runs,
           "ratios": {"bound_vs_unbound_median": round(res["bound"]["pinned_median_gbs"] / res["unbound"]["pinned_median_gbs"], 3),
                      "bound_median_vs_best": round(res["bound"]["pinned_median_gbs"] / best, 3),
                      "best_vs_link_limit": round(best / LINK_GBS, 3),
                      "bound_median_vs_link_limit": round(res["bound"]["pinned_median_gbs"] / LINK_GBS, 3),
                      "pinned_vs_pageable_unbound": round(res["unbound"]["pinned_median_gbs"] / res["unbound"]["pageable_median_gbs"], 2)}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
