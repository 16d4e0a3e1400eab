#!/usr/bin/env python3
"""The bound step's sysfs-first topology read against NVML's answer on a real
GPU node.

    python3 -P tests/gpu/bind_topology_real.py [--runs 7] [--out FILE]

Standalone, ~20 s, read-only (changes no GPU or node setting). On the live
host (``/``):

1. ``facts``: :func:`gsrun.facts.topology.read_topology` with NVML
   (``nvml=True``, what ``gsrun-node doctor`` and the ``gsrun-bind --plan``
   table use) and sysfs-first (``nvml=NVML_IF_NEEDED``, what the SPANK plugin
   and ``gsrun-bind --plan --json`` use): every GPU's bus id, minor, UUID,
   NUMA node and its source, PCI path must be equal; ``nvml_index`` equal
   when sysfs-first opened NVML, None when it did not. Also recorded per GPU:
   sysfs ``numa_node`` and ``local_cpulist`` as read, NVML's CPU affinity,
   procfs' minor/UUID, and why NVML was (not) needed
   (:func:`gsrun.facts.topology.sysfs_decides`).
2. ``plans``: the plan JSON for 1, n and 2n ranks on all GPUs (and on GPU 0
   alone) from both reads must be identical.
3. ``timing``: wall time of a fresh interpreter reading the topology each
   way (median of ``--runs``), against the same interpreter doing nothing.

Prints one JSON verdict (``ok`` true when 1 and 2 hold), also written to
``--out``; exit 0 when ok, 1 when a check fails, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

READ = """
import sys
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import NVML_IF_NEEDED, read_topology
read_topology(HostFS("/"), nvml=NVML_IF_NEEDED if sys.argv[1] == "first" else True)
"""


def _gpu_facts(g) -> dict:
    return {"pci_bus_id": g.pci_bus_id, "minor": g.minor, "uuid": g.uuid, "numa_node": g.numa_node,
            "numa_source": g.numa_source, "pci_path": list(g.pci_path)}


def _time(argv: list[str], runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=60)
        out.append(time.perf_counter() - t0)
    return round(statistics.median(out) * 1000, 1)


def _emit(verdict: dict, out: str | None) -> None:
    text = json.dumps(verdict, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from gsrun.bind.plan import plan_from_env
    from gsrun.base.cpulist import parse_cpulist
    from gsrun.facts.hostfs import HostFS
    from gsrun.facts.topology import NVML_IF_NEEDED, read_gpus, read_topology, sysfs_decides

    verdict: dict = {"ok": False, "checks": {}}
    fs = HostFS("/")
    try:
        full = read_topology(fs)
        first = read_topology(fs, nvml=NVML_IF_NEEDED)
    except Exception as e:  # noqa: BLE001 - reported, exit 2
        verdict["error"] = f"{type(e).__name__}: {e}"
        _emit(verdict, a.out)
        return 2
    sysfs_only, _ = read_gpus(fs, list(full.nodes), list(full.cpus_online), None)
    opened = not any(n.startswith("NVML not opened") for n in first.notes)
    verdict["nvml_opened_by_sysfs_first"] = opened
    verdict["why_nvml"] = sysfs_decides(fs, sysfs_only)
    verdict["notes"] = {"nvml": list(full.notes), "sysfs_first": list(first.notes)}
    gpus = []
    for g in full.gpus:
        base = f"sys/bus/pci/devices/{g.pci_bus_id}"
        local = fs.read(f"{base}/local_cpulist")
        try:
            local_cpus = parse_cpulist(local) if local else None
        except Exception:  # noqa: BLE001
            local_cpus = None
        gpus.append({**_gpu_facts(g), "nvml_index": g.nvml_index,
                     "sysfs_numa_node": fs.read(f"{base}/numa_node"), "sysfs_local_cpulist": local,
                     "nvml_local_cpus_equal_local_cpulist": local_cpus is not None
                     and sorted(local_cpus) == sorted(g.local_cpus)})
    verdict["gpus"] = gpus
    c = verdict["checks"]
    c["gpus_found"] = len(full.gpus) > 0
    c["facts_equal"] = [_gpu_facts(g) for g in first.gpus] == [_gpu_facts(g) for g in full.gpus]
    c["nvml_index"] = ([g.nvml_index for g in first.gpus] == [g.nvml_index for g in full.gpus] if opened
                       else all(g.nvml_index is None for g in first.gpus))
    minors = [g.minor for g in full.gpus if g.minor is not None]
    envs = []
    if minors:
        k = len(minors)
        for sel in (minors, minors[:1]):
            for n in sorted({1, len(sel), 2 * len(sel), k}):
                envs.append({"SLURM_STEP_GPUS": ",".join(map(str, sel)), "SLURM_STEP_TASKS_PER_NODE": str(n)})
    diffs = []
    for env in envs:
        pa = plan_from_env(env, fs, None, topology=full).to_json()
        pb = plan_from_env(env, fs, None, topology=first).to_json()
        if pa != pb:
            diffs.append({"env": env, "nvml": pa, "sysfs_first": pb})
    c["plans_equal"] = bool(envs) and not diffs
    verdict["plans_compared"] = len(envs)
    verdict["plan_diffs"] = diffs[:3]
    py = sys.executable
    verdict["timing_ms"] = {"floor": _time([py, "-P", "-c", "pass"], a.runs),
                            "read_nvml": _time([py, "-P", "-c", READ, "nvml"], a.runs),
                            "read_sysfs_first": _time([py, "-P", "-c", READ, "first"], a.runs)}
    verdict["ok"] = all(c.values())
    _emit(verdict, a.out)
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
