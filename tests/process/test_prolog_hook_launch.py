"""slurmd runs ``gsrun-node prolog`` for every job on every node, launched as
``python3 -I -S -c <bootstrap>`` (no ``site``). Here the prolog of a job that
asks nothing (the job credential's fields in the environment) runs that way:
it makes no Slurm call, has the node daemon's monitor sample the job, and
leaves no process holding a descriptor of the prolog's caller beyond 0-2 (an
inheritable one left open by slurmd)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import psutil
import pytest

import gsrun
import gsrun.epilog
import gsrun.prolog
import gsrun.wrapper
from helpers.node_site import make_site, node_daemon, run_node, samplers_of, stop_daemon

pytestmark = pytest.mark.process

# gsrun's package dirs as this interpreter finds them (an install, or the checkout's
# package-dir mapping: gsrun.prolog is <repo>/prolog), for a child without `site`
_ROOTS = [os.path.dirname(os.path.dirname(m.__file__)) for m in (gsrun, gsrun.prolog, gsrun.wrapper, gsrun.epilog)]
CREDENTIAL = {"SLURM_JOB_RESTART_COUNT": "0"}   # slurmd's credential fields: the job has no comment


def _launch() -> str:
    # the checkout first, this venv's site-packages (gsrun's dependencies) last, as HOOK_BOOTSTRAP puts it
    return (f"import sys\nsys.path[:0] = [{_ROOTS[0]!r}]\nsys.path.append({sysconfig.get_path('purelib')!r})\n"
            "import gsrun\n"
            f"gsrun.__path__.extend(d for d in {_ROOTS[1:]!r} if d not in gsrun.__path__)\n"
            "from gsrun.admin.node_entry import main\n"
            "main(sys.argv[1:])\n")


@pytest.fixture
def site():
    s = make_site()
    yield s
    stop_daemon(s.state)
    shutil.rmtree(s.base, ignore_errors=True)


def _hook(site, phase: str, job: str, **kw) -> subprocess.CompletedProcess:
    env = site.env(job_id=job, **CREDENTIAL)
    return subprocess.run([sys.executable, "-I", "-S", "-c", _launch(), phase], env=env,
                          capture_output=True, text=True, timeout=120, cwd="/", **kw)


def test_plain_prolog_makes_no_slurm_call_and_has_the_monitor_sample_the_job(site):
    node_daemon(site.env())
    for job in ("4301", "4302"):
        cp = _hook(site, "prolog", job)
        assert cp.returncode == 0, cp.stderr
        rec = json.loads((site.spool / "jobs" / job / "prolog-gpu-node01.json").read_text())
        assert rec["slurm_calls"] == [] and rec["request"]["source"] == "none"
        assert rec["steps"]["sampler"] == {"monitor": "sampling", "resumed": False, "gpus": 1}
        assert samplers_of(job, site.state)
        assert _hook(site, "epilog", job).returncode == 0
        assert not samplers_of(job, site.state)


def test_prolog_leaves_no_process_holding_its_callers_descriptors(site):
    """slurmd waits for the end of what it gave the prolog: nothing the prolog leaves
    running (it starts none; the node monitor is the daemon's) keeps an inheritable
    descriptor of its caller."""
    node_daemon(site.env())
    marker = site.base / "inherited-fd"
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.set_inheritable(fd, True)
        cp = _hook(site, "prolog", "4303", pass_fds=(fd,))
    finally:
        os.close(fd)
    assert cp.returncode == 0, cp.stderr
    try:
        assert samplers_of("4303", site.state)
        holders = []
        for p in psutil.process_iter(["pid"]):
            try:
                if any(f.path == str(marker) for f in p.open_files()):
                    holders.append(p.pid)
            except psutil.Error:
                pass
        assert holders == []
    finally:
        assert run_node(["epilog"], site.env(job_id="4303", **CREDENTIAL)).returncode == 0
    assert not samplers_of("4303", site.state)
