"""Fault injection (crash safety of the hooks): the real prolog and epilog (child
processes of ``gsrun-node``, fake host root) are SIGKILLed at every step
boundary (``GSRUN_FAULT_AT=<phase>:<step>[:end]``, see gsrun.node.steps); then a
second epilog or ``gsrun-node restore --all`` must leave the fake node tree
exactly at its baseline (every file's bytes under sys/ and proc/), the node
monitor must sample the job no more, and the data already collected (sampler state,
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
from contextlib import suppress

import psutil
import pytest

from helpers.node_site import kill_fakes, TUNE, host_only, make_site, monitor_pid, node_daemon, run_node, \
    sampled_jobs, samplers_of, snapshot, stop_daemon
from helpers.tuning_tree import diff

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root (chown of user files)")
PROLOG_POINTS = ["records", "records:end", "tuning", "tuning:end", "sampler", "sampler:end"]
EPILOG_POINTS = ["gpus", "gpus:end", "mps", "mps:end", "residual", "residual:end", "mig", "mig:end", "tuning",
                 "tuning:end", "sampler+summary", "sampler+summary:end"]
RECORD = "JobId={job} JobName=train UserId=nobody(65534) OverSubscribe=NO Comment=(null)"


def job_env(site, job="4242", **kw):
    return site.env(job_id=job, spank={"SPANK_GS_TUNE": TUNE, "SPANK_GS_EXCLUSIVE": "1"}, FAKE_SLURM="record",
                    FAKE_SCONTROL_RECORD=RECORD.format(job=job), **kw)


@pytest.fixture
def site():
    s = make_site()
    yield s
    kill_fakes(s)       # and the site's node daemon
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
def test_monitor_sigkilled_mid_job_loses_at_most_the_gap(site):
    """The node monitor SIGKILLed mid-job (then its daemon restarted): the next
    monitor takes the job up from its monitor.json and sampler.json; the figures
    go on from the last flush and the time nobody sampled is gap, never zero."""
    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    time.sleep(1.0)
    pid = monitor_pid(site.state)
    assert pid is not None and samplers_of("4242", site.state)
    state_before = json.loads((site.state / "jobs/4242/sampler.json").read_text())
    os.kill(pid, signal.SIGKILL)
    with suppress(psutil.NoSuchProcess):    # reaped by its daemon between two looks: gone too
        while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.02)
    t_down = time.monotonic()
    stop_daemon(site.state)
    time.sleep(0.5)
    node_daemon(env)
    assert monitor_pid(site.state) not in (None, pid)
    assert samplers_of("4242", site.state), "the new monitor took the job up"
    down_s = time.monotonic() - t_down
    time.sleep(0.6)
    e = run_node(["epilog"], env)
    assert e.returncode == 0, e.stderr
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["sampler_stop"] == "stopped"
    assert summ["samples"] > state_before["samples"] >= 1
    gap_s = summ["gpus"][0]["util_gap_s"]
    assert 0.5 <= gap_s <= down_s + 2.0, (gap_s, down_s)
    assert any("counted as gap" in n for n in summ.get("notes", [])), summ.get("notes")
    assert not tuned(site)


@root_only
def test_a_second_prolog_of_a_job_resumes_its_sampling_once(site):
    """Whatever runs the prolog twice (no epilog between), the job is sampled once:
    the second prolog's begin resumes the sampling the first began (its figures go on)."""
    env = job_env(site)
    assert run_node(["prolog"], env).returncode == 0
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["steps"]["sampler"] == {"monitor": "sampling", "resumed": False, "gpus": 1}
    time.sleep(0.6)
    first = json.loads((site.state / "jobs/4242/sampler.json").read_text())
    assert run_node(["prolog"], env).returncode == 0
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["steps"]["sampler"] == {"monitor": "sampling", "resumed": True, "gpus": 1}
    assert sampled_jobs(site.state) == ["4242"]
    time.sleep(0.6)
    again = json.loads((site.state / "jobs/4242/sampler.json").read_text())
    assert again["start_time"] == first["start_time"] and again["samples"] > first["samples"]
    assert run_node(["epilog"], env).returncode == 0
    assert no_sampler_within(site, "4242")
