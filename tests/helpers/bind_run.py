"""``gsrun-bind`` in a child process, as a task would run it (no tests here)."""

import os
import subprocess
import sys

from helpers.paths import REPO

ENTRY = "from gsrun.wrapper.bind import main; main()"
CHILD = ("import os, json; print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), "
         "'env': {k: v for k, v in os.environ.items() if k.startswith(('CUDA_', 'LOCAL_', 'OMP_', "
         "'GSRUN_BIND', 'ROCR', 'GPU_DEVICE', 'NCCL_'))}}))")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "CUDA_", "GSRUN_", "ROCR_", "GPU_DEVICE", "NCCL_"))}
    env.update(extra)
    return env


def run_bind(args, env):
    return subprocess.run([sys.executable, "-P", "-c", ENTRY, *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)
