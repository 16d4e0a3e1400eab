#!/usr/bin/env python3
"""What the SPANK plugin adds to ``sbatch --wrap true`` and to an ``srun -n1
true`` step, with and without ``--gs-*`` options, measured side by side in one
run on the local test cluster.

The cluster's plugstack file is switched before each command between

* ``none``: empty (the baseline: no plugin),
* ``plugin``: the plugin line as ``tests/cluster/up`` wrote it (``bind=`` not
  given: the site binds tasks, so slurmstepd starts Python for a normal step),
* ``bind-none``: the same line with ``bind=none`` (an unused plugin: no
  Python anywhere unless a ``--gs-*`` option is given),

in an order that rotates every round. sbatch/srun read the file at start and
slurmstepd at each step, so the client and the node side are both measured.
``sbatch`` runs with ``--hold`` (submission only; the held jobs are cancelled
at the end). Prints JSON: medians, ratios against ``none`` and the targets:

* ``sbatch --wrap true`` and ``srun -n1 true`` without ``--gs-*``: ratio <= 1.10
  (``srun`` under ``bind-none``; under ``plugin`` it is shown, not judged:
  binding every task is work the site asked for);
* with ``--gs-*`` options: added time <= 30 ms (``sbatch --gs-mps=50
  --gs-report=none``, ``srun -n1 --gs-report=none``, both under ``plugin``,
  and the srun one also under ``bind-none``: there slurmstepd starts Python
  for the option alone, not to bind the task).
Each command waits ``--gap-s`` first, so that it is not measured behind the
previous job's epilogs and merge.

Run as root with the cluster up (the lead does; never in CI):

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

RATIO_MAX = 1.10
ADDED_MAX_S = 0.030


def timed(argv, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    return time.perf_counter() - t0


def plugstack_lines(line: str) -> dict[str, str]:
    """The three plugstack texts measured (see the module doc)."""
    plugin = line.strip()
    words = [w for w in plugin.split() if not w.startswith("bind=")]
    return {"none": "\n", "plugin": plugin + "\n", "bind-none": " ".join(words + ["bind=none"]) + "\n"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=os.environ.get("GSRUN_CLUSTER_DIR", "/var/tmp/gsrun-cluster"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--user", default="gsrun-test")
    ap.add_argument("--gap-s", type=float, default=1.0,
                    help="pause before each command: the previous job's epilogs, sampler exit and merge finish "
                         "first (without it each case is measured behind the same predecessor's tail)")
    a = ap.parse_args()
    d = Path(a.cluster)
    plug = d / "etc" / "plugstack.conf"
    original = plug.read_text()
    if "gsrun_spank.so" not in original:
        raise SystemExit("the cluster has no SPANK plugin in its plugstack.conf (tests/cluster/up without --no-spank)")
    texts = plugstack_lines(next(ln for ln in original.splitlines() if "gsrun_spank.so" in ln))
    conf = str(d / "etc" / "slurm.conf")
    env = dict(os.environ, SLURM_CONF=conf)
    user = ["runuser", "-u", a.user, "--", "env", f"SLURM_CONF={conf}"]
    sbatch = user + ["sbatch", "--parsable", "-o", "/dev/null", "--hold"]
    srun = user + ["srun", "-N", "1", "-n", "1"]
    cases = {   # name: (plugstack, argv)
        "sbatch/none": ("none", sbatch + ["--wrap", "true"]),
        "sbatch/plugin": ("plugin", sbatch + ["--wrap", "true"]),
        "sbatch/bind-none": ("bind-none", sbatch + ["--wrap", "true"]),
        "sbatch-gs/plugin": ("plugin", sbatch + ["--gs-mps=50", "--gs-report=none", "--wrap", "true"]),
        "srun/none": ("none", srun + ["true"]),
        "srun/plugin": ("plugin", srun + ["true"]),
        "srun/bind-none": ("bind-none", srun + ["true"]),
        "srun-gs/plugin": ("plugin", srun + ["--gs-report=none", "true"]),
        "srun-gs/bind-none": ("bind-none", srun + ["--gs-report=none", "true"]),
    }
    names = list(cases)
    res: dict[str, list[float]] = {n: [] for n in names}
    try:
        for n in names:                       # warm caches once, unmeasured
            plug.write_text(texts[cases[n][0]])
            timed(cases[n][1], env)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                mode, argv = cases[n]
                plug.write_text(texts[mode])
                time.sleep(a.gap_s)
                res[n].append(timed(argv, env))
    finally:
        plug.write_text(original)
        subprocess.run(["scancel", "-u", a.user, "--state=PENDING"], env=env, check=False)
    med = {n: statistics.median(v) for n, v in res.items()}
    out: dict = {"rounds": a.rounds, "median_s": {n: round(v, 4) for n, v in med.items()}}
    ratios = {
        "sbatch_plugin_vs_none": med["sbatch/plugin"] / med["sbatch/none"],
        "sbatch_bind_none_vs_none": med["sbatch/bind-none"] / med["sbatch/none"],
        "srun_bind_none_vs_none": med["srun/bind-none"] / med["srun/none"],
        "srun_plugin_vs_none (binding on, not judged)": med["srun/plugin"] / med["srun/none"],
    }
    added = {
        "sbatch_gs_options_ms": (med["sbatch-gs/plugin"] - med["sbatch/none"]) * 1000,
        "srun_gs_options_ms": (med["srun-gs/plugin"] - med["srun/none"]) * 1000,
        # the same where the site does not bind tasks (bind=none): what the options cost by themselves
        "srun_gs_options_bind_none_ms": (med["srun-gs/bind-none"] - med["srun/none"]) * 1000,
    }
    out["ratio"] = {k: round(v, 3) for k, v in ratios.items()}
    out["added_ms"] = {k: round(v, 1) for k, v in added.items()}
    out["targets"] = {
        "ratio_max": RATIO_MAX, "added_max_ms": ADDED_MAX_S * 1000,
        "met": {k: v <= RATIO_MAX for k, v in ratios.items() if "not judged" not in k}
        | {k: v <= ADDED_MAX_S * 1000 for k, v in added.items()},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
