"""``gsrun-node status``: text by default, JSON with ``--json``."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers.node_site import TUNE, kill_fakes, make_site, monitor_pid, run_node, stop_daemon

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root (chown of user files)")
RECORD = "JobId=4242 JobName=train UserId=nobody(65534) OverSubscribe=NO Comment=(null)"


@pytest.fixture
def site():
    s = make_site()
    yield s
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def test_status_idle_node_text_and_json(site):
    env = site.env()
    js = run_node(["status", "--json"], env)
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    assert out["tuning"]["changes"] == [] and out["tuning"]["jobs"] == [] and out["samplers"] == {}
    txt = run_node(["status"], env)
    assert txt.returncode == 0, txt.stderr
    assert "no node setting changed" in txt.stdout and "sampled jobs: none" in txt.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(txt.stdout)


@root_only
def test_status_after_prolog_names_the_job(site):
    env = site.env(spank={"SPANK_GS_TUNE": TUNE}, FAKE_SLURM="record", FAKE_SCONTROL_RECORD=RECORD)
    p = run_node(["prolog"], env)
    assert p.returncode == 0, p.stderr
    try:
        out = json.loads(run_node(["status", "--json"], env).stdout)
        assert out["tuning"]["jobs"] == ["4242"] and out["tuning"]["changes"]
        mon = monitor_pid(site.state)
        assert out["samplers"] == {"4242": {"pid": mon, "running": True}} and mon is not None
        txt = run_node(["status"], env).stdout
        assert "tuning jobs on node: 4242" in txt and "by job 4242" in txt
        assert f"sampled jobs: job 4242 (sampled by monitor {mon})" in txt
    finally:
        assert run_node(["epilog"], env).returncode == 0


@root_only
def test_status_names_a_job_begun_but_not_sampled_while_the_monitor_is_down(site):
    """The node daemon stopped mid-job: the job's monitor.json says it began, no
    monitor samples it now; the next daemon's monitor takes it up again."""
    env = site.env(FAKE_SLURM="record", FAKE_SCONTROL_RECORD=RECORD)
    assert run_node(["prolog"], env).returncode == 0
    stop_daemon(site.state)
    out = json.loads(run_node(["status", "--json"], env).stdout)
    assert out["samplers"] == {"4242": {"pid": None, "running": False}}
    assert "job 4242 (not sampled now)" in run_node(["status"], env).stdout
    e = run_node(["epilog"], env)
    assert e.returncode == 0, e.stderr
    summ = json.loads((site.spool / "jobs/4242/node-gpu-node01.json").read_text())
    assert summ["sampler_stop"] == "stopped"
