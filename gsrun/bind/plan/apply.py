"""What touches the process (effects, thin): the CPU affinity
(:func:`apply_affinity`) and the argv that binds memory (:func:`exec_argv`).
"""

from __future__ import annotations

import os

from gsrun.bind.plan.rules import RankPlan
from collections.abc import Sequence
import shutil



def apply_affinity(rank_plan: RankPlan, pid: int = 0) -> list[int]:
    """``os.sched_setaffinity(pid, cpus)``; returns the CPUs applied. Never
    called with an empty set: an empty plan leaves the affinity unchanged.

    Raises:
        OSError: EINVAL when no planned CPU is in the task's cpuset (a plan
            made for another host or cgroup), ESRCH for a vanished pid.
    """
    cpus = list(rank_plan.cpus)
    if not cpus:
        return sorted(os.sched_getaffinity(pid))
    os.sched_setaffinity(pid, cpus)
    return cpus


def exec_argv(rank_plan: RankPlan, host_nodes: int, command: Sequence[str],
              allowed_mems: Sequence[int] | None = None,
              numactl: str | None = None) -> list[str]:
    """The argv to exec: ``numactl --membind=N -- CMD...`` when numactl
    exists (``numactl`` path, else looked up), the rank's node is known, the
    host has > 1 node and the nodes are within ``allowed_mems`` (the
    cpuset's ``Mems_allowed_list``; numactl fails outside it); else CMD."""
    cmd = list(command)
    mems = [m for m in rank_plan.mem_nodes if m is not None and m >= 0]
    if allowed_mems is not None:
        mems = [m for m in mems if m in set(allowed_mems)]
    if rank_plan.numa_node is None or rank_plan.numa_node < 0 or host_nodes <= 1 or not mems:
        return cmd

    exe = numactl or shutil.which("numactl")
    if not exe:
        return cmd
    return [exe, "--membind=" + ",".join(str(m) for m in mems), "--", *cmd]
