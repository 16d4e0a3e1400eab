"""``gsrun-node status``: text by default, JSON with ``--json``."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from helpers.node_site import TUNE, kill_fakes, make_site, run_node, samplers_of

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root (chown of user files)")
RECORD = "JobId=4242 JobName=train UserId=nobody(65534) OverSubscribe=NO Comment=(null)"


@pytest.fixture
def site():
    s = make_site()
    yield s
    for pid in samplers_of("4242", s.state):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    kill_fakes(s)
    shutil.rmtree(s.base, ignore_errors=True)


def test_status_idle_node_text_and_json(site):
    env = site.env()
    js = run_node(["status", "--json"], env)
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    assert out["tuning"]["changes"] == [] and out["tuning"]["jobs"] == [] and out["samplers"] == {}
    txt = run_node(["status"], env)
    assert txt.returncode == 0, txt.stderr
    assert "no node setting changed" in txt.stdout and "samplers: none" in txt.stdout
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
        assert "4242" in out["samplers"]
        txt = run_node(["status"], env).stdout
        assert "tuning jobs on node: 4242" in txt and "by job 4242" in txt and "samplers: job 4242 pid" in txt
    finally:
        assert run_node(["epilog"], env).returncode == 0
