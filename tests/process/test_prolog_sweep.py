"""The real prolog removes the Prometheus textfiles and live files of jobs gone from the node,
deciding from the state dir only, never listing the shared spool (tests/helpers/node_site: fake host root, fake tools)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers.node_site import kill_fakes, make_site, run_node, sampled_jobs

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")


@pytest.fixture
def site(tmp_path):
    prom = tmp_path / "textfiles"
    prom.mkdir()
    s = make_site()
    s.config.write_text(s.config.read_text().replace("[metrics]\n", f'[metrics]\ntextfile_dir = "{prom}"\n'))
    s.prom = prom
    yield s
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def _job_state(site, job_id: str, files: tuple[str, ...]) -> None:
    """A job's state dir with ``files``: ``monitor.json`` (the node monitor samples
    it), ``sampler.json`` (its sampler's state)."""
    d = site.state / "jobs" / job_id
    d.mkdir(parents=True, mode=0o700, exist_ok=True)
    for name in files:
        rec = {"job_id": job_id, "uid": 65534, "node": "gpu-node01", "gpus": [], "dma_latency_us": None} \
            if name == "monitor.json" else {}
        (d / name).write_text(json.dumps(rec))


def _live(site, job_id: str, node: str) -> None:
    d = site.spool / "jobs" / job_id
    d.mkdir(parents=True, exist_ok=True)
    (d / f"user-live-{node}.json").write_text("{}")


@root_only
def test_prolog_removes_files_of_gone_jobs_only(site):
    _job_state(site, "100", ("monitor.json", "sampler.json"))    # running job (the monitor samples it): kept
    _job_state(site, "101", ("sampler.json",))                   # sampled, its sampling ended: removed
    _job_state(site, "102", ())                                  # prolog in progress: kept
    # 103: no state dir (its epilog ran, or the node rebooted): its textfile removed; its live file is
    # left to the job's merge on the controller (the prolog never lists the shared spool)
    for j in ("100", "101", "102", "103"):
        (site.prom / f"gsrun_job_{j}.prom").write_text("gsrun_gpu_idle 1\n")
        _live(site, j, "gpu-node01")
    (site.prom / ".gsrun_job_103.prom.77.0123abcd").write_text("")
    (site.prom / "node_other.prom").write_text("x 1\n")
    _live(site, "103", "gpu-node02")                  # another node's live file in a shared spool
    cp = run_node(["prolog"], site.env())
    assert cp.returncode == 0, cp.stderr
    assert sampled_jobs(site.state) == ["100", "4242"]     # the monitor took 100 up at its start
    files = sorted(os.listdir(site.prom))
    assert files == ["gsrun_job_100.prom", "gsrun_job_102.prom", "gsrun_job_4242.prom", "node_other.prom"]
    assert (site.spool / "jobs/100/user-live-gpu-node01.json").exists()
    assert (site.spool / "jobs/102/user-live-gpu-node01.json").exists()
    assert not (site.spool / "jobs/101/user-live-gpu-node01.json").exists()
    assert (site.spool / "jobs/103/user-live-gpu-node01.json").exists()
    assert (site.spool / "jobs/103/user-live-gpu-node02.json").exists()
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    swept = rec["steps"]["sweep"]
    assert swept["prom"] == [".gsrun_job_103.prom.77.0123abcd", "gsrun_job_101.prom", "gsrun_job_103.prom"]
    assert swept["live"] == ["101"]


@root_only
def test_user_planted_live_file_decides_nothing(site):
    """A live file (group-readable, in a directory the job's group lists) says the job runs:
    ignored; only the state dir counts (the textfile goes; the live file of a job without state
    here is not even looked at)."""
    d = site.spool / "jobs" / "105"
    d.mkdir(parents=True)
    (d / "user-live-gpu-node01.json").write_text(json.dumps({"kind": "live", "written": 9e9}))
    (site.prom / "gsrun_job_105.prom").write_text("gsrun_gpu_idle 0\n")
    cp = run_node(["prolog"], site.env())
    assert cp.returncode == 0, cp.stderr
    assert not (site.prom / "gsrun_job_105.prom").exists()
    assert (d / "user-live-gpu-node01.json").exists()
