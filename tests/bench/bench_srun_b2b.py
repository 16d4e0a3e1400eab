#!/usr/bin/env python3
"""Back-to-back ``srun -N2 -n8 true`` with gsrun (SPANK plugin, Prolog,
Epilog, EpilogSlurmctld) against the same cluster with all of them removed
(``bare``), and with each hook replaced by ``/bin/true`` (``true-hooks``: what
having hooks at all costs in Slurm), side by side in one run on the local test
cluster (within 1.15x of ``bare``).

Each ``srun`` makes a new allocation, so every one pays the prolog on both
nodes (``PrologFlags=Alloc``), the epilog on both and EpilogSlurmctld, and
the next one starts only when the nodes have left COMPLETING. The two modes
alternate every round (``scontrol reconfigure`` between them; plugstack.conf
and the hook lines of slurm.conf switched, restored at the end whatever
happens); a round times ``--per-round`` sruns in a row.

Run as root with the cluster up (the lead does; never in CI):

    tests/cluster/up && /opt/gsrun/venv/bin/python tests/bench/bench_srun_b2b.py --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

RATIO_MAX = 1.15
HOOK_KEYS = ("Prolog", "Epilog", "EpilogSlurmctld")


def bare_conf(text: str) -> str:
    """slurm.conf without gsrun's hooks (the Prolog/Epilog/EpilogSlurmctld lines commented)."""
    return re.sub(rf"^(({'|'.join(HOOK_KEYS)})=)", r"#bench# \1", text, flags=re.M)


def wait_idle(env: dict, what: str) -> None:
    """Both nodes idle: no job still COMPLETING (its epilog and slurmstepd's
    SPANK epilog read the files this bench switches)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%t"], env=env, capture_output=True,
                             text=True).stdout.split()
        if out and all(s == "idle" for s in out):
            return
        time.sleep(0.2)
    raise SystemExit(f"nodes not idle {what}: {out}")


def trivial_conf(text: str) -> str:
    """slurm.conf with every hook of gsrun replaced by ``/bin/true``: what Slurm costs for having
    a Prolog/Epilog/EpilogSlurmctld at all (nodes COMPLETING until the epilog reports)."""
    return re.sub(rf"^(({'|'.join(HOOK_KEYS)})=).*$", r"\1/bin/true", text, flags=re.M)


def one_true(text: str, key: str) -> str:
    """slurm.conf with only gsrun's ``key`` hook replaced by ``/bin/true`` (what that hook costs)."""
    return re.sub(rf"^({key}=).*$", r"\1/bin/true", text, flags=re.M)


def bind_none(plugstack: str) -> str:
    """plugstack.conf with ``bind=none`` on gsrun's line (the plugin loaded, the site not binding)."""
    return "".join(ln.rstrip("\n") + (" bind=none\n" if "gsrun_spank" in ln else "\n")
                   for ln in plugstack.splitlines(True))


def reconfigure(env: dict) -> None:
    subprocess.run(["scontrol", "reconfigure"], env=env, check=True, capture_output=True)
    wait_idle(env, "after scontrol reconfigure")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=os.environ.get("GSRUN_CLUSTER_DIR", "/var/tmp/gsrun-cluster"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--user", default="gsrun-test")
    ap.add_argument("--modes", default="gsrun,bare,true-hooks",
                    help="also: no-plugin (hooks, no SPANK plugin), bind-none (the plugin with bind=none: no "
                         "Python in slurmstepd), true-prolog, true-ctld (that one hook "
                         "/bin/true): where the time goes. Not the epilog: without it each job's sampler "
                         "would go on polling and its tuning registration stay")
    a = ap.parse_args()
    d = Path(a.cluster)
    conf, plug = d / "etc" / "slurm.conf", d / "etc" / "plugstack.conf"
    orig_conf, orig_plug = conf.read_text(), plug.read_text()
    env = dict(os.environ, SLURM_CONF=str(conf))
    argv = ["runuser", "-u", a.user, "--", "env", f"SLURM_CONF={conf}", "srun", "-p", "gpu", "-N", "2", "-n", "8",
            "true"]
    known = {"gsrun": (orig_conf, orig_plug), "bare": (bare_conf(orig_conf), "\n"),
             "true-hooks": (trivial_conf(orig_conf), "\n"), "no-plugin": (orig_conf, "\n"),
             "true-prolog": (one_true(orig_conf, "Prolog"), orig_plug),
             "true-ctld": (one_true(orig_conf, "EpilogSlurmctld"), orig_plug),
             "bind-none": (orig_conf, bind_none(orig_plug))}
    names = [m for m in a.modes.split(",") if m]
    if not {"gsrun", "bare"} <= set(names) or set(names) - set(known):
        raise SystemExit(f"--modes: gsrun and bare, plus any of {sorted(set(known) - {'gsrun', 'bare'})}")
    modes = {m: known[m] for m in names}
    res: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for r in range(a.rounds):
            for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                wait_idle(env, "before switching the configuration")
                conf.write_text(modes[m][0])
                plug.write_text(modes[m][1])
                reconfigure(env)
                subprocess.run(argv, env=env, check=True, capture_output=True, cwd="/tmp")   # warm, unmeasured
                t0 = time.perf_counter()
                for _ in range(a.per_round):
                    subprocess.run(argv, env=env, check=True, capture_output=True, cwd="/tmp")
                res[m].append((time.perf_counter() - t0) / a.per_round)
    finally:
        try:
            wait_idle(env, "before restoring the configuration")
        finally:
            conf.write_text(orig_conf)
        plug.write_text(orig_plug)
        reconfigure(env)
    med = {m: statistics.median(v) for m, v in res.items()}
    ratio = med["gsrun"] / med["bare"]
    print(json.dumps({"rounds": a.rounds, "per_round": a.per_round,
                      "ratio_to_bare": {m: round(v / med["bare"], 3) for m, v in med.items()},
                      "per_srun_s": {m: [round(x, 3) for x in v] for m, v in res.items()},
                      "median_per_srun_s": {m: round(v, 3) for m, v in med.items()},
                      "ratio_gsrun_vs_bare": round(ratio, 3), "target_max": RATIO_MAX, "met": ratio <= RATIO_MAX},
                     indent=1))


if __name__ == "__main__":
    main()
