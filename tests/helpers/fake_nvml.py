"""A scripted NVML recording for the local test cluster (``tests/cluster/up --fake-nvml``) and the
live/idle tests: ``n`` H200-like GPUs (minor numbers 0..n-1) that work for ``busy_s`` seconds after the
sampler starts (utilization 95 %, 450 W), then idle (0 %, 70 W), answered by time through
:class:`gsrun.facts.nvml.FakeNvml`'s ``script`` entries. The compute-process list is "Not Supported"
(the recording cannot know the job's PIDs), so the detector judges by utilization and power.

    python3 tests/helpers/fake_nvml.py --out HOSTROOT/nvml.json [--gpus 4] [--busy-s 0]
"""

from __future__ import annotations

import argparse
import json

IDLE_POWER_MW = 70_000
BUSY_POWER_MW = 450_000


def work_then_idle(n_gpus: int = 4, busy_s: float = 0.0) -> dict:
    """The recording (a dict in ``nvml.json`` form)."""
    devs = []
    for i in range(n_gpus):
        util, power = [], []
        if busy_s > 0:
            util.append([0, {"ok": {"gpu": 95, "memory": 40}}])
            power.append([0, {"ok": BUSY_POWER_MW}])
        util.append([busy_s, {"ok": {"gpu": 0, "memory": 0}}])
        power.append([busy_s, {"ok": IDLE_POWER_MW}])
        devs.append({
            "name": {"ok": "NVIDIA H200"}, "uuid": {"ok": f"GPU-{i:08x}-5a5a-4b4b-8c8c-000000000000"},
            "minor": {"ok": i}, "pci": {"ok": {"busId": f"00000000:{0x41 + i:02x}:00.0"}},
            "memory": {"ok": {"total": 150754820096, "used": 2 << 30, "free": 148 << 30, "reserved": 0}},
            "mig_mode": {"ok": [0, 0]}, "power_limit_mw": {"ok": 700_000},
            "utilization": {"script": util}, "power_mw": {"script": power},
            "util_samples": {"error": "Not Supported", "code": 3},
            "compute_processes": {"error": "Not Supported", "code": 3},
            "temperature_c": {"ok": 35}, "sm_clock_mhz": {"ok": 1980},
        })
    return {"driver": {"ok": "570.00"}, "count": {"ok": n_gpus}, "devices": devs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fake_nvml")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--busy-s", type=float, default=0.0)
    a = ap.parse_args(argv)
    with open(a.out, "w") as f:
        json.dump(work_then_idle(a.gpus, a.busy_s), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
