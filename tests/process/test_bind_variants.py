"""Variants 1 and 2 of the recorded hosts, through ``gsrun-bind --plan --json --host-root``
on host trees built for them (tests/data/hosts/make_fake_hosts.py):

- ``numa-memless``: node1 has CPUs but ``MemTotal: 0 kB``, node2 memory but no
  CPUs; a rank on node1 is bound to node1's CPUs by list and its memory to
  node0 (distance 20, node2 is 40); node2 is never a CPU target;
- ``vm-spread``: every GPU's ``numa_node`` is -1 and its NVML affinity is all
  CPUs; its ranks split the affinity, no memory binding, "no NUMA locality".
"""

import json
import os

import pytest
from click.testing import CliRunner

from helpers.paths import DATA
from gsrun.base.cpulist import parse_cpulist
from gsrun.bind.plan import exec_argv, plan_from_env
from gsrun.facts.hostfs import HostFS
from gsrun.wrapper.bind import main

HOSTS = DATA / "hosts"


def _plan(monkeypatch, host, gpus, n):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_"))]:
        monkeypatch.delenv(k)
    res = CliRunner().invoke(main, ["--plan", "--json", "--host-root", str(HOSTS / host),
                                    "--gpus", gpus, "--ntasks-per-node", str(n)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["ranks"]


def test_memoryless_node_cpus_by_list_memory_on_nearest(monkeypatch):
    ranks = _plan(monkeypatch, "numa-memless", "0,1", 2)
    r0, r1 = ranks
    assert r0["cpus"] == list(range(0, 16)) and r0["mem_nodes"] == [0]
    # GPU1 sits on node1 (CPUs, no memory): its CPUs by list, memory on node0
    assert r1["numa_node"] == 1 and r1["cpus"] == list(range(16, 32))
    assert r1["mem_nodes"] == [0]
    assert "node 1 has no memory: memory on nearest node 0" in r1["reason"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_memoryless_never_in_policy_memory_only_never_cpu(monkeypatch, n):
    ranks = _plan(monkeypatch, "numa-memless", "0,1,2", n)
    for r in ranks:
        assert 1 not in r["mem_nodes"], r
        assert r["cpus"] and set(r["cpus"]) <= set(range(32)), r  # node2 has no CPU
    # GPU2's node (2) has memory but no CPU: its rank takes the nearest node's CPUs (node0)
    g2 = [r for r in ranks if r["gpu"]["index"] == 2]
    assert all(set(r["cpus"]) <= set(range(16)) for r in g2)


def test_memoryless_numactl_argv_names_memory_node():
    fs = HostFS(HOSTS / "numa-memless")
    p = plan_from_env({"SLURM_STEP_GPUS": "1", "SLURM_NTASKS_PER_NODE": "1"}, fs)
    argv = exec_argv(p.rank(0), p.host_nodes, ["true"], allowed_mems=[0, 1, 2], numactl="/usr/bin/numactl")
    assert argv == ["/usr/bin/numactl", "--membind=0", "--", "true"]


def test_spread_gpu_one_rank_gets_all_affinity(monkeypatch):
    (r,) = _plan(monkeypatch, "vm-spread", "0", 1)
    # before: node0's CPUs (0-15) only
    assert r["cpus"] == list(range(32))
    assert r["mem_nodes"] == [] and r["numa_node"] is None
    assert r["reason"].startswith("no NUMA locality: GPU 0 affinity 0-31 spans nodes 0-1")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_spread_gpus_split_fairly(monkeypatch, n):
    ranks = _plan(monkeypatch, "vm-spread", "0,1,2,3", n)
    sizes = [len(r["cpus"]) for r in ranks]
    assert sum(sizes) == 32 and max(sizes) - min(sizes) <= 1
    seen = set()
    for r in ranks:
        assert not seen & set(r["cpus"])
        seen |= set(r["cpus"])
        assert r["mem_nodes"] == [] and "no NUMA locality" in r["reason"]
    assert sorted(seen) == list(range(32))


def test_spread_table_says_no_numa_locality(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_", "GSRUN_"))]:
        monkeypatch.delenv(k)
    res = CliRunner().invoke(main, ["--plan", "--host-root", str(HOSTS / "vm-spread"), "--gpus", "0,1",
                                    "--ntasks-per-node", "2"])
    assert res.exit_code == 0, res.output
    rows = [ln.split(None, 5) for ln in res.stdout.splitlines() if ln.startswith("  0 ")]
    assert len(rows) == 1
    rank, gpu, cpus, mem, nic, reason = rows[0]
    assert (gpu, parse_cpulist(cpus), mem) == ("0", list(range(16)), "-")
    assert reason.startswith("no NUMA locality")
