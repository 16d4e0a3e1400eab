"""The environment slurmd gives the Prolog, the Epilog, EpilogSlurmctld and a
task, for playing slurmd's part on a machine without Slurm (the H200 device
machine).

The Prolog/Epilog key sets and fixed values are the ones recorded from real
Slurm 22.05 (``shared/data/slurm-22.05/prolog_slurmd.env`` and
``epilog_slurmd.env``, copied here because ``../shared`` does not travel to
the device machine); the job's own values (id, user, node, GPUs, CPUs) are
substituted. The task environment follows what slurmstepd sets for a task of
a one-node, one-task step with ``--gres=gpu:N``.
"""

from __future__ import annotations

# recorded (prolog_slurmd.env), values of job 1 on node n1 of the test cluster
PROLOG_RECORDED = {
    "CUDA_VISIBLE_DEVICES": "0,1,2,3", "GPU_DEVICE_ORDINAL": "0,1,2,3", "PWD": "/var/log/slurm",
    "ROCR_VISIBLE_DEVICES": "0,1,2,3", "SLURMD_NODENAME": "n1", "SLURM_CLUSTER_NAME": "test",
    "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_JOBID": "1", "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
    "SLURM_JOB_GID": "1001", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_JOB_ID": "1", "SLURM_JOB_NTASKS": "8",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_STDIN": "/dev/null", "SLURM_JOB_STDOUT": "/home/user1/job-%j.out", "SLURM_JOB_UID": "1001",
    "SLURM_JOB_USER": "user1", "SLURM_JOB_WORK_DIR": "/tmp", "SLURM_NODELIST": "n[1-2]",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_UID": "1001", "ZE_AFFINITY_MASK": "0,1,2,3",
}
# epilog_slurmd.env adds these three and says epilog_slurmd
EPILOG_EXTRA = {"SLURM_JOB_DERIVED_EC": "0", "SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_EXIT_CODE": "0"}

SAFE_PATH = "/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _job_values(job_id: str, uid: int, gid: int, user: str, node: str, gpus: str, cpus: int,
                workdir: str) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": gpus, "GPU_DEVICE_ORDINAL": gpus, "ROCR_VISIBLE_DEVICES": gpus,
        "ZE_AFFINITY_MASK": gpus, "SLURMD_NODENAME": node, "SLURM_JOBID": job_id, "SLURM_JOB_ID": job_id,
        "SLURM_JOB_CPUS_PER_NODE": str(cpus), "SLURM_JOB_GID": str(gid), "SLURM_JOB_GPUS": gpus,
        "SLURM_JOB_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_UID": str(uid), "SLURM_UID": str(uid),
        "SLURM_JOB_USER": user, "SLURM_JOB_WORK_DIR": workdir, "SLURM_NODELIST": node,
        "SLURM_JOB_STDOUT": f"{workdir}/job-%j.out", "SLURM_CONF": "/etc/slurm/slurm.conf",
    }


def prolog_env(job_id, uid, gid, user, node, gpus, cpus, workdir, spank: dict[str, str] | None = None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(PROLOG_RECORDED)
    env.update(_job_values(job_id, uid, gid, user, node, gpus, cpus, workdir))
    env["PATH"] = SAFE_PATH
    env.update(spank or {})
    env.update(extra or {})
    return env


def epilog_env(job_id, uid, gid, user, node, gpus, cpus, workdir, spank=None, extra=None, exit_code=0):
    env = prolog_env(job_id, uid, gid, user, node, gpus, cpus, workdir, spank, extra)
    env.update(EPILOG_EXTRA)
    env["SLURM_JOB_EXIT_CODE"] = str(exit_code << 8)
    env["SLURM_JOB_EXIT_CODE2"] = f"{exit_code}:0"
    env["SLURM_SCRIPT_CONTEXT"] = "epilog_slurmd"
    return env


def ctld_env(job_id, uid, user, node, partition="gpu", extra=None, exit_code=0) -> dict[str, str]:
    """EpilogSlurmctld: job id, user, node list, exit codes; no mail fields."""
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_USER": user, "SLURM_JOB_UID": str(uid),
           "SLURM_JOB_NODELIST": node, "SLURM_JOB_PARTITION": partition,
           "SLURM_JOB_EXIT_CODE": str(exit_code << 8), "SLURM_JOB_EXIT_CODE2": f"{exit_code}:0",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld", "SLURM_CLUSTER_NAME": "test", "PATH": SAFE_PATH}
    env.update(extra or {})
    return env


def task_env(job_id, uid, user, node, gpus, cpus, home, ntasks=1, local_rank=0,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    """What slurmstepd gives task ``local_rank`` of a one-node step with ``ntasks`` tasks."""
    env = {
        "PATH": SAFE_PATH, "HOME": home, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_LOCALID": str(local_rank), "SLURM_PROCID": str(local_rank), "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": "1", "SLURM_JOB_GPUS": gpus, "SLURM_STEP_GPUS": gpus,
        "CUDA_VISIBLE_DEVICES": gpus, "GPU_DEVICE_ORDINAL": gpus, "SLURMD_NODENAME": node,
        "SLURM_JOB_NODELIST": node, "SLURM_NODELIST": node, "SLURM_STEP_NODELIST": node,
        "SLURM_JOB_UID": str(uid), "SLURM_JOB_USER": user, "SLURM_CPUS_ON_NODE": str(cpus),
        "SLURM_JOB_CPUS_PER_NODE": str(cpus), "SLURM_CLUSTER_NAME": "test", "SLURM_JOB_PARTITION": "gpu",
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
    }
    env.update(extra or {})
    return env


SCONTROL = r"""#!/bin/sh
# slurmctld's part: `scontrol [--local] -o show job ID` answers one job record line in
# Slurm 22.05's one-line format; the job holds its node exclusively
# (OverSubscribe=NO) and carries gsrun's requests in its comment.
# FAKE_JOBSTATE / FAKE_RUNTIME / FAKE_COMMENT come from the caller's env.
[ "$1" = "--local" ] && shift
[ "$1" = "-o" ] && [ "$2" = "show" ] && [ "$3" = "job" ] || { echo "scontrol (fake): unsupported: $*" >&2; exit 1; }
echo "JobId=$4 JobName=train_job UserId=${FAKE_USER:-nobody}(${FAKE_UID:-65534}) GroupId=nogroup(${FAKE_UID:-65534}) MCS_label=N/A Priority=1 Nice=0 Account=(null) QOS=normal JobState=${FAKE_JOBSTATE:-RUNNING} Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=${FAKE_RUNTIME:-00:00:01} TimeLimit=01:00:00 TimeMin=N/A Partition=gpu AllocNode:Sid=h200:1 ReqNodeList=(null) ExcNodeList=(null) NodeList=h200 BatchHost=h200 NumNodes=1 NumCPUs=${FAKE_CPUS:-16} NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=${FAKE_CPUS:-16},node=1,billing=${FAKE_CPUS:-16},gres/gpu=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/job.sh WorkDir=/tmp Comment=${FAKE_COMMENT:-(null)} StdErr=/tmp/job.out StdIn=/dev/null StdOut=/tmp/job.out Power= TresPerNode=gres:gpu:1 MailUser=(null) MailType=NONE"
"""


def write_fake_scontrol(bindir) -> str:
    """Write the fake ``scontrol`` into ``bindir`` (0755) and return ``bindir``."""
    import os
    from pathlib import Path

    d = Path(bindir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "scontrol"
    p.write_text(SCONTROL)
    os.chmod(p, 0o755)
    os.chmod(d, 0o755)
    return str(d)


def start_node_daemon(gsrun_node: str, state_dir, env: dict, metrics_port: int = 0, log_path=None):
    """``gsrun-node daemon run`` on ``<state_dir>/daemon.sock`` with its node monitor (the one
    process that opens NVML; the hooks run directly still reach it through
    ``<state_dir>/monitor.sock``), as a site's unit runs it -> the Popen, once the monitor
    listens (stop it with ``terminate()``)."""
    import os
    import subprocess
    import time
    from pathlib import Path

    state = Path(state_dir)
    state.mkdir(mode=0o755, parents=True, exist_ok=True)
    log = open(log_path or os.devnull, "ab")
    p = subprocess.Popen([gsrun_node, "daemon", "run", "--socket", str(state / "daemon.sock"), "--state-dir",
                          str(state), "--metrics-port", str(metrics_port)], env={**os.environ, **env},
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/")
    log.close()
    deadline = time.time() + 60
    while not (state / "monitor.sock").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    return p
