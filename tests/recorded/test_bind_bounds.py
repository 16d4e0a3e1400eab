"""The plan is made as root (SPANK plugin, prolog) from values an ordinary
user sets: ``SLURM_LOCALID``, the task counts, ``SLURM_STEP_GPUS`` /
``SLURM_JOB_GPUS`` / ``CUDA_VISIBLE_DEVICES``. Values beyond what a node can
have are refused at once, not planned.

Measured on server-2s8g / amd-nps4 before the bounds: ``SLURM_LOCALID=20000``
took 1.8-4.1 s (grows faster than linearly), ``SLURM_STEP_GPUS`` of 500
``0-4096`` ranges 13 s (~20 ms a range).
"""

from __future__ import annotations

import time

import pytest

from helpers.paths import DATA
from gsrun.base.errors import InputError
from gsrun.bind.plan import (MAX_LOCAL_RANKS, MAX_STEP_GPUS, Plan, fallback_rank, plan_from_env, rank_env,
                             worker_environ)
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import read_topology

FAST_S = 0.2   # a refusal reads no more than the environment


def host(name="amd-nps4"):
    fs = HostFS(DATA / "hosts" / name)
    return fs, read_topology(fs)


def refused(env, name="amd-nps4"):
    fs, topo = host(name)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as ei:
        plan_from_env(env, fs, None, topology=topo)
    return time.perf_counter() - t0, str(ei.value)


@pytest.mark.parametrize("localid", [60000, 10**6, 10**9 - 1])
def test_huge_localid_is_refused_fast(localid):
    took, msg = refused({"SLURM_LOCALID": str(localid), "SLURM_STEP_GPUS": "0"})
    assert took < FAST_S
    assert msg.startswith(f"gsrun: bind: SLURM_LOCALID out of range: {localid}") and "\nhint: " in msg


def test_localid_of_thousands_of_digits_is_refused_not_a_crash():
    took, msg = refused({"SLURM_LOCALID": "9" * 5000})
    assert took < FAST_S and msg.startswith("gsrun: bind: SLURM_LOCALID out of range")


@pytest.mark.parametrize("var", ["SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])
def test_huge_task_count_is_refused_fast(var):
    took, msg = refused({var: "1000000", "SLURM_LOCALID": "0"})
    assert took < FAST_S and msg.startswith("gsrun: bind: tasks per node out of range: 1000000")


@pytest.mark.parametrize("var", ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"])
def test_thousands_of_wide_gpu_ranges_are_refused_fast(var):
    took, msg = refused({var: ",".join(["0-4096"] * 5000), "SLURM_LOCALID": "0"})
    assert took < FAST_S
    assert msg.startswith(f"gsrun: bind: {var} names too many GPUs: 5000 entries") and "\nhint: " in msg


def test_one_range_wider_than_a_node_is_refused():
    took, msg = refused({"SLURM_STEP_GPUS": "0-4096"})
    assert took < FAST_S and f"over {MAX_STEP_GPUS} GPUs once its ranges are expanded" in msg


def test_long_cuda_visible_devices_is_refused():
    took, msg = refused({"CUDA_VISIBLE_DEVICES": ",".join(["0"] * 100000)})
    assert took < FAST_S and msg.startswith("gsrun: bind: CUDA_VISIBLE_DEVICES names too many GPUs")


def test_the_bounds_keep_real_steps():
    fs, topo = host()
    p = plan_from_env({"SLURM_STEP_GPUS": "0-3", "SLURM_LOCALID": "3"}, fs, None, topology=topo)
    assert len(p.ranks) == 4 and rank_env(p, 3)["LOCAL_RANK"] == "3"
    # a local id beyond the task count still plans up to it (below the bound), with a warning
    p = plan_from_env({"SLURM_STEP_GPUS": "0", "SLURM_LOCALID": "40"}, fs, None, topology=topo)
    assert len(p.ranks) == 41 and any("SLURM_LOCALID 40" in w for w in p.warnings)


def test_the_largest_plan_allowed_is_made_in_well_under_a_second():
    fs, topo = host()
    t0 = time.perf_counter()
    p = plan_from_env({"SLURM_LOCALID": str(MAX_LOCAL_RANKS - 1)}, fs, None, topology=topo)
    took = time.perf_counter() - t0
    assert len(p.ranks) == MAX_LOCAL_RANKS and took < 1.0   # 0.07 s measured (6.3 s when each rank counted its pool)
    t0 = time.perf_counter()
    for r in range(MAX_LOCAL_RANKS):
        assert p.rank(r).local_rank == r
    assert time.perf_counter() - t0 < 0.1        # a dict lookup, not a search


def test_rank_lookup_keeps_the_first_and_refuses_a_missing_rank():
    a = fallback_rank(0, 2, [0, 1], "x")
    b = fallback_rank(0, 2, [2, 3], "y")
    p = Plan(ranks=(a, b), allowed_cpus=(0, 1, 2, 3), host_nodes=1, step_gpus=())
    assert p.rank(0) is a
    with pytest.raises(InputError, match="no such local rank"):
        p.rank(1)
    assert p == Plan(ranks=(a, b), allowed_cpus=(0, 1, 2, 3), host_nodes=1, step_gpus=())
    assert "_by_rank" not in repr(p)


def test_worker_environ_ignores_numbers_of_thousands_of_digits():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "9" * 5000, "GSRUN_LAUNCHER": "torchrun"}
    assert worker_environ(env) == (env, False)
