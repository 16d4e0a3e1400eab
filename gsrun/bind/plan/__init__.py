"""The per-rank binding plan ("the library computes, the adapter applies"):
:mod:`~gsrun.bind.plan.rules` decides (pure), :mod:`~gsrun.bind.plan.env`
turns the step environment into bounded inputs, :mod:`~gsrun.bind.plan.apply`
applies, :mod:`~gsrun.bind.plan.table` renders. Every name is re-exported here.
"""

from __future__ import annotations

from gsrun.base.errors import GsrunError
from gsrun.bind.plan.rules import (FOREIGN_GPU_VARS, MAX_LOCAL_RANKS, GpuRef, Plan, RankPlan, fallback_rank, make_plan,
                                   max_local_ranks, mig_visible_devices, rank_env, resolve_step_gpus)
from gsrun.bind.plan.env import (MAX_STEP_GPUS, WORKER_TASK_VARS, ntasks_from_env, plan_from_env,
                                 read_job_mig_devices, worker_environ, worker_task_env)
from gsrun.bind.plan.apply import apply_affinity, exec_argv
from gsrun.bind.plan.table import render_table

__all__ = ["GpuRef", "RankPlan", "Plan", "FOREIGN_GPU_VARS", "resolve_step_gpus", "make_plan",
           "fallback_rank", "rank_env", "ntasks_from_env", "plan_from_env", "apply_affinity",
           "exec_argv", "render_table", "GsrunError", "MAX_LOCAL_RANKS", "MAX_STEP_GPUS", "max_local_ranks",
           "worker_environ", "worker_task_env", "WORKER_TASK_VARS", "mig_visible_devices",
           "read_job_mig_devices"]
