#!/usr/bin/env python3
"""GPU efficiency figures validated on the real H200: the sampler's numbers
against loads whose busy time is known (docs/history/benchmarks-log.md, "GPU efficiency
validation").

    python3 tests/gpu/efficiency_real.py [--window-s 20] [--interval-s 1] [--out eff.json]

Two controlled loads, each in its own process (torch), sampled by gsrun's own
sampler (:class:`gsrun.node.sampler.Sampler` with the real NVML backend, driven
here with ``sample_once`` every ``--interval-s``), then summarised by
:func:`gsrun.report.summary.node_record` / :func:`job_summary` with findings:

* ``burst``: 8192x8192 bf16 matmuls for ~200 ms (the count calibrated first),
  then idle until the 400 ms period ends: the GPU busy ~50 % of the time. The
  load measures its own busy fraction (host clock around synchronized bursts).
  Expect: utilization 50 +/- 5 %; reported energy equal to the NVML energy
  counter delta read here (``nvmlDeviceGetTotalEnergyConsumption``) just
  before the first and just after the last sample (within 1 %).
* ``tiny``: 64x64 bf16 matmuls back to back (a CUDA graph of 1000, replayed):
  kernels run nearly all the time but occupy one SM. Expect: GPM SM activity
  far below the duty-cycle utilization (< 1/5 of it) and the report's
  ``low_sm_activity`` finding.

Prints one JSON object with the figures and checks; exits 0 when all hold.
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

LOAD = r"""
import json, sys, time, torch
mode = sys.argv[1]
torch.backends.cuda.matmul.allow_tf32 = True
if mode == "burst":
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5): c = a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
    t_mm = (time.perf_counter() - t) / 20
    k = max(1, round(0.200 / t_mm))
    period, busy_s, total_s, started = 0.400, 0.0, 0.0, False
    steady = None
    import select
    n = 0
    while True:
        p0 = time.perf_counter()
        for _ in range(k): c = a @ b
        torch.cuda.synchronize()
        busy = time.perf_counter() - p0
        k = max(1, round(k * 0.200 / busy))   # keep each burst at 200 ms of GPU work
        rest = period - (time.perf_counter() - p0)
        if rest > 0: time.sleep(rest)
        n += 1
        if steady is not None:
            busy_s += busy; total_s += time.perf_counter() - p0
        if n == 10:
            steady = time.perf_counter()
            print(json.dumps({"steady": True, "t_mm_ms": t_mm * 1e3, "k": k}), flush=True)
        if steady is not None and select.select([sys.stdin], [], [], 0)[0]:
            break
    print(json.dumps({"busy_frac": busy_s / total_s, "periods": n, "t_mm_ms": t_mm * 1e3, "k": k}), flush=True)
else:
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): c = a @ b
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(1000): c = a @ b
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    print(json.dumps({"steady": True}), flush=True)
    import select
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(10): g.replay()
        torch.cuda.synchronize()
        n += 10
        if select.select([sys.stdin], [], [], 0)[0]:
            break
    dt = time.perf_counter() - t0
    print(json.dumps({"replays": n, "kernels_per_s": n * 1000 / dt, "us_per_kernel": dt / (n * 1000) * 1e6}), flush=True)
"""


def own_energy_mj(handle) -> int:
    import pynvml
    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def measure(mode: str, window_s: float, interval_s: float, tmp: Path) -> dict:
    import pynvml

    from gsrun.facts.hostfs import HostFS
    from gsrun.node.sampler import Sampler, state_to_json
    from gsrun.request.config import parse_config
    from gsrun.report.summary import job_summary, node_record
    from gsrun.report.records import JobInfo

    # a short measurement window: the site setting that withholds advice for
    # jobs under 60 s is set to 0 so the findings are computed
    cfg = parse_config("[findings]\nshort_job_s = 0\n")

    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "CUDA_VISIBLE_DEVICES": "0"}
    load = subprocess.Popen([sys.executable, "-c", LOAD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    res: dict = {"mode": mode}
    try:
        first = json.loads(load.stdout.readline())
        res["load_start"] = first
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        job = f"99007{ {'burst': 1, 'tiny': 2}[mode] }"
        s = Sampler(HostFS.from_env(None), job, os.getuid(), "h200", [0], str(tmp / f"{mode}.json"),
                    interval_s, 3600.0, 1000)
        e0 = own_energy_mj(h)
        t0 = time.time()
        s.sample_once()
        n = 1
        while time.time() - t0 < window_s:
            time.sleep(max(0.0, t0 + n * interval_s - time.time()))
            s.sample_once()
            n += 1
        e1 = own_energy_mj(h)
        t1 = time.time()
        load.stdin.write("stop\n")
        load.stdin.flush()
        res["load_end"] = json.loads(load.stdout.readline())
        load.wait(30)
        st = state_to_json(s.state)   # the flushed (JSON) form
        rec = node_record(st, {"node": "h200", "job_id": job, "cpus_on_node": os.cpu_count(), "gpus": [0]},
                          st["last_time"])
        node = rec.to_json()
        summ = job_summary(JobInfo(**{"id": job, "nodes": ["h200"], "state": "COMPLETED", "exit_code": 0,
                            "elapsed_s": st["last_time"] - st["start_time"]}), [rec], cfg)
        g = node["gpus"][0]
        res.update({
            "samples": st["samples"], "window_s": round(t1 - t0, 3),
            "util_mean_pct": g["util_mean_pct"], "sm_active_mean_pct": g["sm_active_mean_pct"],
            "sm_occupancy_mean_pct": g["sm_occupancy_mean_pct"], "tensor_active_mean_pct": g["tensor_active_mean_pct"],
            "dram_bw_mean_pct": g["dram_bw_mean_pct"], "power_mean_w": g["power_mean_w"],
            "energy_j": g["energy_j"], "nvml_energy_delta_j": (e1 - e0) / 1000.0,
            "mem_peak_bytes": g["mem_peak_bytes"], "unsupported": g["unsupported"],
            "findings": [{"code": str(f.code), "text": f.text} for f in summ.findings],
        })
        s.nv.close()
    finally:
        if load.poll() is None:
            load.kill()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--tiny-window-s", type=float, default=12.0)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gsrun-eff-"))
    out: dict = {"interval_s": args.interval_s, "checks": {}}
    c = out["checks"]
    try:
        b = measure("burst", args.window_s, args.interval_s, tmp)
        out["burst"] = b
        u = b["util_mean_pct"]
        c["burst_util_50_pm_5"] = u is not None and abs(u - 50.0) <= 5.0
        bf = (b.get("load_end") or {}).get("busy_frac")
        if bf is not None and u is not None:
            c["burst_util_matches_duty"] = abs(u - 100 * bf) <= 5.0
        c["burst_energy_equals_counter"] = b["energy_j"] is not None and \
            abs(b["energy_j"] - b["nvml_energy_delta_j"]) <= 0.01 * b["nvml_energy_delta_j"]
        c["burst_not_low_sm"] = "low_sm_activity" not in [f["code"] for f in b["findings"]]
        t = measure("tiny", args.tiny_window_s, args.interval_s, tmp)
        out["tiny"] = t
        c["tiny_sm_far_below_util"] = t["sm_active_mean_pct"] is not None and t["util_mean_pct"] is not None \
            and t["sm_active_mean_pct"] < t["util_mean_pct"] / 5
        c["tiny_finding_low_sm"] = "low_sm_activity" in [f["code"] for f in t["findings"]]
        c["tiny_energy_equals_counter"] = t["energy_j"] is not None and \
            abs(t["energy_j"] - t["nvml_energy_delta_j"]) <= 0.01 * t["nvml_energy_delta_j"]
    except Exception as e:  # noqa: BLE001
        import traceback
        out["error"] = traceback.format_exc()[-3000:]
        c["no_error"] = False
    out["ok"] = bool(c) and all(c.values())
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
