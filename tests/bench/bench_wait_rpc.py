#!/usr/bin/env python3
"""RPCs that a waiting user sends to slurmctld, counted by slurmctld itself
(``sdiag``, "Remote Procedure Call statistics by user"), side by side in one
run on the local test cluster; and, with ``--fake``, the calls N waiters make
to a fake controller (tests/helpers/fake_slurm.py), no cluster needed.

For each mode a job of the test user that sleeps ``--job-s`` seconds is
submitted, ``sdiag -r`` resets the counters, the waiter runs as the test user
until the job ends, and the user's RPC count is read back:

* ``naive``: what ``gsrun --wait`` did before the backoff: ``scontrol show
  job`` every second (scontrol asks for the federation first: 2 RPCs a poll);
* ``gsrun``: the installed ``gsrun.wrapper.submit.follow_to_end`` (backoff, one
  ``scontrol --local`` RPC a poll).

Prints JSON: per mode the RPC count by message type, the user's total, and
RPCs per waiting-job-minute; the ratio gsrun/naive. The waiters run one after
the other (their counts would mix: sdiag counts by user).

``--waiters 1,40 --window-s 60``: RPCs per second while N waiters of one
user follow N jobs (pending or running) during the first ``--window-s``
seconds, for ``previous`` (the earlier ``gsrun --wait``: one ``scontrol
--local`` per waiter, every second for the first 10 s after a change, then
backing off) and ``gsrun`` (the shared ``squeue --me``).

Measured on the local cluster (Slurm 22.05, 2 CPUs, 60 s window, jobs pending or
running): ``previous`` 0.42 RPC/s for 1 waiter and 17.0 RPC/s for 40 (the 40
scontrol processes a second are CPU-bound on 2 cores); ``gsrun`` 0.37 RPC/s for 1
waiter and 0.67 RPC/s for 40 (each squeue is 2 RPCs: REQUEST_JOB_USER_INFO and
the REQUEST_PARTITION_INFO squeue always sends). ``--fake``: 0.23 and 0.33 calls
a second over 30 s.

Run as root with the cluster up (the lead does; never in CI):

    tests/cluster/up && /opt/gsrun/venv/bin/python tests/bench/bench_wait_rpc.py --job-s 180
    /opt/gsrun/venv/bin/python tests/bench/bench_wait_rpc.py --waiters 1,40 --window-s 60
    /opt/gsrun/venv/bin/python -P tests/bench/bench_wait_rpc.py --fake --waiters 1,40 --window-s 30
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
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

# the earlier gsrun --wait: scontrol --local per poll, 1 s for 10 s after a change, then 1.5x to 30 s
PREVIOUS = r"""
import subprocess, sys, time
job = sys.argv[1]
t0 = changed = time.monotonic(); last = None
while True:
    out = subprocess.run(["scontrol", "--local", "-o", "show", "job", job], capture_output=True, text=True).stdout
    m = [w for w in out.split() if w.startswith("JobState=")]
    st = m[0] if m else ""
    now = time.monotonic()
    if st != last:
        changed, last = now, st
    if st.split("=", 1)[-1] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        break
    since = now - changed
    time.sleep(1.0 if since < 10 else min(30.0, 1.5 ** ((since - 10) / 10 + 1)))
"""

GSRUN = r"""
import sys
from gsrun.wrapper.submit import follow_to_end
sys.exit(follow_to_end(sys.argv[1], err=open("/dev/null", "w")).rc)
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


def many(mode: str, code: str, n: int, window_s: float, user: str, workdir: str) -> dict:
    """``n`` waiters of ``user`` for ``window_s`` seconds on ``n`` jobs that outlast the window."""
    jobs = [sh(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", f"sleep {window_s + 120:g}"],
               user=user, cwd=workdir, check=True).stdout.strip().split(";")[0] for _ in range(n)]
    time.sleep(2)
    sh(["sdiag", "-r"], check=True)
    procs = [subprocess.Popen(["runuser", "-u", user, "--", "env", f"SLURM_CONF={os.environ['SLURM_CONF']}",
                               f"PATH={os.environ['PATH']}", sys.executable, "-c", code, j], cwd=workdir,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for j in jobs]
    time.sleep(window_s)
    total, types = user_rpcs(user)
    for p in procs:            # the waiter is runuser's child: end the whole session, not just runuser
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    sh(["scancel", *jobs])
    return {"mode": mode, "waiters": n, "window_s": window_s, "user_rpcs": total,
            "rpcs_per_s": round(total / window_s, 2),
            "by_type": {k: v for k, v in types.items() if k.startswith("REQUEST_JOB") or k in ("REQUEST_FED_INFO",
                                                                                        "REQUEST_PARTITION_INFO")}}


def fake(n: int, window_s: float) -> dict:
    """``n`` gsrun waiters against the fake controller: its calls per second."""
    import tempfile

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from helpers.fake_slurm import FakeSlurm

    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        jobs = {str(100 + i): {"run_s": window_s + 600} for i in range(n)}
        f = FakeSlurm(os.path.join(tmp, "bin"), {"jobs": jobs, "submitted": {j: now for j in jobs}})
        env = dict(os.environ, PATH=f.path(), XDG_RUNTIME_DIR=tmp)
        procs = [subprocess.Popen([sys.executable, "-P", "-c", GSRUN, j], env=env) for j in jobs]
        time.sleep(window_s)
        calls = f.calls()
        for p in procs:
            p.kill()
            p.wait()
    t0 = min(c[0] for c in calls) if calls else now
    return {"mode": "gsrun-fake", "waiters": n, "window_s": window_s, "calls": len(calls),
            "calls_per_s": round(len(calls) / window_s, 2),
            "calls_per_s_first_10s": round(sum(1 for c in calls if c[0] - t0 < 10) / 10, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-s", type=float, default=180.0)
    ap.add_argument("--user", default=os.environ.get("GSRUN_TEST_USER", "gsrun-test"))
    ap.add_argument("--workdir", default="/var/tmp/gsrun-cluster/work")
    ap.add_argument("--waiters", default=None, help="comma-separated waiter counts, e.g. 1,40")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--fake", action="store_true", help="count the calls to a fake controller (no cluster)")
    args = ap.parse_args()
    os.environ.setdefault("SLURM_CONF", "/var/tmp/gsrun-cluster/etc/slurm.conf")
    if args.waiters:
        counts = [int(x) for x in args.waiters.split(",")]
        if args.fake:
            runs = [fake(n, args.window_s) for n in counts]
        else:
            runs = [many(mode, code, n, args.window_s, args.user, args.workdir)
                    for n in counts for mode, code in (("previous", PREVIOUS), ("gsrun", GSRUN))]
        print(json.dumps({"runs": runs}, indent=1))
        return 0
    runs = [one("naive", NAIVE, args.job_s, args.user, args.workdir),
            one("gsrun", GSRUN, args.job_s, args.user, args.workdir)]
    out = {"job_s": args.job_s, "runs": runs,
           "ratio_gsrun_vs_naive": round(runs[1]["user_rpcs"] / max(1, runs[0]["user_rpcs"]), 3)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
