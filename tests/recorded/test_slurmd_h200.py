"""What a real slurmd (Slurm 22.05.8) on a real H200 node gave gsrun's hooks
and tasks (tests/data/slurmd-h200/, README there), read by the same code the
hooks use."""

from __future__ import annotations

import json

import pytest

from gsrun.epilog import ctld
from gsrun.facts.jobenv import job_from_env
from gsrun.facts.slurm import parse_comment_request
from gsrun.request.job import comment_from_env, request_from_comment
from helpers.paths import DATA

pytestmark = pytest.mark.recorded

H200 = DATA / "slurmd-h200"


def env_of(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize("hook", ["prolog.env", "epilog.env"])
def test_node_hooks_read_the_job_from_real_slurmd(hook):
    env = env_of(H200 / "excl" / hook)
    job = job_from_env(env)
    assert (job.job_id, job.uid, job.user, job.node, job.gpus) == ("2", 1001, "gsrun-gc1", "vm", [0])
    assert job.cpus_on_node == 16 and job.nodelist == ["vm"]
    comment = comment_from_env(env)
    assert comment == "gsrun:tune=swappiness=10,dirty_ratio=40,thp=never;mps=;exclusive=1"
    req = request_from_comment(comment, "job comment")
    assert req.tune == "swappiness=10,dirty_ratio=40,thp=never" and req.mps == ""
    assert parse_comment_request(comment)["exclusive"] == "1"


def test_task_saw_only_its_gpu_under_the_device_cgroup():
    task = json.loads((H200 / "excl" / "task-0.json").read_text())
    assert task["devices"] == ["nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
    assert task["cgroup"] == "0::/system.slice/vm_slurmstepd.scope/job_2/step_0/user/task_0"
    env = task["env"]
    assert (env["CUDA_VISIBLE_DEVICES"], env["SLURM_STEP_GPUS"], env["GSRUN_GPU"]) == ("0", "0", "0")
    assert env["CUDA_MPS_PIPE_DIRECTORY"].endswith("/mps/2/pipe")      # the job's own MPS daemon


def test_scontrol_shows_the_gres_index():
    text = (H200 / "excl" / "scontrol-show-job-d.txt").read_text()
    assert "GRES=gpu:1(IDX:0)" in text and "OverSubscribe=NO" in text


def test_epilog_slurmctld_of_a_cancelled_job_has_no_final_state():
    """Why the state is settled later: EpilogSlurmctld's environment has no
    state and exit code 0:0, and the job record says COMPLETING."""
    env = env_of(H200 / "cancel" / "epilog-ctld.env")
    assert env["SLURM_SCRIPT_CONTEXT"] == "epilog_slurmctld" and env["SLURM_JOB_EXIT_CODE2"] == "0:0"
    assert not [k for k in env if "STATE" in k]
    job = ctld.job_from_record(env["SLURM_JOB_ID"], {"JobState": "COMPLETING", "ExitCode": "0:15"}, env)
    assert (job.state, job.state_source) == ("FAILED", "exit_code")
    assert "CANCELLED after" in (H200 / "cancel" / "gseff.txt").read_text()    # settled by the background step


def test_verdict_of_the_run():
    v = json.loads((H200 / "verdict.json").read_text())
    assert v["ok"] and v["cluster"]["mode"] == "cgroup" and v["cluster"]["gpus"] == 1
    verdicts = {c["check"]: c["verdict"] for c in v["checks"]}
    assert [k for k, x in verdicts.items() if x == "FAIL"] == []
    assert sum(x == "PASS" for x in verdicts.values()) == 13
    assert {k for k, x in verdicts.items() if x == "SKIP"} == {
        "shared.two_daemons", "shared.own_gpu_only", "shared.no_leak", "shared.tuning_refused",
        "shared.first_epilog_leaves_second"}
