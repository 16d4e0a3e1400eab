"""gsrun-bind as a command: --plan output, exec mode on this real host
(affinity and environment seen by the child), error handling."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from helpers.bind_run import CHILD, clean_env, run_bind
from helpers.paths import DATA, REPO
from gsrun.bind.plan import plan_from_env
from gsrun.base.cpulist import format_cpulist
from gsrun.facts.hostfs import HostFS
from gsrun.wrapper.bind import main

HOSTS = DATA / "hosts"
def test_exec_ci_like_task_on_real_host():
    """The CI cluster's task: 4 fake GPUs, 4 tasks, affinity = all CPUs of the machine."""
    env = clean_env(SLURM_JOB_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="1",
                    SLURM_TASKS_PER_NODE="4(x2)", SLURM_NODEID="0", ROCR_VISIBLE_DEVICES="0",
                    GPU_DEVICE_ORDINAL="0", GSRUN_BIND_VERBOSE="1")
    r = run_bind(["--", sys.executable, "-c", CHILD], env)
    assert r.returncode == 0, r.stderr
    child = json.loads(r.stdout)
    parent_cpus = sorted(os.sched_getaffinity(0))
    plan = plan_from_env({k: v for k, v in env.items()}, HostFS("/"), parent_cpus)
    want = plan.rank(1)
    assert child["cpus"] == list(want.cpus)
    assert set(child["cpus"]) <= set(parent_cpus) and child["cpus"]
    e = child["env"]
    assert e["LOCAL_RANK"] == "1" and e["LOCAL_WORLD_SIZE"] == "4"
    assert e["OMP_NUM_THREADS"] == str(len(child["cpus"]))
    assert e["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "ROCR_VISIBLE_DEVICES" not in e and "GPU_DEVICE_ORDINAL" not in e
    assert e["GSRUN_BIND_CPUS"] == format_cpulist(child["cpus"])
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("gsrun-bind: rank 1 gpu 1 cpus ")]
    assert line and "(" in line[0]


def test_exec_gpu_isolation_and_user_device_order_kept():
    env = clean_env(SLURM_JOB_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="2",
                    SLURM_NTASKS_PER_NODE="4", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    r = run_bind(["--gpu-isolation", "--", sys.executable, "-c", CHILD], env)
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["env"]
    assert e["CUDA_VISIBLE_DEVICES"] == "2"
    assert e["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    # the node's warnings come once, from local rank 0
    assert "CUDA_DEVICE_ORDER=FASTEST_FIRST kept" not in r.stderr
    r0 = run_bind(["--gpu-isolation", "--", sys.executable, "-c", CHILD], dict(env, SLURM_LOCALID="0"))
    assert r0.returncode == 0 and "CUDA_DEVICE_ORDER=FASTEST_FIRST kept" in r0.stderr


def test_one_warning_line_per_job_the_rest_in_the_admins_log(tmp_path):
    """2 nodes x N ranks sharing too few CPUs: the job's stderr gets one line (global
    rank 0: the first warning, naming the node, and how many more); every warning of
    each node goes once to the admin's log (syslog; here ``GSRUN_LOG_FILE``)."""
    n = len(os.sched_getaffinity(0))
    per_node = max(4, n + 1)        # more ranks than CPUs: round-robin warning
    log = tmp_path / "gsrun.log"
    base = clean_env(SLURM_JOB_GPUS="0,1,2,3", SLURM_NTASKS_PER_NODE=str(per_node), SLURM_JOB_ID="77",
                     SLURM_NTASKS=str(2 * per_node), GSRUN_LOG_FILE=str(log))
    errs = []
    for node in range(2):
        for lr in range(per_node):
            r = run_bind(["--", sys.executable, "-c", "pass"],
                         dict(base, SLURM_LOCALID=str(lr), SLURM_PROCID=str(node * per_node + lr),
                              SLURMD_NODENAME=f"gpu0{7 + node}"))
            assert r.returncode == 0, r.stderr
            errs.append(r.stderr)
    lines = [ln for e in errs for ln in e.splitlines()]
    assert len(lines) == 1 and lines[0].startswith("gsrun: bind: warning: gpu07: "), lines
    logged = log.read_text().splitlines()
    assert all(" gsrun[77]: bind: gpu0" in ln for ln in logged)
    for node in ("gpu07", "gpu08"):
        mine = [ln for ln in logged if f"bind: {node}: " in ln]
        assert mine and len(mine) == len(set(mine)) and any("round-robin" in ln for ln in mine)
    more = len([ln for ln in logged if "bind: gpu07: " in ln]) - 1
    assert (f"(and {more} more: GSRUN_BIND_VERBOSE=1" in lines[0]) == (more > 0)
    # verbose: every warning of the node, on stderr too
    r = run_bind(["--", sys.executable, "-c", "pass"], dict(base, SLURM_LOCALID="0", SLURM_PROCID="4",
                                                            SLURMD_NODENAME="gpu08", GSRUN_BIND_VERBOSE="1"))
    shown = [ln for ln in r.stderr.splitlines() if ln.startswith("gsrun: bind: warning: gpu08: ")]
    assert len(shown) == len([ln for ln in logged if "bind: gpu08: " in ln]) and len(shown) >= 1


def test_torchrun_worker_bound_by_local_rank():
    """One srun task per node (SLURM_LOCALID 0 of 1), torchrun's worker 2 of 4: worker 2's plan."""
    env = clean_env(SLURM_JOB_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="0",
                    SLURM_STEP_TASKS_PER_NODE="1", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID="1", SLURM_NTASKS="2",
                    LOCAL_RANK="2", LOCAL_WORLD_SIZE="4", RANK="6", WORLD_SIZE="8", GSRUN_LAUNCHER="torchrun")
    child_code = CHILD.replace("('CUDA_', ", "('CUDA_', 'RANK', 'WORLD_SIZE', ")
    r = run_bind(["--", sys.executable, "-c", child_code], env)
    assert r.returncode == 0, r.stderr
    child = json.loads(r.stdout)
    want = plan_from_env(dict(env, SLURM_LOCALID="2", SLURM_NTASKS_PER_NODE="4", SLURM_STEP_TASKS_PER_NODE="4"),
                         HostFS("/"), sorted(os.sched_getaffinity(0))).rank(2)
    assert child["cpus"] == list(want.cpus)
    e = child["env"]
    assert e["LOCAL_RANK"] == "2" and e["LOCAL_WORLD_SIZE"] == "4"
    assert e["RANK"] == "6" and e["WORLD_SIZE"] == "8"      # torchrun's, not srun's task ids
    assert e["CUDA_VISIBLE_DEVICES"].split(",")[2] == "2"


def test_torchrun_worker_sees_one_world_in_slurm_variables():
    """What Lightning / Accelerate read from Slurm agrees with torchrun's RANK/LOCAL_RANK/WORLD_SIZE."""
    env = clean_env(SLURM_JOB_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="0",
                    SLURM_STEP_TASKS_PER_NODE="1", SLURM_TASKS_PER_NODE="1(x2)", SLURM_NTASKS_PER_NODE="1",
                    SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_NPROCS="2", SLURM_STEP_NUM_TASKS="2",
                    LOCAL_RANK="2", LOCAL_WORLD_SIZE="4", RANK="6", WORLD_SIZE="8", GSRUN_LAUNCHER="torchrun")
    code = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ('SLURM_PROCID', 'SLURM_LOCALID', "
            "'SLURM_NTASKS', 'SLURM_NPROCS', 'SLURM_STEP_NUM_TASKS', 'SLURM_NTASKS_PER_NODE', "
            "'SLURM_TASKS_PER_NODE', 'SLURM_STEP_TASKS_PER_NODE')}))")
    r = run_bind(["--", sys.executable, "-c", code], env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "8",
                                    "SLURM_NPROCS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS_PER_NODE": "4",
                                    "SLURM_TASKS_PER_NODE": None, "SLURM_STEP_TASKS_PER_NODE": None}
    # one task per GPU (no launcher): Slurm's own variables stay as srun set them
    plain = clean_env(SLURM_JOB_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1", SLURM_LOCALID="1", SLURM_PROCID="3",
                      SLURM_NTASKS="4", SLURM_NTASKS_PER_NODE="2")
    r = run_bind(["--", sys.executable, "-c", code], plain)
    got = json.loads(r.stdout)
    assert (got["SLURM_PROCID"], got["SLURM_LOCALID"], got["SLURM_NTASKS"]) == ("3", "1", "4")


def test_plan_problem_never_stops_the_task():
    env = clean_env(SLURM_JOB_GPUS="0,bogus", SLURM_LOCALID="0")
    r = run_bind(["--", sys.executable, "-c", CHILD], env)
    assert r.returncode == 0, r.stderr
    assert "gsrun: bind: warning:" in r.stderr and "no plan" in r.stderr
    assert json.loads(r.stdout)["cpus"] == sorted(os.sched_getaffinity(0))


def test_usage_errors_exit_2_with_gsrun_message():
    r = run_bind(["--"], clean_env())
    assert r.returncode == 2 and r.stderr.startswith("gsrun: bind: no command to run")
    assert "hint:" in r.stderr
    r = run_bind(["--host-root", "/nonexistent/x", "--", "true"], clean_env())
    assert r.returncode == 2 and r.stderr.startswith("gsrun: bind: host root is not a directory")
    r = run_bind(["--plan", "--json", "--allowed-cpus", "ff,00"], clean_env())
    assert r.returncode == 2 and r.stderr.startswith("gsrun: bind: bad --allowed-cpus")
    r = run_bind(["--", "/nonexistent/cmd"], clean_env())
    assert r.returncode == 2 and "gsrun: bind: cannot run command" in r.stderr


def test_no_shell_hostile_argument_passed_verbatim():
    hostile = "a'b\"c; $(touch /tmp/gsrun-pwned) `id`\nx"
    r = run_bind(["--", sys.executable, "-c", "import sys; print(repr(sys.argv[1]))", hostile],
                 clean_env())
    assert r.returncode == 0 and r.stdout.strip() == repr(hostile)
    assert not os.path.exists("/tmp/gsrun-pwned")


def test_plan_table_and_local_rank_json(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_HOST"))]:
        monkeypatch.delenv(k)
    root = str(HOSTS / "ci-emulated")
    res = CliRunner().invoke(main, ["--plan", "--host-root", root, "--gpus", "0,1,2,3",
                                    "--ntasks-per-node", "4"])
    assert res.exit_code == 0
    assert "(no NVIDIA GPU found on this host)" in res.stdout and "round-robin" in res.stdout
    res = CliRunner().invoke(main, ["--plan", "--json", "--local-rank", "2", "--gpus", "0,1,2,3",
                                    "--ntasks-per-node", "4"], env={"GSRUN_HOST_ROOT": root})
    (r,) = json.loads(res.stdout)["ranks"]
    assert r["local_rank"] == 2 and r["cpus"] == [0] and r["gpu"]["index"] == 2


def test_plan_local_rank_out_of_range_is_error(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_HOST"))]:
        monkeypatch.delenv(k)
    res = CliRunner().invoke(main, ["--plan", "--json", "--host-root", str(HOSTS / "h200-vm"),
                                    "--gpus", "0", "--ntasks-per-node", "2", "--local-rank", "5"])
    # the count is raised to cover the rank (a warning), never a crash
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ranks"][0]["local_rank"] == 5
