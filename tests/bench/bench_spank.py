#!/usr/bin/env python3
"""What the SPANK plugin adds to ``srun -n 8 true`` and to ``sbatch``
submission, measured side by side in one run on the local test cluster.

The plugstack file is switched between the plugin line and empty before each
run (order alternates); srun/sbatch read it at start and slurmstepd at each
step, so both the local and the remote side are measured. Prints JSON with
medians and ratios. Run as root with the cluster up:

    tests/cluster/up && /opt/gsrun/venv/bin/python tests/bench/bench_spank.py --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path


def timed(argv, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=os.environ.get("GSRUN_CLUSTER_DIR", "/var/tmp/gsrun-cluster"))
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    d = Path(a.cluster)
    plug = d / "etc" / "plugstack.conf"
    line = plug.read_text()
    if "gsrun_spank.so" not in line:
        raise SystemExit("the cluster has no SPANK plugin in its plugstack.conf (tests/cluster/up without --no-spank)")
    env = dict(os.environ, SLURM_CONF=str(d / "etc" / "slurm.conf"))
    srun = ["runuser", "-u", "gsrun-test", "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
            "srun", "-N", "2", "-n", "8", "--overlap", "true"]
    sbatch = ["runuser", "-u", "gsrun-test", "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
              "sbatch", "--parsable", "-o", "/dev/null", "--hold", "--wrap", "true"]
    res = {"with": {"srun": [], "sbatch": []}, "without": {"srun": [], "sbatch": []}}
    try:
        for r in range(a.rounds):
            for mode in (("with", "without") if r % 2 == 0 else ("without", "with")):
                plug.write_text(line if mode == "with" else "\n")
                res[mode]["srun"].append(timed(srun, env))
                res[mode]["sbatch"].append(timed(sbatch, env))
    finally:
        plug.write_text(line)
        subprocess.run(["scancel", "-u", "gsrun-test", "--state=PENDING"], env=env, check=False)
    out = {"rounds": a.rounds}
    for what in ("srun", "sbatch"):
        w = statistics.median(res["with"][what])
        wo = statistics.median(res["without"][what])
        out[what] = {"with_plugin_median_s": round(w, 4), "without_plugin_median_s": round(wo, 4),
                     "added_s": round(w - wo, 4), "ratio": round(w / wo, 3)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
