#!/usr/bin/env python3
"""Node-side costs on a real GPU node, measured side by side (part of the
real GPU node validation; docs/history/benchmarks-log.md, "Node-side costs").

    python3 tests/bench/bench_node.py [--runs 5] [--samples 100]

As root, with gsrun installed (``gsrun-node``, ``gsrun`` on PATH) and a real
NVML. Medians of ``--runs`` wall times (ms):

* ``python3 -c pass`` (the floor any Python hook pays);
* ``gsrun-node prolog`` in slurmd's environment (node ``h200``, GPU 0,
  ``SPANK_GS_TUNE=swappiness=10,dirty_ratio=40,thp=never``,
  ``SPANK_GS_EXCLUSIVE=1``; tuning journal, the node monitor begins sampling) and the
  matching ``gsrun-node epilog`` (the monitor's final sample + node summary + restore),
  with one node daemon running for the whole bench; the same two
  with ``SPANK_GS_MPS=`` (MPS daemon start/quit) for ``--mps-runs`` runs;
* ``gsrun --dry-run --gpus 1 --gpus-per-node 1 train.py`` (no Slurm needed);
* sampler cost: process CPU time per ``Sampler.sample_once()`` per GPU (real
  NVML, every key the sampler reads, GPM included) against a bare ``pynvml``
  loop making the same NVML calls with no aggregation, ``--samples`` each.

Every prolog is followed by its epilog; vm/THP values are checked to be back
to the start after each pair (``restored``). Prints JSON with the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import slurm_env  # noqa: E402
from real_node import snapshot  # noqa: E402


def wall_ms(argv, env, timeout=120) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")
    return (time.perf_counter() - t0) * 1000, cp.returncode, cp.stderr[-1500:]


def sampler_cost(samples: int, tmp: Path) -> dict:
    import pynvml

    from gsrun.facts.hostfs import HostFS
    from gsrun.node.sampler import Sampler

    s = Sampler(HostFS.from_env(None), "990013", os.getuid(), "h200", [0], str(tmp / "s.json"), 1.0, 3600, 1000)
    s.sample_once()
    c0 = time.process_time()
    w0 = time.perf_counter()
    for _ in range(samples):
        s.sample_once()
    gs_cpu = (time.process_time() - c0) / samples
    gs_wall = (time.perf_counter() - w0) / samples
    # GPU-only part (no job CPU/memory scan)
    from gsrun.node.sampler import read_gpu, update_gpu
    ref, g = s.refs[0], s.state["gpus"][0]
    c0 = time.process_time()
    for _ in range(samples):
        update_gpu(g, read_gpu(s.nv, ref, g["last_sample_us"]), 1.0, 1.0)
    gs_gpu_cpu = (time.process_time() - c0) / samples
    s.nv.close()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    last = 0
    prev = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, prev)

    def bare():
        nonlocal last, prev
        pynvml.nvmlDeviceGetMemoryInfo(h)
        pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        try:
            pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        except pynvml.NVMLError:
            pass
        try:
            _, smp = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
            if smp:
                last = max(x.timeStamp for x in smp)
        except pynvml.NVMLError:
            pass
        cur = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, cur)
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.sample1, mg.sample2 = prev, cur
        # the sampler's GPM metrics; PCIe comes from GPM (no nvmlDeviceGetPcieThroughput on a GPM GPU)
        ids = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
               pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
               pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC)
        mg.numMetrics = len(ids)
        for i, mid in enumerate(ids):
            mg.metrics[i].metricId = mid
        pynvml.nvmlGpmMetricsGet(mg)
        pynvml.nvmlGpmSampleFree(prev)
        prev = cur

    bare()
    c0 = time.process_time()
    w0 = time.perf_counter()
    for _ in range(samples):
        bare()
    bare_cpu = (time.process_time() - c0) / samples
    bare_wall = (time.perf_counter() - w0) / samples
    return {"samples": samples,
            "gsrun_sample_once_cpu_ms": round(gs_cpu * 1e3, 3), "gsrun_sample_once_wall_ms": round(gs_wall * 1e3, 3),
            "gsrun_gpu_part_cpu_ms": round(gs_gpu_cpu * 1e3, 3),
            "bare_nvml_cpu_ms": round(bare_cpu * 1e3, 3), "bare_nvml_wall_ms": round(bare_wall * 1e3, 3),
            "ratio_gsrun_vs_bare_cpu": round(gs_cpu / bare_cpu, 2) if bare_cpu else None,
            "ratio_gpu_part_vs_bare_cpu": round(gs_gpu_cpu / bare_cpu, 2) if bare_cpu else None,
            "job_scan_source": s.state["cpu"]["source"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mps-runs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=100)
    args = ap.parse_args()
    node = shutil.which("gsrun-node")
    gsrun = shutil.which("gsrun")
    base = Path(tempfile.mkdtemp(prefix="gsrun-bench-node-", dir="/tmp"))
    os.chmod(base, 0o755)
    cfg = base / "gsrun.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\nmps_dir = "{base}/mps"\n'
                   '\n[tuning]\nexclusive_only = false\n')
    fakebin = slurm_env.write_fake_scontrol(base / "bin")
    extra = {"GSRUN_CONFIG": str(cfg), "PATH": f"{fakebin}:{slurm_env.SAFE_PATH}",
             "FAKE_COMMENT": "gsrun:tune=swappiness=10,dirty_ratio=40,thp=never"}
    cpus = os.cpu_count() or 1
    out: dict = {"runs": args.runs, "errors": []}
    daemon = slurm_env.start_node_daemon(node, base / "state", extra)   # the node monitor the hooks ask
    before = snapshot()
    t_pass = [wall_ms([sys.executable, "-c", "pass"], {"PATH": slurm_env.SAFE_PATH})[0] for _ in range(args.runs + 1)][1:]
    times = {"prolog": [], "epilog": [], "prolog_mps": [], "epilog_mps": []}
    restored = True
    jid = 990100
    for kind, n in (("", args.runs), ("_mps", args.mps_runs)):
        for _ in range(n):
            jid += 1
            spank = {"SPANK_GS_TUNE": "swappiness=10,dirty_ratio=40,thp=never", "SPANK_GS_EXCLUSIVE": "1"}
            if kind:
                spank["SPANK_GS_MPS"] = ""
            pe = slurm_env.prolog_env(str(jid), 65534, 65534, "nobody", "h200", "0", cpus, "/tmp", spank, extra)
            ee = slurm_env.epilog_env(str(jid), 65534, 65534, "nobody", "h200", "0", cpus, "/tmp", spank, extra)
            t, rc, err = wall_ms([node, "prolog"], pe)
            times["prolog" + kind].append(t)
            if rc:
                out["errors"].append(f"prolog rc {rc}: {err}")
            time.sleep(1.0)
            t, rc, err = wall_ms([node, "epilog"], ee)
            times["epilog" + kind].append(t)
            if rc:
                out["errors"].append(f"epilog rc {rc}: {err}")
            if snapshot() != before:
                restored = False
    daemon.terminate()
    daemon.wait(30)
    script = base / "train.py"
    script.write_text("print('hi')\n")
    dry = []
    for _ in range(args.runs + 1):
        t, rc, err = wall_ms([gsrun, "--gpus", "1", "--gpus-per-node", "1", "--dry-run", str(script)],
                             {"PATH": slurm_env.SAFE_PATH, **extra})
        dry.append(t)
        if rc:
            out["errors"].append(f"dry-run rc {rc}: {err}")
    dry = dry[1:]
    med = {k: round(statistics.median(v), 1) for k, v in times.items() if v}
    p = statistics.median(t_pass)
    out.update({
        "python_c_pass_ms": round(p, 1), "median_ms": med, "dry_run_ms": round(statistics.median(dry), 1),
        "ratios_vs_python_c_pass": {**{k: round(v / p, 2) for k, v in med.items()},
                                    "dry_run": round(statistics.median(dry) / p, 2)},
        "restored_after_each_pair": restored,
    })
    try:
        out["sampler"] = sampler_cost(args.samples, base)
    except Exception as e:  # noqa: BLE001
        import traceback
        out["sampler"] = {"error": traceback.format_exc()[-2000:]}
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
