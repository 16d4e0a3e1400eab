#!/usr/bin/env python3
"""Record the real GPU node for ``tests/data/hosts/h200-real/`` (part of the
real GPU node validation, see BENCHMARKS.md).

    python3 tests/gpu/record_real.py OUTDIR

Writes under OUTDIR (read-only probing; no NVML set call, nothing tuned):

* ``nvml.json``: every key of :data:`gsrun.facts.nvml.KEYS` for each GPU, asked
  through gsrun's own :class:`gsrun.facts.nvml.RealNvml` and written in the
  recording format :class:`gsrun.facts.nvml.FakeNvml` reads (``{"ok": v}`` /
  ``{"error", "code"}``). ``gpm`` is asked twice, 1 s apart, while a
  4096x4096 bf16 matmul loop runs (the second answer is recorded; the first
  is ``first GPM sample`` by design); ``util_samples`` is the driver's whole
  buffer (``since_us=0``);
* ``nvidia-smi-topo-m.txt``, ``nvidia-smi-q.txt`` (first 80 lines);
* ``tree/``: the same files as the recorded ``tests/data/hosts/h200-vm``
  tree (its ``proc/`` and ``sys/`` paths), read from this host, for a diff;
* ``plans.json``: ``gsrun-bind --plan --json`` for 1 and 4 local ranks on
  this host (``SLURM_JOB_GPUS=0``), to compare with the golden plans made
  from the recorded tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from gsrun.facts.nvml import KEYS, NA, RealNvml, is_na  # noqa: E402

LOAD = ("import torch,time\na=torch.randn(4096,4096,device='cuda',dtype=torch.bfloat16)\n"
        "print('go',flush=True)\nend=time.time()+6\nwhile time.time()<end:\n c=a@a\n torch.cuda.synchronize()\n")


def enc(v):
    if is_na(v):
        return {"error": v.reason, "code": v.code}
    return {"ok": v}


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    nv = RealNvml()
    rec: dict = {"driver": enc(nv.driver_version()), "count": {"ok": nv.count()}, "devices": [],
                 "recorded_by": "tests/gpu/record_real.py (gsrun.facts.nvml.RealNvml)", "recorded_at": time.time()}
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    load.stdout.readline()
    for i in range(nv.count()):
        dev: dict = {"index": i}
        for key in KEYS:
            if key in ("gpm", "util_samples", "gpu_instance_profiles", "xid_events"):
                continue
            dev[key] = enc(nv.get(i, key))
        first = nv.get(i, "gpm")
        time.sleep(1.0)
        dev["gpm"] = enc(nv.get(i, "gpm"))
        dev["gpm_first_call"] = enc(first)
        dev["util_samples"] = enc(nv.get(i, "util_samples", since_us=0))
        dev["xid_events"] = enc(nv.get(i, "xid_events"))
        gi = nv.get(i, "gpu_instance_profiles")
        dev["gpu_instance_profiles"] = gi if not is_na(gi) else {"error": gi.reason, "code": gi.code}
        dev["utilization_under_load"] = enc(nv.get(i, "utilization"))
        rec["devices"].append(dev)
    load.wait(30)
    nv.close()
    (out / "nvml.json").write_text(json.dumps(rec, indent=1, default=str))
    for name, argv in (("nvidia-smi-topo-m.txt", ["nvidia-smi", "topo", "-m"]),
                       ("nvidia-smi-q.txt", ["nvidia-smi", "-q"])):
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            text = cp.stdout if name.endswith("topo-m.txt") else "\n".join(cp.stdout.splitlines()[:80])
            (out / name).write_text(text)
        except Exception as e:  # noqa: BLE001
            (out / name).write_text(f"error: {e}\n")
    # the recorded tree's paths, read from this host
    ref = REPO / "tests" / "data" / "hosts" / "h200-vm"
    copied = 0
    for top in ("proc", "sys"):
        for p in sorted((ref / top).rglob("*")):
            if not p.is_file():
                continue
            rel = p.relative_to(ref)
            src = Path("/") / rel
            dst = out / "tree" / rel
            try:
                data = src.read_bytes()
            except OSError:
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            copied += 1
    plans = {}
    bind = shutil.which("gsrun-bind")
    for n in (1, 4):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_GPUS": "0", "SLURM_STEP_GPUS": "0",
               "CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_LOCALID": "0"}
        try:
            cp = subprocess.run([bind, "--plan", "--json"], env=env, capture_output=True, text=True, timeout=60)
            plans[str(n)] = json.loads(cp.stdout) if cp.returncode == 0 else {"rc": cp.returncode, "stderr": cp.stderr}
        except Exception as e:  # noqa: BLE001
            plans[str(n)] = {"error": str(e)}
    (out / "plans.json").write_text(json.dumps(plans, indent=1))
    print(json.dumps({"nvml_keys": len(rec["devices"][0]) if rec["devices"] else 0, "tree_files": copied,
                      "gpm": rec["devices"][0].get("gpm") if rec["devices"] else None,
                      "util_samples_n": len(rec["devices"][0]["util_samples"].get("ok") or [])
                      if rec["devices"] else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
