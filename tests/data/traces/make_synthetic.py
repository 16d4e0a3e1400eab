#!/usr/bin/env python3
"""Write the SYNTHETIC stuck-collective trace (``stuck_collective_synthetic.json``)
in the recorded traces' format (README.md here). Deterministic: the committed
file is what this script writes (a test checks it).

    python3 tests/data/traces/make_synthetic.py [OUTDIR]

No real NCCL hang can be recorded on a one-GPU machine, so this trace is a
model, built from the real H200's figures
(``tests/data/hosts/h200-real/results/``): 2 minutes of training (utilization
~99 %, SM activity ~70 %, tensor ~62 %, 380-440 W), then 18 minutes in which a
collective waits forever: the driver counts a kernel as running the whole time
(utilization 100 %), but it spins without doing work: SM activity 0.2-0.6 %,
tensor activity 0, power 128-136 W (the H200 idles at 83 W bare and 120-128 W
holding a CUDA context). Polled every 5 s (``sampler.interval_s`` default).

Limits of the model: a real spinning NCCL kernel keeps one thread block per
channel resident, so its SM activity is about channels / 132 on an H200
(2 channels ~1.5 %, 16 channels ~12 %); above ``idle.sm_idle_pct`` such a hang
is not called stuck (docs/ADMIN.md says how to tune it). The job's process is
on the GPU throughout (``job_pids``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

INTERVAL_S = 5.0
TRAIN_S = 120.0
STUCK_S = 1080.0
SAMPLE_PERIOD_S = 1.0           # one utilization sample a second (the H200 driver keeps ~6/s; fewer keep the file small)
T0_US = 1_760_000_000_000_000
PID = 4242
MEM_TOTAL = 150754820096


def _wave(k: int, lo: float, hi: float, period: int = 7) -> float:
    """A deterministic ripple between lo and hi (no random numbers)."""
    return round(lo + (hi - lo) * ((k * 3) % period) / (period - 1), 2)


def trace() -> dict:
    polls = []
    n = int((TRAIN_S + STUCK_S) / INTERVAL_S) + 1
    energy_mj = 2_858_029_000
    for k in range(n):
        t = k * INTERVAL_S
        train = t <= TRAIN_S
        util = 99 if train else 100
        samples = []
        s0 = (t - INTERVAL_S) if k else t - SAMPLE_PERIOD_S * 5
        j = 1
        while s0 + j * SAMPLE_PERIOD_S <= t + 1e-9:
            ts = T0_US + int(round((s0 + j * SAMPLE_PERIOD_S) * 1e6))
            samples.append([ts, util if train else 100])
            j += 1
        power_w = _wave(k, 380.0, 440.0) if train else _wave(k, 128.0, 136.0)
        gpm = {"error": "first GPM sample", "code": None} if k == 0 else (
            {"sm_active_pct": _wave(k, 66.0, 74.0), "sm_occupancy_pct": 10.5,
             "tensor_active_pct": _wave(k, 58.0, 66.0), "dram_bw_pct": 9.0} if train else
            {"sm_active_pct": _wave(k, 0.2, 0.6), "sm_occupancy_pct": 0.1, "tensor_active_pct": 0.0,
             "dram_bw_pct": 0.0})
        used = 60 * 2**30 if t > 5 else 0
        # only the readings the detector's path uses (update_gpu reads a missing key as not read)
        r = {"memory": {"total": MEM_TOTAL, "used": used + 2**29, "free": MEM_TOTAL - used - 2**29,
                        "reserved": 2**29 + 2**28},
             "power_mw": int(power_w * 1000), "energy_mj": energy_mj,
             "compute_processes": [{"pid": PID, "used_bytes": used}] if t > 5 else [],
             "gpm": gpm, "util_samples": samples}
        energy_mj += int(power_w * INTERVAL_S * 1000)
        polls.append({"t_s": t, "job_pids": [PID], "r": r})
    return {"format": "gsrun.gpu-trace/1", "name": "stuck_collective_synthetic", "synthetic": True,
            "source": "SYNTHETIC: written by tests/data/traces/make_synthetic.py from the real H200's idle/busy "
                      "figures (a model of a hung collective, not a recording)",
            "interval_s": INTERVAL_S,
            "gpu": {"name": "NVIDIA H200", "uuid": "GPU-synthetic", "gpm": True, "mig": False, "power_limit_w": 700.0},
            "phases": [{"name": "train", "start_s": 0.0, "end_s": TRAIN_S},
                       {"name": "stuck", "start_s": TRAIN_S, "end_s": TRAIN_S + STUCK_S}],
            "workload": {"what": "training, then a collective that never completes"},
            "polls": polls}


def dump(t: dict) -> str:
    return json.dumps(t, separators=(",", ":")) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    (out / "stuck_collective_synthetic.json").write_text(dump(trace()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
