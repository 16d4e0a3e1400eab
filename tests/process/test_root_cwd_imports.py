"""Root code never imports from its working directory.

A user who can write the working directory of a root hook (slurmctld's may
be ``/var/tmp``; an admin may run ``gsrun-node install`` from ``/tmp`` or a
shared checkout) plants a ``gsrun/`` package or a module named like a
standard-library one (``json.py``). With ``python -m``/``-c`` the current
directory comes first on ``sys.path``, so every child Python that root code
starts must run with ``-P -s``, ``cwd="/"`` and a scrubbed environment
(:func:`gsrun.base.proc.root_python`, :func:`gsrun.base.proc.root_child_env`).

Each root entry point runs from the planted directory -- the hooks as slurmd
runs them, *and the children they start for real*: EpilogSlurmctld's mail
flush and AdminComment step, ``gsrun-node install``'s measurement runs,
``gsrun-node doctor`` -- and each leaves evidence that it ran (the node
summary, a delivered mail, accounting.json). A planted module writes a marker
file when imported; none may appear. (The prolog starts no child: the node
daemon's monitor, started from ``/``, samples the job.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gsrun.base.proc import root_child_env, root_python
from helpers.node_site import kill_fakes, make_site, nvml_devices, run_node, wait_for

pytestmark = pytest.mark.process

PLANT = ("import os, sys\n"
         "open(os.path.join({marks!r}, {name!r} + '.' + str(os.getpid())), 'w').write(repr(sys.argv))\n")
RECORD = ("JobId=4242 JobName=t UserId=nobody(65534) GroupId=nogroup(65534) JobState=COMPLETED "
          "ExitCode=0:0 RunTime=00:01:00 NodeList=gpu-node01 NumNodes=1 MailUser=u@example.com MailType=END "
          "Partition=gpu OverSubscribe=NO Comment=(null)")


def plant(cwd: Path, marks: Path, what: str) -> None:
    if what in ("gsrun-package", "both"):
        (cwd / "gsrun").mkdir()
        (cwd / "gsrun" / "__init__.py").write_text(PLANT.format(marks=str(marks), name="gsrun"))
    if what in ("json-module", "both"):
        (cwd / "json.py").write_text(PLANT.format(marks=str(marks), name="json"))


@pytest.fixture
def site():
    s = make_site(nvml=nvml_devices(1))
    sendmail = s.base / "sendmail"
    sendmail.write_text(f"#!/bin/sh\ncat > {s.base}/delivered.eml\n")
    sendmail.chmod(0o755)
    with open(s.config, "a") as f:
        f.write(f'[mail]\nmailprog = "{sendmail}"\nfrom_addr = "gsrun@example.com"\n')
    yield s
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


@pytest.mark.parametrize("what", ["gsrun-package", "json-module"])
def test_no_root_entry_point_or_child_imports_from_cwd(site, what):
    cwd = site.base / "hostile-cwd"
    marks = site.base / "marks"
    cwd.mkdir()
    marks.mkdir()
    os.chmod(cwd, 0o777)
    plant(cwd, marks, what)
    env = site.env(gpus="0", spank={"SPANK_GS_REPORT": "1"}, FAKE_SLURM="record", FAKE_SCONTROL_RECORD=RECORD)
    jobdir = site.spool / "jobs" / "4242"
    seen = []

    def marked() -> list[str]:
        return sorted(p.name + ": " + p.read_text()[:200] for p in marks.iterdir())

    # 1. prolog, which has the node monitor begin sampling the job
    cp = run_node(["prolog"], env, cwd=str(cwd))
    seen.append(("prolog", cp.returncode, cp.stderr[-500:]))
    assert wait_for(lambda: (site.state / "jobs/4242/sampler.json").exists() or marked(), 30), seen
    # 2. epilog (ends the job's sampling, writes the node summary)
    cp = run_node(["epilog"], env, cwd=str(cwd))
    seen.append(("epilog", cp.returncode, cp.stderr[-500:]))
    # 3. EpilogSlurmctld: kicks `mail flush` and the AdminComment step as detached children
    cenv = dict(env, SLURM_SCRIPT_CONTEXT="epilog_slurmctld")
    cp = run_node(["epilog-ctld", "--wait-s", "3"], cenv, cwd=str(cwd))
    seen.append(("epilog-ctld", cp.returncode, cp.stderr[-500:]))
    assert wait_for(lambda: ((jobdir / "accounting.json").exists() and (site.base / "delivered.eml").exists())
                    or marked(), 60), seen
    # 4. gsrun-node install's measurement runs (prolog --dry-run and the epilog import, real children)
    code = ("import json, sys\nfrom gsrun.admin.install import measure_hook_cost\n"
            "c = measure_hook_cost(sys.argv[1], runs=1, timeout_s=60)\nprint(json.dumps(c.error))\n")
    # an admin's PYTHONPATH naming the planted directory must not reach the children either
    # (-E: the parent itself ignores it, as the gsrun-node console script would not -- that is the admin's own)
    ienv = dict(env, PYTHONPATH=str(cwd), PYTHONSTARTUP=str(cwd / "json.py"))
    cp = subprocess.run([sys.executable, "-P", "-E", "-c", code, str(site.config)], cwd=cwd, env=ienv,
                        capture_output=True, text=True, timeout=180)
    seen.append(("install measure", cp.returncode, cp.stdout[-300:] + cp.stderr[-500:]))
    # 5. doctor (its probes run with cwd=/)
    cp = run_node(["doctor", "--json", "--config", str(site.config)], env, cwd=str(cwd))
    seen.append(("doctor", cp.returncode, cp.stderr[-300:]))

    assert marked() == [], f"planted {what} imported by a root child: {marked()}\n{seen}"
    # ... and every child really ran (so the absence of markers means something)
    assert json.loads((jobdir / "node-gpu-node01.json").read_text())["sampler_stop"] == "stopped", seen
    assert (jobdir / "accounting.json").exists(), seen
    assert (site.base / "delivered.eml").exists(), seen
    assert seen[3][1] == 0 and seen[3][2].splitlines()[0] == "null", seen
    assert json.loads(run_node(["doctor", "--json", "--config", str(site.config)], env, cwd=str(cwd)).stdout)


def test_root_python_and_env_shape(monkeypatch):
    assert root_python("-m", "x", python="/py") == ["/py", "-P", "-s", "-m", "x"]
    base = {"PATH": "/bin", "PYTHONPATH": "/tmp/x", "PYTHONHOME": "/tmp", "PYTHONSTARTUP": "/tmp/s.py",
            "PYTHONUSERBASE": "/tmp/u", "PYTHONWARNINGS": "ignore::evil.W", "PYTHONDONTWRITEBYTECODE": "1",
            "GSRUN_CONFIG": "/etc/g.toml", "LD_PRELOAD": "/tmp/x.so", "HOME": "/tmp", "GSRUN_SPOOL_DIR": "/s"}
    env = root_child_env(("GSRUN_SPOOL_DIR", "PYTHONPATH"), base=base, extra={"PYTHONHOME": "/x", "A": "1"})
    assert env == {"PATH": "/bin", "GSRUN_CONFIG": "/etc/g.toml", "GSRUN_SPOOL_DIR": "/s",
                   "PYTHONDONTWRITEBYTECODE": "1", "A": "1"}
    assert root_child_env(base={})["PATH"].startswith("/usr/local/sbin")
