"""The environment a user submits from (gsrun.wrapper.environ): SBATCH_* input
variables that would override the script put back on the command line (or
refused where sbatch cannot undo them), and a parent allocation's SLURM_*/SRUN_*
left out of a job submitted from inside it."""

from __future__ import annotations

import pytest

from gsrun.base.errors import InputError
from gsrun.wrapper.environ import sbatch_env_args, scrub_note, script_options, submit_environ

SCRIPT = """#!/bin/bash
#SBATCH --job-name="my job"
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --partition=gpu
#SBATCH --time=10
#SBATCH --mem-per-cpu=4G
#SBATCH --requeue
set -eu
"""


def test_script_options_unquote_like_sbatch():
    assert script_options(SCRIPT) == {"job-name": "my job", "nodes": "1", "ntasks-per-node": "4", "gres": "gpu:4",
                                      "partition": "gpu", "time": "10", "mem-per-cpu": "4G", "requeue": None}


def test_module_variables_are_overridden_on_the_command_line():
    env = {"SBATCH_PARTITION": "debug", "SBATCH_TIMELIMIT": "1", "SBATCH_MEM_PER_NODE": "1G",
           "SBATCH_JOB_NAME": "x", "SBATCH_NO_REQUEUE": "1", "SBATCH_ACCOUNT": "module-acct", "HOME": "/h"}
    args, named = sbatch_env_args(SCRIPT, env)
    assert args == ["--partition=gpu", "--time=10", "--job-name=my job", "--requeue", "--mem-per-cpu=4G"]
    assert sorted(named) == ["SBATCH_JOB_NAME", "SBATCH_MEM_PER_NODE", "SBATCH_NO_REQUEUE", "SBATCH_PARTITION",
                             "SBATCH_TIMELIMIT"]
    # what gsrun does not render stays the module's (SBATCH_ACCOUNT): sbatch reads it as before


def test_no_variables_no_arguments():
    assert sbatch_env_args(SCRIPT, {"PATH": "/bin"}) == ([], [])


@pytest.mark.parametrize("var", ["SBATCH_GPUS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_TASK",
                                 "SBATCH_TRES_PER_TASK", "SBATCH_CPUS_PER_GPU", "SBATCH_WAIT", "SBATCH_EXCLUSIVE"])
def test_variables_without_an_undo_are_refused(var):
    with pytest.raises(InputError) as ei:
        sbatch_env_args(SCRIPT, {var: "2"})
    msg = str(ei.value)
    assert msg.startswith(f"gsrun: submit: {var} is set: ") and "\nhint: " in msg and var in msg.split("hint:")[1]


def test_exclusive_variable_with_exclusive_asked_is_fine():
    assert sbatch_env_args(SCRIPT + "#SBATCH --exclusive\n", {"SBATCH_EXCLUSIVE": "1"}) == ([], [])


def test_inside_an_allocation_the_parent_variables_are_left_out():
    parent = {"SLURM_JOB_ID": "77", "SLURM_MEM_PER_CPU": "2000", "SRUN_CPUS_PER_TASK": "4",
              "SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0", "SLURM_CONF": "/etc/s.conf",
              "SLURM_CLUSTERS": "c1", "SBATCH_QOS": "q", "PATH": "/bin"}
    env, gone = submit_environ(parent)
    assert env == {"SLURM_CONF": "/etc/s.conf", "SLURM_CLUSTERS": "c1", "SBATCH_QOS": "q", "PATH": "/bin"}
    assert gone == sorted(set(parent) - set(env))
    assert scrub_note("77", gone) == (
        "gsrun: submit: note: inside job 77: the parent job's SLURM_*/SRUN_* variables (SLURM_MEM_PER_CPU, "
        "SRUN_CPUS_PER_TASK, SLURM_CPUS_PER_TASK, SLURM_NTASKS, SLURM_JOB_ID and 1 more) are left out of the new job")


def test_outside_an_allocation_nothing_is_left_out():
    env = {"SLURM_MEM_PER_CPU": "2000", "PATH": "/bin"}     # the user's own srun input: theirs
    assert submit_environ(env) == (env, [])
