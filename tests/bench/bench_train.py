#!/usr/bin/env python3
"""Training step time under gsrun-bind vs a plain launch, same script, same run
(part of the real GPU node validation; docs/history/benchmarks-log.md, "Training step time").
For the H200 device machine (torch; gsrun-bind on PATH).

    python3 tests/bench/bench_train.py [--rounds 2] [--seconds 10]

Runs ``tests/gpu/train_job.py`` (transformer LM, bf16, DataLoader with 4
workers) in the Slurm task environment of a one-task step on GPU 0, once
through ``gsrun-bind --`` and once plainly per round (order alternating).
Prints JSON: per mode the median step time (ms) and tokens/s, per-run
figures, and the ratio bound/plain of the median step times.
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

GPU = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU))
import slurm_env  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--ntasks", type=int, default=1)
    args = ap.parse_args()
    bind = shutil.which("gsrun-bind")
    env = slurm_env.task_env("990011", os.getuid(), "root", "h200", "0", os.cpu_count() or 1, "/tmp",
                             ntasks=args.ntasks)
    cmd = [sys.executable, str(GPU / "train_job.py"), "--seconds", str(args.seconds), "--warmup-steps", "20"]
    runs = {"bound": [], "plain": []}
    for r in range(args.rounds):
        for mode in (("bound", "plain") if r % 2 == 0 else ("plain", "bound")):
            argv = ([bind, "--"] + cmd) if mode == "bound" else cmd
            cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.seconds + 180)
            if cp.returncode != 0:
                print(json.dumps({"error": f"{mode}: {cp.stderr[-2000:]}"}))
                return 1
            j = json.loads(cp.stdout.strip().splitlines()[-1])
            runs[mode].append({k: j[k] for k in ("step_ms_median", "step_ms_p90", "tokens_per_s", "steps",
                                                 "Cpus_allowed_list", "torch_threads", "loss_first", "loss_last")})
    med = {m: statistics.median(x["step_ms_median"] for x in rs) for m, rs in runs.items()}
    tps = {m: statistics.median(x["tokens_per_s"] for x in rs) for m, rs in runs.items()}
    out = {"rounds": args.rounds, "seconds": args.seconds, "ntasks": args.ntasks,
           "step_ms_median": {m: round(v, 3) for m, v in med.items()},
           "tokens_per_s": {m: round(v, 1) for m, v in tps.items()},
           "ratio_bound_vs_plain_step_ms": round(med["bound"] / med["plain"], 3), "runs": runs}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
