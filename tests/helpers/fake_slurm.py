"""A fake Slurm controller for ``gsrun --wait``: ``squeue``, ``sacct``,
``sbatch`` and ``scancel`` (the job becomes CANCELLED) as scripts in a directory to put first on ``PATH``, answering from
a plan file and failing in scripted ways; every call is one line in
``calls.log`` (wall time and argv), so a test or benchmark counts the RPCs a
real controller would have served.

Plan (``plan.json`` in the directory, re-read on every call)::

    {"jobs": {"101": {"run_s": 5, "exit": "0:0", "state": "COMPLETED",
                      "in_queue": true, "in_acct": true, "stdout": "/path"}},
     "submitted": {"101": 1700000000.0},
     "fail": ["timeout", "again", "rate", "contact", "kill"],
     "sbatch": "101;gpu"}

A job is RUNNING for ``run_s`` seconds after its ``submitted`` wall time,
then ``state`` with ``exit``. ``fail`` answers the first calls of squeue or
sacct one by one, each with Slurm's own message (``src/common/slurm_errno.c``):
``timeout`` (Socket timed out on send/recv operation), ``again`` (Resource
temporarily unavailable), ``rate`` (Rate limit exceeded, please retry
momentarily), ``contact`` (Unable to contact slurm controller (connect
failure)), ``kill`` (the command is killed by SIGKILL), ``hang`` (no answer:
sleeps past gsrun's timeout). ``always_fail``: every call fails that way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FAKE = r'''#!/usr/bin/env python3
import fcntl, json, os, signal, sys, time
d = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
with open(os.path.join(d, "calls.log"), "a") as f:
    f.write(json.dumps([time.time(), name] + sys.argv[1:]) + "\n")
with open(os.path.join(d, "plan.json")) as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    plan = json.load(f)
    mode = plan.get("always_fail")
    if not mode and plan.get("fail") and name != "sbatch":
        mode = plan["fail"].pop(0)
        with open(os.path.join(d, "plan.json.new"), "w") as g:
            json.dump(plan, g)
        os.rename(os.path.join(d, "plan.json.new"), os.path.join(d, "plan.json"))
MSG = {"timeout": "Socket timed out on send/recv operation",
       "again": "Resource temporarily unavailable",
       "rate": "Rate limit exceeded, please retry momentarily",
       "contact": "Unable to contact slurm controller (connect failure)"}
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "hang":
    time.sleep(3600)
if mode:
    sys.stderr.write(("slurm_load_jobs error: " if name == "squeue" else name + ": error: ") + MSG[mode] + "\n")
    sys.exit(1)
if name == "scancel":
    j = plan["jobs"][sys.argv[-1]]
    j.update(state="CANCELLED", exit="0:15", run_s=0)
    with open(os.path.join(d, "plan.json.new"), "w") as g:
        json.dump(plan, g)
    os.rename(os.path.join(d, "plan.json.new"), os.path.join(d, "plan.json"))
    sys.exit(0)
if name == "sbatch":
    sys.stdin.read()
    print(plan.get("sbatch", "101"))
    sys.exit(0)
now = time.time()
def state(jid, j):
    t0 = plan.get("submitted", {}).get(jid, now)
    if now - t0 < j.get("run_s", 0):
        return "RUNNING", "0:0", "%02d:%02d" % divmod(int(now - t0), 60)
    return j.get("state", "COMPLETED"), j.get("exit", "0:0"), "%02d:%02d" % divmod(int(j.get("run_s", 0)), 60)
jobs = plan.get("jobs", {})
if name == "squeue":
    for jid, j in sorted(jobs.items()):
        if j.get("in_queue", True):
            st, ec, used = state(jid, j)
            print("|".join([jid, st, "None", used, "n1", ec, j.get("stdout", "")]) + "|")
elif name == "sacct":
    jid = sys.argv[sys.argv.index("-j") + 1]
    j = jobs.get(jid)
    if j and j.get("in_acct", True):
        st, ec, used = state(jid, j)
        print("|".join([jid, st, ec, used, "n1"]))
'''


class FakeSlurm:
    """The fake commands in ``root`` (created), with ``plan`` written."""

    def __init__(self, root: Path, plan: dict):
        self.dir = Path(root)
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("squeue", "sacct", "sbatch", "scancel"):
            p = self.dir / name
            p.write_text(FAKE.replace("/usr/bin/env python3", sys.executable, 1))
            p.chmod(0o755)
        self.set_plan(plan)

    def set_plan(self, plan: dict) -> None:
        tmp = self.dir / "plan.json.new"
        tmp.write_text(json.dumps(plan))
        os.rename(tmp, self.dir / "plan.json")

    def path(self) -> str:
        """``PATH`` with the fake commands first."""
        return f"{self.dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def calls(self, name: str | None = None) -> list[list]:
        """``[[wall time, command, args...], ...]`` in call order."""
        log = self.dir / "calls.log"
        if not log.exists():
            return []
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return [r for r in rows if name is None or r[1] == name]
