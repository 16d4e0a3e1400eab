"""Fault injection (crash safety of the hooks): the real prolog and epilog (child
processes of ``gsrun-node``, fake host root) are SIGKILLed at every step
boundary (``GSRUN_FAULT_AT=<phase>:<step>[:end]``, see gsrun.node.steps); then a
second epilog or ``gsrun-node restore --all`` must leave the fake node tree
exactly at its baseline (every file's bytes under sys/ and proc/), no
sampler process may be left, and the data already collected (sampler state,
node summary) must survive.

Tuning is requested the way the SPANK plugin passes it (``SPANK_GS_TUNE``,
``SPANK_GS_EXCLUSIVE=1``), and the job record (fake scontrol) says
``OverSubscribe=NO``, so node-wide settings are really changed. The
boundaries *inside* tuning (each sysfs and journal write) are covered by
test_tuning_crash.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import psutil
import pytest

from helpers.node_site import kill_fakes, leftover_fakes, TUNE, host_only, make_site, run_node, samplers_of, snapshot
from helpers.tuning_tree import diff

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root (chown of user files)")
PROLOG_POINTS = ["records", "records:end", "tuning", "tuning:end", "sampler", "sampler:end"]
EPILOG_POINTS = ["sampler+summary", "sampler+summary:end", "mps", "mps:end", "residual", "residual:end",
                 "mig", "mig:end", "tuning", "tuning:end"]
RECORD = "JobId={job} JobName=train UserId=nobody(65534) OverSubscribe=NO Comment=(null)"


def job_env(site, job="4242", **kw):
    return site.env(job_id=job, spank={"SPANK_GS_TUNE": TUNE, "SPANK_GS_EXCLUSIVE": "1"}, FAKE_SLURM="record",
                    FAKE_SCONTROL_RECORD=RECORD.format(job=job), **kw)


@pytest.fixture
def site():
    s = make_site()
    yield s
    for pid in samplers_of("4242", s.state) + samplers_of("4243", s.state):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    kill_fakes(s)
    shutil.rmtree(s.base, ignore_errors=True)


def tuned(site) -> bool:
    return (site.host / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text() == "performance\n"


def no_sampler_within(site, job: str, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not samplers_of(job, site.state):
            return True
        time.sleep(0.05)
    return False


@root_only
def test_full_run_changes_then_restores(site):
    """The harness itself: without a fault the node is really tuned, then back."""
    base = host_only(snapshot(site.host))
    env = job_env(site)
    p = run_node(["prolog"], env)
    assert p.returncode == 0, p.stderr
    assert tuned(site) and samplers_of("4242", site.state)
    assert len(diff(base, host_only(snapshot(site.host)))) >= 6     # governor x4, swappiness, thp, dirty_ratio
    time.sleep(0.5)
    e = run_node(["epilog"], env)
    assert e.returncode == 0, e.stderr
    assert diff(base, host_only(snapshot(site.host))) == []
    assert no_sampler_within(site, "4242")
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["samples"] >= 1 and summ["gpu_available"] is True


@root_only
@pytest.mark.parametrize("point", PROLOG_POINTS)
@pytest.mark.parametrize("way_back", ["epilog", "restore --all"])
def test_prolog_killed_at_step_boundary(site, point, way_back):
    base = host_only(snapshot(site.host))
    env = job_env(site, GSRUN_FAULT_AT=f"prolog:{point}")
    p = run_node(["prolog"], env)
    assert p.returncode == -signal.SIGKILL, (point, p.returncode, p.stderr)
    if point in ("tuning:end", "sampler", "sampler:end"):
        assert tuned(site), "the fault must hit after the node was changed"
    if point == "sampler:end":
        assert samplers_of("4242", site.state), "sampler was started before the kill"
    env.pop("GSRUN_FAULT_AT")
    if way_back == "epilog":
        e = run_node(["epilog"], env)
        assert e.returncode == 0, (point, e.stderr)
    else:
        r = run_node(["restore", "--all"], env)
        assert r.returncode == 0, (point, r.stderr)
        # (gsrun-node restore prints tuning's log lines on stdout before the JSON: see the report)
        assert json.loads(r.stdout)["tuning"]["ok"] is True
        assert diff(base, host_only(snapshot(site.host))) == [], point
        e = run_node(["epilog"], env)     # slurmd still runs the epilog: must not undo anything twice
        assert e.returncode == 0, (point, e.stderr)
    assert diff(base, host_only(snapshot(site.host))) == [], f"prolog killed at {point}, back by {way_back}"
    assert no_sampler_within(site, "4242"), f"sampler left after prolog killed at {point}"
    st = run_node(["status", "--json"], env)
    assert json.loads(st.stdout)["tuning"]["changes"] == []


@root_only
@pytest.mark.parametrize("point", EPILOG_POINTS)
def test_epilog_killed_at_step_boundary_then_rerun(site, point):
    base = host_only(snapshot(site.host))
    env = job_env(site)
    p = run_node(["prolog"], env)
    assert p.returncode == 0 and tuned(site), p.stderr
    time.sleep(0.6)     # a few samples flushed
    e1 = run_node(["epilog"], {**env, "GSRUN_FAULT_AT": f"epilog:{point}"})
    assert e1.returncode == -signal.SIGKILL, (point, e1.stderr)
    e2 = run_node(["epilog"], env)
    assert e2.returncode == 0, (point, e2.stderr)
    assert diff(base, host_only(snapshot(site.host))) == [], f"epilog killed at {point}"
    assert no_sampler_within(site, "4242")
    # nothing collected is lost: the summary holds the samples taken during the job
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["samples"] >= 2, (point, summ["samples"])
    assert summ["gpus"][0]["pci_bus_id"] == "0000:00:06.0"


@root_only
def test_sampler_sigkilled_mid_job_loses_at_most_one_flush(site):
    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    time.sleep(1.0)
    [pid] = samplers_of("4242", site.state)
    state_before = json.loads((site.state / "jobs/4242/sampler.json").read_text())
    os.kill(pid, signal.SIGKILL)
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.02)
    e = run_node(["epilog"], env)
    assert e.returncode == 0, e.stderr
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["sampler_stop"].split(";")[0] in ("not running", "stopped")   # a zombie until init reaps it
    assert summ["samples"] >= state_before["samples"] >= 1
    assert not tuned(site)


@root_only
def test_unrecorded_sampler_is_found_and_stopped(site):
    """Prolog killed between starting the sampler and recording its PID:
    the epilog finds it by its command line (root-owned, this job id)."""
    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    [pid] = samplers_of("4242", site.state)
    os.unlink(site.state / "jobs/4242/sampler.pid.json")
    e = run_node(["epilog"], env)
    assert e.returncode == 0, e.stderr
    assert no_sampler_within(site, "4242")
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert f"unrecorded sampler {pid}: stopped" in summ["sampler_stop"]


@root_only
def test_a_finished_prolog_record_spares_the_epilog_its_proc_scan(site):
    """The prolog's record names the sampler it started, as sampler.pid.json does: no
    sampler of the job can be unrecorded, so the epilog does not scan /proc (one open
    per process on the node, on every epilog's critical path). A process whose command
    line looks like an unrecorded sampler of this job is left alone (it is found, and
    stopped, when the records disagree: test_unrecorded_sampler_is_found_and_stopped)."""
    import subprocess
    import sys

    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gsrun.epilog.sampler",
                              "--job-id", "4242", "--state-dir", str(site.state)])
    try:
        e = run_node(["epilog"], env)
        assert e.returncode == 0, e.stderr
        summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
        assert "unrecorded" not in summ["sampler_stop"]
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


@root_only
def test_a_second_prolog_of_a_job_stops_the_first_ones_sampler(site):
    """One sampler per job per node, whatever runs the prolog twice (no epilog between)."""
    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    [first] = samplers_of("4242", site.state)
    assert run_node(["prolog"], env).returncode == 0
    # the second sampler starts detached: on a loaded machine it may show after the first is gone
    deadline = time.monotonic() + 20
    alive = samplers_of("4242", site.state)
    while (first in alive or len(alive) != 1) and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = samplers_of("4242", site.state)
    assert first not in alive and len(alive) == 1
    assert json.loads((site.state / "jobs/4242/sampler.pid.json").read_text())["pid"] == alive[0]
    assert run_node(["epilog"], env).returncode == 0
    assert no_sampler_within(site, "4242")


@root_only
def test_a_sampler_record_without_a_start_time_never_signals_its_pid(site):
    """A PID recorded without its start time may be anyone's by now: the epilog signals
    nothing by it and finds the sampler by its command line instead."""
    import subprocess
    import sys

    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    [pid] = samplers_of("4242", site.state)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = site.state / "jobs/4242/sampler.pid.json"
        rec.write_text(json.dumps({"pid": bystander.pid, "create_time": None, "argv": []}))
        e = run_node(["epilog"], env)
        assert e.returncode == 0, e.stderr
        assert bystander.poll() is None
        summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
        assert summ["sampler_stop"].startswith("bad sampler record: no start time")
        assert f"unrecorded sampler {pid}: stopped" in summ["sampler_stop"]
        assert no_sampler_within(site, "4242")
    finally:
        bystander.kill()
        bystander.wait()
