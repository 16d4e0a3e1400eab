#!/usr/bin/env python3
"""GPU memory figures on a real GPU (host variant 4).

    python3 -P tests/gpu/memory_real.py [--gpu MINOR] [--window-s 6] [--out FILE]

Standalone, under 3 minutes, changes no GPU setting (no MIG, compute mode,
clocks, persistence, ECC or reset). Uses gsrun's own sampler
(:class:`gsrun.node.sampler.Sampler`, real NVML) and summary
(:func:`gsrun.report.summary.node_record`) on one idle GPU:

1. ``idle``: no process on the GPU, sampled for ``--window-s``. Expect the
   summary's ``mem_peak_bytes`` ~0 (at most 1 % of the GPU's memory: the
   driver's reservation, ~615 MiB on an H200 with the v1 call, must not be
   in it). Also the v1-only path: v1 ``used`` now minus the v1 baseline
   read before (what the prolog subtracts) ~0.
2. ``job``: a child process with ``SLURM_JOB_ID`` set (found by the sampler
   as the job's, psutil) holds a 4 GiB torch tensor while sampled. Expect
   the summary's ``mem_procs_peak_bytes`` within 5 % of
   ``nvidia-smi --query-compute-apps=pid,used_memory`` for that PID.

Prints one JSON verdict (``ok`` true when every check holds), also written
to ``--out``; exit 0 when ok, 1 when a check fails, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB_ID = "918000018"

HOLD = r"""
import sys, time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
"""


def _smi_used_mib(pid: int) -> float | None:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return float(parts[1])
    return None


def _sample(nv, minor: int, window_s: float, usage) -> dict:
    from gsrun.facts.hostfs import HostFS
    from gsrun.node.monitor import read_mem_baseline
    from gsrun.node.sampler import Sampler, state_to_json
    from gsrun.report.summary import node_record

    with tempfile.TemporaryDirectory() as d:
        base = read_mem_baseline(nv, [minor])
        s = Sampler(HostFS("/"), JOB_ID, os.getuid(), "gpu-check", [minor], str(Path(d) / "sampler.json"),
                    0.5, 60.0, nvml=nv, usage=usage, mem_baseline=base)
        t_end = time.time() + window_s
        while time.time() < t_end:
            s.sample_once()
            time.sleep(0.5)
        s.sample_once()
        summ = node_record(state_to_json(s.state), {"node": "gpu-check", "job_id": JOB_ID, "cpus_on_node": 1,
                                           "gpus": [minor]}, time.time()).to_json()
    return summ["gpus"][0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=None, help="minor number (default: the first idle GPU)")
    ap.add_argument("--window-s", type=float, default=6.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    verdict: dict = {"check": "memory_real", "ok": False, "checks": {}}

    def done(rc: int) -> int:
        text = json.dumps(verdict, indent=1, sort_keys=True)
        print(text)
        if a.out:
            Path(a.out).write_text(text + "\n")
        return rc

    try:
        from gsrun.facts.hostfs import HostFS
        from gsrun.facts.nvml import index_by_minor, open_nvml
        nv = open_nvml(HostFS("/"))
    except Exception as e:  # noqa: BLE001
        verdict["error"] = f"cannot open NVML: {e}"
        return done(2)
    by_minor, _ = index_by_minor(nv)
    minor = a.gpu
    if minor is None:
        for m, i in sorted(by_minor.items()):
            ps = nv.get(i, "compute_processes")
            if isinstance(ps, list) and not ps:
                minor = m
                break
    if minor is None or minor not in by_minor:
        verdict["error"] = "no idle GPU (or --gpu not found)"
        return done(2)
    idx = by_minor[minor]
    verdict["gpu"] = {"minor": minor, "nvml_index": idx, "name": str(nv.get(idx, "name"))}
    mem = nv.get(idx, "memory")
    total = int(mem["total"])
    verdict["memory_call"] = "v2" if "reserved" in mem else "v1 only"

    # 1. idle
    g = _sample(nv, minor, a.window_s, usage=lambda: (0.0, 0, 0, "none"))
    limit = total // 100
    verdict["idle"] = {"mem_peak_bytes": g["mem_peak_bytes"], "limit_bytes": limit,
                       "mem_source": g.get("mem_source", "nvmlDeviceGetMemoryInfo_v2")}
    verdict["checks"]["idle_mem_peak_near_0"] = g["mem_peak_bytes"] is not None and g["mem_peak_bytes"] <= limit
    try:  # the v1-only path: v1 used minus a v1 baseline
        import pynvml
        h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        b1 = pynvml.nvmlDeviceGetMemoryInfo(h).used
        time.sleep(1.0)
        u1 = pynvml.nvmlDeviceGetMemoryInfo(h).used
        verdict["idle"]["v1_used_bytes"] = u1
        verdict["idle"]["v1_minus_baseline_bytes"] = max(0, u1 - b1)
        verdict["checks"]["idle_v1_minus_baseline_near_0"] = max(0, u1 - b1) <= limit
    except Exception as e:  # noqa: BLE001
        verdict["idle"]["v1_error"] = str(e)

    # 2. a job process holding 4 GiB
    env = dict(os.environ, SLURM_JOB_ID=JOB_ID, CUDA_VISIBLE_DEVICES=str(nv.get(idx, "uuid")))
    child = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        line = child.stdout.readline()
        if line.strip() != "ready":
            verdict["error"] = "the torch child did not start (torch with CUDA needed)"
            return done(2)
        g = _sample(nv, minor, a.window_s, usage=None)
        smi_mib = _smi_used_mib(child.pid)
    finally:
        try:
            child.stdin.write("\n")
            child.stdin.flush()
        except OSError:
            pass
        child.wait(30)
    procs = g.get("mem_procs_peak_bytes")
    smi = None if smi_mib is None else smi_mib * (1 << 20)
    verdict["job"] = {"pid": child.pid, "mem_procs_peak_bytes": procs, "nvidia_smi_used_bytes": smi,
                      "device_mem_peak_bytes": g["mem_peak_bytes"]}
    verdict["checks"]["job_procs_within_5pct_of_nvidia_smi"] = (
        procs is not None and smi is not None and smi > 0 and abs(procs - smi) <= 0.05 * smi)
    nv.close()
    verdict["ok"] = all(verdict["checks"].values())
    return done(0 if verdict["ok"] else 1)


if __name__ == "__main__":
    raise SystemExit(main())
