#!/usr/bin/env python3
"""A hung collective recognised without GPM on the real H200, and a busy GPU not taken for one.

Run as root or not on the GPU machine, with gsrun importable:

    python3 tests/gpu/hang_real.py [--busy-s 20] [--spin-s 40] [--out hang_real.json]

gsrun's sampler (:class:`gsrun.node.sampler.Sampler`, real NVML, GPU 0) with GPM taken
away (the GPU's ref says no GPM, as on a GPU without it: the detector must decide from
utilization, power against the enforced limit, and NVLink/PCIe traffic), polling every
1 s with ``stuck_after_min`` 0.25 (15 s):

1. ``--busy-s`` of bf16 matmuls (real work: high power): no stuck finding;
2. ``--spin-s`` of a kernel that spins on the SMs without moving data
   (``torch.cuda._sleep``: what a rank waiting in a collective looks like to NVML:
   utilization near 100 %, power near idle, no link traffic): one
   ``gpu_stuck_collective`` finding, whose evidence names the signals used.

Prints one JSON verdict (checks, the finding, the mean figures of each phase) and exits 0
when every check holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from restart_real import TASK as BUSY  # noqa: E402  (bf16 matmuls for argv[1] seconds)

SPIN = ("import sys, time, torch\n"
        "torch.cuda.init()\n"
        "end = time.time() + float(sys.argv[1])\n"
        "while time.time() < end:\n"
        "    torch.cuda._sleep(1_000_000_000)\n"
        "    torch.cuda.synchronize()\n")


def phase(s, code: str, seconds: float) -> dict:
    """Run ``code`` on GPU 0 for ``seconds`` while the sampler polls every 1 s -> the phase's figures."""
    p = subprocess.Popen([sys.executable, "-c", code, str(seconds)], stderr=subprocess.PIPE)
    n0 = len(s.state["waste_findings"])
    t_end = time.time() + seconds + 2
    while time.time() < t_end and p.poll() is None:
        s.poll()
        time.sleep(1.0)
    p.wait(60)
    err = p.stderr.read().decode(errors="replace")[-800:]
    return {"rc": p.returncode, "stderr": err, "new_findings": s.state["waste_findings"][n0:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy-s", type=float, default=20.0)
    ap.add_argument("--spin-s", type=float, default=40.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from gsrun.facts.hostfs import HostFS
    from gsrun.facts.nvml import open_nvml
    from gsrun.node.sampler import Sampler, state_to_json
    from gsrun.request.waste import IdleConfig

    nv = open_nvml(HostFS("/"))
    minor = nv.get(0, "minor")
    tmp = Path(tempfile.mkdtemp(prefix="gsrun-hang-"))
    cfg = IdleConfig(stuck_after_min=0.25, warn_after_min=60.0)
    s = Sampler(HostFS("/"), "990012", None, "h200", [int(minor)], str(tmp / "sampler.json"), 1.0, 5.0, 1000,
                nvml=nv, usage=lambda: (None, None, None, "not read"), idle=cfg)
    gpm_real = s.refs[0].gpm
    s.refs = [dataclasses.replace(r, gpm=False) for r in s.refs]        # a GPU without GPM
    out: dict = {"gpu": s.refs[0].name, "gpm_on_this_gpu": gpm_real, "power_limit_w": s.refs[0].power_limit_w,
                 "checks": {}}
    busy = phase(s, BUSY, a.busy_s)
    spin = phase(s, SPIN, a.spin_s)
    s.finish()
    final = state_to_json(s.state)
    g = final["gpus"][0]
    out["busy"], out["spin"] = busy, spin
    out["unsupported"] = g.get("unsupported")
    out["not_polled"] = g.get("not_polled")
    stuck = [f for f in spin["new_findings"] if f.get("code") == "gpu_stuck_collective"]
    out["finding"] = stuck[0] if stuck else None
    c = out["checks"]
    c["tasks_ran"] = busy["rc"] == 0 and spin["rc"] == 0
    c["busy_not_stuck"] = not [f for f in busy["new_findings"] if f.get("code") == "gpu_stuck_collective"]
    c["spin_found_stuck_without_gpm"] = bool(stuck)
    text = json.dumps(stuck[0]) if stuck else ""
    c["evidence_names_its_signals"] = bool(stuck) and "no GPM" in text and "PCIe" in text and "power" in text
    out["ok"] = all(c.values())
    nv.close()
    body = json.dumps(out, indent=1, default=str)
    if a.out:
        Path(a.out).write_text(body)
    print(body)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
