#!/usr/bin/env python3
"""RPCs that a waiting user sends to slurmctld (issue 24, item 4), counted by
slurmctld itself (``sdiag``, "Remote Procedure Call statistics by user"),
side by side in one run on the local test cluster.

For each mode a job of the test user that sleeps ``--job-s`` seconds is
submitted, ``sdiag -r`` resets the counters, the waiter runs as the test user
until the job ends, and the user's RPC count is read back:

* ``naive``: what ``gsrun --wait`` did before the backoff: ``scontrol show
  job`` every second (scontrol asks for the federation first: 2 RPCs a poll);
* ``gsrun``: the installed ``gsrun.wrapper.submit.follow`` (backoff, one
  ``scontrol --local`` RPC a poll).

Prints JSON: per mode the RPC count by message type, the user's total, and
RPCs per waiting-job-minute; the ratio gsrun/naive. The waiters run one after
the other (their counts would mix: sdiag counts by user).

Run as root with the cluster up (the lead does; never in CI):

    tests/cluster/up && /opt/gsrun/venv/bin/python tests/bench/bench_wait_rpc.py --job-s 180
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

NAIVE = r"""
import subprocess, sys, time
job = sys.argv[1]
while True:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    m = [w for w in out.split() if w.startswith("JobState=")]
    if not m or m[0].split("=", 1)[1] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        break
    time.sleep(1.0)
"""

GSRUN = r"""
import sys
from gsrun.wrapper.submit import follow
sys.exit(follow(sys.argv[1], err=open("/dev/null", "w")))
"""


def sh(argv: list[str], user: str | None = None, **kw) -> subprocess.CompletedProcess:
    if user:
        argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={os.environ['SLURM_CONF']}",
                f"PATH={os.environ['PATH']}"] + argv
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def user_rpcs(user: str) -> tuple[int, dict[str, int]]:
    out = sh(["sdiag"]).stdout
    types = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(REQUEST_\w+)\s+\(\s*\d+\) count:(\d+)", out, re.M)}
    by_user = out.split("by user", 1)[-1]
    m = re.search(rf"^\s+{re.escape(user)}\s+\(\s*\d+\) count:(\d+)", by_user, re.M)
    return (int(m.group(1)) if m else 0), types


def one(mode: str, code: str, job_s: float, user: str, workdir: str) -> dict:
    jid = sh(["sbatch", "--parsable", "-o", f"{workdir}/wait-rpc-%j.out", "--wrap", f"sleep {job_s:g}"],
             user=user, cwd=workdir, check=True).stdout.strip().split(";")[0]
    time.sleep(2)
    sh(["sdiag", "-r"], check=True)
    t0 = time.monotonic()
    sh([sys.executable, "-c", code, jid], user=user, cwd=workdir, timeout=job_s + 300)
    wall_s = time.monotonic() - t0
    total, types = user_rpcs(user)
    return {"mode": mode, "job": jid, "wait_s": round(wall_s, 1), "user_rpcs": total,
            "rpcs_per_job_minute": round(total / (wall_s / 60), 1),
            "by_type": {k: v for k, v in types.items() if k in ("REQUEST_FED_INFO", "REQUEST_JOB_INFO_SINGLE",
                                                              "REQUEST_JOB_INFO")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-s", type=float, default=180.0)
    ap.add_argument("--user", default=os.environ.get("GSRUN_TEST_USER", "gsrun-test"))
    ap.add_argument("--workdir", default="/var/tmp/gsrun-cluster/work")
    args = ap.parse_args()
    os.environ.setdefault("SLURM_CONF", "/var/tmp/gsrun-cluster/etc/slurm.conf")
    runs = [one("naive", NAIVE, args.job_s, args.user, args.workdir),
            one("gsrun", GSRUN, args.job_s, args.user, args.workdir)]
    out = {"job_s": args.job_s, "runs": runs,
           "ratio_gsrun_vs_naive": round(runs[1]["user_rpcs"] / max(1, runs[0]["user_rpcs"]), 3)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
